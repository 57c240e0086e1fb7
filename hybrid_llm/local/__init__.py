"""Running the system on one machine: the topology file, its supervisor
(``hybrid-llm up`` / ``down`` / ``status``), process trees, the netem
delay proxies that emulate inter-region RTTs, and the local trace store
(Arize Phoenix: its launcher and a reader of what it stored)."""

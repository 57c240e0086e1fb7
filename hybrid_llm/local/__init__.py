"""Running the system on one machine: the topology file, its supervisor
(``hybrid-llm up`` / ``down`` / ``status``), process trees and the netem
delay proxies that emulate inter-region RTTs."""

"""Modelling the fleet: the region RTT table, the discrete-event simulator
(``hybrid-llm simulate``) and its check against measurements
(``hybrid-llm simcheck``)."""

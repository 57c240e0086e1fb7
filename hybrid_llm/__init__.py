"""Operator tooling: the ``hybrid-llm`` umbrella command (model fetch, local
topology, load benchmark, fleet simulator)."""

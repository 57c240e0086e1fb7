"""Operator tooling behind the ``hybrid-llm`` command, by concern: running the
system on one machine (:mod:`hybrid_llm.local`), measuring it
(:mod:`hybrid_llm.bench`) and modelling the fleet (:mod:`hybrid_llm.fleet`)."""

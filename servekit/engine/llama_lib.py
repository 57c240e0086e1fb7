"""llama-cpp-python, loaded with the process settings its CPU backend needs.

llama.cpp's CPU backend runs its threads on OpenMP (libgomp). After each
decode libgomp keeps its idle threads spinning for GOMP_SPINCOUNT pause loops
(default 300000: milliseconds) before they sleep, holding a core that the
event loop needs to send the token just made; on 2 cores the agent's
first-token hand-off had a 3 ms p90 tail from it. 10000 keeps the spin short
(decode speed unchanged: barriers inside a decode are far shorter). It must be
set before libgomp loads, so it is set here, right before ``llama_cpp`` is
imported, and only in a process that loads llama.cpp (not the router, not a
gateway over HTTP replicas). An operator's own setting wins. Every module
that uses llama.cpp imports it from here.
"""

import os

os.environ.setdefault("GOMP_SPINCOUNT", "10000")

import llama_cpp  # after the environment it reads when it loads

__all__ = ["llama_cpp"]

"""Does the simulator predict what the bench measures? (``hybrid-llm simcheck``)

All in one run (hold the bench lock around it), so machine drift hits every part:

1. measures the engine profile at ``--engine-url`` (``hybrid-llm profile``:
   idle prefill by prompt length, mixed steps with 1 to slots - 1 decoders
   riding along on the bench's prompt, and the dispersion of prefill and
   decode step times), each request after an idle pause drawn like the
   bench's arrival gaps (mean ``1 / --rate``): on a shared machine an engine
   idle for a second or two prefills up to twice as slowly as one measured
   back to back, and the bench's requests find it idle;
2. measures what the path adds (``--calibrate-path``, on by default): the same
   requests alternately straight to the engine and through ``--bench-url``
   (same-city routes only), with the same pauses; the median difference minus
   the same-city RTT becomes the simulator's router overhead (measured, never
   a tuning knob; clamped at 0);
3. reads each ``--edge-load`` instance's ``/load`` right before the bench: the
   simulated instance starts from the TTFT P50/P95 and rates its real engine
   reported (the router's busy penalty is computed from them, and the profile's
   long prompts are in that TTFT window);
4. drives Poisson load at ``--bench-url`` (``hybrid-llm bench --rate``; its
   schedule is seeded, the same arrival times every run), then profiles again;
   the simulation uses the mean of both profiles;
5. simulates the same fleet, profile (prefill and decode step times drawn
   from its measured dispersion), measured prompt/output lengths, shared
   prompt prefix (the least any request found cached) and the router's own
   token estimate of the bench's text, twice: on the bench's own arrival times
   (replayed with different seeds to 400 requests) and as a long Poisson run;
   prints P50/P95/P99 of TTFT, TPOT and E2E from the bench and both
   simulations with the differences, and the share of requests per route.

``--save`` writes the measurement (profile, path, edge state, every bench
record) as JSON; ``--replay`` simulates a saved one again without measuring,
so a change to the simulator is compared on the same bench data.

Modules: :mod:`~hybrid_llm.fleet.simcheck.measure` (steps 1-4, real servers),
:mod:`~hybrid_llm.fleet.simcheck.replay` (step 5's simulations) and
:mod:`~hybrid_llm.fleet.simcheck.report` (the table).
"""

from hybrid_llm.fleet.simcheck.measure import load_average, mean_profile, measure
from hybrid_llm.fleet.simcheck.replay import edge_only, sim_config, simulate
from hybrid_llm.fleet.simcheck.report import compare, route

__all__ = [
    "compare",
    "edge_only",
    "load_average",
    "mean_profile",
    "measure",
    "route",
    "sim_config",
    "simulate",
]

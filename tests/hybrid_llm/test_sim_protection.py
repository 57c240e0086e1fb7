"""Edge-side TTFT protections of the simulator (``EdgeProtection``): a cap on the
sequences an edge runs, chunked shortest-first prefill, and a TTFT budget.
Each test also runs the same case unprotected, to show what it guards against."""

from __future__ import annotations

import pytest

from hybrid_llm.fleet.sim import (
    CenterSpec,
    EdgeProtection,
    EngineProfile,
    Instance,
    RegionSpec,
    SimConfig,
    Simulation,
    WorkloadSpec,
    summarize_result,
)
from hybrid_llm.fleet.sim.config import LengthDist
from hybrid_llm.fleet.sim.events import EventLoop
from hybrid_llm.fleet.sim.protection import predicted_wait_ms
from tests.support.sim import Recorder, sim_job

PROFILE = EngineProfile(
    prefill_tokens_per_s=1000, decode_base_ms=10, decode_per_seq_ms=0, slots=4, queue_limit=8
)


def _instance(guard: EdgeProtection) -> tuple[EventLoop, Instance, Recorder]:
    loop, rec = EventLoop(), Recorder()
    return loop, Instance("i", "edge", "a", PROFILE, loop, rec, protection=guard), rec


def test_capped_edge_refuses_beyond_the_cap_instead_of_queueing() -> None:
    _, plain, _ = _instance(EdgeProtection())
    assert all(plain.submit(sim_job(i)) for i in range(6))  # four run, two queue
    _, capped, _ = _instance(EdgeProtection(max_decoders=2))
    assert [capped.submit(sim_job(i)) for i in range(3)] == [True, True, False]
    report = capped.report()  # the router sees the cap as the edge's capacity, no queue
    assert (report.running, report.waiting, report.capacity, report.queue_limit) == (2, 0, 2, 0)


def _fleet(guard: EdgeProtection, **kw: object) -> SimConfig:
    """One region of two busy edges (long answers fill their four slots) and a center
    far enough (400 ms) that the router rather queues a request on a full edge."""
    base: dict[str, object] = {
        "rtt": {"rtt_ms": {"a": {"c": 400}}, "same_region_ms": 2},
        "regions": [RegionSpec(name="a", edges=2, rate=3)],
        "edge_profile": EngineProfile(
            prefill_tokens_per_s=4000, decode_base_ms=20, decode_per_seq_ms=0.5, slots=4
        ),
        "edge_protection": guard,
        "center": CenterSpec(region="c", replicas=1, profile="h100x4-llama70b-fp8"),
        "workload": WorkloadSpec(
            prompt_tokens=LengthDist(kind="uniform", low=20, high=200),
            output_tokens=LengthDist(kind="uniform", low=50, high=300),
            hard_fraction=0.0,
        ),
        "duration_s": 20,
        "warmup_s": 2,
        "seed": 3,
    }
    base.update(kw)
    return SimConfig.model_validate(base)


def _peak_sequences(config: SimConfig) -> tuple[int, dict[str, object]]:
    """The most sequences any edge held at once (sampled every ms), and the summary."""
    sim = Simulation(config)
    edges = [i for i in sim.instances if i.tier == "edge"]
    peak = [0]

    def probe() -> None:
        peak[0] = max([peak[0], *(e.used for e in edges)])
        if sim.loop.now < config.duration_s:
            sim.loop.after(0.001, probe)

    sim.loop.at(0.0, probe)
    summary = summarize_result(sim.run())
    return peak[0], summary


def _on_center(summary: dict[str, object]) -> int:
    return int(summary["by_tier"]["center"]["requests"])  # type: ignore[index]


def test_no_capped_edge_ever_runs_more_than_the_cap_and_the_rest_spill() -> None:
    peak, plain = _peak_sequences(_fleet(EdgeProtection()))
    assert peak == 4  # unprotected, the edges fill their slots
    peak, capped = _peak_sequences(_fleet(EdgeProtection(max_decoders=2)))
    assert peak == 2
    assert _on_center(capped) > _on_center(plain)  # what the edges did not take
    assert capped["failed"] == 0


def test_chunked_prefill_lets_a_short_prompt_pass_a_long_one() -> None:
    # A 4000-token document (4 s of prefill) admitted first, a 50-token question
    # 0.25 s later: first come first served, the question waits for the document.
    loop, inst, rec = _instance(EdgeProtection())
    inst.submit(sim_job(0, prompt=4000))
    loop.at(0.25, inst.submit, sim_job(1, prompt=50))
    loop.run()
    assert rec.first[1] == pytest.approx(4.05)
    # In 100-token chunks, shortest first: the question waits for the chunk in
    # flight at most (0.1 s), then prefills; the document finishes 50 ms later.
    loop, inst, rec = _instance(EdgeProtection(prefill_chunk_tokens=100))
    inst.submit(sim_job(0, prompt=4000))
    loop.at(0.25, inst.submit, sim_job(1, prompt=50))
    loop.run()
    assert rec.first[1] == pytest.approx(0.3 + 0.05)
    assert rec.first[1] - 0.25 <= 0.1 + 0.05 + 1e-9
    assert rec.first[0] == pytest.approx(4.05)


@pytest.mark.parametrize(("chunk", "finished"), [(None, 1.02), (100, 0.215)])
def test_chunked_prefill_lets_decoders_advance_a_token_per_chunk(
    chunk: int | None, finished: float
) -> None:
    loop, inst, rec = _instance(EdgeProtection(prefill_chunk_tokens=chunk))
    inst.submit(sim_job(0, prompt=10, output=3))  # first token at 10 ms, two more to decode
    loop.at(0.015, inst.submit, sim_job(1, prompt=1000))  # 1 s of prefill (ten chunks)
    loop.run()
    # Half a step decoded before the long prompt arrives. In one step it carries
    # one token of the decoder and the decoder's last half step waits for its end;
    # in chunks, each chunk's step carries one token, so the decoder ends with the
    # second chunk.
    assert rec.finished[0] == pytest.approx(finished)


def test_budget_refuses_a_request_that_would_wait_for_a_slot() -> None:
    long = 10_000  # answers far longer than the budget
    _, plain, _ = _instance(EdgeProtection())
    assert all(plain.submit(sim_job(i, prompt=10, output=long)) for i in range(5))  # one queues
    loop, inst, _ = _instance(EdgeProtection(ttft_budget_ms=200))
    for i in range(4):
        assert inst.submit(sim_job(i, prompt=10, output=long))
    loop.run(until=1.0)  # all four decoding
    assert not inst.submit(sim_job(4, prompt=10))  # every slot held for seconds more
    assert inst.shed == 1
    report = inst.report()
    assert report.ttft_budget_ms == 200
    # a typical answer's steps (no max_tokens: 256 tokens) before a slot frees
    assert report.predicted_wait_ms is not None
    assert report.predicted_wait_ms > 2000


def test_budget_refuses_a_prompt_behind_a_long_prefill_backlog() -> None:
    loop, inst, _ = _instance(EdgeProtection(ttft_budget_ms=200))
    assert inst.submit(sim_job(0, prompt=3000))  # its own 3 s prefill: taken (see admission)
    assert not inst.submit(sim_job(1, prompt=20))  # behind it: 3 s of backlog
    loop.run()
    assert inst.submit(sim_job(2, prompt=20))  # idle again


def test_budgeted_edges_spill_instead_of_queueing_for_a_slot() -> None:
    def slot_waits(guard: EdgeProtection) -> tuple[int, dict[str, object]]:
        config = _fleet(guard)
        sim = Simulation(config)
        result = sim.run()
        waited = sum(
            1
            for r in result.requests
            if r.winner is not None
            and r.winner.instance is not None
            and r.winner.instance.tier == "edge"
            and r.winner.admitted > r.winner.sent + r.winner.rtt / 2 + 1e-9
        )
        return waited, summarize_result(result)

    waited, _ = slot_waits(EdgeProtection())
    assert waited > 0  # unprotected, some requests queue behind full slots
    # With a budget the edges report it, so the router ranks a full edge last (and
    # the edge would refuse what still came): nothing waits for a slot.
    waited, summary = slot_waits(EdgeProtection(ttft_budget_ms=150))
    assert waited == 0
    assert summary["failed"] == 0


def test_the_simulated_edge_prices_a_queued_newcomer_by_the_admission_queues_rule() -> None:
    """Every slot held: a newcomer waits for the later of its slot and the prompts
    ahead of its own, not their sum (servekit.slot_wait, as the real queue prices it)."""
    wait = predicted_wait_ms(
        slots=2,
        running=2,
        waiting=0,
        prefill_left=[1000],  # 1 s to read at 1000 tokens/s, then a typical answer
        decoding=1,  # read whole, the prompt stalls it 1 s; then 10 steps of 10 ms
        prefill_tokens_per_s=1000.0,
        decode_step_s=0.01,
        typical_tokens=10,
        chunk_tokens=None,
        busy_ms_per_seq=5.0,
    )
    # Its slot frees at 1.1 s, by when the 1 s of prompt ahead is read: the sum of
    # the two (what the simulator priced before) would be 2.1 s.
    assert wait == pytest.approx(max(1100.0, 1000.0) + 5.0)
    free = predicted_wait_ms(
        slots=2,
        running=1,
        waiting=0,
        prefill_left=[1000],
        decoding=0,
        prefill_tokens_per_s=1000.0,
        decode_step_s=0.01,
        typical_tokens=10,
        chunk_tokens=None,
        busy_ms_per_seq=5.0,
    )
    assert free == pytest.approx(1000.0 + 5.0)  # a slot free: the backlog, one beside it

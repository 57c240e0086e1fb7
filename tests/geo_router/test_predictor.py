"""The online TTFT predictor, and the hedge delay and deadline taken from it."""

from __future__ import annotations

import random
import time

import pytest

from geo_router.attempt import first_token_deadline_s
from geo_router.dispatch import hedge_delay_s
from geo_router.predictor import Features, TtftModel
from geo_router.region_settings import RegionSettings
from geo_router.routing_settings import BreakerSettings, PredictionSettings, RoutingSettings
from geo_router.scoring import Scored, Scorer
from geo_router.tracker import Tracker
from servekit.engine.protocol import LoadReport
from servekit.registry.protocol import InstanceInfo, InstanceState

REGIONS = RegionSettings(default="east", rtt_ms={"east": {"center": 20.0}})


def features(
    tokens: int, wait_ms: float = 0.0, ms_per_token: float = 2.5, busy: int = 0
) -> Features:
    rtt = 20.0
    return Features(
        rtt_ms=rtt,
        uncached_tokens=tokens,
        wait_ms=wait_ms,
        reported_wait_ms=0.0,
        busy_seqs=busy,
        prior_ms=rtt + wait_ms + tokens * ms_per_token,
        ms_per_token=ms_per_token,
    )


def repeat_at(rtt_ms: float) -> Features:
    """A whole-prompt repeat: one token left to prefill, the rest cached there."""
    return Features(rtt_ms, 1, 0.0, 0.0, 0, rtt_ms + 2.5, 2.5, cached_tokens=900)


def engine_ttft(f: Features, rng: random.Random) -> float:
    """An engine unlike the prior: 150 ms overhead, 1.6 ms a token, wait as told, noisy."""
    return (f.rtt_ms + 150.0 + 1.6 * f.uncached_tokens + f.wait_ms) * rng.lognormvariate(0, 0.1)


def test_the_formula_first_then_its_corrections_and_no_quantile_until_enough_were_seen() -> None:
    model = TtftModel(PredictionSettings(min_samples=5))
    rng = random.Random(1)
    first = model.predict(features(500), 0.0)
    assert (first.median_ms, first.p90_ms) == (features(500).prior_ms, None)
    for i in range(4):
        f = features(500 + 100 * i)
        p = model.predict(f, 0.0)
        assert (p.p90_ms, p.learned) == (None, False)
        actual = engine_ttft(f, rng)
        if i:  # the median follows the engine before the quantile drives any decision
            assert abs(p.median_ms - actual) < abs(f.prior_ms - actual)
        model.observe(p, actual, 0.0)
    p = model.predict(features(500), 0.0)
    model.observe(p, engine_ttft(features(500), rng), 0.0)
    assert model.predict(features(500), 0.0).learned


def test_it_learns_an_engine_the_formula_misprices_and_its_p90_is_calibrated() -> None:
    model = TtftModel(PredictionSettings())
    rng = random.Random(2)

    def request() -> Features:
        return features(rng.randrange(20, 4000), wait_ms=rng.choice([0.0, 0.0, 300.0, 900.0]))

    for _ in range(150):
        f = request()
        model.observe(model.predict(f, 0.0), engine_ttft(f, rng), 0.0)
    errors, under_p90, formula_errors = [], 0, []
    for _ in range(400):
        f = request()
        p = model.predict(f, 0.0)
        actual = engine_ttft(f, rng)
        model.observe(p, actual, 0.0)
        errors.append(abs(p.median_ms - actual) / actual)
        formula_errors.append(abs(f.prior_ms - actual) / actual)
        assert p.p90_ms is not None
        assert p.p90_ms >= p.median_ms
        under_p90 += actual <= p.p90_ms
    mape = sum(errors) / len(errors)
    assert mape < 0.12, mape
    assert sum(formula_errors) / len(formula_errors) > 2 * mape  # it learned something
    assert 0.8 <= under_p90 / 400 <= 0.97


def test_forgetting_follows_an_engine_that_slows_down() -> None:
    model = TtftModel(PredictionSettings(forgetting=0.95))
    rng = random.Random(3)
    for slow in (1.0, 3.0):
        for _ in range(120):
            f = features(rng.randrange(100, 3000))
            model.observe(model.predict(f, 0.0), engine_ttft(f, rng) * slow, 0.0)
    f = features(2000)
    expected = (f.rtt_ms + 150.0 + 1.6 * 2000) * 3.0
    assert model.predict(f, 0.0).median_ms == pytest.approx(expected, rel=0.15)


def test_one_request_slowed_by_the_machine_does_not_reprice_the_prompts_after_it() -> None:
    """A few first tokens seen, then one prompt three times as slow as its like (the
    machine busy elsewhere): the fit moves as for an error of a couple of its spreads,
    not the whole of it."""
    model = TtftModel(PredictionSettings())
    rng = random.Random(3)
    for _ in range(3):
        f = features(rng.randint(50, 1500))
        model.observe(model.predict(f, 0.0), engine_ttft(f, rng), 0.0)
    before = model.predict(features(300), 0.0).fitted_ms
    spike = features(800)
    model.observe(model.predict(spike, 0.0), 3.0 * engine_ttft(spike, rng), 0.0)
    after = model.predict(features(300), 0.0).fitted_ms
    assert after == pytest.approx(before, rel=0.05)  # a plain least-squares step: +12%


def test_an_instance_that_slowed_for_good_is_not_cut_forever() -> None:
    """Cut at every deadline, it would never teach the model it slowed down: the
    misses themselves (lower bounds) raise the P90 until answers arrive in time."""
    model = TtftModel(PredictionSettings())
    rng = random.Random(5)
    for _ in range(60):
        f = features(rng.randrange(100, 1000))
        model.observe(model.predict(f, 0.0), engine_ttft(f, rng), 0.0)
    misses = 0
    for _ in range(40):
        f = features(rng.randrange(100, 1000))
        p = model.predict(f, 0.0)
        assert p.p90_ms is not None
        deadline = 2 * p.p90_ms
        actual = engine_ttft(f, rng) * 4  # four times slower from now on
        if actual > deadline:
            model.censored(p, deadline)
            misses += 1
        else:
            model.observe(p, actual, 0.0)
    assert 0 < misses < 15
    f = features(500)
    p90 = model.predict(f, 0.0).p90_ms
    assert p90 is not None
    assert 2 * p90 > (f.rtt_ms + 150.0 + 1.6 * 500) * 4 * 1.1


def test_it_learns_what_each_running_sequence_costs_beyond_the_formula() -> None:
    model = TtftModel(PredictionSettings())
    rng = random.Random(7)
    for _ in range(200):
        f = features(rng.randrange(100, 1000), busy=rng.randrange(0, 4))
        model.observe(model.predict(f, 0.0), engine_ttft(f, rng) + 80.0 * f.busy_seqs, 0.0)
    idle, busy = model.predict(features(500), 0.0), model.predict(features(500, busy=3), 0.0)
    assert busy.median_ms - idle.median_ms == pytest.approx(240.0, rel=0.25)


def test_an_instance_left_alone_fades_back_to_the_formula() -> None:
    """Avoided after a slow spell, it would teach nothing more and stay avoided."""
    model = TtftModel(PredictionSettings(stale_half_life_s=60.0))
    rng = random.Random(8)
    for _ in range(30):
        f = features(rng.randrange(100, 1000))
        model.observe(model.predict(f, 0.0), engine_ttft(f, rng) * 4, 0.0)
    f = features(500)
    now = model.predict(f, 0.0)
    later = model.predict(f, 60.0)
    much_later = model.predict(f, 600.0)
    assert now.median_ms > 2.5 * f.prior_ms  # learned: the engine is 4x slower
    assert later.median_ms == pytest.approx((now.median_ms + f.prior_ms) / 2)
    assert much_later.median_ms == pytest.approx(f.prior_ms, rel=0.01)
    assert now.p90_ms is not None
    assert much_later.p90_ms == pytest.approx(f.prior_ms + now.p90_ms - now.median_ms, rel=0.01)


def test_it_learns_an_instance_nearer_than_the_rtt_table_says() -> None:
    """The table says 150 ms; short prompts' first tokens come after 30 ms, long
    prompts' after their prefill: a short one is predicted near 30 ms."""
    model = TtftModel(PredictionSettings())
    rng = random.Random(9)

    def at(tokens: int) -> Features:
        return Features(150.0, tokens, 0.0, 0.0, 0, 150.0 + tokens * 2.5, 2.5)

    for _ in range(60):
        f = at(rng.choice([20, 20, rng.randrange(500, 4000)]))
        model.observe(model.predict(f, 0.0), 25.0 + 2.5 * f.uncached_tokens, 0.0)
    short, long = model.predict(at(20), 0.0), model.predict(at(3000), 0.0)
    assert short.median_ms == pytest.approx(75.0, abs=20.0)
    assert short.p90_ms is not None
    assert short.p90_ms < 100.0
    assert long.median_ms == pytest.approx(25.0 + 2.5 * 3000, rel=0.05)


def center(iid: str = "c") -> InstanceState:
    info = InstanceInfo(iid, "center", "center", "127.0.0.1", 1, "m")
    load = LoadReport(ready=True, capacity=8, prefill_tokens_per_s=400.0)
    return InstanceState(info, load, True, time.time())


def scored_after_long_prompts(
    routing: RoutingSettings, short_tokens: int
) -> tuple[Scored, Tracker]:
    """A center whose history is long, slow prompts, then a short request scored there."""
    tracker = Tracker(routing.breaker, routing.prediction)
    scorer = Scorer(routing, REGIONS.rtt_table(), tracker, random.Random(0))
    rng = random.Random(4)
    for _ in range(30):
        tokens = rng.randrange(3000, 8000)
        cand = scorer.score(center(), "east", tokens)
        assert cand.prediction is not None
        actual = 20.0 + 100.0 + 2.4 * tokens * rng.lognormvariate(0, 0.1)
        tracker.success("c", actual, cand.prediction)
    return scorer.score(center(), "east", short_tokens), tracker


def test_a_short_request_after_long_slow_prompts_is_hedged_and_cut_on_its_own_time() -> None:
    routing = RoutingSettings.model_validate(
        {"slow_start_s": 0, "hedge": {"enabled": True, "min_delay_ms": 50}}
    )
    short, tracker = scored_after_long_prompts(routing, short_tokens=40)
    p95 = tracker.stats("c").ttft_p95_ms()
    assert p95 is not None
    assert p95 > 15_000
    assert short.ttft_p90_ms is not None
    assert short.ttft_p90_ms < 600
    assert hedge_delay_s(routing.hedge, tracker, short) < 0.6
    assert first_token_deadline_s(routing, short) < 1.5  # 2 x its P90, not 10 s or the P95
    # A long one there keeps a long deadline: it is cut on its own predicted time too.
    long = scored_after_long_prompts(routing, short_tokens=6000)[0]
    assert first_token_deadline_s(routing, long) > 2 * 6000 * 2.4 / 1000


def test_without_a_learned_model_the_fixed_rules_stay() -> None:
    routing = RoutingSettings.model_validate({"prediction": {"min_samples": 1000}})
    short, tracker = scored_after_long_prompts(routing, short_tokens=40)
    assert short.ttft_p90_ms is None
    assert hedge_delay_s(routing.hedge, tracker, short) > 15.0  # the instance's P95
    assert first_token_deadline_s(routing, short) == routing.ttft_deadline_s


def test_an_unlearned_instance_is_not_hedged_before_the_requests_own_prediction() -> None:
    """``up --netem``: a same-city edge chosen for a cold customer-service prompt
    (3.5 s predicted) was raced at the default 0.5 s, twelve times in a row, each
    hedge cancelling the prefill that would have made the next one quick."""
    routing = RoutingSettings.model_validate({"slow_start_s": 0, "hedge": {"enabled": True}})
    tracker = Tracker(routing.breaker, routing.prediction)
    scorer = Scorer(routing, REGIONS.rtt_table(), tracker, random.Random(0))
    cold = scorer.score(center(), "east", 1400)  # 400 tokens/s: ~3.5 s
    assert cold.ttft_p90_ms is None
    assert hedge_delay_s(routing.hedge, tracker, cold) == pytest.approx(cold.ttft_ms / 1000.0)
    short = scorer.score(center(), "east", 40)  # its own prediction is under the default
    assert hedge_delay_s(routing.hedge, tracker, short) == routing.hedge.default_delay_ms / 1000


def test_explain_shows_the_median_and_the_p90() -> None:
    routing = RoutingSettings.model_validate({"slow_start_s": 0})
    short = scored_after_long_prompts(routing, short_tokens=40)[0]
    shown = short.to_dict()
    assert shown["prediction"] == "learned"
    assert shown["predicted_ttft_p90_ms"] >= shown["predicted_ttft_ms"] > 0
    fresh = Scorer(routing, REGIONS.rtt_table(), Tracker(routing.breaker)).score(
        center(), "east", 40, bias_ms=30.0
    )
    shown = fresh.to_dict()
    assert (shown["prediction"], shown["predicted_ttft_p90_ms"]) == ("formula", None)
    assert shown["rank_ms"] == pytest.approx(shown["predicted_ttft_ms"] + 30.0)


def test_ranking_follows_what_each_instance_was_learned_to_take() -> None:
    """Two centers the formula cannot tell apart: the one seen to be three times
    slower than its report says ranks second."""
    routing = RoutingSettings.model_validate({"slow_start_s": 0, "p2c_window_ms": 0})
    tracker = Tracker(routing.breaker, routing.prediction)
    scorer = Scorer(routing, REGIONS.rtt_table(), tracker, random.Random(0))
    rng = random.Random(6)
    for _ in range(20):
        for iid, slow in (("fast", 1.0), ("slow", 3.0)):
            tokens = rng.randrange(200, 2000)
            cand = scorer.score(center(iid), "east", tokens)
            assert cand.prediction is not None
            tracker.success(iid, cand.prediction.features.prior_ms * slow, cand.prediction)
    ranked = scorer.order([scorer.score(center(i), "east", 800) for i in ("slow", "fast")])
    assert [c.id for c in ranked] == ["fast", "slow"]
    assert ranked[1].ttft_ms == pytest.approx(3 * ranked[0].ttft_ms, rel=0.1)


def test_a_request_with_nothing_to_prefill_is_predicted_from_such_requests_there() -> None:
    """Long prompts teach an overhead that a conversation found whole in the cache
    never pays: its next turn is a decode step away (ShareGPT through `up`: 32-49 ms
    seen, 163-395 ms predicted by the regression scaled to the long prompts)."""
    model = TtftModel(PredictionSettings())
    rng = random.Random(5)
    for i in range(40):
        f = features(rng.randrange(300, 3000))
        model.observe(model.predict(f, 0.0), engine_ttft(f, rng), 0.0)
        if i % 8 == 0:
            cached = features(1)
            model.observe(model.predict(cached, 0.0), 35.0 * rng.lognormvariate(0, 0.1), 0.0)
    p = model.predict(features(1), 0.0)
    assert p.learned
    assert 25.0 <= p.median_ms <= 50.0
    assert p.p90_ms is not None
    assert p.median_ms <= p.p90_ms <= 80.0
    # A prompt with something to prefill is still priced by the regression.
    assert model.predict(features(2000), 0.0).median_ms > 2000.0
    # Behind a queue it is not a decode step away either.
    assert model.predict(features(1, wait_ms=900.0), 0.0).median_ms > 500.0


def test_a_prefill_slower_per_token_as_the_context_grows_is_learned() -> None:
    """Each new token attends to the context before it: on this machine's CPU edges
    a token costs ~5 ms at the start of a prompt and ~10 ms 2,500 tokens in."""
    model = TtftModel(PredictionSettings())
    rng = random.Random(11)

    def engine(f: Features) -> float:
        new, held = f.uncached_tokens, f.cached_tokens
        cost = 30.0 + new * (5.0 + 0.002 * (held + new / 2.0))
        return (f.rtt_ms + cost) * rng.lognormvariate(0, 0.05)

    def at(new: int, held: int = 0) -> Features:
        return Features(20.0, new, 0.0, 0.0, 0, 20.0 + new * 6.0, 6.0, cached_tokens=held)

    for _ in range(60):
        f = at(rng.randrange(40, 2500), rng.choice([0, 0, rng.randrange(0, 2000)]))
        model.observe(model.predict(f, 0.0), engine(f), 0.0)
    for new, held in ((60, 0), (300, 0), (2500, 0), (200, 2000)):
        f = at(new, held)
        truth = f.rtt_ms + 30.0 + new * (5.0 + 0.002 * (held + new / 2.0))
        assert model.predict(f, 0.0).median_ms == pytest.approx(truth, rel=0.12), (new, held)


def test_a_request_with_a_few_new_tokens_pays_them_on_top_of_a_quick_one() -> None:
    model = TtftModel(PredictionSettings(min_samples=3))
    rng = random.Random(12)
    for _ in range(10):  # whole conversations found cached: one decode step, 30 ms
        f = features(1)
        model.observe(model.predict(f, 0.0), f.rtt_ms + 30.0 + 2.5 * rng.random(), 0.0)
    f = features(30)  # still quick, but 30 new tokens at 2.5 ms each
    assert model.predict(f, 0.0).median_ms == pytest.approx(20.0 + 31.0 + 75.0, abs=5.0)


def test_an_instance_that_saw_no_quick_request_starts_from_the_others() -> None:
    """Its first whole-conversation hit is priced as one elsewhere was, plus its own RTT,
    not by a regression fitted to long prompts (or the formula's prefill alone)."""
    tracker = Tracker(BreakerSettings(), PredictionSettings())
    near, far = tracker.stats("near", "edge").model, tracker.stats("far", "edge").model

    def at(rtt: float, tokens: int) -> Features:
        return Features(rtt, tokens, 0.0, 0.0, 0, rtt + tokens * 2.5, 2.5, cached_tokens=900)

    for _ in range(5):
        f = at(2.0, 1)
        near.observe(near.predict(f, 0.0), 2.0 + 40.0, 0.0)
    for tokens in (400, 900, 1500):  # far has learned only long prompts
        f = at(60.0, tokens)
        far.observe(far.predict(f, 0.0), 60.0 + 3.0 * tokens, 0.0)
    first = far.predict(at(60.0, 1), 0.0)
    assert first.median_ms == pytest.approx(60.0 + 40.0 + 2.5, abs=3.0)
    assert first.p90_ms is None  # decisions wait for its own


def test_a_repeat_found_mostly_cached_pays_no_prefill_for_the_tail_the_blocks_miss() -> None:
    """The router names whole character blocks: an exact repeat's last partial block
    counts as uncached though the engine holds it all (through ``up``: ~200 ms at the
    center with 1 or 20 tokens counted uncached). A short new prompt still pays."""
    model = TtftModel(PredictionSettings(min_samples=3))

    def at(new: int, held: int) -> Features:
        return Features(150.0, new, 0.0, 0.0, 0, 150.0 + new * 7.0, 7.0, cached_tokens=held)

    for new in (1, 3, 20, 2, 18):
        f = at(new, 2000)
        model.observe(model.predict(f, 0.0), 200.0, 0.0)
    assert model.predict(at(20, 370), 0.0).median_ms == pytest.approx(200.0, abs=1.0)
    assert model.predict(at(20, 0), 0.0).median_ms == pytest.approx(200.0 + 20 * 7.0, abs=1.0)


def test_the_scorer_tells_the_predictor_what_is_cached_there() -> None:
    """Repeats of a long conversation, each a decode step away (45 ms), with a tail
    of 1-20 tokens the router's character blocks do not name. The predictor
    prices such a tail nothing only when it knows the rest is cached there: told
    nothing, it charged the tail at the prefill rate, learned negative bases from
    it, and predicted the next repeat at 1 ms (ShareGPT through ``up``: repeats
    at the center predicted at 1 ms took 43-68 ms)."""
    routing = RoutingSettings.model_validate({"slow_start_s": 0, "prediction": {"min_samples": 3}})
    tracker = Tracker(routing.breaker, routing.prediction)
    scorer = Scorer(routing, REGIONS.rtt_table(), tracker, random.Random(0))
    slow = InstanceState(
        InstanceInfo("c", "center", "center", "127.0.0.1", 1, "m"),
        LoadReport(ready=True, capacity=8, prefill_tokens_per_s=100.0),
        True,
        time.time(),
    )
    for tail in (1, 3, 20, 2, 18, 15, 12):
        cand = scorer.score(slow, "east", 2000, cached_tokens=2000 - tail)
        assert cand.prediction is not None
        assert cand.prediction.features.cached_tokens == 2000 - tail
        tracker.success("c", 45.0, cand.prediction)
    repeat = scorer.score(slow, "east", 2000, cached_tokens=1999)
    assert repeat.ttft_ms == pytest.approx(45.0, abs=1.0)


def test_a_repeat_sent_as_a_long_prompt_there_ended_is_not_priced_behind_it() -> None:
    """The last load report was taken while a long prompt prefilled there, the edge
    predicting a newcomer 800 ms of wait behind it; that prompt has since ended. The
    repeat sent next is one decode step away, as the repeats before it were: its
    wait goes with the sequence it was behind (ShareGPT one at a time: repeats sent
    right after a long prompt at the same edge were predicted at 201 and 817 ms and
    took 29-39 ms, the suspected cause)."""
    routing = RoutingSettings.model_validate({"slow_start_s": 0})
    wall = [time.time()]
    tracker = Tracker(routing.breaker, routing.prediction, wall=lambda: wall[0])
    scorer = Scorer(routing, REGIONS.rtt_table(), tracker, random.Random(0))
    info = InstanceInfo("e", "edge", "center", "127.0.0.1", 1, "m")
    idle = InstanceState(
        info, LoadReport(ready=True, capacity=4, prefill_tokens_per_s=100.0), True, 0.0
    )
    for _ in range(3):
        cand = scorer.score(idle, "east", 821, cached_tokens=820)
        assert cand.prediction is not None
        tracker.success("e", 45.0, cand.prediction)
    asked = wall[0]
    prefilling = LoadReport(
        ready=True, capacity=4, prefill_tokens_per_s=100.0, running=1, predicted_wait_ms=800.0
    )
    stale = InstanceState(info, prefilling, True, asked)
    tracker.acquire("e")
    wall[0] = asked + 1.0
    tracker.release("e")  # the long prompt's answer ended after the report
    repeat = scorer.score(stale, "east", 821, cached_tokens=820)
    assert repeat.prediction is not None
    assert repeat.prediction.basis == "quick"
    assert repeat.ttft_ms == pytest.approx(45.0, abs=1.0)
    # A report taken after that answer ended still counts one: another's, ahead of it.
    later = InstanceState(info, prefilling, True, asked + 2.0)
    behind = scorer.score(later, "east", 821, cached_tokens=820)
    assert behind.prediction is not None
    assert behind.prediction.basis != "quick"
    assert behind.prediction.features.reported_wait_ms == 800.0


def test_an_edge_with_no_quick_request_of_its_own_is_priced_from_the_edges_not_the_center() -> None:
    """A center's repeats pass one more hop (the gateway to a replica): one pool for the
    fleet priced an edge's first repeat at 70-77 ms that took 33-47 (ShareGPT, ``up``)."""
    tracker = Tracker(BreakerSettings(), PredictionSettings())
    center, edge_a = tracker.stats("center", "center").model, tracker.stats("a", "edge").model
    edge_b = tracker.stats("b", "edge").model

    for _ in range(5):
        center.observe(center.predict(repeat_at(2.0), 0.0), 2.0 + 70.0, 0.0)
        edge_a.observe(edge_a.predict(repeat_at(2.0), 0.0), 2.0 + 35.0, 0.0)
    assert edge_b.predict(repeat_at(40.0), 0.0).median_ms == pytest.approx(40.0 + 35.0)


def test_one_slow_repeat_of_its_own_does_not_price_the_next_its_tier_does() -> None:
    """ShareGPT through ``up``: an edge's first repeat took 559 ms (machine noise) and
    priced its next two at 550 ms as the median of its one-sample window; they took 60."""
    tracker = Tracker(BreakerSettings(), PredictionSettings())
    edge_a, edge_b = tracker.stats("a", "edge").model, tracker.stats("b", "edge").model

    for _ in range(5):
        edge_a.observe(edge_a.predict(repeat_at(2.0), 0.0), 2.0 + 35.0, 0.0)
    edge_b.observe(edge_b.predict(repeat_at(40.0), 0.0), 40.0 + 520.0, 0.0)
    assert edge_b.predict(repeat_at(40.0), 0.0).median_ms == pytest.approx(40.0 + 35.0)


def test_a_tiers_one_slow_first_repeat_does_not_outvote_the_formula() -> None:
    """Replaying five ShareGPT runs (``studies/predictor_replay.py``): the edges' first
    repeat of a run took 559 ms, the pool's only sample, and priced the next two at
    552 ms; they took 60. Until a few were seen the formula's base votes too."""
    tracker = Tracker(BreakerSettings(), PredictionSettings())
    edge_a, edge_b = tracker.stats("a", "edge").model, tracker.stats("b", "edge").model
    formula = repeat_at(40.0).prior_ms

    edge_a.observe(edge_a.predict(repeat_at(2.0), 0.0), 2.0 + 520.0, 0.0)
    assert edge_b.predict(repeat_at(40.0), 0.0).median_ms == pytest.approx(formula)
    edge_a.observe(edge_a.predict(repeat_at(2.0), 0.0), 2.0 + 35.0, 0.0)
    assert edge_b.predict(repeat_at(40.0), 0.0).median_ms == pytest.approx(40.0 + 35.0)


def test_a_censored_wait_does_not_price_the_other_instances_quick_requests() -> None:
    """An attempt cut at its deadline at a hung instance says nothing of the others:
    the fleet's pool of quick requests holds what first tokens took, not lower bounds."""
    tracker = Tracker(BreakerSettings(), PredictionSettings())
    hung, fresh = tracker.stats("hung", "edge").model, tracker.stats("fresh", "edge").model
    f = Features(2.0, 1, 0.0, 0.0, 0, 2.0 + 2.5, 2.5, cached_tokens=900)
    tracker.late("hung", 5000.0, hung.predict(f, 0.0))
    assert fresh.predict(f, 0.0).median_ms == pytest.approx(f.prior_ms)
    assert list(hung.late_quick) == [5000.0 - 2.0]  # its own window keeps the lower bound


def test_a_quick_request_cut_at_its_deadline_raises_the_p90_but_is_never_the_median() -> None:
    """One hang of the center (``up --netem``): its short question was cut at the
    deadline, and the next one was priced at that lower bound (the median of a
    one-sample window), so its hedge waited ~1 s instead of ~0.57 s."""
    tracker = Tracker(BreakerSettings(), PredictionSettings(min_samples=3))
    edge, center = tracker.stats("edge", "center").model, tracker.stats("center", "center").model

    for _ in range(5):  # the fleet has seen quick first tokens: 40 ms beyond the RTT
        edge.observe(edge.predict(repeat_at(2.0), 0.0), 2.0 + 40.0, 0.0)
    tracker.late("center", 1150.0, center.predict(repeat_at(150.0), 0.0))
    assert center.predict(repeat_at(150.0), 0.0).median_ms == pytest.approx(150.0 + 40.0)
    for _ in range(4):  # the center answers again, quickly; its P90 keeps the hang
        center.observe(center.predict(repeat_at(150.0), 0.0), 150.0 + 60.0, 0.0)
    recovered = center.predict(repeat_at(150.0), 0.0)
    assert recovered.median_ms == pytest.approx(150.0 + 60.0)
    assert recovered.p90_ms == pytest.approx(1150.0)


def east_edge(rtt_ms: float | None) -> InstanceState:
    info = InstanceInfo("e", "edge", "center", "127.0.0.1", 1, "m")
    load = LoadReport(ready=True, capacity=8, prefill_tokens_per_s=400.0)
    return InstanceState(info, load, True, time.time(), rtt_ms=rtt_ms)


def test_the_measured_rtt_prices_users_in_the_routers_region_once_measured() -> None:
    """The table says 20 ms to the center; the router timed 3 ms: a user in its own
    region (east) is priced with 3, before any timed poll and elsewhere with the table."""
    routing = RoutingSettings.model_validate({"slow_start_s": 0})
    table = RegionSettings(
        default="east", rtt_ms={"east": {"center": 20.0}, "west": {"center": 45.0}}
    ).rtt_table()
    scorer = Scorer(routing, table, Tracker(routing.breaker), measured_rtt_region="east")
    measured = scorer.score(east_edge(3.0), "east", 40)
    assert (measured.rtt_ms, measured.rtt_source) == (3.0, "measured")
    assert measured.prediction is not None
    assert measured.prediction.features.rtt_ms == 3.0  # what the predictor adds and learns on
    assert measured.to_dict()["measured_rtt_ms"] == 3.0
    before = scorer.score(east_edge(None), "east", 40)
    assert (before.rtt_ms, before.rtt_source) == (20.0, "table")
    assert before.to_dict()["measured_rtt_ms"] is None
    elsewhere = scorer.score(east_edge(3.0), "west", 40)
    assert (elsewhere.rtt_ms, elsewhere.rtt_source) == (45.0, "table")
    off = Scorer(routing, table, Tracker(routing.breaker)).score(east_edge(3.0), "east", 40)
    assert (off.rtt_ms, off.rtt_source) == (20.0, "table")

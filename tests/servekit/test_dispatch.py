"""The one dispatch loop over fake attempts: order, deadlines, hedges, verdicts, supplies.

An attempt's priming is held by a future the test settles (or never does), so
what is asserted is the order of things, not how long they took."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from servekit.dispatch import Hedge, first_primed
from servekit.errors import (
    ContextLengthExceeded,
    InvalidRequest,
    NotReady,
    ServeError,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
)


class Fake:
    """An attempt at ``name``: primes after ``then`` (an awaitable factory), or fails with
    ``error``; records its one verdict."""

    def __init__(
        self,
        name: str,
        made: list[str],
        *,
        error: ServeError | None = None,
        then: Callable[[], Coroutine[Any, Any, object]] | None = None,
        deadline_s: float = math.inf,
    ) -> None:
        self.name = name
        self.started = time.perf_counter()
        self.deadline = self.started + deadline_s
        self.error = error
        self.then = then
        self.verdict: str | None = None
        made.append(name)

    async def prime(self) -> None:
        if self.then is not None:
            await self.then()
        if self.error is not None:
            raise self.error

    def failed(self, exc: BaseException) -> ServeError:
        assert self.verdict is None
        self.verdict = "failed"
        assert isinstance(exc, ServeError)
        # As the router's: too long here is no reason to stop, a bad request is.
        if not exc.retryable and not isinstance(exc, ContextLengthExceeded):
            raise exc
        return exc

    def missed(self) -> ServeError:
        assert self.verdict is None
        self.verdict = "missed"
        return UpstreamTimeout(f"{self.name}: no first token")

    async def abandon(self) -> None:
        if self.verdict is None:
            self.verdict = "abandoned"


async def forever() -> None:
    await asyncio.get_running_loop().create_future()


class Plan:
    """A fixed try order of fakes; ``prune`` drops untried names after a failure."""

    def __init__(
        self,
        *specs: tuple[str, dict[str, Any]],
        prune: Callable[[str, ServeError], set[str]] = lambda _name, _err: set(),
    ) -> None:
        self.specs = list(specs)
        self.made: list[str] = []
        self.attempts: dict[str, Fake] = {}
        self.heard: list[tuple[str, str]] = []  # (attempt, error class) told to failed()
        self.hedge_flags: list[bool] = []
        self._prune = prune

    def more(self) -> bool:
        return bool(self.specs)

    async def next(self, *, hedge: bool) -> Fake | None:
        if not self.specs:
            return None
        name, kwargs = self.specs.pop(0)
        self.hedge_flags.append(hedge)
        attempt = self.attempts[name] = Fake(name, self.made, **kwargs)
        return attempt

    def failed(self, attempt: Fake, err: ServeError) -> None:
        self.heard.append((attempt.name, type(err).__name__))
        gone = self._prune(attempt.name, err)
        self.specs = [s for s in self.specs if s[0] not in gone]


def test_candidates_are_tried_in_order_until_one_primes() -> None:
    async def run() -> None:
        plan = Plan(
            ("a", {"error": UpstreamUnavailable("down")}),
            ("b", {"error": UpstreamError("500")}),
            ("c", {}),
            ("d", {}),
        )
        winner, hedged = await first_primed(plan)
        assert (winner.name, hedged) == ("c", False)
        assert plan.made == ["a", "b", "c"]
        assert plan.heard == [("a", "UpstreamUnavailable"), ("b", "UpstreamError")]
        assert [plan.attempts[n].verdict for n in "ab"] == ["failed", "failed"]
        assert winner.verdict is None  # the caller's to give

    asyncio.run(run())


def test_the_last_error_is_raised_when_nobody_primes() -> None:
    async def run() -> None:
        plan = Plan(
            ("a", {"error": UpstreamUnavailable("down")}), ("b", {"error": UpstreamError("b")})
        )
        with pytest.raises(UpstreamError) as caught:
            await first_primed(plan)
        assert caught.value.message == "b"
        assert plan.made == ["a", "b"]

    asyncio.run(run())


def test_a_non_retryable_error_stops_at_once() -> None:
    async def run() -> None:
        plan = Plan(("a", {"error": InvalidRequest("bad")}), ("b", {}))
        with pytest.raises(InvalidRequest):
            await first_primed(plan)
        assert plan.made == ["a"]

    asyncio.run(run())


def test_an_attempt_past_its_deadline_is_cut_while_somebody_is_left() -> None:
    async def run() -> None:
        plan = Plan(("a", {"then": forever, "deadline_s": 0.01}), ("b", {}))
        winner, _ = await first_primed(plan)
        assert winner.name == "b"
        assert plan.attempts["a"].verdict == "missed"
        assert plan.heard == [("a", "UpstreamTimeout")]

    asyncio.run(run())


def test_the_last_attempt_is_not_cut_at_its_deadline() -> None:
    async def run() -> None:
        async def slow() -> None:
            await asyncio.sleep(0.05)  # five times its deadline

        plan = Plan(
            ("a", {"error": UpstreamUnavailable("down")}), ("b", {"then": slow, "deadline_s": 0.01})
        )
        winner, _ = await first_primed(plan)
        assert (winner.name, winner.verdict) == ("b", None)

    asyncio.run(run())


def test_a_failure_reaches_the_supply_before_it_picks_the_next() -> None:
    """The router's pruning: a context-length refusal leaves only larger windows."""

    async def run() -> None:
        def prune(name: str, err: ServeError) -> set[str]:
            return {"b"} if isinstance(err, ContextLengthExceeded) else set()

        plan = Plan(
            ("a", {"error": ContextLengthExceeded("long")}), ("b", {}), ("c", {}), prune=prune
        )
        winner, _ = await first_primed(plan)
        assert winner.name == "c"
        assert plan.made == ["a", "c"]

    asyncio.run(run())


def test_a_supply_may_wait_for_a_candidate() -> None:
    async def run() -> None:
        back = asyncio.Event()
        made: list[str] = []

        class ComesBack:
            asked = 0

            def more(self) -> bool:
                return False

            async def next(self, *, hedge: bool) -> Fake | None:
                self.asked += 1
                await back.wait()
                return Fake("r0", made)

            def failed(self, attempt: Fake, err: ServeError) -> None:
                raise AssertionError("nothing failed")

        supply = ComesBack()
        asyncio.get_running_loop().call_later(0.01, back.set)
        winner, _ = await first_primed(supply)
        assert (winner.name, supply.asked, made) == ("r0", 1, ["r0"])

    asyncio.run(run())


def test_a_supply_raises_its_own_error_when_it_gives_up() -> None:
    async def run() -> None:
        class Empty:
            def more(self) -> bool:
                return False

            async def next(self, *, hedge: bool) -> Fake | None:
                raise NotReady("no healthy replica", retry_after=2)

            def failed(self, attempt: Fake, err: ServeError) -> None:
                raise AssertionError("nothing was tried")

        with pytest.raises(NotReady, match="no healthy replica"):
            await first_primed(Empty())

    asyncio.run(run())


def test_an_attempt_awaited_in_place_is_abandoned_when_the_client_leaves() -> None:
    async def run() -> None:
        began = asyncio.Event()

        async def hangs() -> None:
            began.set()
            await forever()

        plan = Plan(("a", {"then": hangs}), ("b", {}))
        task = asyncio.create_task(first_primed(plan))
        await began.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert plan.attempts["a"].verdict == "abandoned"
        assert plan.made == ["a"]

    asyncio.run(run())


def _hedge(started: list[int]) -> Hedge[Fake]:
    return Hedge(lambda _a: 0.01, lambda: started.append(1))


def test_a_hedge_that_primes_first_wins() -> None:
    async def run() -> None:
        started: list[int] = []
        plan = Plan(("a", {"then": forever}), ("b", {}), ("c", {}))
        winner, hedged = await first_primed(plan, hedge=_hedge(started))
        assert (winner.name, hedged, started) == ("b", True, [1])
        assert plan.attempts["a"].verdict == "abandoned"  # not a failure: it was not late
        assert plan.hedge_flags == [False, True]
        assert plan.made == ["a", "b"]

    asyncio.run(run())


def test_a_hedge_that_loses_is_abandoned() -> None:
    async def run() -> None:
        started: list[int] = []
        raced = asyncio.Event()

        async def after_the_hedge_began() -> None:
            await raced.wait()

        async def hedge_hangs() -> None:
            raced.set()
            await forever()

        plan = Plan(("a", {"then": after_the_hedge_began}), ("b", {"then": hedge_hangs}))
        winner, hedged = await first_primed(plan, hedge=_hedge(started))
        assert (winner.name, hedged, started) == ("a", True, [1])
        assert plan.attempts["b"].verdict == "abandoned"

    asyncio.run(run())


def test_a_loser_already_past_its_deadline_is_judged_late() -> None:
    async def run() -> None:
        raced = asyncio.Event()

        async def after_the_hedge_began() -> None:
            await raced.wait()
            await asyncio.sleep(0.01)  # so that the hedge is past its deadline of 0

        async def hedge_hangs() -> None:
            raced.set()
            await forever()

        plan = Plan(
            ("a", {"then": after_the_hedge_began}),
            ("b", {"then": hedge_hangs, "deadline_s": 0.0}),
        )
        winner, _ = await first_primed(plan, hedge=_hedge([]))
        assert winner.name == "a"
        assert plan.attempts["b"].verdict == "missed"

    asyncio.run(run())


def test_a_hedged_failure_moves_on_and_the_last_error_is_raised() -> None:
    async def run() -> None:
        plan = Plan(
            ("a", {"error": UpstreamError("500")}), ("b", {"error": UpstreamUnavailable("x")})
        )
        with pytest.raises(UpstreamUnavailable):
            await first_primed(plan, hedge=_hedge([]))
        assert plan.made == ["a", "b"]
        assert [plan.attempts[n].verdict for n in "ab"] == ["failed", "failed"]

    asyncio.run(run())


def test_a_hedged_race_cuts_a_late_attempt_while_somebody_is_left() -> None:
    async def run() -> None:
        started: list[int] = []
        plan = Plan(("a", {"then": forever, "deadline_s": 0.01}), ("b", {}))
        # The hedge would start far later than the deadline: the cut comes first.
        slow = Hedge[Fake](lambda _a: 60.0, lambda: started.append(1))
        winner, hedged = await first_primed(plan, hedge=slow)
        assert (winner.name, hedged, started) == ("b", False, [])
        assert plan.attempts["a"].verdict == "missed"

    asyncio.run(run())

"""Each request's TTFT on each instance, learned online from the first tokens seen there.

The scorer's formula (``geo_router.scoring``) is the prior: RTT + the
router's wait estimate (queue + busy) + the uncached prompt at the reported
prefill rate. Per instance, a :class:`TtftModel` corrects it from what the
router observes when an attempt primes:

* a linear regression, fitted by recursive least squares with exponential
  forgetting (``forgetting`` per observation), of the TTFT beyond the RTT on
  ``[1, uncached tokens / 1000, router wait / 1 s, reported wait / 1 s,
  sequences running there, attention]`` (the reported wait is the instance's own
  ``predicted_wait_ms``; the running sequences let it learn what each costs
  a new arrival beyond the formula's busy term; attention is uncached x
  (cached + uncached / 2) / 1e6, since each new token reads the context before
  it: on ShareGPT through ``hybrid-llm up`` a CPU edge's token cost ~5 ms at a
  prompt's start and ~10 ms 2,500 tokens in, which a line through long prompts
  turns into a negative overhead for short ones). Each observation is weighed
  by its size (its spread 10% of TTFT + 100 ms): a long prompt's seconds of
  noise must not outweigh a short one's milliseconds, and an error beyond two
  spreads of what the fit expected moves it as one of two would (a Huber step:
  one request the machine slowed threefold, three requests into a fit, moved
  the next prompts' estimate by 12%; now under 5%). It starts at the formula's
  coefficients (no intercept, the prior's ms per token, one ms per ms of
  wait, nothing per sequence or for attention), so its first corrections are
  small steps from today's estimate, and it follows an engine whose prefill
  rate or overhead drifts;
* the recent ratios (actual + 100 ms) / (fitted + 100 ms) (``window`` of
  them, each against the fit made *before* that request: an honest
  out-of-sample error). Their median and 90th percentile scale the fit into
  the prediction's median and its calibrated upper quantile. Mostly a ratio,
  not a difference: a slow long prompt's error is seconds, a short one's
  milliseconds, and a spread of differences would hand a short request the
  long ones' seconds; the 100 ms keep a few milliseconds of jitter on a
  near-instant answer from reading as a large ratio that would then stretch
  every long prompt's quantile.

The prior's uncertainty is the engine's: its fixed overhead is small (a
200 ms spread around none), its cost per token may be off by its own size (a
reported prefill rate can be stale or optimistic), so a long prompt slower
than the formula said corrects the cost per token, not the overhead a short
request would then inherit.

An instance the router stopped sending to teaches its model nothing more:
one that was slow for a while would be avoided on that memory for good. So
the learned median fades back toward the formula's with the time since the
model's last observation (half of the difference every ``stale_half_life_s``),
and the instance is tried again once the formula ranks it best; its P90
keeps the learned spread around that median.

Until ``min_samples`` first tokens were seen there, the median is the
regression's (the formula's until the first; not yet scaled by the ratios,
which a fit still moving would correct twice), with no upper quantile
(``p90_ms`` is ``None``): the dispatcher then keeps its fixed hedge delay and
a deadline from the formula's estimate. With ``enabled`` off it is the
formula's throughout. A learned prediction's P90
sets the request's own hedge delay and first-token deadline
(``geo_router.dispatch``, ``geo_router.attempt``), so a hung instance is
recognised within about the time *this* request should take there, not the
instance's P95 over everyone's prompts.

A request with nothing to prefill and nothing ahead of it (at most
``_QUICK_TOKENS`` uncached, no wait, nothing running: a conversation found
whole in the cache) is one decode step away, an overhead long prompts never
show the regression: fitted to them, its intercept and ratio priced such a
turn at 4-10 times what it took (ShareGPT through ``hybrid-llm up``: 32-49 ms
seen, 163-395 ms predicted). Such requests are predicted from the recent
ones like them: the RTT and their few new tokens at the formula's rate, plus
the lower median of what those took beyond theirs (the "base": what slows one,
the machine busy elsewhere, only adds); with none seen in its tier yet, the
formula's (never the regression's, fitted to prefills), and until a few were
seen the formula's base votes beside them (the edges' first repeat of one
ShareGPT run took 559 ms, the pool's only sample, and priced the next two at
552 ms that took 60). From the first
few (``_QUICK_MIN``) such requests seen at the instance; before, from the first tokens of its tier's
instances (a window the ``Tracker`` shares per tier: a center's pass one more hop
than an edge's; never an attempt cut at
its deadline: that lower bound stays with its own instance), never below no base, since a
negative one says the region table overstates *that* instance's RTT. An
instance's own negative base is believed once it has learned. Their P90
drives decisions once the instance has learned and ``_QUICK_MIN`` were seen
there. They still teach the regression. Such a request cut at its deadline
is a lower bound: it may raise that P90, never the median (one hang of the
center through ``up --netem`` made it the median of a one-sample window, so
the next short question waited ~1 s at the hung center before its hedge,
against ~0.57 s for the first, and the center's recovered answers of
0.4-0.8 s were predicted at 0.8-1.1 s).

Only primed attempts teach the regression. An attempt cut at its deadline is
censored (its TTFT is unknown, at least the deadline): that lower bound joins
the ratios alone (:meth:`TtftModel.censored`). Without it an instance that
slowed down for good would be cut at every deadline and never teach the model
that it did; with it, a few misses raise the P90, and with it the deadline,
until its answers arrive in time again. A one-off hang adds fewer misses than
the top tenth of the window holds (the breaker opens first), so it barely
moves the P90 of what follows. A lost hedge is left out.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from geo_router.routing_settings import PredictionSettings

__all__ = ["Features", "Prediction", "TtftModel"]

_DIMS = 6
_NOISE_MS = 100.0  # the spread of one observation the prior's variances are measured in
_INTERCEPT_SD_MS = 200.0  # how far the engine's fixed overhead may be from none
_WAIT_SD_MS = 1000.0  # per second of wait, how far from the wait itself
_PER_SEQ_SD_MS = 100.0  # what one running sequence adds beyond the formula's busy term
_SPREAD_FLOOR_MS = 100.0  # errors scale with the TTFT plus this (see _spread)
_RELATIVE_NOISE = 0.1  # an observation's spread in the fit: this share of (TTFT + the floor)
_MIN_FITTED_MS = 1.0
_ROBUST_SIGMAS = 2.0  # beyond this an observation's error counts as this many (Huber)
_QUICK_TOKENS = 32  # at most this many uncached tokens: nothing worth a prefill
_QUICK_MIN = 3  # such requests seen at an instance before they predict the next
_MOSTLY_CACHED = 4  # cached tokens per uncached one beyond which a quick request has no prefill


@dataclass(frozen=True, slots=True)
class Features:
    """What the router knows of a request at an instance when it scores it."""

    rtt_ms: float
    uncached_tokens: int
    wait_ms: float  # the router's queue + busy estimate
    reported_wait_ms: float  # the instance's own predicted wait (0 when it says none)
    busy_seqs: int  # sequences running there (the larger of its report and the router's)
    prior_ms: float  # the formula's estimate: RTT + wait + prefill
    ms_per_token: float  # the formula's prefill cost of one uncached token
    cached_tokens: int = 0  # the prompt's tokens already held there, which the new ones attend to

    @property
    def quick(self) -> bool:
        """Nothing to prefill and nothing ahead: one decode step from its first token."""
        return (
            self.uncached_tokens <= _QUICK_TOKENS
            and self.wait_ms <= 0.0
            and self.reported_wait_ms <= 0.0
            and self.busy_seqs == 0
        )

    @property
    def new_tokens_ms(self) -> float:
        """A quick request's prefill: none when it was found mostly cached, since what
        the router counts uncached there is the tail its character blocks do not name
        (an exact repeat is held whole by the engine: ShareGPT through ``up`` took the
        same ~200 ms with 1 or 20 tokens counted uncached); else its few new tokens."""
        if self.cached_tokens >= _MOSTLY_CACHED * self.uncached_tokens:
            return 0.0
        return self.uncached_tokens * self.ms_per_token

    def vector(self) -> tuple[float, ...]:
        new = self.uncached_tokens
        return (
            1.0,
            new / 1000.0,
            self.wait_ms / 1000.0,
            self.reported_wait_ms / 1000.0,
            float(self.busy_seqs),
            new
            * (self.cached_tokens + new / 2.0)
            / 1e6,  # attention: each new token reads the context
        )


@dataclass(frozen=True, slots=True)
class Prediction:
    """A request's predicted TTFT at one instance (milliseconds)."""

    features: Features
    median_ms: float
    p90_ms: float | None  # None until the instance's model has learned
    fitted_ms: float  # the regression's value, which the observed ratio is taken against
    # Which rule gave the median: the "formula", the regression not yet scaled
    # ("fitted"), the "learned" model, or a request with nothing to prefill ("quick").
    basis: str = "formula"

    @property
    def learned(self) -> bool:
        return self.p90_ms is not None


class TtftModel:
    """One instance's regression and ratio quantiles; see the module docstring."""

    __slots__ = (
        "_max_trace",
        "_p50",
        "_p90",
        "_settings",
        "cov",
        "last_seen",
        "late_quick",
        "observed",
        "pool",
        "quick",
        "ratios",
        "theta",
    )

    def __init__(self, settings: PredictionSettings, pool: deque[float] | None = None) -> None:
        self._settings = settings
        # Quick bases shared with like instances (``Tracker`` keeps one per tier): an
        # instance that has seen no quick request of its own starts from theirs.
        self.pool = pool
        self.theta: list[float] = []  # set from the first prior seen
        self.cov: list[list[float]] = []
        self._max_trace = 0.0
        self.ratios: deque[float] = deque(maxlen=settings.window)
        self.quick: deque[float] = deque(maxlen=settings.window)  # quick requests' bases
        # Quick requests cut at their deadline: lower bounds of a base, for the P90 only.
        self.late_quick: deque[float] = deque(maxlen=settings.window)
        self.observed = 0
        self.last_seen = 0.0  # monotonic (or a simulation's clock) of the last observation
        self._p50 = self._p90 = 1.0

    def predict(self, features: Features, now: float) -> Prediction:
        theta = self.theta or _prior_theta(features)
        # The RTT is the region table's, an assumption: the intercept may learn it is
        # shorter (a negative intercept), so only the whole is kept positive.
        fitted = max(_MIN_FITTED_MS, features.rtt_ms + _dot(theta, features.vector()))
        if not self._settings.enabled:
            return Prediction(features, features.prior_ms, None, fitted)
        learned = self.observed >= self._settings.min_samples and bool(self.ratios)
        if features.quick:  # never the regression's median: it is fitted to prefills
            return self._predict_quick(features, fitted, learned)
        if not self.observed:
            return Prediction(features, features.prior_ms, None, fitted)
        if not learned:
            # The regression's steps from the formula, not yet scaled by its errors: a
            # ratio or two against a fit that has moved since would correct it twice.
            return Prediction(features, fitted, None, fitted, "fitted")
        median = learned_ms = _spread(fitted, self._p50)
        p90 = max(median, _spread(fitted, self._p90))
        half_life = self._settings.stale_half_life_s
        idle = now - self.last_seen
        if idle > 0 and half_life > 0:  # fade toward the formula, keep the spread
            median = features.prior_ms + (learned_ms - features.prior_ms) * 0.5 ** (
                idle / half_life
            )
            p90 = median + (p90 - learned_ms)
        return Prediction(features, median, p90, fitted, "learned")

    def _predict_quick(self, f: Features, fitted: float, learned: bool) -> Prediction:
        """The RTT and the few new tokens, plus what such requests took beyond them."""
        # Its own once it has a few: until then its tier's pool, which holds its own
        # too (one slow repeat at an edge, 559 ms, was the median of its one-sample
        # window and priced the next two at 550 ms; they took 60).
        own = len(self.quick) >= _QUICK_MIN or not self.pool
        seen = sorted(self.quick if own else (self.pool or ()))
        if not seen:  # none seen anywhere: the formula's, with the regression's spread
            spread = max(f.prior_ms, _spread(fitted, self._p90)) if learned else None
            return Prediction(f, f.prior_ms, spread, fitted, "quick")
        extra = f.rtt_ms + f.new_tokens_ms
        # The lower median: what slows such a request (the machine busy elsewhere) only
        # ever adds. Until a few were seen the formula's base votes too, so one slow
        # first sample in a tier (559 ms where the next two took 60) is not the median.
        voters = seen if len(seen) >= _QUICK_MIN else sorted([*seen, f.prior_ms - extra])
        base = voters[(len(voters) - 1) // 2]
        if not (own and learned):
            # A base below none says the table overstates an RTT: believed of this
            # instance once it has learned, not of another's, nor from a sample or two.
            base = max(0.0, base)
        median = max(_MIN_FITTED_MS, extra + base)
        p90: float | None = None
        if own and learned and len(seen) >= _QUICK_MIN:
            bounds = sorted([*seen, *self.late_quick])
            p90 = max(median, extra + _quantile(bounds, 0.9))
        elif learned:  # too few of its own yet: the regression's spread
            p90 = max(median, _spread(fitted, self._p90))
        return Prediction(f, median, p90, fitted, "quick")

    def _quick_base(self, f: Features, ttft_ms: float) -> None:
        """What a quick request took beyond its RTT and new tokens: its own window and
        its tier's."""
        base = ttft_ms - f.rtt_ms - f.new_tokens_ms
        self.quick.append(base)
        if self.pool is not None:
            self.pool.append(base)

    def observe(self, predicted: Prediction, actual_ms: float, now: float) -> None:
        """A first token ``actual_ms`` after the send of a request predicted so."""
        f = predicted.features
        if not self.theta:
            self._start(f)
        self._ratio((actual_ms + _SPREAD_FLOOR_MS) / (predicted.fitted_ms + _SPREAD_FLOOR_MS))
        if f.quick:
            self._quick_base(f, actual_ms)
        self._update(f.vector(), actual_ms - f.rtt_ms)
        self.observed += 1
        self.last_seen = max(self.last_seen, now)

    def censored(self, predicted: Prediction, waited_ms: float) -> None:
        """No first token within ``waited_ms`` (the attempt was cut at its deadline)."""
        self._ratio((waited_ms + _SPREAD_FLOOR_MS) / (predicted.fitted_ms + _SPREAD_FLOOR_MS))
        f = predicted.features
        if f.quick:  # at least that long: a lower bound, for its own P90 alone (see above).
            # Not its tier's either: this one's hang is not the others'.
            self.late_quick.append(waited_ms - f.rtt_ms - f.new_tokens_ms)

    def _ratio(self, ratio: float) -> None:
        self.ratios.append(ratio)
        ordered = sorted(self.ratios)
        self._p50 = _quantile(ordered, 0.5)
        self._p90 = max(self._p50, _quantile(ordered, 0.9))

    def _start(self, f: Features) -> None:
        """The formula's coefficients, each as uncertain as the module docstring says."""
        self.theta = _prior_theta(f)
        per_1k_sd = max(self.theta[1], 500.0)
        sds = (_INTERCEPT_SD_MS, per_1k_sd, _WAIT_SD_MS, _WAIT_SD_MS, _PER_SEQ_SD_MS, per_1k_sd)
        variances = [(sd / _NOISE_MS) ** 2 for sd in sds]
        self.cov = [[variances[i] if i == j else 0.0 for j in range(_DIMS)] for i in range(_DIMS)]
        self._max_trace = 10.0 * sum(variances)  # a direction never excited must not blow up

    def _update(self, x: tuple[float, ...], y: float) -> None:
        """One recursive-least-squares step with forgetting."""
        # Weighted by the observation's own spread, a share of its size: a long
        # prompt's seconds of noise must not outweigh a short one's milliseconds.
        w = _NOISE_MS / (_RELATIVE_NOISE * (max(0.0, y) + _SPREAD_FLOOR_MS))
        x = tuple(v * w for v in x)
        y *= w
        theta, cov, lam = self.theta, self.cov, self._settings.forgetting
        px = [_dot(row, x) for row in cov]
        gain_den = lam + _dot(x, px)
        gain = [v / gain_den for v in px]
        err = y - _dot(theta, x)
        # Huber: an error beyond _ROBUST_SIGMAS of what the fit expected (its own
        # uncertainty and the observation's) moves it as one of that size would. One
        # request slowed by the machine (the same 128-token prompt took 1.2 s in one
        # run and 1.7 s in another) is no reason to reprice every prompt after it.
        sigmas = abs(err) / (_NOISE_MS * math.sqrt(gain_den))
        if sigmas > _ROBUST_SIGMAS:
            err *= _ROBUST_SIGMAS / sigmas
        for i in range(_DIMS):
            theta[i] += gain[i] * err
        for i in range(_DIMS):
            for j in range(_DIMS):
                cov[i][j] = (cov[i][j] - gain[i] * px[j]) / lam
        last = _DIMS - 1
        if theta[last] < 0.0 < cov[last][last]:
            # No attention cost below none: the fit conditioned on none, so the others
            # move as they would have had it been none (a bare clamp would leave them
            # bent to make up for the negative value, as the tests' linear engines showed).
            shift = -theta[last] / cov[last][last]
            for i in range(last):
                theta[i] += cov[i][last] * shift
            theta[last] = 0.0
        for i in range(1, _DIMS):  # time per token or per ms of wait is never negative
            theta[i] = max(0.0, theta[i])
        trace = sum(cov[i][i] for i in range(_DIMS))
        if trace > self._max_trace:
            scale = self._max_trace / trace
            for row in cov:
                for j in range(_DIMS):
                    row[j] *= scale


def _prior_theta(f: Features) -> list[float]:
    """The formula as coefficients: no intercept, its prefill cost, its wait as is."""
    return [0.0, f.ms_per_token * 1000.0, 1000.0, 0.0, 0.0, 0.0]


def _spread(fitted_ms: float, ratio: float) -> float:
    """The fit scaled by an observed ratio of (actual + floor) / (fitted + floor)."""
    return max(0.0, (fitted_ms + _SPREAD_FLOOR_MS) * ratio - _SPREAD_FLOOR_MS)


def _dot(a: list[float] | tuple[float, ...], b: list[float] | tuple[float, ...]) -> float:
    return sum(p * q for p, q in zip(a, b, strict=True))


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]

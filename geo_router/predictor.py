"""Each request's TTFT on each instance, learned online from the first tokens seen there.

The scorer's formula (``geo_router.scoring``) is the prior: RTT + the
router's wait estimate (queue + busy) + the uncached prompt at the reported
prefill rate. Per instance, a :class:`TtftModel` corrects it from what the
router observes when an attempt primes:

* a linear regression, fitted by recursive least squares with exponential
  forgetting (``forgetting`` per observation), of the TTFT beyond the RTT on
  ``[1, uncached tokens / 1000, router wait / 1 s, reported wait / 1 s,
  sequences running there]`` (the reported wait is the instance's own
  ``predicted_wait_ms``; the running sequences let it learn what each costs
  a new arrival beyond the formula's busy term). It starts at the formula's
  coefficients (no intercept, the prior's ms per token, one ms per ms of
  wait, nothing per sequence), so its first corrections are small steps from
  today's estimate, and it follows an engine whose prefill rate or overhead
  drifts;
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

Until ``min_samples`` first tokens were seen there, the prediction is the
formula's, with no upper quantile (``p90_ms`` is ``None``): the dispatcher
then keeps its fixed hedge delay and deadline. A learned prediction's P90
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
ones like them at that instance (their median and 90th percentile, once
the instance's model has learned and ``_QUICK_MIN`` were seen), and still
teach the regression.

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

from collections import deque
from dataclasses import dataclass

from geo_router.settings import PredictionSettings

__all__ = ["Features", "Prediction", "TtftModel"]

_DIMS = 5
_NOISE_MS = 100.0  # the spread of one observation the prior's variances are measured in
_INTERCEPT_SD_MS = 200.0  # how far the engine's fixed overhead may be from none
_WAIT_SD_MS = 1000.0  # per second of wait, how far from the wait itself
_PER_SEQ_SD_MS = 100.0  # what one running sequence adds beyond the formula's busy term
_SPREAD_FLOOR_MS = 100.0  # errors scale with the TTFT plus this (see _spread)
_MIN_FITTED_MS = 1.0
_QUICK_TOKENS = 32  # at most this many uncached tokens: nothing worth a prefill
_QUICK_MIN = 3  # such requests seen at an instance before they predict the next


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

    @property
    def quick(self) -> bool:
        """Nothing to prefill and nothing ahead: one decode step from its first token."""
        return (
            self.uncached_tokens <= _QUICK_TOKENS
            and self.wait_ms <= 0.0
            and self.reported_wait_ms <= 0.0
            and self.busy_seqs == 0
        )

    def vector(self) -> tuple[float, ...]:
        return (
            1.0,
            self.uncached_tokens / 1000.0,
            self.wait_ms / 1000.0,
            self.reported_wait_ms / 1000.0,
            float(self.busy_seqs),
        )


@dataclass(frozen=True, slots=True)
class Prediction:
    """A request's predicted TTFT at one instance (milliseconds)."""

    features: Features
    median_ms: float
    p90_ms: float | None  # None until the instance's model has learned
    fitted_ms: float  # the regression's value, which the observed ratio is taken against

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
        "observed",
        "quick",
        "ratios",
        "theta",
    )

    def __init__(self, settings: PredictionSettings) -> None:
        self._settings = settings
        self.theta: list[float] = []  # set from the first prior seen
        self.cov: list[list[float]] = []
        self._max_trace = 0.0
        self.ratios: deque[float] = deque(maxlen=settings.window)
        self.quick: deque[float] = deque(maxlen=settings.window)  # TTFTs of quick requests
        self.observed = 0
        self.last_seen = 0.0  # monotonic (or a simulation's clock) of the last observation
        self._p50 = self._p90 = 1.0

    def predict(self, features: Features, now: float) -> Prediction:
        theta = self.theta or _prior_theta(features)
        # The RTT is the region table's, an assumption: the intercept may learn it is
        # shorter (a negative intercept), so only the whole is kept positive.
        fitted = max(_MIN_FITTED_MS, features.rtt_ms + _dot(theta, features.vector()))
        if self.observed < self._settings.min_samples or not self.ratios:
            return Prediction(features, features.prior_ms, None, fitted)
        if features.quick and len(self.quick) >= _QUICK_MIN:
            seen = sorted(self.quick)
            median = _quantile(seen, 0.5)
            return Prediction(features, median, max(median, _quantile(seen, 0.9)), fitted)
        median = learned = _spread(fitted, self._p50)
        p90 = max(median, _spread(fitted, self._p90))
        half_life = self._settings.stale_half_life_s
        idle = now - self.last_seen
        if idle > 0 and half_life > 0:  # fade toward the formula, keep the spread
            median = features.prior_ms + (learned - features.prior_ms) * 0.5 ** (idle / half_life)
            p90 = median + (p90 - learned)
        return Prediction(features, median, p90, fitted)

    def observe(self, predicted: Prediction, actual_ms: float, now: float) -> None:
        """A first token ``actual_ms`` after the send of a request predicted so."""
        f = predicted.features
        if not self.theta:
            self._start(f)
        self._ratio((actual_ms + _SPREAD_FLOOR_MS) / (predicted.fitted_ms + _SPREAD_FLOOR_MS))
        if f.quick:
            self.quick.append(actual_ms)
        self._update(f.vector(), actual_ms - f.rtt_ms)
        self.observed += 1
        self.last_seen = max(self.last_seen, now)

    def censored(self, predicted: Prediction, waited_ms: float) -> None:
        """No first token within ``waited_ms`` (the attempt was cut at its deadline)."""
        self._ratio((waited_ms + _SPREAD_FLOOR_MS) / (predicted.fitted_ms + _SPREAD_FLOOR_MS))
        if predicted.features.quick:  # at least that long: a lower bound, as for the ratios
            self.quick.append(waited_ms)

    def _ratio(self, ratio: float) -> None:
        self.ratios.append(ratio)
        ordered = sorted(self.ratios)
        self._p50 = _quantile(ordered, 0.5)
        self._p90 = max(self._p50, _quantile(ordered, 0.9))

    def _start(self, f: Features) -> None:
        """The formula's coefficients, each as uncertain as the module docstring says."""
        self.theta = _prior_theta(f)
        per_1k_sd = max(self.theta[1], 500.0)
        sds = (_INTERCEPT_SD_MS, per_1k_sd, _WAIT_SD_MS, _WAIT_SD_MS, _PER_SEQ_SD_MS)
        variances = [(sd / _NOISE_MS) ** 2 for sd in sds]
        self.cov = [[variances[i] if i == j else 0.0 for j in range(_DIMS)] for i in range(_DIMS)]
        self._max_trace = 10.0 * sum(variances)  # a direction never excited must not blow up

    def _update(self, x: tuple[float, ...], y: float) -> None:
        """One recursive-least-squares step with forgetting."""
        theta, cov, lam = self.theta, self.cov, self._settings.forgetting
        px = [_dot(row, x) for row in cov]
        gain_den = lam + _dot(x, px)
        gain = [v / gain_den for v in px]
        err = y - _dot(theta, x)
        for i in range(_DIMS):
            theta[i] += gain[i] * err
        for i in range(1, _DIMS):  # time per token or per ms of wait is never negative
            theta[i] = max(0.0, theta[i])
        for i in range(_DIMS):
            for j in range(_DIMS):
                cov[i][j] = (cov[i][j] - gain[i] * px[j]) / lam
        trace = sum(cov[i][i] for i in range(_DIMS))
        if trace > self._max_trace:
            scale = self._max_trace / trace
            for row in cov:
                for j in range(_DIMS):
                    row[j] *= scale


def _prior_theta(f: Features) -> list[float]:
    """The formula as coefficients: no intercept, its prefill cost, its wait as is."""
    return [0.0, f.ms_per_token * 1000.0, 1000.0, 0.0, 0.0]


def _spread(fitted_ms: float, ratio: float) -> float:
    """The fit scaled by an observed ratio of (actual + floor) / (fitted + floor)."""
    return max(0.0, (fitted_ms + _SPREAD_FLOOR_MS) * ratio - _SPREAD_FLOOR_MS)


def _dot(a: list[float] | tuple[float, ...], b: list[float] | tuple[float, ...]) -> float:
    return sum(p * q for p, q in zip(a, b, strict=True))


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]

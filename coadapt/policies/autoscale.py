"""Serving autoscalers: pure functions of (observations, state, clock) -> replica count.

A deployment (a served model with a latency SLO) needs replicas; how many is an autoscaler's
call. Like a scheduling policy, an autoscaler does no I/O and keeps its memory in a JSON
``state`` the caller hands back, so the simulator, the controller and the tests run the same
objects (STYLE §1). Three are here:

* :class:`StaticAutoscaler` — a fixed count (the static serving partition sized for the peak);
* :class:`KnativeAutoscaler` — Knative's KPA as documented (knative.dev, "Additional autoscaling
  configuration for Knative Pod Autoscaler", and the ``config-autoscaler`` defaults): a
  requests-per-second target per replica at 70 % target utilisation, the average over a 60 s
  stable window, a 6 s panic window (10 % of the stable window) entered when the panic-window
  demand needs >= 2x the ready replicas (panic-threshold 200 %), no scale-down while panicking,
  panic left after a stable window without reason to panic, max scale-up rate 1000 and
  max scale-down rate 2 per decision, scale to zero after a stable window without traffic plus
  the 30 s grace period. It ignores the SLO and what a new replica costs to start;
* :class:`SloAutoscaler` — coadapt's: learns the per-replica capacity at the SLO online from
  observed (load, latency-quantile) pairs, forecasts demand over the time a replica it asks for
  now needs to become ready (Holt's linear trend and the recent peak), and adds a headroom
  learned from its own past forecast errors, so it asks for what the SLO needs and no more.

The shared vocabulary (:class:`Deployment`, :class:`DemandWindow`, :class:`DemandSource`) is here
too, because the co-scheduling policy and the serving simulator both speak it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from coadapt.policies import queueing
from coadapt.policies.base import PolicyError, PolicyState


class DeploymentError(PolicyError):
    """A deployment description is invalid; the message names the field and what to do."""


@dataclass(frozen=True)
class Deployment:
    """A served model as the scheduler sees it.

    The SLO is "the ``slo_quantile`` latency quantile stays <= ``slo_s``" (p99 <= 50 ms by
    default). ``capacity_rps`` is the requests/s one replica sustains within the SLO as a load
    test measured it: Knative's per-replica target and the SLO autoscaler's prior, which it
    refines from live observations. One replica holds one slot (GPU or CPU slot).
    """

    name: str
    capacity_rps: float
    slo_s: float = 0.05
    slo_quantile: float = 0.99
    priority: int = 0  # higher first when serving alone exceeds the cluster
    min_replicas: int = 0
    max_replicas: int = 64
    ready_s: float = 20.0  # a new replica's cold start: process + model load + warm-up
    scale_to_zero_s: float | None = 300.0  # idle time before zero replicas; None = never

    def __post_init__(self) -> None:
        def bad(fld: str, value: object, accepted: str) -> DeploymentError:
            return DeploymentError(
                f"deployment {self.name!r}: field {fld!r} = {value!r} is invalid; "
                f"accepted: {accepted}"
            )

        if not isinstance(self.name, str) or not self.name.strip():
            raise DeploymentError(
                f"deployment: field 'name' = {self.name!r} is invalid; accepted: a non-empty string"
            )
        if not _finite_positive(self.capacity_rps):
            raise bad("capacity_rps", self.capacity_rps, "requests/s per replica > 0")
        if not _finite_positive(self.slo_s):
            raise bad("slo_s", self.slo_s, "seconds > 0 (e.g. 0.05)")
        if not (isinstance(self.slo_quantile, float | int) and 0.5 <= self.slo_quantile < 1.0):
            raise bad("slo_quantile", self.slo_quantile, "a fraction in [0.5, 1), e.g. 0.99")
        if not isinstance(self.priority, int):
            raise bad("priority", self.priority, "an integer (higher is served first)")
        if not isinstance(self.min_replicas, int) or self.min_replicas < 0:
            raise bad("min_replicas", self.min_replicas, "an integer >= 0")
        if not isinstance(self.max_replicas, int) or self.max_replicas < max(1, self.min_replicas):
            raise bad("max_replicas", self.max_replicas, "an integer >= max(1, min_replicas)")
        if not (isinstance(self.ready_s, float | int) and math.isfinite(self.ready_s)) or (
            self.ready_s < 0
        ):
            raise bad("ready_s", self.ready_s, "seconds >= 0")
        if self.scale_to_zero_s is not None and not (
            isinstance(self.scale_to_zero_s, float | int)
            and math.isfinite(self.scale_to_zero_s)
            and self.scale_to_zero_s >= 0
        ):
            raise bad("scale_to_zero_s", self.scale_to_zero_s, "seconds >= 0, or null (never)")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Deployment:
        """A deployment from a spec mapping (YAML/JSON), ``slo_ms`` or ``slo_s`` for the SLO.

        Unknown keys are refused by name, so a typo never silently falls back to a default.
        """
        if not isinstance(data, Mapping):
            raise DeploymentError(
                f"deployment: expected a mapping of fields, got {type(data).__name__}"
            )
        known = {
            "name",
            "capacity_rps",
            "slo_ms",
            "slo_s",
            "slo_quantile",
            "priority",
            "min_replicas",
            "max_replicas",
            "ready_s",
            "scale_to_zero_s",
        }
        name = data.get("name", "")
        unknown = sorted(set(data) - known)
        if unknown:
            raise DeploymentError(
                f"deployment {name!r}: unknown field {unknown[0]!r}; accepted: "
                f"{', '.join(sorted(known))}"
            )
        for required in ("name", "capacity_rps"):
            if required not in data:
                raise DeploymentError(
                    f"deployment {name!r}: field {required!r} is missing; it is required"
                )
        if "slo_ms" in data and "slo_s" in data:
            raise DeploymentError(f"deployment {name!r}: give 'slo_ms' or 'slo_s', not both")
        kwargs: dict[str, Any] = {k: v for k, v in data.items() if k not in {"slo_ms"}}
        if "slo_ms" in data:
            ms = data["slo_ms"]
            if not _finite_positive(ms):
                raise DeploymentError(
                    f"deployment {name!r}: field 'slo_ms' = {ms!r} is invalid; "
                    "accepted: milliseconds > 0"
                )
            kwargs["slo_s"] = float(ms) / 1000.0
        return cls(**kwargs)

    @property
    def tail_factor(self) -> float:
        """ln(1/(1-q)): the exponential tail's quantile factor (4.6 for p99)."""
        return math.log(1.0 / (1.0 - self.slo_quantile))


def _finite_positive(x: object) -> bool:
    return isinstance(x, float | int) and not isinstance(x, bool) and math.isfinite(x) and x > 0


@dataclass(frozen=True)
class LatencySample:
    """One observation of a deployment over a second or so.

    ``load_rps`` is the requests/s each ready replica served (the pool's total divided by
    ``replicas``), ``latency_s`` the SLO quantile of latency over all of them, ``replicas``
    how many ready replicas shared that load behind the gateway. The pool's total is
    ``load_rps * replicas``. A sample written before ``replicas`` existed reads as one
    replica serving ``load_rps`` alone (the M/M/1 reading every sample had then).
    """

    load_rps: float
    latency_s: float
    replicas: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int):
            raise DeploymentError(
                f"latency sample: field 'replicas' = {self.replicas!r} is invalid; "
                "accepted: the ready replicas (an integer >= 1) that served the load"
            )
        if self.replicas < 1:
            raise DeploymentError(
                f"latency sample: field 'replicas' = {self.replicas} is invalid; "
                "accepted: an integer >= 1 (a second without a ready replica is no sample)"
            )

    @property
    def total_rps(self) -> float:
        """Requests/s the whole pool served."""
        return self.load_rps * self.replicas


@dataclass(frozen=True)
class DemandWindow:
    """What the mechanism measured for one deployment since the last decision.

    ``rates`` are requests/s per second of the window, oldest first, ending at ``end``: offered
    demand, requests held by the activator or shed included. ``replicas`` is how many were
    ready at ``end``; ``held_now`` how many requests the activator holds at ``end`` (waiting
    for a first replica): they keep a deployment busy however long ago they arrived, so a
    replica being started for them is never scaled away before it answers.
    """

    end: float
    rates: tuple[float, ...] = ()
    samples: tuple[LatencySample, ...] = ()
    replicas: int = 0
    held_now: int = 0


@runtime_checkable
class DemandSource(Protocol):
    """Where a deployment's demand comes from: a trace in the simulator, measured request
    rates and latencies in the live controller."""

    def window(self, deployment: str, start: float, end: float) -> DemandWindow:
        """The measurements of ``deployment`` over ``[start, end)``."""
        ...


@dataclass(frozen=True)
class ScaleDecision:
    """An autoscaler's answer: replicas wanted, and its estimates behind the number."""

    replicas: int
    capacity_rps: float  # per-replica requests/s at the SLO it believes
    forecast_rps: float  # demand it provisions for (before headroom)
    state: PolicyState = field(default_factory=dict)
    diagnostics: dict[str, float] = field(default_factory=dict)
    # set when the replicas are pooled (M/M/c): each one's service rate, so that a grant of
    # fewer replicas than asked is admitted at that smaller pool's capacity, not this one's
    service_rps: float | None = None


@runtime_checkable
class Autoscaler(Protocol):
    """Decide a deployment's replica count; ``horizon`` is how far ahead the count must hold
    (until the next decision's replicas can be ready)."""

    @property
    def name(self) -> str: ...

    def decide(
        self,
        deployment: Deployment,
        window: DemandWindow,
        state: PolicyState,
        now: float,
        horizon: float,
    ) -> ScaleDecision: ...


def _clamp(dep: Deployment, replicas: int) -> int:
    return max(dep.min_replicas, min(dep.max_replicas, replicas))


def _history(state: PolicyState, window: DemandWindow, keep: int) -> list[float]:
    """The last ``keep`` per-second rates: the stored ones followed by the window's."""
    hist = [float(x) for x in state.get("hist", [])] + [float(x) for x in window.rates]
    return hist[-keep:] if keep > 0 else []


@dataclass(frozen=True)
class StaticAutoscaler:
    """A fixed replica count per deployment (a static partition)."""

    replicas: Mapping[str, int]
    name: str = "static"

    def decide(
        self,
        deployment: Deployment,
        window: DemandWindow,
        state: PolicyState,
        now: float,
        horizon: float,
    ) -> ScaleDecision:
        if deployment.name not in self.replicas:
            raise DeploymentError(
                f"static autoscaler: no replica count for deployment {deployment.name!r}; "
                f"give one in replicas (known: {', '.join(sorted(self.replicas)) or 'none'})"
            )
        n = _clamp(deployment, int(self.replicas[deployment.name]))
        return ScaleDecision(n, deployment.capacity_rps, n * deployment.capacity_rps, {})


@dataclass(frozen=True)
class KnativeAutoscaler:
    """Knative's KPA in RPS mode (see the module docstring for the sources of each default).

    The per-replica target is the deployment's ``capacity_rps`` (what a user would write in
    ``autoscaling.knative.dev/target`` after a load test) times ``target_utilisation``.
    Scale to zero follows the deployment's ``scale_to_zero_s`` (None: never), at least a
    stable window plus the grace period.
    """

    target_utilisation: float = 0.7
    stable_window_s: int = 60
    panic_window_pct: float = 10.0
    panic_threshold: float = 2.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    scale_to_zero_grace_s: float = 30.0
    name: str = "knative"

    def decide(
        self,
        deployment: Deployment,
        window: DemandWindow,
        state: PolicyState,
        now: float,
        horizon: float,
    ) -> ScaleDecision:
        hist = _history(state, window, self.stable_window_s)
        panic_n = max(1, round(self.stable_window_s * self.panic_window_pct / 100.0))
        stable_avg = sum(hist) / len(hist) if hist else 0.0
        recent = hist[-panic_n:]
        panic_avg = sum(recent) / len(recent) if recent else 0.0
        per_replica = deployment.capacity_rps * self.target_utilisation
        want_stable = math.ceil(stable_avg / per_replica - 1e-9)
        want_panic = math.ceil(panic_avg / per_replica - 1e-9)
        ready = window.replicas
        last_busy = float(state.get("last_busy", now))
        if window.held_now > 0 or any(r > 0 for r in window.rates):
            last_busy = now
        panic_since = state.get("panic_since")
        panic_max = int(state.get("panic_max", 0))
        if want_panic >= self.panic_threshold * max(ready, 1) and panic_avg > 0:
            if panic_since is None:  # entering panic: never below what is ready now
                panic_max = ready
            panic_since = now  # a new reason to panic restarts the clock
        elif panic_since is not None and now - float(panic_since) >= self.stable_window_s:
            panic_since, panic_max = None, 0
        if panic_since is not None:
            want = max(want_panic, panic_max)  # no scale-down while panicking
            panic_max = want
        else:
            want = want_stable
        if ready > 0:
            want = min(want, math.ceil(self.max_scale_up_rate * ready))
            want = max(want, math.floor(ready / self.max_scale_down_rate))
        if want == 0 and ready > 0:
            idle_needed = max(
                self.stable_window_s + self.scale_to_zero_grace_s,
                deployment.scale_to_zero_s if deployment.scale_to_zero_s is not None else 0.0,
            )
            if deployment.scale_to_zero_s is None or now - last_busy < idle_needed:
                want = 1
        if window.held_now > 0:
            want = max(want, 1)  # the activator holds requests: a replica must come (or stay)
        new_state: PolicyState = {
            "hist": hist,
            "last_busy": last_busy,
            "panic_since": panic_since,
            "panic_max": panic_max,
        }
        return ScaleDecision(
            _clamp(deployment, want),
            deployment.capacity_rps,
            stable_avg if panic_since is None else panic_avg,
            new_state,
            {"panic": 1.0 if panic_since is not None else 0.0},
        )


def prior_service_rate(dep: Deployment) -> float:
    """The per-replica service rate the load test implies: the M/M/1 replica whose
    ``slo_quantile`` latency at ``capacity_rps`` is exactly the SLO (a load test drives one
    replica, where pooled and M/M/1 agree)."""
    return dep.capacity_rps + dep.tail_factor / dep.slo_s


def sample_information(mu: float, c: int, total_rps: float, latency_s: float, q: float) -> float:
    """How much one sample tells about ``mu``: (d log latency / d log mu)^2 at the sample.

    A 5 % error of a measured quantile moves the inverted ``mu`` by 5 % / |sensitivity|, so
    this is the inverse-variance weight. Near saturation the latency is steep in ``mu`` (the
    sample is precise), at low load it is the service time alone (sensitivity 1).
    """
    h = 1e-4
    f = queueing.pooled_beyond
    d_mu = (f(mu * (1 + h), c, total_rps, latency_s) - f(mu * (1 - h), c, total_rps, latency_s)) / (
        2 * h
    )
    d_t = (f(mu, c, total_rps, latency_s * (1 + h)) - f(mu, c, total_rps, latency_s * (1 - h))) / (
        2 * h
    )
    if d_t >= 0 or not math.isfinite(d_mu / d_t):
        return 1.0
    return (d_mu / d_t) ** 2


def _legacy_service_rate(dep: Deployment, stats: Sequence[float]) -> float | None:
    """The service rate of a state saved before the pooled fit (``state["fit"]``): its
    statistics ``[w, Σx, Σy, Σxx, Σxy]`` were the line ``1/latency = b0 + b1 * load`` per
    replica; the rate returned keeps the capacity at the SLO that line gave (None when the
    statistics define no falling line, as the old fit then fell back to the load test)."""
    if len(stats) != 5:
        return None
    w, sx, sy, sxx, sxy = (float(v) for v in stats)
    if w <= 0:
        return None
    var = sxx / w - (sx / w) ** 2
    if var <= 1e-12 * max(1.0, (sx / w) ** 2):
        return None
    b1 = (sxy / w - (sx / w) * (sy / w)) / var
    b0 = sy / w - b1 * sx / w
    if b1 >= 0:
        return None
    return (1.0 / dep.slo_s - b0) / b1 + dep.tail_factor / dep.slo_s


#: Headrooms the SLO autoscaler considers: 0 to 100 % in steps of 2.5 %.
HEADROOM_GRID = tuple(i * 0.025 for i in range(41))


@dataclass(frozen=True)
class SloAutoscaler:
    """coadapt's autoscaler: learned capacity at the SLO, forecast over the ready time, learned
    headroom (see the module docstring; ``docs/coschedule.md`` has the reasoning).

    * capacity: each latency sample is inverted into the per-replica service rate ``mu`` at
      which the queueing model gives the observed quantile: with ``pooled`` (the default:
      the gateway routes least-outstanding, so the ready replicas share one queue) an M/M/c
      of ``sample.replicas`` servers at the pool's total load, else one M/M/1 replica at
      ``sample.load_rps``. The fit is the exponentially forgotten, information-weighted mean
      of ``ln mu`` (cheap sufficient statistics, like θ_sys for training), with the load
      test as prior; ``mu`` is kept where the one-replica capacity stays within
      ``capacity_bounds`` times the load-tested one (a guard against a fit on a narrow,
      noisy range);
    * forecast: ``max(Holt level + max(trend, 0) * horizon, peak of the last peak_window_s)``;
    * headroom: the least h (on a 2.5 % grid, within [min_headroom, max_headroom]) such that
      of the requests seen over past decisions' horizons, at most ``miss_budget`` came in
      seconds when demand exceeded that decision's forecast x (1 + h): the surprises it has
      actually met, weighted by the requests they would cost, forgotten slowly (by time, so
      5 s rounds remember a burst as long as 60 s rounds). Before any
      decision was judged, ``max_headroom``;
    * replicas: pooled, the least count whose M/M/c quantile at forecast x (1 + headroom)
      meets the SLO (fewer than separate replicas would need: a larger pool runs each
      replica closer to ``mu``) with each replica busy at most ``max_utilisation`` of the
      time; not pooled, ``ceil(forecast x (1 + headroom) / capacity)``;
    * scale to zero after ``scale_to_zero_s`` without a request; the activator holds requests
      meanwhile and any request asks for a replica at once.
    """

    alpha: float = 0.3  # Holt level smoothing per second
    beta: float = 0.01  # Holt trend smoothing per second
    peak_window_s: int = 60  # the learned headroom covers bursts; a longer peak double-counts
    min_headroom: float = 0.05
    max_headroom: float = 1.0
    miss_budget: float = 0.0005  # share of requests allowed to come above the provision
    # the judged surprises are forgotten by forget_decisions per forget_period_s of time
    # (half-life ~140 periods = 2.3 h), however often it decides: with 5 s serving rounds a
    # per-decision rate would forget the last burst before the next one comes
    forget_decisions: float = 0.995
    forget_period_s: float = 60.0
    # the load test counts as this many low-load samples (weight 1 each)
    prior_weight: float = 20.0
    forget: float = 0.995  # per latency sample
    capacity_bounds: tuple[float, float] = (0.5, 2.0)
    pooled: bool = True  # the replicas share one queue (least-outstanding routing)
    # a sample's weight is (d ln latency / d ln mu)^2, capped: a quantile measured in a
    # nearly saturated second is noisier than the model's 5 % says
    max_sample_weight: float = 100.0
    # pooled: each replica busy at most this share of the time at the provision. A pool
    # sized by the SLO quantile alone runs each replica at ~99.5 % of mu and drains a
    # burst's queue slowly (benchmark: 99.873 % attainment at 1.0, 99.968 % at 0.98, the
    # same training JCT; docs/coschedule.md)
    max_utilisation: float = 0.98
    name: str = "slo"

    def __post_init__(self) -> None:
        if not _finite_positive(self.forget_period_s):
            raise PolicyError(
                f"slo autoscaler: forget_period_s = {self.forget_period_s!r} is invalid; "
                "accepted: seconds > 0"
            )
        if not (_finite_positive(self.max_utilisation) and self.max_utilisation <= 1.0):
            raise PolicyError(
                f"slo autoscaler: max_utilisation = {self.max_utilisation!r} is invalid; "
                "accepted: a share in (0, 1]"
            )

    def _prior_stats(self, dep: Deployment) -> list[float]:
        """[weight, weight x ln mu] of the load test: ``prior_weight`` samples' worth at
        the weight of one taken at low load (where a quantile tells ``mu`` to its own error)."""
        return [self.prior_weight, self.prior_weight * math.log(prior_service_rate(dep))]

    def _stats(self, dep: Deployment, state: PolicyState) -> list[float]:
        got = state.get("mu_fit")
        if got is not None and len(got) == 2:
            return [float(got[0]), float(got[1])]
        legacy = state.get("fit")  # a state saved before the pooled fit
        mu = _legacy_service_rate(dep, legacy) if legacy is not None else None
        w, _ = self._prior_stats(dep)
        if mu is None or mu <= 0:
            return self._prior_stats(dep)
        return [w, w * math.log(mu)]

    def service_rate(self, deployment: Deployment, state: PolicyState) -> float:
        """Per-replica service rate ``mu`` from the fit in ``state`` (the prior without),
        within the bounds."""
        w, slog = self._stats(deployment, state)
        mu = math.exp(slog / w) if w > 0 else prior_service_rate(deployment)
        lo, hi = self.capacity_bounds
        extra = deployment.tail_factor / deployment.slo_s  # mu - capacity of one replica
        return min(
            max(mu, lo * deployment.capacity_rps + extra), hi * deployment.capacity_rps + extra
        )

    def capacity(self, deployment: Deployment, state: PolicyState, replicas: int = 1) -> float:
        """Per-replica requests/s at the SLO: of one replica alone (``replicas`` = 1, or not
        pooled), else of each of ``replicas`` pooled ones."""
        mu = self.service_rate(deployment, state)
        c = max(int(replicas), 1) if self.pooled else 1
        q = deployment.slo_quantile
        return queueing.pooled_capacity(mu, c, deployment.slo_s, q) / c

    def _learn(self, dep: Deployment, stats: list[float], s: LatencySample) -> list[float]:
        """Fold one sample into ``[weight, weight x ln mu]``."""
        if not (s.latency_s > 0 and s.load_rps > 0 and math.isfinite(s.latency_s)):
            return stats
        c = s.replicas if self.pooled else 1
        total = s.total_rps if self.pooled else s.load_rps
        q = dep.slo_quantile
        mu = queueing.service_rate_for(c, total, s.latency_s, q)
        w = min(sample_information(mu, c, total, s.latency_s, q), self.max_sample_weight)
        return [stats[0] * self.forget + w, stats[1] * self.forget + w * math.log(mu)]

    def decide(
        self,
        deployment: Deployment,
        window: DemandWindow,
        state: PolicyState,
        now: float,
        horizon: float,
    ) -> ScaleDecision:
        # 1. the replicas' service rate, refitted on the window's latency samples
        stats = self._stats(deployment, state)
        for s in window.samples:
            stats = self._learn(deployment, stats, s)
        new_state: PolicyState = {"mu_fit": stats}
        mu = self.service_rate(deployment, new_state)
        # 2. demand: Holt's linear trend over the per-second rates, and the recent peak
        level = state.get("level")
        trend = float(state.get("trend", 0.0))
        for r in window.rates:
            if level is None:
                level, trend = float(r), 0.0
                continue
            prev = float(level)
            level = self.alpha * r + (1 - self.alpha) * (prev + trend)
            trend = self.beta * (level - prev) + (1 - self.beta) * trend
        # a decision is judged at the first call after its horizon: keep two horizons (the
        # horizon includes a round) so the whole of it is still here
        keep = max(self.peak_window_s, 2 * math.ceil(horizon) + 1)
        hist = _history(state, window, keep)
        recent_peak = max(hist[-self.peak_window_s :], default=0.0)
        lvl = float(level) if level is not None else 0.0
        forecast = max(lvl + max(trend, 0.0) * horizon, recent_peak, 0.0)
        # 3. headroom from realised surprises: for each past decision whose horizon has ended,
        # the requests that came in seconds above its forecast x (1 + h), for every h of the
        # grid, forgotten exponentially; the headroom is the least h whose share stays
        # within the miss budget
        pending = [list(p) for p in state.get("pending", [])]
        over = [float(x) for x in state.get("over", [0.0] * len(HEADROOM_GRID))]
        seen_total = float(state.get("seen", 0.0))
        start = now - len(hist)  # time of hist[0]
        still: list[list[float]] = []
        last_t = state.get("t")
        elapsed = self.forget_period_s if last_t is None else max(now - float(last_t), 0.0)
        forget = self.forget_decisions ** (elapsed / self.forget_period_s)
        judged = False
        for t0, f0, h0 in pending:
            if t0 + h0 > now:
                still.append([t0, f0, h0])
                continue
            lo_i, hi_i = int(t0 - start), int(t0 + h0 - start)
            seen = hist[max(lo_i, 0) : max(hi_i, 0)]
            if not seen or f0 <= 0:
                continue
            if not judged:  # forget once per call, by the time since the last one
                over = [forget * o for o in over]
                seen_total *= forget
                judged = True
            over = [
                o + sum(r for r in seen if r > f0 * (1.0 + h))
                for o, h in zip(over, HEADROOM_GRID, strict=True)
            ]
            seen_total += sum(seen)
        headroom = self.max_headroom
        if seen_total > 0:
            for o, h in zip(over, HEADROOM_GRID, strict=True):
                if h >= self.min_headroom and o <= self.miss_budget * seen_total:
                    headroom = h
                    break
        headroom = min(max(headroom, self.min_headroom), self.max_headroom)
        if forecast > 0:
            still.append([now, forecast, horizon])
        # 4. replicas, scale to zero after an idle period
        last_busy = float(state.get("last_busy", now))
        if window.held_now > 0 or any(r > 0 for r in window.rates):
            last_busy = now
        provision = forecast * (1.0 + headroom)
        q, slo = deployment.slo_quantile, deployment.slo_s
        if self.pooled:
            most = max(deployment.max_replicas, 1)
            want = queueing.replicas_for(mu, provision, slo, q, most)
            if self.max_utilisation < 1.0:  # spare service rate to drain a burst's queue
                want = max(want, math.ceil(provision / (mu * self.max_utilisation) - 1e-9))
        else:
            capacity = queueing.pooled_capacity(mu, 1, slo, q)
            want = math.ceil(provision / capacity - 1e-9)
        idle = (
            window.held_now == 0
            and deployment.scale_to_zero_s is not None
            and now - last_busy >= deployment.scale_to_zero_s
        )
        if idle:
            # the user's idle time wins over the recent peak the forecast still remembers
            want = 0
        elif want == 0:
            want = 1
        new_state.update(
            {
                "level": level,
                "trend": trend,
                "hist": hist,
                "pending": still,
                "over": over,
                "seen": seen_total,
                "last_busy": last_busy,
                "t": now if judged or last_t is None else last_t,
            }
        )
        replicas = _clamp(deployment, want)
        return ScaleDecision(
            replicas,
            self.capacity(deployment, new_state, replicas),
            forecast,
            new_state,
            {"headroom": headroom, "trend_rps_per_s": trend, "service_rps": mu},
            mu if self.pooled else None,
        )


#: Autoscaler names accepted by :func:`make_autoscaler`.
AUTOSCALER_NAMES = ("slo", "knative")


def make_autoscaler(name: str, **options: Any) -> Autoscaler:
    """An autoscaler by name (the static one needs its counts: build it directly)."""
    if name == "slo":
        return SloAutoscaler(**options)
    if name == "knative":
        return KnativeAutoscaler(**options)
    raise PolicyError(f"unknown autoscaler {name!r}; accepted: {', '.join(AUTOSCALER_NAMES)}")

"""Serving in the simulator: request-rate traces, a replica latency model, SLO attainment.

**Traces.** No public request trace ships in an installed package with a licence that allows
redistribution here, so none is bundled; :func:`diurnal_trace` builds a documented synthetic
one instead (seeded): a day compressed to ``period_s`` (the Pollux workloads submit jobs over
~7.7 h, so a compressed day is 8 h by default) shaped ``trough + (1 - trough) * (1 - cos)/2``
(midnight at t = 0), times bursts that arrive as a Poisson process (mean gap
``burst_every_s``), each a lognormal relative size (median ``burst_size``) that rises over
``burst_rise_s`` and decays exponentially with a lognormal time constant (median
``burst_s``); the whole series is scaled so that its maximum is exactly ``peak_rps``.

**Replicas.** One replica is modelled as an M/M/1 server of rate ``service_rps`` fed an equal
share of the requests (round-robin): a request's latency is exponential with rate
``mu - load``, so the q-quantile is ``ln(1/(1-q)) / (mu - load)`` and the fraction within the
SLO ``1 - exp(-(mu - load) * slo)``. That is conservative (a pooled M/M/c queue has a lighter
tail) and has one parameter, set from a measured point of the real runtime
(:meth:`ReplicaModel.from_measurement`). ``ServingConfig(dispatch="pooled")`` models what the
live gateway does instead (least-outstanding routing ~ one M/M/c queue, Erlang C, the math in
:mod:`coadapt.policies.queueing`); the SLO autoscaler must then fit the same model
(``SloAutoscaler(pooled=True)``, ``docs/coschedule.md``). Each latency sample carries the
ready replicas that served it. A replica needs ``ready_s`` after its slot is granted before
it serves (cold start).

**Seconds.** :class:`ServingSimulation` steps each deployment one second at a time inside the
reservations the co-scheduling policy made each round (:meth:`apply`). Requests arrive as
Poisson counts of the trace's rate, spread evenly over the second. Ready replicas serve at
``mu`` each; what they cannot serve waits in a FIFO backlog, and a request misses the SLO when
the work queued ahead of it on arrival takes longer than the SLO to serve (a few requests
carried into the next second delay only its first milliseconds); at
zero replicas the activator holds requests the same way until a replica is ready (the time
from the first held request to the first answer is the *cold start* it reports). Requests
are shed with 503 + Retry-After — counted as errors and as misses, never dropped silently —
when they waited ``queue_timeout_s`` in the backlog (``activator_timeout_s`` if the
activator held them), and, for a deployment the policy capped
because serving alone exceeded the cluster, at once beyond the admitted rate.
The simulation is a :class:`~coadapt.policies.autoscale.DemandSource`: the policy reads the
measured rates and (load, latency-quantile) samples back from it, as the controller would
from live metrics.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from coadapt.policies import queueing
from coadapt.policies.autoscale import DemandWindow, Deployment, LatencySample
from coadapt.policies.coschedule import Reservation
from coadapt.sim.errors import SimInputError, SimulationError

#: Seconds of the default compressed day: the Pollux workloads' submission span (~7.7 h).
COMPRESSED_DAY_S = 8 * 3600.0


@dataclass(frozen=True)
class TraceSpec:
    """The knobs of :func:`diurnal_trace` (see the module docstring)."""

    peak_rps: float
    duration_s: int
    period_s: float = COMPRESSED_DAY_S
    trough: float = 0.2
    burst_every_s: float = 2700.0
    burst_size: float = 0.15
    burst_sigma: float = 0.5
    burst_s: float = 120.0
    burst_rise_s: float = 10.0
    seed: int = 0

    def __post_init__(self) -> None:
        checks = [
            ("peak_rps", self.peak_rps > 0, "requests/s > 0"),
            ("duration_s", self.duration_s >= 1, "seconds >= 1"),
            ("period_s", self.period_s > 0, "seconds > 0"),
            ("trough", 0.0 <= self.trough <= 1.0, "a fraction of the peak in [0, 1]"),
            ("burst_every_s", self.burst_every_s > 0, "seconds > 0"),
            ("burst_size", self.burst_size >= 0, "a relative size >= 0"),
            ("burst_sigma", self.burst_sigma >= 0, ">= 0"),
            ("burst_s", self.burst_s > 0, "seconds > 0"),
            ("burst_rise_s", self.burst_rise_s > 0, "seconds > 0"),
        ]
        for name, ok, accepted in checks:
            if not ok:
                raise SimInputError(
                    f"trace: {name} = {getattr(self, name)!r} is invalid; accepted: {accepted}"
                )


def diurnal_trace(spec: TraceSpec) -> np.ndarray:
    """Requests/s for each second of ``[0, spec.duration_s)`` (see the module docstring)."""
    rng = np.random.default_rng([spec.seed, 17])
    t = np.arange(spec.duration_s, dtype=np.float64)
    day = spec.trough + (1.0 - spec.trough) * 0.5 * (1.0 - np.cos(2 * np.pi * t / spec.period_s))
    burst = np.zeros_like(t)
    at = float(rng.exponential(spec.burst_every_s))
    while at < spec.duration_s:
        size = spec.burst_size * float(rng.lognormal(0.0, spec.burst_sigma))
        tau = spec.burst_s * float(rng.lognormal(0.0, spec.burst_sigma))
        dt = t - at
        rise = np.clip(dt / spec.burst_rise_s, 0.0, 1.0)
        decay = np.exp(-np.maximum(dt - spec.burst_rise_s, 0.0) / tau)
        burst += np.where(dt >= 0, size * rise * decay, 0.0)
        at += float(rng.exponential(spec.burst_every_s))
    rates = day * (1.0 + burst)
    return rates * (spec.peak_rps / float(rates.max()))


@dataclass(frozen=True)
class ReplicaModel:
    """One replica as an M/M/1 server of ``service_rps`` (see the module docstring)."""

    service_rps: float

    def __post_init__(self) -> None:
        if not self.service_rps > 0:
            raise SimInputError(
                f"replica model: service_rps = {self.service_rps!r} is invalid; accepted: > 0"
            )

    @classmethod
    def from_measurement(cls, rps: float, quantile_s: float, q: float = 0.99) -> ReplicaModel:
        """The model through one measured point: ``rps`` per replica at quantile latency."""
        return cls(rps + math.log(1.0 / (1.0 - q)) / quantile_s)

    def latency_quantile(self, load_rps: float, q: float) -> float:
        """The q-quantile latency at ``load_rps`` per replica (inf at or past saturation)."""
        slack = self.service_rps - load_rps
        return math.inf if slack <= 0 else math.log(1.0 / (1.0 - q)) / slack

    def capacity(self, slo_s: float, q: float) -> float:
        """Per-replica requests/s at which the q-quantile latency equals ``slo_s``."""
        return max(self.service_rps - math.log(1.0 / (1.0 - q)) / slo_s, 0.0)

    def within(self, load_rps: float, slo_s: float) -> float:
        """Fraction of requests answered within ``slo_s`` at ``load_rps`` per replica."""
        slack = self.service_rps - load_rps
        return 0.0 if slack <= 0 else 1.0 - math.exp(-slack * slo_s)

    def pooled_beyond(self, replicas: int, total_rps: float, t: float) -> float:
        """P(latency > t) when ``replicas`` serve ``total_rps`` from one queue (M/M/c, FCFS):
        the gateway routes each request to the replica with the fewest outstanding, which
        behaves like a pooled queue, not like ``replicas`` separate ones (Erlang C;
        :mod:`coadapt.policies.queueing`)."""
        return queueing.pooled_beyond(self.service_rps, replicas, total_rps, t)

    def pooled_quantile(self, replicas: int, total_rps: float, q: float) -> float:
        """The q-quantile latency of :meth:`pooled_beyond` (inf at or past saturation)."""
        return queueing.pooled_quantile(self.service_rps, replicas, total_rps, q)

    def pooled_capacity(self, replicas: int, slo_s: float, q: float) -> float:
        """Total requests/s ``replicas`` pooled replicas serve within the SLO quantile."""
        return queueing.pooled_capacity(self.service_rps, replicas, slo_s, q)


@dataclass(frozen=True)
class ServingConfig:
    """Mechanism knobs of :class:`ServingSimulation`."""

    sample_every_s: int = 10  # one (load, latency-quantile) sample per this many seconds
    latency_noise: float = 0.05  # lognormal sigma of a measured quantile
    queue_timeout_s: float = 30.0  # a queued request waiting this long is shed (503)
    activator_timeout_s: float = 120.0  # the same for one held at zero replicas (cold start)
    seed: int = 0
    # "pooled": least-outstanding routing as the live gateway does (M/M/c); "split": requests
    # spread evenly over separate M/M/1 replicas (the model before; more pessimistic)
    dispatch: Literal["pooled", "split"] = "split"
    # "fluid": a request misses when the backlog ahead of it when it arrives (arrivals spread
    # over the second) takes longer than the SLO to serve; "second": every request of a
    # second that starts with a backlog, or overflows, misses (the rule before)
    backlog_misses: Literal["fluid", "second"] = "fluid"

    def __post_init__(self) -> None:
        for name, value, accepted in (
            ("dispatch", self.dispatch, ("pooled", "split")),
            ("backlog_misses", self.backlog_misses, ("fluid", "second")),
        ):
            if value not in accepted:
                raise SimInputError(
                    f"serving config: {name} = {value!r} is invalid; accepted: "
                    f"{', '.join(accepted)}"
                )


@dataclass
class _Dep:
    spec: Deployment
    rates: np.ndarray
    model: ReplicaModel
    rng: np.random.Generator
    ready_at: list[float] = field(default_factory=list)  # per reserved replica: serves from
    admit_rps: float | None = None
    # [arrival second, requests, shed at this second]
    backlog: deque[list[float]] = field(default_factory=deque)
    held_since: float | None = None  # first request held with no replica ready
    cold_starts: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class ServingRecord:
    """Per-second series of one deployment, and its totals."""

    name: str
    rate: np.ndarray  # the trace's expected requests/s
    arrivals: np.ndarray
    within: np.ndarray  # requests answered within the SLO
    shed: np.ndarray  # 503 + Retry-After
    ready: np.ndarray  # replicas serving
    reserved: np.ndarray  # slots held (ready or starting)
    need: np.ndarray  # replicas the expected rate needs at the SLO (true capacity)
    cold_starts: tuple[float, ...]

    @property
    def requests(self) -> int:
        return int(self.arrivals.sum())

    @property
    def attainment(self) -> float:
        total = self.arrivals.sum()
        return float(self.within.sum() / total) if total else 1.0

    @property
    def errors(self) -> int:
        return int(self.shed.sum())

    def scale_up_delays(self) -> list[float]:
        """Seconds from each rise of the needed replicas above the ready ones until enough
        are ready (0 when capacity was there first, not counted)."""
        delays: list[float] = []
        n = len(self.need)
        t = 1
        while t < n:
            if self.need[t] > self.need[t - 1] and self.need[t] > self.ready[t]:
                target = self.need[t]
                s = t
                while s < n and self.ready[s] < target:
                    s += 1
                delays.append(float(s - t))
            t += 1
        return delays


class ServingSimulation:
    """Deployments served second by second inside the policy's reservations (module doc)."""

    def __init__(
        self,
        deployments: Sequence[Deployment],
        rates: Mapping[str, np.ndarray],
        models: Mapping[str, ReplicaModel],
        config: ServingConfig | None = None,
    ) -> None:
        self.config = config or ServingConfig()
        self.now = 0
        self._deps: dict[str, _Dep] = {}
        for i, dep in enumerate(deployments):
            if dep.name not in rates or dep.name not in models:
                raise SimInputError(
                    f"serving: deployment {dep.name!r} needs a rate trace and a replica model"
                )
            series = np.asarray(rates[dep.name], dtype=np.float64)
            if series.ndim != 1 or np.any(series < 0) or not np.all(np.isfinite(series)):
                raise SimInputError(f"serving: trace of {dep.name!r} must be rates >= 0 per second")
            self._deps[dep.name] = _Dep(
                dep,
                series,
                models[dep.name],
                np.random.default_rng([self.config.seed, i]),
            )
        horizon = min(len(d.rates) for d in self._deps.values()) if self._deps else 0
        self.horizon = horizon
        size = horizon
        self._arr = {k: np.zeros(size) for k in self._deps}
        self._within = {k: np.zeros(size) for k in self._deps}
        self._shed = {k: np.zeros(size) for k in self._deps}
        self._ready = {k: np.zeros(size, dtype=np.int64) for k in self._deps}
        self._reserved = {k: np.zeros(size, dtype=np.int64) for k in self._deps}
        self._samples: dict[str, list[tuple[int, LatencySample]]] = {k: [] for k in self._deps}

    # ------------------------------------------------------------ mechanism
    def apply(
        self, now: float, reservations: Mapping[str, Reservation], warm: bool = False
    ) -> None:
        """Take the round's reservations at ``now``: new slots serve after the deployment's
        ``ready_s`` (at once with ``warm``, for the initial state), removed ones stop."""
        for name, dep in self._deps.items():
            res = reservations.get(name)
            if res is None:
                continue
            ready_at = sorted(dep.ready_at)
            if res.slots < len(ready_at):
                ready_at = ready_at[: res.slots]  # the not-yet-ready ones go first
            start = now if warm else now + dep.spec.ready_s
            ready_at += [start] * (res.slots - len(ready_at))
            dep.ready_at = ready_at
            dep.admit_rps = res.admit_rps

    def advance_to(self, end: float) -> None:
        """Serve every second of ``[self.now, end)``."""
        stop = math.ceil(end)
        if stop > self.horizon:
            raise SimulationError(
                f"serving: the simulation reached {stop} s but the request traces end at "
                f"{self.horizon} s; generate longer traces (duration_s)"
            )
        for s in range(self.now, stop):
            for name, dep in self._deps.items():
                self._second(name, dep, s)
        self.now = max(self.now, stop)

    def _second(self, name: str, dep: _Dep, s: int) -> None:
        cfg = self.config
        mu = dep.model.service_rps
        arrivals = float(dep.rng.poisson(dep.rates[s]))
        ready = sum(1 for t in dep.ready_at if t <= s)
        self._ready[name][s] = ready
        self._reserved[name][s] = len(dep.ready_at)
        self._arr[name][s] = arrivals
        shed = 0.0
        if dep.admit_rps is not None and arrivals > dep.admit_rps:
            shed += arrivals - dep.admit_rps
            arrivals = dep.admit_rps
        backlog = dep.backlog
        capacity = ready * mu
        queued = sum(b[1] for b in backlog)
        within = self._in_slo(dep, ready, arrivals, queued) if arrivals > 0 else 0.0
        served_old = 0.0
        while backlog and capacity > 0:
            take = min(backlog[0][1], capacity)
            backlog[0][1] -= take
            capacity -= take
            served_old += take
            if backlog[0][1] <= 1e-9:
                backlog.popleft()
        if ready > 0 and dep.held_since is not None and served_old > 0:
            dep.cold_starts.append(s - dep.held_since)
            dep.held_since = None
        if backlog or capacity <= 0:
            if arrivals > 0:
                wait = cfg.activator_timeout_s if ready == 0 else cfg.queue_timeout_s
                backlog.append([float(s), arrivals, s + wait])
                if ready == 0 and dep.held_since is None:
                    dep.held_since = float(s)
        else:
            load = (served_old + arrivals) / ready
            now_served = min(arrivals, capacity)
            if arrivals > now_served:
                backlog.append([float(s), arrivals - now_served, s + cfg.queue_timeout_s])
            if s % cfg.sample_every_s == 0 and load < mu:
                q = dep.spec.slo_quantile
                if cfg.dispatch == "pooled":
                    lat = dep.model.pooled_quantile(ready, load * ready, q)
                else:
                    lat = dep.model.latency_quantile(load, q)
                noisy = lat * float(dep.rng.lognormal(0.0, cfg.latency_noise))
                self._samples[name].append((s, LatencySample(load, noisy, ready)))
        while backlog and s >= backlog[0][2]:
            shed += backlog.popleft()[1]
        self._within[name][s] = within
        self._shed[name][s] = shed

    def _in_slo(self, dep: _Dep, ready: int, arrivals: float, queued: float) -> float:
        """Requests of this second answered within the SLO, ``queued`` waiting before it."""
        if ready <= 0:
            return 0.0
        slo = dep.spec.slo_s
        mu = dep.model.service_rps
        cap = ready * mu
        if self.config.backlog_misses == "second":
            if queued > 0 or arrivals > cap:
                return 0.0
            return arrivals * self._tail_within(dep, ready, arrivals)
        # fluid: arrivals spread over the second; the one arriving at x waits for the work
        # ahead of it, q(x) = queued + (arrivals - cap) x (at least 0), served at cap
        if arrivals < cap:
            late = 0.0 if queued <= cap * slo else (queued - cap * slo) / (cap - arrivals)
            ok = max(0.0, 1.0 - late)
            return arrivals * ok * self._tail_within(dep, ready, arrivals)
        if queued > cap * slo:
            return 0.0
        ok = 1.0 if arrivals == cap else min(1.0, (cap * slo - queued) / (arrivals - cap))
        return arrivals * ok  # the ones in time wait less than the SLO; saturated, no tail

    def _tail_within(self, dep: _Dep, ready: int, arrivals: float) -> float:
        """Share within the SLO of a queue in steady state at this second's load."""
        if self.config.dispatch == "pooled":
            return 1.0 - dep.model.pooled_beyond(ready, arrivals, dep.spec.slo_s)
        return dep.model.within(arrivals / ready, dep.spec.slo_s)

    # ------------------------------------------------------------ DemandSource
    def window(self, deployment: str, start: float, end: float) -> DemandWindow:
        """Measured arrivals per second and latency samples over ``[start, end)``."""
        if deployment not in self._deps:
            raise SimInputError(f"serving: unknown deployment {deployment!r}")
        lo = max(math.floor(start), 0)
        hi = min(math.ceil(end), self.now)
        rates = tuple(float(x) for x in self._arr[deployment][lo:hi]) if hi > lo else ()
        samples = tuple(x for s, x in self._samples[deployment] if lo <= s < hi)
        replicas = int(self._ready[deployment][hi - 1]) if hi > 0 else 0
        return DemandWindow(end=float(end), rates=rates, samples=samples, replicas=replicas)

    # ------------------------------------------------------------ results
    def _need(self, dep: _Dep, rate: np.ndarray) -> np.ndarray:
        """Replicas each second's expected rate needs at the SLO (the true capacity): split,
        ``ceil(rate / capacity)``; pooled, the least count whose M/M/c quantile meets it."""
        slo, q = dep.spec.slo_s, dep.spec.slo_quantile
        cap = dep.model.capacity(slo, q)
        if cap <= 0:
            return np.zeros(len(rate), dtype=np.int64)
        split = np.ceil(rate / cap - 1e-9).astype(np.int64)
        if self.config.dispatch != "pooled" or len(rate) == 0:
            return split
        most = int(split.max()) if len(split) else 0
        # the pool's capacity grows with its size: most[c - 1] = what c replicas serve
        pool = np.array([dep.model.pooled_capacity(c, slo, q) for c in range(1, most + 1)])
        need = np.searchsorted(pool, rate - 1e-9, side="left") + 1
        return np.where(rate > 0, need, 0).astype(np.int64)

    def records(self) -> dict[str, ServingRecord]:
        """Each deployment's series up to the current second."""
        out: dict[str, ServingRecord] = {}
        n = self.now
        for name, dep in self._deps.items():
            rate = dep.rates[:n]
            need = self._need(dep, rate)
            out[name] = ServingRecord(
                name=name,
                rate=rate,
                arrivals=self._arr[name][:n],
                within=self._within[name][:n],
                shed=self._shed[name][:n],
                ready=self._ready[name][:n],
                reserved=self._reserved[name][:n],
                need=need,
                cold_starts=tuple(dep.cold_starts),
            )
        return out

"""The contract between the controller and a deployment's gateway.

A deployment's clients talk to one stable address, its *gateway* (:mod:`coadapt.serve.gateway`):
a small process that forwards each request to a ready replica (a ``coadapt serve`` process on a
slot the scheduler granted), holds requests while there is none (the activator: scale to zero
and back), sheds what the scheduler could not grant with 503 + ``Retry-After``, and measures
what the autoscaler needs: offered requests per second and the latency quantile of the SLO.

The two sides share only plain data, so a controller killed and restarted finds its gateways
still serving and re-reads their figures:

* controller -> gateway: a :class:`RouteTable`, written atomically as JSON to
  ``<gateway run dir>/ROUTES_FILE``; the gateway re-reads it when its mtime changes (polling a
  few times a second) and keeps serving with the last good one when a new one is unreadable;
* gateway -> controller: ``GET STATS_PATH?since=T`` on the gateway's port answers a
  :class:`GatewayStats` for the complete seconds ``>= T``, which :func:`demand_window` turns into
  the policies' :class:`~coadapt.policies.autoscale.DemandWindow`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from coadapt.atomicfile import atomic_write
from coadapt.policies.autoscale import DemandWindow, LatencySample

ROUTES_FILE = "routes.json"
STATS_PATH = "/-/stats"
HEALTH_PATH = "/-/healthz"
KEEP_SECONDS = 600  # the gateway keeps this many seconds of per-second figures


class RouteError(ValueError):
    """A route table or a stats document is malformed; the message names the field."""


def _field(data: Mapping[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    if name not in data:
        raise RouteError(f"{what}: field {name!r} is missing")
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise RouteError(f"{what}: field {name!r} = {value!r} has the wrong type")
    return value


@dataclass(frozen=True)
class Backend:
    """One ready replica the gateway may send requests to."""

    replica: str  # the replica's id in the controller's database (stable, for logs and stats)
    host: str
    port: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Backend:
        what = "route table backend"
        port = _field(data, "port", int, what)
        if not 0 < port < 65536:
            raise RouteError(f"{what}: field 'port' = {port} is not a TCP port")
        return cls(str(_field(data, "replica", str, what)), _field(data, "host", str, what), port)


@dataclass(frozen=True)
class RouteTable:
    """What the controller tells a gateway; a new ``generation`` each time it changes."""

    deployment: str
    model: str  # the model name in ``/v1/models/{model}:predict`` on the replicas
    generation: int
    backends: tuple[Backend, ...] = ()
    admit_rps: float | None = None  # None: admit all; else shed beyond it with 503
    retry_after_s: float = 60.0  # what a shed request's Retry-After says
    hold_s: float = 120.0  # activator: how long a request waits for a first ready replica
    slo_s: float = 0.05  # the latency the gateway counts requests within
    slo_quantile: float = 0.99  # the quantile it reports per second

    def __post_init__(self) -> None:
        what = f"route table of {self.deployment!r}"
        if self.admit_rps is not None and not (
            math.isfinite(self.admit_rps) and self.admit_rps >= 0
        ):
            raise RouteError(f"{what}: field 'admit_rps' = {self.admit_rps!r} must be >= 0 or null")
        for name in ("retry_after_s", "hold_s", "slo_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise RouteError(f"{what}: field {name!r} = {v!r} must be > 0")
        if not 0.5 <= self.slo_quantile < 1.0:
            raise RouteError(
                f"{what}: field 'slo_quantile' = {self.slo_quantile!r} not in [0.5, 1)"
            )

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["backends"] = list(out["backends"])
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RouteTable:
        what = "route table"
        if not isinstance(data, Mapping):
            raise RouteError(f"{what}: expected an object, got {type(data).__name__}")
        backends = _field(data, "backends", (list, tuple), what)
        admit = data.get("admit_rps")
        if admit is not None and (isinstance(admit, bool) or not isinstance(admit, int | float)):
            raise RouteError(f"{what}: field 'admit_rps' = {admit!r} has the wrong type")
        floats = {}
        for name in ("retry_after_s", "hold_s", "slo_s", "slo_quantile"):
            if name in data:
                floats[name] = float(_field(data, name, (int, float), what))
        return cls(
            deployment=_field(data, "deployment", str, what),
            model=_field(data, "model", str, what),
            generation=_field(data, "generation", int, what),
            backends=tuple(Backend.from_json(b) for b in backends),
            admit_rps=None if admit is None else float(admit),
            **floats,
        )

    def write(self, run_dir: str | os.PathLike[str]) -> Path:
        """Atomically replace ``run_dir/ROUTES_FILE`` (a reader never sees half a table)."""
        path = Path(run_dir) / ROUTES_FILE
        atomic_write(path, json.dumps(self.to_json(), sort_keys=True).encode())
        return path

    @classmethod
    def read(cls, run_dir: str | os.PathLike[str]) -> RouteTable:
        path = Path(run_dir) / ROUTES_FILE
        try:
            return cls.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as exc:
            raise RouteError(f"cannot read the route table {path}: {exc}") from exc


@dataclass(frozen=True)
class SecondStats:
    """What the gateway saw in one wall-clock second (``t`` = its integer Unix time).

    A request counts in the second it *arrived*: ``offered`` = ``served`` + ``shed`` +
    ``errors`` + those still held when the second was reported (which count when answered).
    """

    t: int
    offered: int = 0  # arrived (held, shed and failed included): the demand
    served: int = 0  # answered 2xx by a replica
    within_slo: int = 0  # of the served, answered within slo_s (gateway-measured, end to end)
    shed: int = 0  # answered 503 by the gateway (beyond admit_rps, or held past hold_s)
    errors: int = 0  # a replica failed or answered 5xx
    held: int = 0  # arrived while no replica was ready (waited in the activator)
    latency_q_s: float | None = None  # the slo_quantile of served latencies in this second
    backends: int = 0  # ready replicas during this second (the most seen)


@dataclass(frozen=True)
class GatewayStats:
    """``GET STATS_PATH?since=T``: the gateway's figures since ``T`` and its state now."""

    deployment: str
    generation: int  # of the route table in force
    now: float
    seconds: tuple[SecondStats, ...] = ()  # complete seconds >= since, oldest first
    backends: int = 0  # ready replicas now
    held_now: int = 0  # requests waiting in the activator now
    cold_starts_s: tuple[float, ...] = ()  # per zero -> ready: first held arrival -> answered
    totals: dict[str, int] = field(default_factory=dict)  # since start: offered, served, ...

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GatewayStats:
        what = "gateway stats"
        if not isinstance(data, Mapping):
            raise RouteError(f"{what}: expected an object, got {type(data).__name__}")
        names = {f for f in SecondStats.__dataclass_fields__}
        try:
            seconds = tuple(
                SecondStats(**{k: v for k, v in s.items() if k in names})
                for s in _field(data, "seconds", (list, tuple), what)
            )
        except (TypeError, AttributeError) as exc:
            raise RouteError(f"{what}: field 'seconds' is malformed: {exc}") from exc
        return cls(
            deployment=_field(data, "deployment", str, what),
            generation=_field(data, "generation", int, what),
            now=float(_field(data, "now", (int, float), what)),
            seconds=seconds,
            backends=int(data.get("backends", 0)),
            held_now=int(data.get("held_now", 0)),
            cold_starts_s=tuple(float(x) for x in data.get("cold_starts_s", ())),
            totals={str(k): int(v) for k, v in dict(data.get("totals", {})).items()},
        )


def demand_window(
    seconds: Sequence[SecondStats], start: float, end: float, replicas: int, held_now: int = 0
) -> DemandWindow:
    """The autoscaler's view of ``[start, end)``: offered requests/s for every second ``t``
    with ``floor(start) <= t < floor(end)`` (so consecutive windows cover every second exactly
    once, and a second still running at ``end`` waits for the next window; a second the gateway
    did not report had no request) and, for each second with served requests on ready
    replicas, a (per-replica load, latency quantile, ready replicas) sample: the gateway
    routes least-outstanding over all its backends, so they served that second as one pool
    (:class:`~coadapt.policies.autoscale.LatencySample`); ``held_now``: requests the
    activator holds now (:attr:`GatewayStats.held_now`)."""
    by_t = {s.t: s for s in seconds}
    first, last = math.floor(start), math.floor(end)
    rates = tuple(float(by_t[t].offered) if t in by_t else 0.0 for t in range(first, last))
    samples = tuple(
        LatencySample(
            load_rps=s.served / s.backends, latency_s=s.latency_q_s, replicas=int(s.backends)
        )
        for s in (by_t[t] for t in range(first, last) if t in by_t)
        if s.served > 0 and s.backends > 0 and s.latency_q_s is not None
    )
    return DemandWindow(end=end, rates=rates, samples=samples, replicas=replicas, held_now=held_now)

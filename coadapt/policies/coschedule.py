"""One policy for serving and training: deployments first, any training policy on the rest.

:class:`CoSchedulePolicy` wraps a training policy (``pollux`` by default in the benchmark).
Each round it

1. asks each deployment's :class:`~coadapt.policies.autoscale.Autoscaler` how many replicas the
   next ``round_s + ready_s`` seconds need (the demand comes from a
   :class:`~coadapt.policies.autoscale.DemandSource`: a trace in the simulator, measured
   request rates live);
2. grants them in priority order (higher ``priority`` first, then name), serving before
   training: a deployment gets what it asks up to what the cluster has left. A deployment
   granted less than it asked is *capped*: the mechanism must shed its demand beyond the
   granted capacity with 503 + Retry-After (``admit_rps``, ``retry_after_s`` in its
   :class:`Reservation`), never let it time out silently;
3. places the granted slots on nodes: a deployment keeps the slots it had (warm replicas),
   shrinks off the nodes where it holds least, grows onto free slots first, then next to
   other serving slots, then onto the nodes with the fewest training GPUs;
4. hands the inner policy the snapshot with those slots removed from the nodes and the
   training jobs' current allocations clipped to fit (latest-submitted job first): shrinking a
   training job is the ordinary restart-rescale, nothing special;
5. with ``spare_share`` > 0, turns slots training left idle into warm spare replicas (up to
   that share of each grant): free for training this round, given back first next round.

With ``full_round_s``, rounds of ``round_s`` between full ones are *serving rounds*, the live
controller's: the autoscalers decide, serving only grows, training is left as it is when
serving fits beside it, and a full round runs instead when serving needs training's slots,
every ``full_round_s``, or when the set of jobs changed.

The static partition is this wrapper with a :class:`~coadapt.policies.autoscale.StaticAutoscaler`
sized for the peak; the Knative-style baseline is it with the
:class:`~coadapt.policies.autoscale.KnativeAutoscaler`, which asks without regard to training.
Pure and deterministic: the wrapper's memory (each autoscaler's state, the placements) and the
inner policy's state live in the JSON state; :func:`reservations_of` reads the serving part
back for the mechanism.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from coadapt.policies.autoscale import (
    Autoscaler,
    DemandSource,
    Deployment,
    DeploymentError,
)
from coadapt.policies.base import (
    Allocation,
    BatchMode,
    ClusterSnapshot,
    Decision,
    NodeInfo,
    Policy,
    PolicyError,
    PolicyState,
    validate_allocations,
)
from coadapt.policies.queueing import pooled_capacity


@dataclass(frozen=True)
class Reservation:
    """What a deployment holds for the next round."""

    slots: int  # replicas granted (one slot each)
    desired: int  # replicas its autoscaler asked for
    placement: dict[str, int]  # node name -> slots
    capacity_rps: float  # per-replica requests/s at the SLO the autoscaler believes
    admit_rps: float | None  # capped: admit at most this (None: admit everything)
    retry_after_s: float  # what a shed request's Retry-After says

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Reservation:
        admit = data.get("admit_rps")
        placement = data.get("placement", {})
        if not isinstance(placement, Mapping):
            raise PolicyError("stored reservation: 'placement' must be a mapping")
        return cls(
            slots=int(data["slots"]),  # type: ignore[call-overload]
            desired=int(data["desired"]),  # type: ignore[call-overload]
            placement={str(k): int(v) for k, v in placement.items()},
            capacity_rps=float(data["capacity_rps"]),  # type: ignore[arg-type]
            admit_rps=None if admit is None else float(admit),  # type: ignore[arg-type]
            retry_after_s=float(data["retry_after_s"]),  # type: ignore[arg-type]
        )


def reservations_of(state: Mapping[str, object]) -> dict[str, Reservation]:
    """The reservations a :class:`CoSchedulePolicy` decision put in its state."""
    serving = state.get("serving", {})
    if not isinstance(serving, Mapping):
        raise PolicyError("co-scheduling state: 'serving' must be a mapping")
    out: dict[str, Reservation] = {}
    for name, entry in serving.items():
        if isinstance(entry, Mapping) and "reservation" in entry:
            out[str(name)] = Reservation.from_json(entry["reservation"])
    return out


class CoSchedulePolicy:
    """Serving deployments and training jobs on one cluster (see the module docstring)."""

    def __init__(
        self,
        inner: Policy,
        deployments: Sequence[Deployment],
        autoscaler: Autoscaler,
        demand: DemandSource,
        round_s: float = 60.0,
        full_round_s: float | None = None,
        spare_share: float = 0.0,
    ) -> None:
        names = [d.name for d in deployments]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise DeploymentError(f"deployment names must be unique; repeated: {', '.join(dup)}")
        if not round_s > 0:
            raise PolicyError(f"round_s: {round_s!r} is invalid; accepted: seconds > 0")
        if full_round_s is not None and not full_round_s >= round_s:
            raise PolicyError(
                f"full_round_s: {full_round_s!r} is invalid; accepted: seconds >= round_s "
                f"({round_s!r}), or None for a full round every round"
            )
        if not 0.0 <= spare_share <= 10.0:
            raise PolicyError(
                f"spare_share: {spare_share!r} is invalid; accepted: a fraction of the grant "
                "in [0, 10] (0: no spare replicas)"
            )
        self.inner = inner
        self.spare_share = float(spare_share)
        self.deployments = tuple(sorted(deployments, key=lambda d: (-d.priority, d.name)))
        self.autoscaler = autoscaler
        self.demand = demand
        self.round_s = float(round_s)
        self.full_round_s = None if full_round_s is None else float(full_round_s)
        self.name = f"{autoscaler.name}+{inner.name}"
        self.batch_mode: BatchMode = inner.batch_mode

    # ------------------------------------------------------------------ serving
    def plan(
        self, snapshot: ClusterSnapshot, state: PolicyState, grow_only: bool = False
    ) -> tuple[dict[str, Reservation], PolicyState, dict[str, float]]:
        """Each deployment's reservation for the next round, the serving state, diagnostics.

        ``grow_only`` (a serving round between full rounds): a deployment keeps at least the
        slots it holds, since slots it gave back would sit idle until training is decided."""
        prev = state.get("serving", {})
        last = state.get("last_now")
        start = float(last) if last is not None else max(snapshot.now - self.round_s, 0.0)
        free = snapshot.total_gpus
        grants: list[tuple[Deployment, int, int, float]] = []
        serving_state: PolicyState = {}
        diags: dict[str, float] = {}
        for dep in self.deployments:
            entry = prev.get(dep.name, {})
            window = self.demand.window(dep.name, start, snapshot.now)
            horizon = self.round_s + dep.ready_s
            decision = self.autoscaler.decide(
                dep, window, entry.get("autoscaler", {}), snapshot.now, horizon
            )
            want = max(0, int(decision.replicas))
            if grow_only:
                held_before = entry.get("reservation", {}).get("slots", 0)
                want = max(want, int(held_before))
            grant = min(want, free)
            free -= grant
            cap = float(decision.capacity_rps)
            if 0 < grant < want and decision.service_rps is not None:
                # a pooled model: the per-replica capacity of a smaller pool is lower
                pool = pooled_capacity(decision.service_rps, grant, dep.slo_s, dep.slo_quantile)
                cap = pool / grant
            grants.append((dep, want, grant, cap))
            serving_state[dep.name] = {"autoscaler": decision.state}
            key = f"serving.{dep.name}"
            diags[f"{key}.desired"] = float(want)
            diags[f"{key}.slots"] = float(grant)
            diags[f"{key}.forecast_rps"] = float(decision.forecast_rps)
            diags[f"{key}.capacity_rps"] = float(decision.capacity_rps)
            for k, v in decision.diagnostics.items():
                diags[f"{key}.{k}"] = float(v)
        placements = _place(snapshot, grants, prev)
        out: dict[str, Reservation] = {}
        for dep, want, grant, cap in grants:
            res = Reservation(
                slots=grant,
                desired=want,
                placement=placements[dep.name],
                capacity_rps=cap,
                admit_rps=grant * cap if grant < want else None,
                retry_after_s=self.round_s + dep.ready_s,
            )
            out[dep.name] = res
            serving_state[dep.name]["reservation"] = res.to_json()
        return out, serving_state, diags

    # ------------------------------------------------------------------ policy
    def optimize(
        self, snapshot: ClusterSnapshot, state: PolicyState, rng: np.random.Generator
    ) -> Decision:
        """A full round, or with ``full_round_s`` a serving round while no full one is due."""
        if self.full_round_s is not None and not self._full_due(snapshot, state):
            served = self._serving_round(snapshot, state)
            if served is not None:
                return served
        return self._full_round(snapshot, state, rng)

    def _full_due(self, snapshot: ClusterSnapshot, state: PolicyState) -> bool:
        """A full round is due every ``full_round_s``, and at once when the set of jobs changed
        (the live controller's prompt round on a submission or a completion)."""
        last = state.get("last_full")
        if last is None or "packed" not in state or self.full_round_s is None:
            return True
        if sorted(snapshot.jobs) != sorted(state.get("jobs", [])):
            return True
        return snapshot.now - float(last) >= self.full_round_s - 1e-6

    def _serving_round(self, snapshot: ClusterSnapshot, state: PolicyState) -> Decision | None:
        """Serving alone, training untouched: what the autoscalers want (never less than they
        hold) if it fits beside the training allocations; None when it needs training's
        slots, and a full round must decide both (the live controller's serving round)."""
        reservations, serving_state, diags = self.plan(snapshot, state, grow_only=True)
        held = self._held(snapshot, reservations)
        packed = {str(k): str(v) for k, v in dict(state.get("packed", {})).items()}
        current = {k: tuple(int(x) for x in a) for k, a in snapshot.current.items() if any(a)}
        packed = {g: h for g, h in packed.items() if g in current and h in current}
        used = held.copy()
        for job, alloc in current.items():
            if job not in packed:
                used += np.asarray(alloc, dtype=np.int64)
        caps = np.array([n.gpus for n in snapshot.nodes], dtype=np.int64)
        if np.any(used > caps):
            return None
        _check_total(snapshot, current, packed, held)
        diags["serving.slots"] = float(held.sum())
        diags["serving.round"] = 1.0
        return Decision(
            allocations=current,
            state={
                **state,
                "serving": serving_state,
                "last_now": snapshot.now,
                "packed": packed,
            },
            diagnostics=diags,
            packed=packed,
        )

    def _add_spares(
        self,
        snapshot: ClusterSnapshot,
        reservations: dict[str, Reservation],
        serving_state: PolicyState,
        held: np.ndarray,
        allocations: Mapping[str, Allocation],
        packed: Mapping[str, str],
    ) -> np.ndarray:
        """Slots training left idle this round become warm spare replicas, up to
        ``spare_share`` of each grant (priority order): they cost training nothing now, cover
        a burst before the next decision, and are the first thing given back (a spare is not
        part of the next round's grant). Updates ``reservations`` and ``serving_state``."""
        caps = np.array([n.gpus for n in snapshot.nodes], dtype=np.int64)
        used = held.copy()
        for job, alloc in allocations.items():
            if job not in packed:
                used += np.asarray(alloc, dtype=np.int64)
        spare = caps - used
        held = held.copy()
        for dep in self.deployments:
            res = reservations[dep.name]
            want = min(
                math.ceil(self.spare_share * res.slots - 1e-9),
                dep.max_replicas - res.slots,
                int(spare.sum()),
            )
            if want <= 0 or res.admit_rps is not None:
                continue
            row = {n.name: 0 for n in snapshot.nodes}
            for _ in range(want):
                # beside the deployment's own slots first, then where most is spare
                cand = np.flatnonzero(spare > 0)
                mine = np.array([res.placement.get(snapshot.nodes[i].name, 0) for i in cand])
                i = int(cand[np.lexsort((cand, -spare[cand], -mine))[0]])
                spare[i] -= 1
                held[i] += 1
                row[snapshot.nodes[i].name] += 1
            placement = dict(res.placement)
            for node, k in row.items():
                if k:
                    placement[node] = placement.get(node, 0) + k
            res = dataclasses.replace(res, slots=res.slots + want, placement=placement)
            reservations[dep.name] = res
            serving_state[dep.name]["reservation"] = res.to_json()
        return held

    @staticmethod
    def _held(snapshot: ClusterSnapshot, reservations: Mapping[str, Reservation]) -> np.ndarray:
        held = np.zeros(len(snapshot.nodes), dtype=np.int64)
        index = {n.name: i for i, n in enumerate(snapshot.nodes)}
        for res in reservations.values():
            for node, k in res.placement.items():
                held[index[node]] += k
        return held

    def _full_round(
        self, snapshot: ClusterSnapshot, state: PolicyState, rng: np.random.Generator
    ) -> Decision:
        reservations, serving_state, diags = self.plan(snapshot, state)
        held = self._held(snapshot, reservations)
        reduced = training_snapshot(snapshot, held)
        inner_state = state.get("inner", {})
        allocations: dict[str, Allocation] = {}
        packed: dict[str, str] = {}
        if reduced.total_gpus > 0 and reduced.jobs:
            inner = self.inner.optimize(reduced, inner_state, rng)
            try:
                validate_allocations(reduced, inner.allocations, inner.packed)
            except PolicyError as exc:
                raise PolicyError(f"inner policy {self.inner.name}: {exc}") from exc
            allocations = {k: tuple(int(x) for x in a) for k, a in inner.allocations.items()}
            packed = dict(inner.packed)
            inner_state = inner.state
            diags.update(inner.diagnostics)
        if self.spare_share > 0:
            held = self._add_spares(
                snapshot, reservations, serving_state, held, allocations, packed
            )
        _check_total(snapshot, allocations, packed, held)
        diags["serving.slots"] = float(held.sum())
        new_state: PolicyState = {
            "inner": inner_state,
            "serving": serving_state,
            "last_now": snapshot.now,
        }
        if self.full_round_s is not None:
            # what a serving round needs to leave training as it is
            new_state.update(
                {"last_full": snapshot.now, "packed": packed, "jobs": sorted(snapshot.jobs)}
            )
        return Decision(
            allocations=allocations,
            state=new_state,
            diagnostics=diags,
            packed=packed,
        )


def training_snapshot(snapshot: ClusterSnapshot, held: np.ndarray) -> ClusterSnapshot:
    """``snapshot`` with ``held`` slots per node taken out (node order kept, so allocations
    map back one to one) and the jobs' current allocations clipped to the rest, latest
    submitted job first."""
    caps = np.array([n.gpus for n in snapshot.nodes], dtype=np.int64) - held
    if np.any(caps < 0):
        raise PolicyError("serving reservations exceed a node's capacity")
    nodes = tuple(
        NodeInfo(n.name, int(c), n.gpu_type) for n, c in zip(snapshot.nodes, caps, strict=True)
    )
    current = {k: np.asarray(v, dtype=np.int64).copy() for k, v in snapshot.current.items()}
    order = [j for j in snapshot.jobs if j in current][::-1]
    used = sum((current[j] for j in order), np.zeros(len(nodes), dtype=np.int64))
    for i in np.flatnonzero(used > caps):
        excess = int(used[i] - caps[i])
        for j in order:
            if excess <= 0:
                break
            take = min(excess, int(current[j][i]))
            current[j][i] -= take
            excess -= take
    clipped = {k: tuple(int(x) for x in v) for k, v in current.items() if v.any()}
    total = int(caps.sum())
    jobs = {
        name: dataclasses.replace(
            info,
            max_replicas=max(1, min(info.max_replicas, total)),
            min_replicas=min(info.min_replicas, max(1, min(info.max_replicas, total))),
        )
        for name, info in snapshot.jobs.items()
    }
    return dataclasses.replace(snapshot, nodes=nodes, current=clipped, jobs=jobs)


def _place(
    snapshot: ClusterSnapshot,
    grants: Sequence[tuple[Deployment, int, int, float]],
    prev: Mapping[str, object],
) -> dict[str, dict[str, int]]:
    """Node placement of each grant (see the module docstring, step 3)."""
    width = len(snapshot.nodes)
    caps = np.array([n.gpus for n in snapshot.nodes], dtype=np.int64)
    train = np.zeros(width, dtype=np.int64)
    for alloc in snapshot.current.values():
        train += np.asarray(alloc, dtype=np.int64)
    serving = np.zeros(width, dtype=np.int64)
    rows: dict[str, np.ndarray] = {}
    # keep what each deployment had, shrinking off its least-used nodes
    for dep, _, grant, _ in grants:
        row = np.zeros(width, dtype=np.int64)
        entry = prev.get(dep.name, {})
        old = entry.get("reservation", {}).get("placement", {}) if isinstance(entry, dict) else {}
        for i, n in enumerate(snapshot.nodes):
            row[i] = min(int(old.get(n.name, 0)), int(caps[i] - serving[i]))
        while row.sum() > grant:
            held_nodes = np.flatnonzero(row > 0)
            i = int(held_nodes[np.lexsort((-held_nodes, row[held_nodes]))[0]])
            row[i] -= 1
        serving += row
        rows[dep.name] = row
    # grow: free slots, then beside other serving slots, then the least training GPUs
    for dep, _, grant, _ in grants:
        row = rows[dep.name]
        for _ in range(grant - int(row.sum())):
            room = caps - serving
            free = room - np.minimum(train, room)
            cand = np.flatnonzero(room > 0)
            if cand.size == 0:  # cannot happen: grants never exceed the cluster
                raise PolicyError("serving grants exceed the cluster")
            keys = (cand, train[cand], -serving[cand], -free[cand])
            i = int(cand[np.lexsort(keys)[0]])
            row[i] += 1
            serving[i] += 1
    return {
        dep.name: {snapshot.nodes[i].name: int(k) for i, k in enumerate(rows[dep.name]) if k}
        for dep, _, _, _ in grants
    }


def _check_total(
    snapshot: ClusterSnapshot,
    allocations: Mapping[str, Allocation],
    packed: Mapping[str, str],
    held: np.ndarray,
) -> None:
    """Training plus serving never over-commits a node (a bug here must not reach a cluster)."""
    validate_allocations(snapshot, allocations, packed)
    used = held.copy()
    for job, alloc in allocations.items():
        if job not in packed:
            used += np.asarray(alloc, dtype=np.int64)
    caps = np.array([n.gpus for n in snapshot.nodes], dtype=np.int64)
    if np.any(used > caps):
        over = [snapshot.nodes[i].name for i in np.flatnonzero(used > caps)]
        raise PolicyError(f"training and serving over-commit nodes: {', '.join(over)}")

"""The one way a :class:`ClusterSnapshot` is built, whoever knows the jobs.

The simulator (simulated jobs) and the controller (database rows) each describe a job as a
neutral :class:`JobFacts`; :func:`build_snapshot` turns those facts and the cluster's nodes into
the snapshot a policy decides on. Keeping the rules here (clamping bounds to the cluster,
attained service up to the round, allocations on nodes that left) means a policy sees the same
kind of snapshot in a simulation as in a live cluster, so simulated figures speak for the
controller.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from coadapt.goodput import BatchLimits, GoodputModel
from coadapt.policies.base import Allocation, ClusterSnapshot, JobInfo, NodeInfo


def accrued_service(attained: float, gpus: int, since: float | None, now: float) -> float:
    """GPU-seconds received up to ``now``: ``attained`` as of ``since`` plus ``gpus`` held
    since then (nothing is added without a ``since``, without GPUs, or if ``now`` is earlier).

    The single rule by which the simulator and the controller count attained service, which
    least-attained-service policies (Tiresias, LAS admission) order jobs by.
    """
    if since is None or gpus <= 0 or now <= since:
        return attained
    return attained + gpus * (now - since)


@dataclass(frozen=True)
class JobFacts:
    """What the mechanism knows about one job, in neutral terms (see the module docstring).

    ``attained_service`` counts GPU-seconds up to ``service_since`` (None: up to the round
    itself); ``gpus_held`` GPUs are then added for the time since. ``allocation`` is what the
    job holds now, node name -> GPUs (empty: nothing). Bounds are the job's own; the builder
    clamps them to the cluster.
    """

    name: str
    submit_time: float
    attained_service: float = 0.0
    service_since: float | None = None
    gpus_held: int = 0
    num_restarts: int = 0
    min_replicas: int = 0
    max_replicas: int = 64
    max_gpus_held: int = 0
    goodput: GoodputModel | None = None
    limits: BatchLimits | None = None
    requested_replicas: int | None = None
    step_time: Callable[[int], float] | None = None
    remaining_iterations: float | None = None
    priority: int = 0
    allocation: Mapping[str, int] = field(default_factory=dict)
    gpu_types: tuple[str, ...] | None = None
    goodput_by_type: Mapping[str, GoodputModel] | None = None
    packing_key: str | None = None  # GPU sharing: the job's class in the co-location table
    progress: float | None = None  # fraction of declared work done (None: unknown)


def allocation_tuple(per_node: Mapping[str, int], nodes: Sequence[NodeInfo]) -> Allocation:
    """A node -> count mapping as the policy's tuple, in ``nodes`` order (nodes not listed,
    e.g. ones that left the cluster, are dropped: their replicas are gone)."""
    return tuple(int(per_node.get(n.name, 0)) for n in nodes)


def allocation_dict(alloc: Sequence[int], nodes: Sequence[NodeInfo]) -> dict[str, int]:
    """The policy's tuple as node -> count, without the zeros (the neutral form)."""
    return {n.name: int(k) for n, k in zip(nodes, alloc, strict=True) if int(k) > 0}


def job_info(facts: JobFacts, total_gpus: int, now: float) -> JobInfo:
    """The policy's view of one job: bounds clamped to the cluster (a job can never get more
    than ``total_gpus``, and its minimum and request never exceed its maximum), attained
    service counted up to ``now``."""
    max_replicas = max(1, min(facts.max_replicas, total_gpus))
    requested = facts.requested_replicas
    return JobInfo(
        name=facts.name,
        submit_time=facts.submit_time,
        attained_service=accrued_service(
            facts.attained_service, facts.gpus_held, facts.service_since, now
        ),
        num_restarts=facts.num_restarts,
        min_replicas=max(0, min(facts.min_replicas, max_replicas)),
        max_replicas=max_replicas,
        max_gpus_held=facts.max_gpus_held,
        goodput=facts.goodput,
        limits=facts.limits,
        requested_replicas=min(requested, max_replicas) if requested is not None else None,
        step_time=facts.step_time,
        remaining_iterations=facts.remaining_iterations,
        priority=facts.priority,
        gpu_types=facts.gpu_types,
        goodput_by_type=facts.goodput_by_type,
        packing_key=facts.packing_key,
        progress=clamp_progress(facts.progress),
    )


def clamp_progress(progress: float | None) -> float | None:
    """A reported fraction of work done as the policy sees it: within [0, 1], None when
    unknown (None, NaN or infinite: a broken report must not steer the policy)."""
    if progress is None or not math.isfinite(progress):
        return None
    return min(max(float(progress), 0.0), 1.0)


def build_snapshot(
    jobs: Sequence[JobFacts], nodes: Sequence[NodeInfo], now: float, restart_delay: float
) -> ClusterSnapshot:
    """The snapshot of one round: ``jobs`` in submission order on ``nodes``.

    A job's current allocation counts only the nodes still present; a job holding nothing
    there has no current allocation.
    """
    inventory = tuple(nodes)
    total = sum(n.gpus for n in inventory)
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"job names must be unique in a snapshot; repeated: {', '.join(dup)}")
    current: dict[str, Allocation] = {}
    for j in jobs:
        if j.allocation:
            alloc = allocation_tuple(j.allocation, inventory)
            if any(alloc):
                current[j.name] = alloc
    return ClusterSnapshot(
        now=now,
        nodes=inventory,
        jobs={j.name: job_info(j, total, now) for j in jobs},
        current=current,
        restart_delay=restart_delay,
    )

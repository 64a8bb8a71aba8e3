"""From database rows to the :class:`ClusterSnapshot` a policy decides on (pure functions).

The job reports its fitted θ_sys (``perf``) and gradient statistics (``grad``) on the metrics
channel; the scheduler rebuilds the same :class:`GoodputModel` from that data, or fits the
reported throughput profile itself when only the profile arrived.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from coadapt.controller.spec import JobSpec
from coadapt.controller.states import JobState
from coadapt.controller.store import Job
from coadapt.goodput import (
    BatchLimits,
    FitError,
    GoodputModel,
    GradParams,
    Observations,
    PerfParams,
    fit_perf_params,
)
from coadapt.policies import ClusterSnapshot, JobInfo, NodeInfo

NODE_NAME = "local"


def _finite(values: dict[str, Any], keys: Sequence[str]) -> list[float] | None:
    out = []
    for key in keys:
        v = values.get(key)
        if not isinstance(v, (int, float)) or not math.isfinite(v):
            return None
        out.append(float(v))
    return out


def _perf_from(report: dict[str, Any]) -> PerfParams | None:
    perf = report.get("perf")
    if isinstance(perf, dict):
        vals = _finite(perf, list(PerfParams.__dataclass_fields__))
        if vals is not None:
            return PerfParams(*vals)
    rows = report.get("profile")
    if not isinstance(rows, list) or not rows:
        return None
    keys = ("nodes", "replicas", "local_bsz", "accum_steps", "iter_time")
    table = [r for r in rows if isinstance(r, dict) and _finite(r, keys) is not None]
    if not table:
        return None
    try:
        obs = Observations.build(
            [r["nodes"] for r in table],
            [r["replicas"] for r in table],
            [r["local_bsz"] for r in table],
            [r["iter_time"] for r in table],
            accum_steps=[r["accum_steps"] for r in table],
        )
        return fit_perf_params(obs)
    except (FitError, ValueError):
        return None


def goodput_model(job: Job) -> GoodputModel | None:
    """The job's goodput model from its latest report (None until it has reported one)."""
    report = job.report or {}
    grad = report.get("grad")
    if not isinstance(grad, dict):
        return None
    g = _finite(grad, ("sqr", "var"))
    if g is None or g[0] < 0 or g[1] < 0:
        return None
    perf = _perf_from(report)
    if perf is None:
        return None
    return GoodputModel(perf, GradParams(*g), int(job.spec.get("batch_size", 1)))


def batch_limits(spec: JobSpec, learned_max_local_bsz: int | None = None) -> BatchLimits:
    """The job's batch bounds: its spec's, and the per-replica cap learned after an OOM (the
    policy's goodput model then never counts on a micro-batch that did not fit; larger total
    batches stay possible through accumulation, as the job itself does)."""
    caps = [c for c in (spec.max_local_bsz, learned_max_local_bsz) if c is not None]
    return BatchLimits(
        init_batch_size=spec.batch_size,
        max_batch_size=max(spec.effective_max_batch, spec.batch_size),
        max_local_bsz=min(caps) if caps else None,
        pinned_batch=spec.pinned_batch,
    )


def _step_time(model: GoodputModel | None, limits: BatchLimits) -> Callable[[int], float]:
    """Seconds per step at the submitted batch on k replicas (perfect scaling without a
    model), for remaining-time policies such as Optimus."""
    fixed = BatchLimits(
        limits.init_batch_size,
        limits.init_batch_size,
        max_local_bsz=limits.max_local_bsz,
        pinned_batch=limits.init_batch_size,
    )

    def step_time(k: int) -> float:
        if k <= 0:
            return math.inf
        if model is None:
            return 1.0 / k
        choice = model.optimize(1, k, fixed)
        good = float(choice.goodput)
        if good <= 0:
            return math.inf
        return float(choice.total_batch) / float(
            model.throughput(1, k, int(choice.local_bsz), int(choice.accum_steps))
        )

    return step_time


def job_info(job: Job, slots: int) -> JobInfo:
    spec = job.job_spec
    model = goodput_model(job)
    limits = batch_limits(spec, job.max_local_bsz)
    max_replicas = max(1, min(spec.max_replicas, slots))
    return JobInfo(
        name=job.id,
        submit_time=job.submit_time,
        attained_service=job.attained_service,
        num_restarts=job.num_restarts,
        min_replicas=min(spec.min_replicas, max_replicas),
        max_replicas=max_replicas,
        max_gpus_held=job.max_gpus_held,
        goodput=model,
        limits=limits,
        requested_replicas=min(spec.requested_replicas, max_replicas),
        step_time=_step_time(model, limits),
        remaining_iterations=None,
        priority=spec.priority,
    )


def holds_slots(job: Job) -> bool:
    return job.state in (JobState.RUNNING, JobState.RESCALING) and job.replicas > 0


def build_snapshot(
    jobs: Sequence[Job], nodes: int | Sequence[NodeInfo], now: float, restart_delay: float
) -> ClusterSnapshot:
    """The cluster as the executor reports it (``nodes``, or one node ``local`` with that many
    slots); ``jobs`` in submission order. A job's current allocation counts only the nodes
    still present: replicas on a node that left are gone, whatever the database says."""
    inventory = (NodeInfo(NODE_NAME, nodes),) if isinstance(nodes, int) else tuple(nodes)
    total = sum(n.gpus for n in inventory)
    return ClusterSnapshot(
        now=now,
        nodes=inventory,
        jobs={j.id: job_info(j, total) for j in jobs},
        current={j.id: allocation_tuple(j.held, inventory) for j in jobs if holds_slots(j)},
        restart_delay=restart_delay,
    )


def allocation_tuple(per_node: dict[str, int], nodes: Sequence[NodeInfo]) -> tuple[int, ...]:
    """A node -> count mapping as the policy's tuple, in the snapshot's node order."""
    return tuple(int(per_node.get(n.name, 0)) for n in nodes)


def allocation_dict(alloc: Sequence[int], nodes: Sequence[NodeInfo]) -> dict[str, int]:
    """The policy's tuple as node -> count, without the zeros (what the database keeps)."""
    return {n.name: int(k) for n, k in zip(nodes, alloc, strict=True) if int(k) > 0}


def speedup(job: Job, replicas: int) -> float | None:
    """Predicted goodput on ``replicas`` over goodput on one replica (None without a model)."""
    model = goodput_model(job)
    if model is None or replicas <= 0:
        return None
    limits = batch_limits(job.job_spec, job.max_local_bsz)
    pair = model.optimize(np.array([1, 1]), np.array([1, replicas]), limits).goodput
    base = float(pair[0])
    return float(pair[1]) / base if base > 0 else None

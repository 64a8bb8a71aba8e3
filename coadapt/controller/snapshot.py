"""From database rows to the :class:`ClusterSnapshot` a policy decides on (pure functions).

Each row becomes the neutral :class:`~coadapt.policies.snapshot.JobFacts` the simulator also
produces, and :func:`coadapt.policies.snapshot.build_snapshot` (the one builder) makes the
snapshot. The job reports its fitted θ_sys (``perf``) and gradient statistics (``grad``) on the
metrics channel; the scheduler rebuilds the same :class:`GoodputModel` from that data, or fits
the reported throughput profile itself when only the profile arrived (once per profile version,
not every round).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from coadapt.controller.spec import JobSpec
from coadapt.controller.states import JobState
from coadapt.controller.store import Job
from coadapt.goodput import BatchLimits, GoodputModel, GradParams, PerfParams
from coadapt.goodput.fit import fit_profile
from coadapt.policies import ClusterSnapshot, JobInfo, NodeInfo
from coadapt.policies.snapshot import (
    JobFacts,
    accrued_service,
    allocation_dict,
    allocation_tuple,
)
from coadapt.policies.snapshot import build_snapshot as build_from_facts
from coadapt.policies.snapshot import job_info as policy_job_info

NODE_NAME = "local"
#: Report keys: the GPU type the job's current attempt runs on (written at launch), and the
#: type its reported θ_sys / profile was measured on (copied from the former at ingest).
ATTEMPT_GPU_TYPE = "gpu_type"
PERF_GPU_TYPE = "perf_gpu_type"

__all__ = [
    "ATTEMPT_GPU_TYPE",
    "NODE_NAME",
    "PERF_GPU_TYPE",
    "accrued_service",
    "allocation_dict",
    "allocation_tuple",
    "batch_limits",
    "build_snapshot",
    "goodput_by_type",
    "goodput_model",
    "holds_slots",
    "job_facts",
    "job_info",
    "perf_params",
    "speedup",
]


def _finite(values: dict[str, Any], keys: Sequence[str]) -> list[float] | None:
    out = []
    for key in keys:
        v = values.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return None
        out.append(float(v))
    return out


def perf_params(report: dict[str, Any]) -> tuple[PerfParams | None, str | None]:
    """θ_sys the job reported, else fitted on its reported profile (fitted once per profile
    version: :func:`coadapt.goodput.fit.fit_profile`), with where it came from."""
    perf = report.get("perf")
    if isinstance(perf, dict):
        vals = _finite(perf, list(PerfParams.__dataclass_fields__))
        if vals is not None:
            return PerfParams(*vals), "reported"
    fitted = fit_profile(report.get("profile"))
    return (fitted, "fitted from profile") if fitted is not None else (None, None)


def goodput_model(job: Job) -> GoodputModel | None:
    """The job's goodput model from its latest report (None until it has reported one)."""
    report = job.report or {}
    grad = report.get("grad")
    if not isinstance(grad, dict):
        return None
    g = _finite(grad, ("sqr", "var"))
    if g is None or g[0] < 0 or g[1] < 0:
        return None
    perf, _ = perf_params(report)
    if perf is None:
        return None
    return GoodputModel(perf, GradParams(*g), int(job.spec.get("batch_size", 1)))


def goodput_by_type(job: Job, model: GoodputModel | None) -> dict[str, GoodputModel] | None:
    """Per GPU type, the job's goodput model: its fitted model belongs to the type it was
    measured on (``report["perf_gpu_type"]``, stamped at ingest with the type the job's
    attempt ran on); the other types fall back to the type-less model (the policy's
    :meth:`~coadapt.policies.JobInfo.goodput_on`)."""
    gpu_type = (job.report or {}).get(PERF_GPU_TYPE)
    if model is None or not isinstance(gpu_type, str):
        return None
    return {gpu_type: model}


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


def reported_progress(job: Job) -> float | None:
    """Fraction of its declared epochs the job reported done (the training library's
    ``loader.epochs(n)``), or None: nothing declared, nothing reported yet, or a bad value."""
    report = (job.report or {}).get("progress") or {}
    value = report.get("fraction") if isinstance(report, dict) else None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    return float(value) if math.isfinite(value) else None


def job_facts(job: Job) -> JobFacts:
    """What the database knows about ``job``, in the snapshot builder's neutral terms."""
    spec = job.job_spec
    model = goodput_model(job)
    limits = batch_limits(spec, job.max_local_bsz)
    return JobFacts(
        name=job.id,
        submit_time=job.submit_time,
        attained_service=job.attained_service,
        service_since=job.service_at,
        gpus_held=job.replicas,
        num_restarts=job.num_restarts,
        min_replicas=spec.min_replicas,
        max_replicas=spec.max_replicas,
        max_gpus_held=job.max_gpus_held,
        goodput=model,
        limits=limits,
        requested_replicas=spec.requested_replicas,
        step_time=_step_time(model, limits),
        remaining_iterations=None,
        priority=spec.priority,
        allocation=job.held if holds_slots(job) else {},
        gpu_types=tuple(spec.gpu_types) if spec.gpu_types else None,
        goodput_by_type=goodput_by_type(job, model),
        packing_key=spec.packing_key,
        progress=reported_progress(job),
    )


def job_info(job: Job, slots: int, now: float | None = None) -> JobInfo:
    """The policy's view of ``job`` alone on ``slots`` slots, as a snapshot at ``now`` would
    hold it (None: attained service as stored)."""
    facts = job_facts(job)
    return policy_job_info(facts, slots, now if now is not None else -math.inf)


def holds_slots(job: Job) -> bool:
    return job.state in (JobState.RUNNING, JobState.RESCALING) and job.replicas > 0


def build_snapshot(
    jobs: Sequence[Job], nodes: int | Sequence[NodeInfo], now: float, restart_delay: float
) -> ClusterSnapshot:
    """The cluster as the executor reports it (``nodes``, or one node ``local`` with that many
    slots); ``jobs`` in submission order. A job's current allocation counts only the nodes
    still present: replicas on a node that left are gone, whatever the database says."""
    inventory = (NodeInfo(NODE_NAME, nodes),) if isinstance(nodes, int) else tuple(nodes)
    return build_from_facts([job_facts(j) for j in jobs], inventory, now, restart_delay)


def speedup(job: Job, replicas: int) -> float | None:
    """Predicted goodput on ``replicas`` over goodput on one replica (None without a model)."""
    model = goodput_model(job)
    if model is None or replicas <= 0:
        return None
    limits = batch_limits(job.job_spec, job.max_local_bsz)
    pair = model.optimize(np.array([1, 1]), np.array([1, replicas]), limits).goodput
    base = float(pair[0])
    return float(pair[1]) / base if base > 0 else None

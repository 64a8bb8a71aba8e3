"""The in-job agent's batch choice: one pure function for the training library and the simulator.

A job re-tunes its (micro-batch m, accumulation steps s) from its goodput model (eq. 14). The
shipped agent (:mod:`coadapt.train.model`) guards that choice three ways, and the simulator
must run the very same rule or its results describe an agent that does not ship:

* a **minimum-measurement gate**: no change of M before ``min_measurements`` gradient-noise
  measurements (the first estimates are too noisy to bet the batch on);
* a **trust region**: M grows at most 2x per re-tune, because the model extrapolates poorly
  past what was profiled (the reason Pollux caps a job at 2x its GPUs);
* an **adoption threshold** (:func:`should_adopt`): a change must be predicted to gain more
  than 5%, since changing M perturbs the optimiser; except while the job has timed only one
  micro-batch size (``explore``): then the throughput model's split of the step time into
  fixed and per-sample cost is a prior, not a measurement, and on the examples it predicted
  2-4% for growing, so the threshold kept jobs at M0 for good (issue 19). A larger optimum
  is then tried at once: one more size is what lets the fit learn the split.

``artifact_compatible=True`` is the Pollux artifact simulator's rule instead: always take
eq. 14's optimum over the job's full limits. ``benchmarks/reproduce_pollux.py`` uses it to
reproduce the published numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

from coadapt.goodput.model import BatchLimits, GoodputModel, should_adopt

#: Noise measurements before the batch size may change (the shipped agent's gate).
MIN_MEASUREMENTS = 8
#: The trust region: the total batch may grow at most this factor per re-tune.
TRUST_REGION = 2.0
#: Smallest predicted relative gain worth a change of (m, s).
ADOPT_THRESHOLD = 0.05


class Reason(str, Enum):
    """Why :func:`choose_batch` returned what it did (for metrics and tests)."""

    NO_MODEL = "no-model"  # nothing to decide on yet: keep the current (m, s)
    GATED = "gated"  # fewer noise measurements than the gate asks for
    ADOPTED = "adopted"  # the model's optimum, predicted to be worth the change
    KEPT = "kept"  # the optimum is the current (m, s), or not worth the change
    ARTIFACT = "artifact"  # artifact-compatible mode: the unguarded optimum


@dataclass(frozen=True)
class AgentChoice:
    """The (m, s) to use, the optimum the model proposed, and both predicted goodputs."""

    local_bsz: int
    accum_steps: int
    reason: Reason
    best: tuple[int, int] | None = None  # eq. 14's (m, s) within the limits used
    best_goodput: float = math.nan
    current_goodput: float = math.nan

    @property
    def config(self) -> tuple[int, int]:
        return self.local_bsz, self.accum_steps


def split_total(total: int, replicas: int, max_local_bsz: int | None) -> tuple[int, int]:
    """(m, s) for a total batch on ``replicas``: the fewest accumulation steps that fit."""
    if total < 1 or replicas < 1:
        raise ValueError(f"need total batch >= 1 and replicas >= 1, got {total}, {replicas}")
    per_replica = -(-total // replicas)
    cap = max_local_bsz if max_local_bsz is not None else per_replica
    accum = max(-(-per_replica // cap) - 1, 0)
    return -(-per_replica // (accum + 1)), accum


def trust_limits(limits: BatchLimits, current_batch: int) -> BatchLimits:
    """``limits`` with M capped at ``TRUST_REGION`` times the current batch (never below M0).

    Also the shipped library's measurement: it takes the gradient noise between consecutive
    steps too, so a single replica may grow M without accumulating (``accumulate_to_measure``
    off). With it on, as in the artifact, growing one replica past M0 means m = M0, s = 1:
    no throughput gain at all, so the agent never left M0 on one replica (issue 19).
    """
    cap = max(int(TRUST_REGION * current_batch), limits.init_batch_size)
    upper = max(min(limits.max_batch_size, cap), limits.init_batch_size)
    return replace(limits, max_batch_size=upper, accumulate_to_measure=False)


def choose_batch(
    model: GoodputModel | None,
    limits: BatchLimits,
    current: tuple[int, int],
    nodes: int,
    replicas: int,
    measurements: int,
    *,
    artifact_compatible: bool = False,
    min_measurements: int = MIN_MEASUREMENTS,
    threshold: float = ADOPT_THRESHOLD,
    explore: bool = False,
) -> AgentChoice:
    """The (m, s) a job on ``nodes``/``replicas`` should train with next (pure).

    ``current`` is the job's (m, s) on these replicas, ``measurements`` the gradient-noise
    measurements it has taken, ``limits`` its batch bounds (``max_local_bsz`` is the
    per-replica memory cap, learned after an OOM where applicable). ``explore``: the model
    has timed one micro-batch size only, so a larger optimum is tried without the threshold.
    """
    m, s = current
    if model is None:
        return AgentChoice(m, s, Reason.NO_MODEL)
    if artifact_compatible:
        opt = model.optimize(nodes, replicas, limits)
        best = (int(opt.local_bsz), int(opt.accum_steps))
        return AgentChoice(*best, Reason.ARTIFACT, best, float(opt.goodput))
    if limits.pinned_batch is None and measurements < min_measurements:
        return AgentChoice(m, s, Reason.GATED)
    opt = model.optimize(nodes, replicas, trust_limits(limits, replicas * m * (s + 1)))
    best = (int(opt.local_bsz), int(opt.accum_steps))
    best_good = float(opt.goodput)
    cur_good = float(model.goodput(nodes, replicas, m, s))
    larger = best[0] * (best[1] + 1) > m * (s + 1)
    gain = should_adopt(cur_good, best_good, 0.0 if explore and larger else threshold)
    if best != (m, s) and math.isfinite(best_good) and gain:
        return AgentChoice(*best, Reason.ADOPTED, best, best_good, cur_good)
    return AgentChoice(m, s, Reason.KEPT, best, best_good, cur_good)

"""A job's throughput model on GPU types it has run on little or never (Sia's bootstrap).

A job fits θ_sys directly only on its **anchor** type, the one it profiled most
configurations on. Its model on any other type is the anchor's with the compute terms
(``alpha_grad``, ``beta_grad``) divided by that type's speed relative to the anchor; the
all-reduce terms stay, the interconnect being the same (as in :mod:`coadapt.sim.gpu_types`).
The relative speed is *measured* once the job has run on the type (geometric mean, over the
configurations profiled there, of the anchor model's predicted compute time over the measured
one: a few measurements refine it) and otherwise the *prior*, the ratio of Gavel's speeds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from coadapt.goodput import PerfParams

#: A job's profile on one type: (nodes, replicas, local batch) -> (step_time, sync_time).
Profile = Mapping[tuple[int, int, int], tuple[float, float]]


def anchor_type(profiles: Mapping[str, Profile], current: str) -> str:
    """The type with the most profiled configurations (ties: ``current``, then by name)."""
    return max(sorted(profiles), key=lambda t: (len(profiles[t]), t == current))


def measured_speed(anchor_perf: PerfParams, profile: Profile) -> float | None:
    """How many times faster the profiled type computes than ``anchor_perf`` predicts
    (None: nothing measured there)."""
    logs = []
    for (_, _, local_bsz), (step, sync) in profile.items():
        predicted = anchor_perf.alpha_grad + anchor_perf.beta_grad * local_bsz
        measured = step - sync
        if predicted > 0 and measured > 0:
            logs.append(math.log(predicted / measured))
    if not logs:
        return None
    return math.exp(sum(logs) / len(logs))


def scale_compute(perf: PerfParams, speed: float) -> PerfParams:
    """``perf`` on a type ``speed`` times faster at computing (communication unchanged)."""
    if speed <= 0 or not math.isfinite(speed):
        raise ValueError(f"speed must be a finite number > 0, got {speed}")
    return replace(perf, alpha_grad=perf.alpha_grad / speed, beta_grad=perf.beta_grad / speed)

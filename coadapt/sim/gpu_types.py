"""GPU types in the simulator: per-type step times and co-location from Gavel's measurements.

The Pollux artifact's traces were measured on one GPU type (AWS T4s). We take them as the
speed of the **reference type** ``p100`` (the closest Gavel type to a T4: 16 GB of memory,
9.3 vs 8.1 FP32 TFLOPS) and of :data:`DEFAULT_GPU_TYPE` (a cluster that declares no types, so
untyped simulations replay the traces unchanged). Each artifact application is mapped to its
closest Gavel job type (:data:`GAVEL_JOB_TYPES`); its speed on type ``t`` relative to the
reference is Gavel's isolated one-GPU throughput ratio ``tput[t] / tput[p100]``. Only the
compute part of an iteration (``step - sync``) scales with it: the all-reduce time is set by
the interconnect, the same for every type here, which also reproduces Gavel's observation that
faster GPUs scale worse over the same network.

Co-location (Gandiva-style packing): Gavel measured both jobs' throughputs when two share one
GPU; the fraction of its isolated throughput each keeps is looked up on the reference type for
every pair of applications (one table, as ``ClusterSnapshot.colocation`` has no type; pairs
Gavel could not fit, ``[0, 0]``, are left out).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from coadapt.policies.base import DEFAULT_GPU_TYPE
from coadapt.sim.applications import APPLICATION_NAMES, Application, Placement

#: The Gavel type the artifact's traces stand for (see the module docstring).
REFERENCE_TYPE = "p100"
#: GPU types a simulated cluster may declare (Gavel's, plus the untyped default).
GPU_TYPES: tuple[str, ...] = (DEFAULT_GPU_TYPE, "k80", "p100", "v100")

#: Artifact application -> closest Gavel job type (model family, per-GPU batch near the app's).
GAVEL_JOB_TYPES: dict[str, str] = {
    "cifar10": "ResNet-18 (batch size 128)",  # ResNet-18 on CIFAR-10 in both
    "imagenet": "ResNet-50 (batch size 128)",  # ResNet-50 on ImageNet in both
    "ncf": "Recommendation (batch size 8192)",  # collaborative filtering, large batches
    "deepspeech2": "LM (batch size 20)",  # recurrent (LSTM/GRU) sequence model
    "yolov3": "ResNet-50 (batch size 16)",  # deep CNN backbone, few large images per GPU
    "bert": "Transformer (batch size 16)",  # attention model, small per-GPU batch
}


@cache
def _gavel() -> dict[str, Any]:
    ref = resources.files("coadapt.sim").joinpath("data").joinpath("gavel")
    data: dict[str, Any] = json.loads(ref.joinpath("throughputs_1gpu.json").read_text("utf-8"))
    return data


def _key(job_type: str) -> str:
    return f"('{job_type}', 1)"


def gavel_throughput(app: str, gpu_type: str) -> float:
    """Gavel's isolated one-GPU throughput (iterations/s) of ``app``'s job type on a type."""
    t = REFERENCE_TYPE if gpu_type == DEFAULT_GPU_TYPE else gpu_type
    return float(_gavel()[t][_key(GAVEL_JOB_TYPES[app])]["null"])


@cache
def speed_factor(app: str, gpu_type: str) -> float:
    """How many times faster ``app`` computes on ``gpu_type`` than on the reference type."""
    if gpu_type in (DEFAULT_GPU_TYPE, REFERENCE_TYPE):
        return 1.0
    return gavel_throughput(app, gpu_type) / gavel_throughput(app, REFERENCE_TYPE)


def typed_throughput(
    app: Application, gpu_type: str, placement: Placement, local_bsz: int
) -> tuple[float, float]:
    """True (step_time, sync_time) of one iteration on ``gpu_type`` (see the module doc)."""
    step, sync = app.throughput(placement, local_bsz)
    factor = speed_factor(app.name, gpu_type)
    if factor == 1.0:
        return step, sync
    return (step - sync) / factor + sync, sync


@cache
def colocation_table() -> dict[tuple[str, str], tuple[float, float]]:
    """(app_a, app_b) -> (fraction of a's isolated throughput, of b's) when both share one
    reference-type GPU; both orders of every pair that fits are present."""
    data = _gavel()[REFERENCE_TYPE]
    table: dict[tuple[str, str], tuple[float, float]] = {}
    for a in APPLICATION_NAMES:
        ja = GAVEL_JOB_TYPES[a]
        for b in APPLICATION_NAMES:
            jb = GAVEL_JOB_TYPES[b]
            pair = data[_key(ja)].get(_key(jb))
            if pair is None or min(pair) <= 0.0:
                continue
            frac_a = float(pair[0]) / float(data[_key(ja)]["null"])
            frac_b = float(pair[1]) / float(data[_key(jb)]["null"])
            table[a, b] = (frac_a, frac_b)
    return table

"""The tenants' tasks: what each trains on which data over which discrete space, per bank.

Shared by every other part of the benchmark (``benchmarks/tune_tenants.py``): the recording
trains these, the replay and the live run tune them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
#: The script that drives the benchmark (and is the ``--live`` trial program).
SCRIPT = ROOT / "benchmarks" / "tune_tenants.py"

BANK = ROOT / "benchmarks" / "data" / "tune_curves.json"
HEAVY_BANK = ROOT / "benchmarks" / "data" / "tune_curves_heavy.json"
#: A held-out log-loss above this (or non-finite: a diverged model) is recorded as this.
LOSS_CAP = 100.0
POLICIES = ("fifo", "algorithm1", "ei-per-gpu", "ei-per-gpu-no-preempt")
#: Labels that are a policy with parameters: ablations of ei-per-gpu's preemption (off, or
#: at a lower worth ratio than the default 3); pass them to ``--policies``.
VARIANTS: dict[str, tuple[str, dict[str, float]]] = {
    "ei-per-gpu-no-preempt": ("ei-per-gpu", {"preempt_ratio": 0.0}),
    "ei-per-gpu-preempt-1.5": ("ei-per-gpu", {"preempt_ratio": 1.5}),
    "ei-per-gpu-preempt-1": ("ei-per-gpu", {"preempt_ratio": 1.0}),
}


@dataclass(frozen=True)
class TaskDef:
    """One tenant's task: what is trained on what, for how many epochs, over which space."""

    dataset: str
    model: str  # mlp (1 hidden layer), mlp2 (2 hidden layers), cnn, cnn2 (2 conv layers)
    epochs: int
    space: dict[str, list[Any]]
    augment: int = 0  # 0: the bundled split as is; n: training set enlarged to ~n samples


#: The light bank: the bundled datasets as they are (a trial is mostly process start-up).
TASKS: dict[str, TaskDef] = {
    "digits-mlp": TaskDef(
        "digits",
        "mlp",
        10,
        {
            "lr": [0.001, 0.003, 0.01, 0.03, 0.1, 0.3],
            "hidden": [16, 64, 256],
            "momentum": [0.0, 0.9],
            "batch_size": [16, 64, 256],
        },
    ),
    "cancer-mlp": TaskDef(
        "breast_cancer",
        "mlp",
        10,
        {
            "lr": [0.0003, 0.001, 0.003, 0.01, 0.03, 0.1],
            "hidden": [8, 32, 128],
            "momentum": [0.0, 0.9],
            "batch_size": [8, 32, 128],
        },
    ),
    "wine-mlp": TaskDef(
        "wine",
        "mlp",
        10,
        {
            "lr": [0.001, 0.003, 0.01, 0.03, 0.1, 0.3],
            "hidden": [8, 32, 128],
            "momentum": [0.0, 0.9],
            "batch_size": [4, 16, 64],
        },
    ),
    "digits-cnn": TaskDef(
        "digits",
        "cnn",
        6,
        {
            "lr": [0.003, 0.01, 0.03, 0.1],
            "channels": [4, 8, 16],
            "momentum": [0.0, 0.9],
            "batch_size": [16, 64],
        },
    ),
}

#: The heavy bank: training dominates start-up, as in DL tuning. The training sets are
#: enlarged deterministically to ~24k samples (digits: every ±1-pixel shift of each training
#: image plus pixel noise; tabular: Gaussian jitter of the standardised training rows); the
#: held-out 25% stays the untouched original split. 24 configurations each.
HEAVY_MLP_SPACE: dict[str, list[Any]] = {  # the same 12 MLP configurations on each dataset
    "lr": [0.0003, 0.001, 0.003, 0.01, 0.03, 0.1],
    "hidden": [256, 512],
    "batch_size": [16, 32],
}
HEAVY_TASKS: dict[str, TaskDef] = {
    "digits-cnn": TaskDef(
        "digits",
        "cnn2",
        15,
        {"lr": [0.003, 0.01, 0.03, 0.1], "channels": [8, 16, 32], "batch_size": [32, 64]},
        augment=24_000,
    ),
    "digits-mlp": TaskDef(
        "digits",
        "mlp2",
        20,
        HEAVY_MLP_SPACE,
        augment=24_000,
    ),
    "cancer-mlp": TaskDef(
        "breast_cancer",
        "mlp2",
        20,
        HEAVY_MLP_SPACE,
        augment=24_000,
    ),
    "wine-mlp": TaskDef(
        "wine",
        "mlp2",
        20,
        HEAVY_MLP_SPACE,
        augment=24_000,
    ),
}

BANKS: dict[str, tuple[Path, dict[str, TaskDef]]] = {
    "light": (BANK, TASKS),
    "heavy": (HEAVY_BANK, HEAVY_TASKS),
}
#: The ``mixed`` replay: tenants whose trials differ 6-9x in cost, as on a shared cluster where
#: one team tunes a CNN and another a small MLP. Rule, fixed before it was run: the first two
#: tasks of the heavy bank and the first two of the light one, each with its own recorded curves.
MIXED: tuple[tuple[str, int], ...] = (("heavy", 2), ("light", 2))


def task_def(name: str) -> TaskDef:
    """A task by name; ``heavy:<name>`` for the heavy bank's (what ``--live`` trials get)."""
    kind, _, task = name.rpartition(":")
    return BANKS[kind or "light"][1][task]

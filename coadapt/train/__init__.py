"""coadapt.train — elastic, goodput-adaptive training for PyTorch (the in-job PolluxAgent).

    import coadapt.train as ct
    ctx = ct.init()                                   # env: coadapt.protocol.ReplicaEnv
    loader = ct.AdaptiveDataLoader(dataset, batch_size=64, max_batch_size=1024)
    model = ct.AdaptiveModel(net, optimizer, loader)  # restores the checkpoint, if any
    for epoch in loader.epochs(10):
        for x, y in loader:
            model.step(loss_fn(model(x), y))          # accumulation, LR rule, re-tuning
        ct.report("accuracy", evaluate(net), model.steps)

The names are imported lazily (PEP 562): ``coadapt.train.launch`` (the launcher) must not pay
for ``import torch``, which takes seconds, before it has spawned anything.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coadapt.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
    from coadapt.train.context import (
        TrainConfigError,
        TrainEnv,
        TrainingContext,
        current,
        init,
        report,
        shutdown,
    )
    from coadapt.train.data import AdaptiveDataLoader, split_batch
    from coadapt.train.gns import GradNoiseEMA, estimate
    from coadapt.train.metrics import MetricsSink
    from coadapt.train.model import AdaptiveModel, default_lr_rule
    from coadapt.train.profile import Profile

_EXPORTS = {
    "AdaptiveDataLoader": "data",
    "AdaptiveModel": "model",
    "CheckpointError": "checkpoint",
    "GradNoiseEMA": "gns",
    "MetricsSink": "metrics",
    "Profile": "profile",
    "TrainConfigError": "context",
    "TrainEnv": "context",
    "TrainingContext": "context",
    "current": "context",
    "default_lr_rule": "model",
    "estimate": "gns",
    "init": "context",
    "load_checkpoint": "checkpoint",
    "report": "context",
    "save_checkpoint": "checkpoint",
    "shutdown": "context",
    "split_batch": "data",
}

__all__ = [
    "AdaptiveDataLoader",
    "AdaptiveModel",
    "CheckpointError",
    "GradNoiseEMA",
    "MetricsSink",
    "Profile",
    "TrainConfigError",
    "TrainEnv",
    "TrainingContext",
    "current",
    "default_lr_rule",
    "estimate",
    "init",
    "load_checkpoint",
    "report",
    "save_checkpoint",
    "shutdown",
    "split_batch",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'coadapt.train' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"coadapt.train.{module}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

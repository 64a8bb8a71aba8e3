"""coadapt.train — elastic, goodput-adaptive training for PyTorch (the in-job PolluxAgent).

    import coadapt.train as ct
    ctx = ct.init()                                   # env: RANK, WORLD_SIZE, COADAPT_*
    loader = ct.AdaptiveDataLoader(dataset, batch_size=64, max_batch_size=1024)
    model = ct.AdaptiveModel(net, optimizer, loader)  # restores the checkpoint, if any
    for epoch in loader.epochs(10):
        for x, y in loader:
            model.step(loss_fn(model(x), y))          # accumulation, LR rule, re-tuning
        ct.report("accuracy", evaluate(net), model.steps)
"""

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

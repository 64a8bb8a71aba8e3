"""The goodput model: throughput, statistical efficiency, fitting, batch choice, LR, speedup."""

from coadapt.goodput.fit import FitError, Observations, exploration_cap, fit_perf_params
from coadapt.goodput.lr import LRRule, adascale_gain, lr_factor
from coadapt.goodput.model import (
    BatchChoice,
    BatchLimits,
    GoodputModel,
    GradParams,
    PerfParams,
    efficiency,
    grad_time,
    iter_time,
    should_adopt,
    sync_time,
    total_batch,
)
from coadapt.goodput.speedup import SpeedupFunction

__all__ = [
    "BatchChoice",
    "BatchLimits",
    "FitError",
    "GoodputModel",
    "GradParams",
    "LRRule",
    "Observations",
    "PerfParams",
    "SpeedupFunction",
    "adascale_gain",
    "efficiency",
    "exploration_cap",
    "fit_perf_params",
    "grad_time",
    "iter_time",
    "lr_factor",
    "should_adopt",
    "sync_time",
    "total_batch",
]

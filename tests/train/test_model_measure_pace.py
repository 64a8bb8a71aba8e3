"""How often an adaptive job measures the noise and re-tunes (issue 19)."""

from __future__ import annotations

import math

import torch
from torch import nn

from coadapt.goodput import PerfParams
from coadapt.train import AdaptiveDataLoader, AdaptiveModel
from coadapt.train.context import TrainingContext
from coadapt.train.model import MEASURE_BUDGET

from .test_model import linear_problem


def _job(ctx: TrainingContext, measure_every: int, retune_every: int = 50) -> AdaptiveModel:
    data, lin, _ = linear_problem()
    loader = AdaptiveDataLoader(data, batch_size=32, max_batch_size=64, context=ctx)
    opt = torch.optim.SGD(lin.parameters(), lr=0.0)  # w fixed: φ = 21
    return AdaptiveModel(lin, opt, loader, measure_every=measure_every, retune_every=retune_every)


def test_split_measurements_are_spaced_to_their_budget(ctx: TrainingContext) -> None:
    """A split step pays one more micro-batch's fixed cost: one in 4 made the adaptive job
    cost 16-28% more per step than a fixed one at M0 on the examples."""
    model = _job(ctx, measure_every=4)
    step = 0.001
    model.profile.iter_time = lambda key: step  # type: ignore[method-assign]
    model._perf = PerfParams(0.0005, 1e-5, 0.0, 0.0, 0.0, 0.0, 1.0)
    expected = math.ceil(0.0005 / (MEASURE_BUDGET * step))
    assert model._measure_spacing() == expected > 4
    model._gated, model._split_spacing = False, expected
    assert model._measure_period == expected
    model._split_spacing = 2  # never more often than measure_every
    assert model._measure_period == 4


def test_retunes_when_the_measurements_double(ctx: TrainingContext) -> None:
    """Without periodic re-tunes (retune_every huge), the job still looks again each time
    its noise measurements have doubled: O(log steps) re-tunes."""
    model = _job(ctx, measure_every=2, retune_every=10**9)
    loader = model.loader
    # keep 32 whatever the fit says (a batch change adds a follow-up re-tune)
    model._choose = lambda: (loader.local_bsz, loader.accum_steps)  # type: ignore[method-assign]
    seen: list[int] = []
    retune = model.retune

    def counting() -> None:
        seen.append(model.gns.count)
        retune()

    model.retune = counting  # type: ignore[method-assign]
    for _ in loader.epochs(50):
        for x, y in loader:
            model.step(nn.functional.mse_loss(model(x), y))
            if model.gns.count >= 70:
                break
        if model.gns.count >= 70:
            break
    gate = seen[0]
    assert [c for c in seen if c > gate][:3] == [2 * gate, 4 * gate, 8 * gate]

"""How fast the shipped agent gets to its first batch decision (issue 19): while the noise gate
holds the batch at M0 it measures on every step it can and re-tunes the moment the gate opens;
after a batch change it waits for the new size's follow-up before looking again; fixed-batch
jobs keep the amortised measurement period (no extra cost)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from coadapt.goodput.agent import MIN_MEASUREMENTS
from coadapt.train import AdaptiveDataLoader, AdaptiveModel
from coadapt.train.context import TrainingContext
from coadapt.train.profile import Profile
from tests.train.test_model import linear_problem


def _run(model: AdaptiveModel, loader: AdaptiveDataLoader, steps: int) -> list[int]:
    """Train ``steps`` optimizer steps; the steps at which the model re-tuned."""
    retunes: list[int] = []
    inner = model.retune

    def retune() -> None:
        retunes.append(model.steps)
        inner()

    model.retune = retune  # type: ignore[method-assign]
    for _ in loader.epochs(100):
        for x, y in loader:
            model.step(nn.functional.mse_loss(model(x), y))
            if model.steps >= steps:
                return retunes
    return retunes


def test_the_gate_opens_after_one_step_per_measurement(ctx: TrainingContext) -> None:
    data, lin, _ = linear_problem()
    loader = AdaptiveDataLoader(data, batch_size=32, max_batch_size=256, seed=0, context=ctx)
    opt = torch.optim.SGD(lin.parameters(), lr=0.01)
    model = AdaptiveModel(lin, opt, loader, retune_every=1000, measure_every=4)
    # keep 32 at the gate: a batch change would measure every other step again until
    # FRESH_MEASUREMENTS are in (test_a_follow_up_waits_for_fresh_noise_measurements)
    model._choose = lambda: (loader.local_bsz, loader.accum_steps)  # type: ignore[method-assign]
    assert model._measure_period == 2  # gated, one replica: every other step (split)
    retunes = _run(model, loader, 2 * MIN_MEASUREMENTS + 1)
    # one replica, s = 0: every other gated step is split in two, one measurement each (the
    # three consecutive steps a measurement took before were biased and slower to the gate);
    # the steps between are timed for the first fit
    assert model.gns.count >= MIN_MEASUREMENTS
    assert retunes and retunes[0] == 2 * MIN_MEASUREMENTS - 1  # at the gate, not at 1000
    # amortised again once the gate is open: every measure_every steps, or fewer split steps
    # where their extra micro-batch would cost more than MEASURE_BUDGET (timing-dependent)
    assert model._measure_period == max(4, model._split_spacing)


def test_after_a_batch_change_the_next_look_is_the_follow_up(ctx: TrainingContext) -> None:
    data, lin, _ = linear_problem()
    loader = AdaptiveDataLoader(data, batch_size=32, max_batch_size=256, seed=0, context=ctx)
    opt = torch.optim.SGD(lin.parameters(), lr=0.01)
    model = AdaptiveModel(lin, opt, loader, retune_every=1, measure_every=4)
    _run(model, loader, 3 * MIN_MEASUREMENTS + 1)
    loader.set_batch(64, 0)  # as retune() does on a change
    followup = model._followup = model.steps + 9
    retunes = _run(model, loader, followup + 3)
    # retune_every = 1 would look at every step; the new size is settling until the follow-up
    assert retunes and retunes[0] == followup


def test_a_fixed_batch_job_keeps_the_amortised_period(ctx: TrainingContext) -> None:
    data, lin, _ = linear_problem()
    loader = AdaptiveDataLoader(data, batch_size=32, seed=0, context=ctx)  # max = M0: fixed
    model = AdaptiveModel(lin, torch.optim.SGD(lin.parameters(), lr=0.01), loader)
    assert model._measure_period == model.measure_every


def test_a_retune_never_waits_for_the_optimizer_import(
    ctx: TrainingContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While SciPy is still loading, a one-replica job fits anyway (its Gauss-Newton fit
    needs neither SciPy nor BLAS), a re-tune of several replicas' rows keeps the last fit (no
    stall), and an explicit goodput_model() waits for SciPy and fits."""
    import coadapt.train.model as cm
    from coadapt.goodput import Observations

    fresh = cm._Optimizer()
    monkeypatch.setattr(fresh, "start", lambda: None)  # the import "never finishes"
    monkeypatch.setattr(cm, "_OPTIMIZER", fresh)
    data, lin, _ = linear_problem()
    loader = AdaptiveDataLoader(data, batch_size=32, max_batch_size=256, seed=0, context=ctx)
    model = AdaptiveModel(lin, torch.optim.SGD(lin.parameters(), lr=0.01), loader)
    _run(model, loader, 3 * MIN_MEASUREMENTS + 4)  # the gate has opened: a re-tune ran
    assert model.gns.count >= MIN_MEASUREMENTS and model._perf is not None  # fitted
    assert not fresh.ready  # without SciPy
    one = model._perf
    two = Observations.build([1, 1], [2, 2], [32, 64], [2e-3, 3e-3])  # two replicas' rows
    model._fit_version = ()  # forget the last fit's profile version: fit again
    assert model._fit(two, wait=False) is one  # no SciPy yet: the last fit, no stall
    monkeypatch.undo()
    loaded = cm._Optimizer()
    assert not loaded.ready
    loaded.start()
    with loaded.one_blas_thread():  # joins the loading thread first
        pass
    assert loaded.ready
    fitted = model._fit(two, wait=True)  # waits for the real one and fits
    assert fitted is not None and fitted is not one


def test_periodic_retunes_fit_their_time_budget(ctx: TrainingContext) -> None:
    """A periodic or epoch re-tune waits until its cost is at most RETUNE_BUDGET of the
    training time since the last (the cancer MLP re-tuned every 8 steps at 2-5 ms each, with
    ~1 ms steps); the follow-up after a batch change is not delayed by it."""
    from coadapt.train.model import RETUNE_BUDGET

    data, lin, _ = linear_problem()
    loader = AdaptiveDataLoader(data, batch_size=32, max_batch_size=256, seed=0, context=ctx)
    model = AdaptiveModel(lin, torch.optim.SGD(lin.parameters(), lr=0.01), loader, retune_every=1)
    gated = _run(model, loader, 2 * MIN_MEASUREMENTS)
    assert len(gated) == 1  # while gated only the gate's re-tune ran (periodic ones could not
    # change the batch), although retune_every = 1
    loader.set_batch(32, 0)  # whatever the gate chose: only periodic re-tunes remain
    model._followup, model._warmup = -1, 0
    key = model._key()
    model.profile = Profile()  # only the steps below (the gated steps at 32 were timed too)
    for _ in range(3):
        model.profile.record_iter(key, 2e-3)  # steps of 2 ms at this size
    # a 10 ms re-tune is worth 100 steps of 2 ms at a 5% budget
    assert model._retune_spacing(0.01) == math.ceil(0.01 / (RETUNE_BUDGET * 2e-3)) == 100
    assert model._retune_spacing(0.0) == 0
    model._next_periodic = model.steps + 15
    start = model.steps
    later = _run(model, loader, start + 30)
    assert later and later[0] == start + 15  # none before the budget allows, then at once

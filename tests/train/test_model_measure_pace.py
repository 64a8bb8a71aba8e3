"""How often an adaptive job measures the noise and re-tunes (issue 19)."""

from __future__ import annotations

import math

import torch
from torch import nn

from coadapt.goodput import PerfParams
from coadapt.train import AdaptiveDataLoader, AdaptiveModel
from coadapt.train.context import TrainingContext
from coadapt.train.model import FLAG_LATENCY_S, MAX_MEASURE_SPACING, MEASURE_BUDGET

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


def test_a_follow_up_waits_for_fresh_noise_measurements(ctx: TrainingContext) -> None:
    """After a batch change the next look must not re-read the φ that decided the change:
    split measurements resume every other step, outside the budget, until
    FRESH_MEASUREMENTS are in; on a GPU the budget had spaced them 20 steps apart and jobs
    grew three times on the gate's φ (issue 19)."""
    from coadapt.train.model import _FOLLOWUP_STEPS, _WARMUP_STEPS, FRESH_MEASUREMENTS

    model = _job(ctx, measure_every=4, retune_every=10**9)
    loader = model.loader
    plan = iter([(64, 0)])  # grow once at the gate, then keep
    model._choose = lambda: next(plan, (loader.local_bsz, loader.accum_steps))  # type: ignore[method-assign]
    looks: list[tuple[int, int]] = []  # (step, noise measurements) at every re-tune
    retune = model.retune

    def spy() -> None:
        looks.append((model.steps, model.gns.count))
        retune()
        model._split_spacing = 50  # as on a GPU: the budget allows one split in 50 steps

    model.retune = spy  # type: ignore[method-assign]
    for _ in loader.epochs(50):
        for x, y in loader:
            model.step(nn.functional.mse_loss(model(x), y))
            if len(looks) >= 2:
                break
        if len(looks) >= 2:
            break
    (gate_step, gate_count), (look_step, look_count) = looks[:2]
    assert loader.local_bsz == 64
    # not the gate's φ again (at the budget's spacing no step between them would measure)
    assert look_count - gate_count >= max(FRESH_MEASUREMENTS, 1)
    assert look_step <= gate_step + _WARMUP_STEPS + 2 * _FOLLOWUP_STEPS
    assert model._measure_period == 50  # fresh noise in: back to the budget's spacing


def test_measuring_steps_of_several_replicas_are_spaced_to_their_budget(
    ctx: TrainingContext,
) -> None:
    """K > 1: rank 0 proposes a spacing that keeps a measurement's extra time in
    MEASURE_BUDGET, counting both steps it costs (the measuring one and the next, which
    finishes its agreement), capped so the stop and save flags (which ride those steps) are
    agreed within FLAG_LATENCY_S."""
    model = _job(ctx, measure_every=4)
    assert model._propose_spacing() == 0  # nothing timed yet: no proposal
    for _ in range(8):
        model._record_wall(False, False, 0.010)
    for _ in range(3):
        model._record_wall(True, False, 0.010)  # the measuring step looks free...
    assert model._propose_spacing() == 0  # ...but its agreement is not finished: no proposal
    for _ in range(3):
        model._record_wall(False, True, 0.013)  # ...the next step pays 30%: one in 6 is 5%
    assert model._propose_spacing() == math.ceil(0.003 / (MEASURE_BUDGET * 0.010)) == 6
    model._record_wall(True, True, 5.0)  # a step that did both tells neither cost: not kept
    assert model._propose_spacing() == 6
    for _ in range(16):
        model._record_wall(True, False, 0.200)  # 20x dearer, but flags within 0.5 s of 10 ms
    assert model._propose_spacing() == min(MAX_MEASURE_SPACING, int(FLAG_LATENCY_S / 0.010))
    for _ in range(32):
        model._record_wall(False, False, 0.300)  # slow steps: 0.5 s is one step
    assert model._propose_spacing() == 1  # measure_every wins
    model._gated, model._sync_spacing = False, 1
    model.ddp = object()  # type: ignore[assignment]  # only its presence is read here
    assert model._measure_period == 4
    model._sync_spacing = 9
    assert model._measure_period == 9
    model._walls_key = (0, 0, 0, 0)  # the timings are per (m, s): another size starts afresh
    model._record_wall(False, False, 0.010)
    assert list(model._walls["plain"]) == [0.010]
    assert not model._walls["launch"] and not model._walls["finish"]
    model.ddp = None

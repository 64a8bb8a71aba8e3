"""AdaptiveModel in one process: PGNS on a problem with known noise, LR rules, checkpoints."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from coadapt.goodput import GradParams, LRRule
from coadapt.train import (
    AdaptiveDataLoader,
    AdaptiveModel,
    CheckpointError,
    GradNoiseEMA,
    estimate,
    load_checkpoint,
    save_checkpoint,
)
from coadapt.train.context import TrainConfigError, TrainingContext
from coadapt.train.gns import consecutive_estimate


def linear_problem(
    d: int = 10, n: int = 40000, sigma2: float = 1.0, seed: int = 0
) -> tuple[TensorDataset, nn.Linear, float]:
    """y = x·w* + ε, x ~ N(0, I), ε ~ N(0, σ²); the model sits at w = w* + δ, |δ| = 1.

    Per-sample gradient of (x·w − y)² is 2x(x·δ − ε): |G|² = 4|δ|² and
    tr Σ = 4((d + 1)|δ|² + dσ²), so φ = (d + 1) + dσ²/|δ|² = 21 for d = 10, σ² = 1.
    """
    g = torch.Generator().manual_seed(seed)
    w_star = torch.randn(d, generator=g)
    delta = torch.randn(d, generator=g)
    delta /= delta.norm()
    x = torch.randn(n, d, generator=g)
    y = x @ w_star + math.sqrt(sigma2) * torch.randn(n, generator=g)
    lin = nn.Linear(d, 1, bias=False)
    with torch.no_grad():
        lin.weight.copy_((w_star + delta)[None])
    return TensorDataset(x, y[:, None]), lin, (d + 1) + d * sigma2


@pytest.mark.parametrize("accum", [3, 0])
def test_pgns_matches_closed_form(ctx: TrainingContext, accum: int) -> None:
    data, lin, phi = linear_problem()
    # a job that may grow its batch (a fixed one at s = 0 does not measure φ); whatever it
    # re-tunes to, φ is that of the problem
    batch = 32 * (accum + 1)
    loader = AdaptiveDataLoader(
        data, batch_size=batch, max_batch_size=2 * batch, max_local_bsz=32, context=ctx
    )
    assert loader.accum_steps == accum
    opt = torch.optim.SGD(lin.parameters(), lr=0.0)  # keep w fixed: the truth is constant
    # ~1000 measurements in the EMA's window: one of 32 samples in two halves (accum = 0)
    # has a relative spread of ~1.6, so the smoothed φ is then within ~5% of the truth
    model = AdaptiveModel(
        lin, opt, loader, grad_smoothing=0.998, measure_every=2, retune_every=10**9
    )
    for _ in loader.epochs(60):  # one step in measure_every (or fewer: MEASURE_BUDGET)
        for x, y in loader:
            model.step(nn.functional.mse_loss(model(x), y))
            if model.gns.count >= 1500:
                break
        if model.gns.count >= 1500:
            break
    assert model.gns.count >= 1500
    assert abs(model.pgns - phi) / phi < 0.15


def test_estimator_is_unbiased_on_exact_expectations() -> None:
    g2, tr, b, n = 2.0, 30.0, 8, 4
    sqr, trace = estimate(g2 + tr / b, g2 + tr / (n * b), b, n)
    assert sqr == pytest.approx(g2) and trace == pytest.approx(tr)
    ema = GradNoiseEMA(0.5)
    ema.update(1.0, 10.0)
    assert ema.pgns() == pytest.approx(10.0)  # bias-corrected after one update
    with pytest.raises(ValueError):
        estimate(1.0, 1.0, 8, 1)


def test_consecutive_estimator_cancels_a_drifting_gradient() -> None:
    """Three steps whose true gradient drifts linearly (as training moves the weights): the
    second-difference estimator stays unbiased where taking two steps as two pieces of one
    gradient reads the drift as noise (issue 19)."""
    g = torch.Generator().manual_seed(0)
    dim, b, sigma = 200, 16, 0.5
    tr_true = dim * sigma**2 * b  # per-sample covariance σ² b I, so a b-mean has σ² I
    base, drift = torch.randn(dim, generator=g), 0.7 * torch.randn(dim, generator=g)
    new, old = [], []
    for _ in range(2000):
        steps = [base + t * drift + sigma * torch.randn(dim, generator=g) for t in range(3)]
        rows = torch.stack(steps).double()
        new.append(consecutive_estimate((rows @ rows.T).tolist(), b))
        a, c = rows[0], rows[1]
        old.append(estimate(0.5 * float(a @ a + c @ c), float((a + c) @ (a + c)) / 4, b, 2))
    sqr_true = float((base + drift) @ (base + drift))
    sqr_new = sum(x[0] for x in new) / len(new)
    tr_new = sum(x[1] for x in new) / len(new)
    tr_old = sum(x[1] for x in old) / len(old)
    assert abs(tr_new - tr_true) / tr_true < 0.03
    assert abs(sqr_new - sqr_true) / sqr_true < 0.05
    assert tr_old > 1.5 * tr_true  # the old estimator's bias b|D|²/2, here ~2x tr Σ
    with pytest.raises(ValueError):
        consecutive_estimate((rows @ rows.T).tolist(), 0)


def test_noise_ema_holds_its_last_positive_gradient_norm() -> None:
    """A window where the smoothed |G|² is <= 0 keeps the last estimate instead of reading an
    infinite noise scale (which made AdaScale scale the LR linearly)."""
    ema = GradNoiseEMA(0.5)
    ema.update(1.0, 40.0)
    assert ema.pgns() == pytest.approx(40.0)
    ema.update(-3.0, 40.0)  # smoothed |G|² now (0.5 - 1.5) / 0.75 < 0
    assert ema.pgns() == pytest.approx(40.0)
    restored = GradNoiseEMA(0.5)
    restored.load_state_dict(ema.state_dict())
    assert restored.pgns() == pytest.approx(40.0)
    fresh = GradNoiseEMA(0.5)
    fresh.update(-1.0, 4.0)  # nothing positive to hold yet: the noise dominates
    assert fresh.pgns() > 1e20


def _one_step(
    ctx: TrainingContext, rule: object, batch: int
) -> tuple[float, torch.Tensor, AdaptiveModel]:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 3), torch.randn(512, 1))
    loader = AdaptiveDataLoader(data, batch_size=32, max_batch_size=512, context=ctx, shuffle=False)
    loader.set_batch(batch, 0)
    lin = nn.Linear(3, 1)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    model = AdaptiveModel(lin, opt, loader, lr_rule=rule)  # type: ignore[arg-type]
    model.gns.update(1.0, 3.0 * 32)  # sqr = 1, var at M0 = 3
    model.retune()  # recomputes the LR factor for the current batch (no profile: keeps it)
    before = lin.weight.detach().clone()
    loader.split_next = False  # one micro-batch is one step here (no noise measurement)
    x, y = next(iter(loader))
    loss = nn.functional.mse_loss(model(x), y)
    grad = torch.autograd.grad(loss, lin.weight, retain_graph=True)[0]
    model.step(loss)
    applied = (before - lin.weight.detach()) / grad
    assert opt.param_groups[0]["lr"] == 0.1  # the scaled LR is restored after the step
    return model.lr_scale, applied, model


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (LRRule.SQRT, 2.0),  # sqrt(128 / 32)
        (LRRule.LINEAR, 4.0),  # 128 / 32
        (LRRule.ADASCALE, (3 + 1) / (3 / 4 + 1)),  # (var + sqr) / (var / S + sqr), S = 4
        (LRRule.ADASCALE_SQRT, 2.0),  # the gain 16/7 capped at sqrt(S) = 2
        (LRRule.NONE, 1.0),
        (lambda m0, m: 1.5, 1.5),
    ],
)
def test_lr_rules_against_hand_computed_values(
    ctx: TrainingContext, rule: object, expected: float
) -> None:
    factor, applied, _ = _one_step(ctx, rule, 128)
    assert factor == pytest.approx(expected)
    assert torch.allclose(applied, torch.full_like(applied, 0.1 * expected), rtol=1e-4)


def test_default_rules() -> None:
    from coadapt.train import default_lr_rule

    lin = nn.Linear(2, 1)
    assert default_lr_rule(torch.optim.SGD(lin.parameters(), lr=1)) is LRRule.ADASCALE_SQRT
    assert default_lr_rule(torch.optim.AdamW(lin.parameters())) is LRRule.SQRT
    assert GradParams(1.0, 3.0).pgns(32) == 96.0


def test_corrupt_checkpoint_falls_back_then_errors(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, {"v": 1})
    save_checkpoint(tmp_path, {"v": 2})
    assert load_checkpoint(tmp_path) == {"v": 2}
    final = tmp_path / "checkpoint.pt"
    final.write_bytes(final.read_bytes()[:20])  # truncated
    with pytest.warns(RuntimeWarning, match="checkpoint.prev.pt"):
        assert load_checkpoint(tmp_path) == {"v": 1}
    (tmp_path / "checkpoint.prev.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=r"checkpoint\.pt is corrupt"):
        load_checkpoint(tmp_path)
    assert load_checkpoint(tmp_path / "none") is None


def test_checkpoint_roundtrip_restores_everything(tmp_path: Path, ctx: TrainingContext) -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 3), torch.randn(64, 1))
    loader = AdaptiveDataLoader(data, batch_size=8, context=ctx)
    lin = nn.Linear(3, 1)
    opt = torch.optim.Adam(lin.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)
    model = AdaptiveModel(lin, opt, loader, scheduler=sched)
    for i, (x, y) in enumerate(loader):
        model.step(nn.functional.mse_loss(model(x), y))
        if i == 2:
            break
    sched.step()
    ctx.save()
    expect = torch.rand(3)
    ctx.checkpoint = load_checkpoint(ctx.env.checkpoint_dir)  # type: ignore[arg-type]
    ctx.restore_rng()
    assert torch.equal(torch.rand(3), expect)  # RNG state saved before the draw
    lin2 = nn.Linear(3, 1)
    opt2 = torch.optim.Adam(lin2.parameters(), lr=0.01)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, 1, 0.5)
    ctx._states.clear()
    loader2 = AdaptiveDataLoader(data, batch_size=8, context=ctx)
    model2 = AdaptiveModel(lin2, opt2, loader2, scheduler=sched2)
    assert loader2.position == 24 and model2.steps == 3
    assert torch.equal(lin2.weight, lin.weight) and opt2.param_groups[0]["lr"] == 0.005
    assert model2.gns.count == model.gns.count


def test_batch_mode_from_the_scheduler_is_read_and_validated() -> None:
    from coadapt.train.context import TrainConfigError, TrainEnv

    assert TrainEnv.from_env({}).batch_mode == "adaptive"
    assert TrainEnv.from_env({"COADAPT_BATCH_MODE": "fixed"}).batch_mode == "fixed"
    with pytest.raises(TrainConfigError, match="COADAPT_BATCH_MODE"):
        TrainEnv.from_env({"COADAPT_BATCH_MODE": "elastic"})


def test_periodic_checkpoints_without_a_stop(tmp_path: Path, ctx: TrainingContext) -> None:
    """checkpoint_every=N saves at every N-th step boundary, so a replica killed without a
    SIGTERM (node lost) resumes from at most N steps back."""
    data = TensorDataset(torch.randn(64, 3), torch.randn(64, 1))
    loader = AdaptiveDataLoader(data, batch_size=8, context=ctx)
    lin = nn.Linear(3, 1)
    model = AdaptiveModel(
        lin, torch.optim.SGD(lin.parameters(), lr=0.01), loader, checkpoint_every=2
    )
    for i, (x, y) in enumerate(loader):
        model.step(nn.functional.mse_loss(model(x), y))
        if i == 4:  # 5 steps taken; the 4th step's checkpoint was written at the 5th forward
            break
    assert ctx.env.checkpoint_dir is not None
    saved = load_checkpoint(ctx.env.checkpoint_dir)
    assert saved is not None and saved["states"]["model"]["steps"] == 4
    with pytest.raises(TrainConfigError, match="checkpoint_every"):
        AdaptiveModel(
            nn.Linear(3, 1),
            torch.optim.SGD(lin.parameters(), lr=0.1),
            loader,
            name="other",
            checkpoint_every=-1,
        )


def test_checkpoint_interval_from_the_environment() -> None:
    from coadapt.train.context import TrainEnv

    assert TrainEnv.from_env({}).checkpoint_every == 0
    assert TrainEnv.from_env({"COADAPT_CHECKPOINT_EVERY": "100"}).checkpoint_every == 100
    with pytest.raises(TrainConfigError, match="COADAPT_CHECKPOINT_EVERY"):
        TrainEnv.from_env({"COADAPT_CHECKPOINT_EVERY": "often"})


def test_measure_noise_is_paid_only_where_phi_is_read(ctx: TrainingContext) -> None:
    """A job that may change its batch measures φ; a fixed one only when asked; asking an
    adaptive job not to measure is refused (it could never leave its noise gate)."""
    data = TensorDataset(torch.randn(256, 3), torch.randn(256, 1))
    adaptive = AdaptiveDataLoader(data, batch_size=8, max_batch_size=64, context=ctx)
    fixed = AdaptiveDataLoader(data, batch_size=8, context=ctx, name="fixed-loader")

    def make(loader: AdaptiveDataLoader, name: str, **kw: Any) -> AdaptiveModel:
        lin = nn.Linear(3, 1)
        return AdaptiveModel(
            lin, torch.optim.SGD(lin.parameters(), lr=0.01), loader, name=name, **kw
        )

    assert make(adaptive, "a")._reads_noise
    assert not make(fixed, "f")._reads_noise
    assert make(fixed, "f2", measure_noise=True)._reads_noise
    with pytest.raises(TrainConfigError, match="measure_noise=False"):
        make(adaptive, "a2", measure_noise=False)


def test_a_coordinate_adam_has_never_seen_weighs_nothing_in_the_k_gt_1_norms(
    ctx: TrainingContext,
) -> None:
    """At K > 1 the pre-conditioned norms are taken before the optimizer step, with the v̂ of
    the steps before: where v̂ is 0 (a dead ReLU unit's weights) the preconditioner is ∞
    (the coordinate weighs nothing), not ε, which made one new gradient 1e16 times too large
    and φ read ~1 (issue 19). The default (K = 1, after the step) keeps ε."""
    data = TensorDataset(torch.randn(64, 3), torch.randn(64, 1))
    loader = AdaptiveDataLoader(data, batch_size=8, max_batch_size=32, context=ctx)
    lin = nn.Linear(3, 1)
    opt = torch.optim.Adam(lin.parameters(), lr=0.01)
    model = AdaptiveModel(lin, opt, loader)
    for _, (x, y) in zip(range(3), loader, strict=False):
        model.step(nn.functional.mse_loss(model(x), y))
    weight = lin.weight
    opt.state[weight]["exp_avg_sq"][0, 1] = 0.0  # never had a gradient
    params = list(model._params)
    seen = model._pinv(params)
    unseen = model._pinv(params, unseen_out=True)
    assert seen is not None and unseen is not None
    i = next(j for j, p in enumerate(params) if p is weight)
    assert float(seen[i][0, 1]) == pytest.approx(1e-8)
    assert math.isinf(float(unseen[i][0, 1]))
    finite = torch.isfinite(unseen[i])
    assert int(finite.sum()) == weight.numel() - 1
    assert torch.equal(unseen[i][finite], seen[i][finite])  # the rest as before
    g = torch.ones_like(weight)
    assert float((g / unseen[i])[0, 1]) == 0.0

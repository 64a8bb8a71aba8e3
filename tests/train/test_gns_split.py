"""One replica measures its gradient noise on a step split in two, not on consecutive steps.

Consecutive steps see weights that the earlier steps' noise moved (G2 = G1 − ηHξ1), so their
cross products under-read |G|² by ~η tr(HΣ)/b: on the examples φ came out 2-31x too high
(``benchmarks/gns_check.py``, issue 19). The two halves of one step share the weights.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from coadapt.train import AdaptiveDataLoader, AdaptiveModel
from coadapt.train.context import TrainingContext
from coadapt.train.gns import consecutive_estimate, halves_estimate
from tests.train.test_model import linear_problem


@pytest.mark.parametrize(("b1", "b2"), [(16, 16), (16, 17), (5, 27)])
def test_halves_estimate_is_exact_on_expectations(b1: int, b2: int) -> None:
    g2, tr = 3.0, 50.0  # |G|², tr Σ per sample
    m = b1 + b2
    piece = g2 + tr / b1  # E|g1|²
    cross = g2 + tr / m  # E[g1·ḡ] = w1 E|g1|² + w2 |G|²
    total = g2 + tr / m  # E|ḡ|²
    sqr, trace = halves_estimate(piece, cross, total, b1, b2)
    assert sqr == pytest.approx(g2) and trace == pytest.approx(tr)
    with pytest.raises(ValueError, match="two non-empty halves"):
        halves_estimate(piece, cross, total, b1, 0)


def test_consecutive_steps_are_biased_where_halves_are_not() -> None:
    """SGD on a quadratic (H = hI): per-step noise ξ moves the next gradient by −ηhξ."""
    rng = np.random.default_rng(0)
    d, b, eta, h = 50, 32, 0.5, 1.0
    sigma2 = 0.64  # per-sample noise per coordinate: tr Σ / b = 1.0 = |G|²
    grad = np.full(d, 1.0 / math.sqrt(d))
    cons, halves = [], []
    for _ in range(4000):
        g, rows = grad.copy(), []
        for _ in range(3):  # three consecutive steps from the same start
            step = g + rng.normal(0, math.sqrt(sigma2 / b), d)
            rows.append(step)
            g = g - eta * h * step
        gram = (np.stack(rows) @ np.stack(rows).T).tolist()
        cons.append(consecutive_estimate(gram, b))
        g1 = grad + rng.normal(0, math.sqrt(sigma2 / (b // 2)), d)
        g2 = grad + rng.normal(0, math.sqrt(sigma2 / (b // 2)), d)
        total = (g1 + g2) / 2
        halves.append(halves_estimate(g1 @ g1, g1 @ total, total @ total, b // 2, b // 2))
    # the truth in the middle of the three steps: E|G2|² = (1 − ηh)²|G|², + noise moved in
    truth_tr = d * sigma2
    c_tr = np.mean([t for _, t in cons])
    h_sqr, h_tr = np.mean([s for s, _ in halves]), np.mean([t for _, t in halves])
    assert h_sqr == pytest.approx(1.0, rel=0.05) and h_tr == pytest.approx(truth_tr, rel=0.05)
    assert c_tr > 1.3 * truth_tr  # the noise that moved the weights reads as more noise


def _steps(model: AdaptiveModel, loader: AdaptiveDataLoader, steps: int) -> list[int]:
    """Train ``steps`` steps; the micro-batch sizes the loader yielded."""
    sizes: list[int] = []
    for _ in loader.epochs(100):
        for x, y in loader:
            sizes.append(len(x))
            model.step(nn.functional.mse_loss(model(x), y))
            if model.steps >= steps:
                return sizes
    return sizes


def test_a_measuring_step_is_split_and_trains_like_one(ctx: TrainingContext) -> None:
    data, lin, _ = linear_problem()
    twin = nn.Linear(10, 1, bias=False)
    twin.load_state_dict(lin.state_dict())
    loader = AdaptiveDataLoader(data, batch_size=33, max_batch_size=66, seed=0, context=ctx)
    model = AdaptiveModel(lin, torch.optim.SGD(lin.parameters(), lr=0.01), loader, measure_every=2)
    assert model._gated  # the noise gate holds the batch for the first steps: M stays 33
    x_all, y_all = data.tensors
    perm = torch.from_numpy(loader.permutation(0))
    sizes = _steps(model, loader, 4)
    assert sizes == [16, 17, 33, 16, 17, 33]  # gated: steps 0 and 2 measure, split 16 + 17
    assert model.gns.count == 2
    opt = torch.optim.SGD(twin.parameters(), lr=0.01)
    for k in range(4):  # the same four full-batch steps, unsplit
        idx = perm[33 * k : 33 * (k + 1)]
        opt.zero_grad()
        nn.functional.mse_loss(twin(x_all[idx]), y_all[idx]).backward()
        opt.step()
    assert torch.allclose(lin.weight, twin.weight, atol=1e-6)
    # no step in the warm-up is timed (split or not)
    assert {k[2:] for k in model.profile.rows} == {(33, 0)}


def test_a_split_steps_halves_time_two_more_micro_batch_sizes(ctx: TrainingContext) -> None:
    """A split step is not a step at m (eq. 12 has no per-step cost beyond its micro-batches:
    timing it as one priced 64 at 3x 16 on the cancer MLP), but each half is a micro-batch
    of its own size at the same weights: the fit gets a second size before the job ever
    changes its batch (issue 19)."""
    data, lin, _ = linear_problem()
    loader = AdaptiveDataLoader(data, batch_size=33, max_batch_size=66, seed=0, context=ctx)
    model = AdaptiveModel(lin, torch.optim.SGD(lin.parameters(), lr=0.01), loader, measure_every=2)
    sizes = _steps(model, loader, 8)
    assert sizes[:3] == [16, 17, 33] and loader.local_bsz == 33  # gated: M stays 33
    rows = model.profile.rows
    split_steps = sum(1 for i in range(3, 8) if i % 2 == 0)  # after the 3 warm-up steps
    assert rows[(1, 1, 16, 0)][0] == rows[(1, 1, 17, 0)][0] == 0  # no whole step at 16, 17
    assert rows[(1, 1, 16, 0)][2] == rows[(1, 1, 17, 0)][2] == split_steps
    assert rows[(1, 1, 33, 0)][0] == 8 - 3 - split_steps  # only unsplit steps time 33
    obs = model.profile.observations()
    assert obs is not None and sorted(obs.local_bsz.tolist()) == [16.0, 17.0, 33.0]
    assert [r["local_bsz"] for r in model.profile.table()] == [33]


def test_adam_is_not_measured_before_its_preconditioner_has_a_few_steps(
    ctx: TrainingContext,
) -> None:
    """After one step v̂ = ḡ², P·ḡ = ±1 everywhere: the cancer MLP's first |Pg1|² read 1e8."""
    from coadapt.train.model import _PRECONDITION_WARMUP

    data, lin, _ = linear_problem()
    loader = AdaptiveDataLoader(data, batch_size=32, max_batch_size=64, seed=0, context=ctx)
    opt = torch.optim.Adam(lin.parameters(), lr=1e-3)
    model = AdaptiveModel(lin, opt, loader, measure_every=2)
    _steps(model, loader, _PRECONDITION_WARMUP)
    assert model.gns.count == 0
    _steps(model, loader, _PRECONDITION_WARMUP + 1)
    assert model.gns.count == 1 and math.isfinite(model.pgns)


def test_a_fixed_batch_job_never_splits_a_step(ctx: TrainingContext) -> None:
    """At a fixed M the efficiency is 1 whatever φ is: no extra micro-batch to measure it
    (the overhead benchmark's pinned job would pay one fixed cost in every measure_every)."""
    data, lin, _ = linear_problem()
    loader = AdaptiveDataLoader(data, batch_size=32, max_batch_size=32, seed=0, context=ctx)
    model = AdaptiveModel(lin, torch.optim.SGD(lin.parameters(), lr=0.01), loader, measure_every=2)
    assert set(_steps(model, loader, 8)) == {32}

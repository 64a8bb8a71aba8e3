from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from coadapt.sparse.datasets import N_CAT, N_DENSE, PlantedConfig, iter_planted
from coadapt.sparse.models import (
    DLRM,
    DeepFM,
    FactorizationMachine,
    LogisticRegression,
    _fm_interaction,
    auc,
    chunk_to_tensors,
)


def test_auc_matches_pairwise_definition() -> None:
    rng = np.random.default_rng(0)
    s = rng.integers(0, 5, 60).astype(float)  # many ties
    y = rng.integers(0, 2, 60)
    pos, neg = s[y == 1], s[y == 0]
    pairs = (pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean()
    assert auc(s, y) == pytest.approx(pairs)
    with pytest.raises(ValueError, match="both"):
        auc([1.0, 2.0], [1, 1])


def test_fm_interaction_is_the_pairwise_sum() -> None:
    v = torch.randn(3, 5, 4, dtype=torch.float64)
    brute = torch.stack(
        [(v[:, i] * v[:, j]).sum(1) for i in range(5) for j in range(i + 1, 5)]
    ).sum(0)
    assert torch.allclose(_fm_interaction(v), brute)


def test_chunk_ids_are_distinct_per_field_and_for_missing() -> None:
    ch = next(iter_planted(PlantedConfig(rows=2000, seed=1, missing_cat=0.5)))
    d, c, y = chunk_to_tensors(ch)
    assert d.shape == (2000, N_DENSE) and c.shape == (2000, N_CAT) and y.shape == (2000,)
    ids = c.numpy().view(np.uint64)
    field = ids >> np.uint64(32)
    assert ((field == np.arange(N_CAT)[None, :]) | ch.cat_missing).all()
    assert len({int(x) for x in ids[:, 3][ch.cat_missing[:, 3]]}) == 1


@pytest.mark.parametrize(
    "make",
    [
        lambda: LogisticRegression(hparams={"alpha": 1.0}),
        lambda: FactorizationMachine(4, hparams={"lr": 0.05}),
        lambda: DeepFM(4, hidden=(16,), hparams={"lr": 0.05}),
        lambda: DeepFM(4, hidden=(16,), fm=False, hparams={"lr": 0.05}),
    ],
    ids=["lr", "fm", "deepfm", "widedeep"],
)
def test_models_learn_the_planted_model(make: object) -> None:
    torch.manual_seed(0)
    cfg = PlantedConfig(rows=24_576, seed=2, zipf_min=2.0, zipf_max=3.0, chunk_rows=8192)
    chunks = list(iter_planted(cfg))
    model: nn.Module = make()  # type: ignore[operator]
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loss_fn = nn.BCEWithLogitsLoss()
    for ch in chunks[:-1]:
        d, c, y = chunk_to_tensors(ch)
        for a in range(0, y.numel(), 512):
            opt.zero_grad()
            loss_fn(model(d[a : a + 512], c[a : a + 512]), y[a : a + 512]).backward()
            opt.step()
    d, c, _ = chunk_to_tensors(chunks[-1])
    with torch.no_grad():
        got = auc(model(d, c).numpy(), chunks[-1].labels)
    ceiling = auc(chunks[-1].logit, chunks[-1].labels)
    assert 0.65 < got <= ceiling + 0.01


def test_dlrm_shapes_with_a_plain_embedding_module() -> None:
    class Plain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.e = nn.Embedding(100, 8)

        def forward(self, cats: torch.Tensor) -> torch.Tensor:
            return self.e(cats % 100)

    m = DLRM(Plain(), dim=8, bottom=(16,), top=(16,))
    out = m(torch.randn(4, N_DENSE), torch.randint(0, 1000, (4, N_CAT)))
    assert out.shape == (4,)

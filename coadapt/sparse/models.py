"""CTR models in plain PyTorch on Criteo-shaped input (13 dense + 26 categorical fields).

Every model takes ``(dense, cats)``: ``dense`` float32 (B, 13) (already transformed, e.g.
``log1p``; missing = 0) and ``cats`` int64/uint64 (B, 26) feature IDs; it returns logits (B,).
Sparse weights live in a :class:`~coadapt.sparse.embedding.SparseEmbeddingCollection` (a
parameter server or a local store); everything else is an ordinary torch parameter.

* :class:`LogisticRegression` — one weight per feature ID (dim 1 tables; FTRL fits it best).
* :class:`FactorizationMachine` — linear term + pairwise interactions of dim-k factors
  (Rendle 2010), computed in O(F k) with the square-of-sum trick.
* :class:`DeepFM` — FM + an MLP over the same embeddings (Guo et al. 2017); ``fm=False`` gives
  Wide&Deep (wide linear part + deep MLP).
* :class:`DLRM` — bottom MLP on dense features, dot interactions with the embeddings, top MLP:
  the model the speed benchmark compares with TorchRec.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from coadapt.sparse.client import SparseStore
from coadapt.sparse.datasets import N_CAT, N_DENSE, PlantedChunk
from coadapt.sparse.embedding import SparseEmbeddingCollection

__all__ = [
    "DLRM",
    "DeepFM",
    "FactorizationMachine",
    "LogisticRegression",
    "auc",
    "chunk_to_tensors",
    "field_names",
    "mlp",
]


def field_names(prefix: str = "C", n: int = N_CAT) -> list[str]:
    """Table names of the categorical fields: C1..C26 as in Criteo."""
    return [f"{prefix}{i + 1}" for i in range(n)]


def mlp(sizes: Sequence[int], last_act: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if last_act or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def chunk_to_tensors(ch: PlantedChunk) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dense log1p (B, 13), categorical IDs (B, 26) int64, labels float (B,)) of a generated
    chunk. IDs are salted per field so equal hex values of two fields stay distinct rows; a
    missing value gets its field's own ID."""
    dense = np.log1p(np.maximum(ch.dense, 0)).astype(np.float32)
    dense[ch.dense < 0] = 0.0
    field = np.arange(N_CAT, dtype=np.uint64)[None, :]
    ids = (field << np.uint64(32)) | ch.cats.astype(np.uint64)
    ids = np.where(ch.cat_missing, (field + np.uint64(1)) << np.uint64(40), ids)
    return (
        torch.from_numpy(dense),
        torch.from_numpy(np.ascontiguousarray(ids).view(np.int64)),
        torch.from_numpy(ch.labels.astype(np.float32)),
    )


def auc(scores: npt.ArrayLike, labels: npt.ArrayLike) -> float:
    """Exact ROC AUC (ties count 1/2) by ranks."""
    s = np.asarray(scores, np.float64)
    y = np.asarray(labels).astype(bool)
    p, n = int(y.sum()), int((~y).sum())
    if p == 0 or n == 0:
        raise ValueError("AUC needs both positive and negative labels")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(s.size, np.float64)
    sorted_s = s[order]
    # average ranks of ties
    start = np.r_[0, np.flatnonzero(np.diff(sorted_s)) + 1]
    end = np.r_[start[1:], s.size]
    avg = (start + end + 1) / 2.0
    ranks[order] = np.repeat(avg, end - start)
    return float((ranks[y].sum() - p * (p + 1) / 2.0) / (p * n))


class _Base(nn.Module):
    def __init__(
        self,
        dim: int,
        store: SparseStore | None,
        optimizer: str,
        hparams: dict[str, float] | None,
        prefix: str,
        seed: int,
    ) -> None:
        super().__init__()
        self.embeddings = SparseEmbeddingCollection(
            field_names(prefix), dim, store=store, optimizer=optimizer, hparams=hparams, seed=seed
        )


class LogisticRegression(_Base):
    """``logit = b + w·dense + sum_f w_f(id_f)``; sparse weights are dim-1 table rows."""

    def __init__(
        self,
        store: SparseStore | None = None,
        optimizer: str = "ftrl",
        hparams: dict[str, float] | None = None,
        prefix: str = "lr_C",
        seed: int = 0,
    ) -> None:
        super().__init__(1, store, optimizer, hparams, prefix, seed)
        self.dense = nn.Linear(N_DENSE, 1)

    def forward(self, dense: torch.Tensor, cats: torch.Tensor) -> torch.Tensor:
        return self.dense(dense).squeeze(1) + self.embeddings(cats).sum(dim=(1, 2))


def _fm_interaction(v: torch.Tensor) -> torch.Tensor:
    """sum_{i<j} <v_i, v_j> = 0.5 * sum_k ((sum_i v_ik)^2 - sum_i v_ik^2); v is (B, F, k)."""
    return 0.5 * (v.sum(dim=1).pow(2) - v.pow(2).sum(dim=1)).sum(dim=1)


class FactorizationMachine(nn.Module):
    """Rendle's FM over the 26 fields (+ dense features as a linear term)."""

    def __init__(
        self,
        dim: int = 8,
        store: SparseStore | None = None,
        optimizer: str = "adagrad",
        hparams: dict[str, float] | None = None,
        prefix: str = "fm_",
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.linear = SparseEmbeddingCollection(
            field_names(prefix + "w"),
            1,
            store=store,
            optimizer=optimizer,
            hparams=hparams,
            seed=seed,
        )
        self.factors = SparseEmbeddingCollection(
            field_names(prefix + "v"),
            dim,
            store=store,
            optimizer=optimizer,
            hparams=hparams,
            seed=seed + 1,
        )
        self.dense = nn.Linear(N_DENSE, 1)

    def forward(self, dense: torch.Tensor, cats: torch.Tensor) -> torch.Tensor:
        lin = self.dense(dense).squeeze(1) + self.linear(cats).sum(dim=(1, 2))
        return lin + _fm_interaction(self.factors(cats))


class DeepFM(FactorizationMachine):
    """DeepFM (``fm=True``) or Wide&Deep (``fm=False``): the FM's wide part (and its pairwise
    term with ``fm``) + an MLP over the same embeddings and the dense features."""

    def __init__(
        self,
        dim: int = 8,
        hidden: Sequence[int] = (128, 64),
        fm: bool = True,
        store: SparseStore | None = None,
        optimizer: str = "adagrad",
        hparams: dict[str, float] | None = None,
        prefix: str = "dfm_",
        seed: int = 0,
    ) -> None:
        super().__init__(dim, store, optimizer, hparams, prefix, seed)
        self.fm = fm
        self.deep = nn.Sequential(mlp([N_CAT * dim + N_DENSE, *hidden]), nn.Linear(hidden[-1], 1))

    def forward(self, dense: torch.Tensor, cats: torch.Tensor) -> torch.Tensor:
        v = self.factors(cats)
        out = self.dense(dense).squeeze(1) + self.linear(cats).sum(dim=(1, 2))
        if self.fm:
            out = out + _fm_interaction(v)
        deep_in = torch.cat([v.flatten(1), dense], dim=1)
        return out + self.deep(deep_in).squeeze(1)


class DLRM(nn.Module):
    """DLRM (Naumov et al. 2019): bottom MLP on dense, pairwise dots, top MLP.

    ``embeddings`` may be any module mapping (B, 26) IDs to (B, 26, dim) — a
    :class:`SparseEmbeddingCollection` here, ``nn.EmbeddingBag`` s in the benchmark baseline.
    """

    def __init__(
        self,
        embeddings: nn.Module,
        dim: int = 64,
        bottom: Sequence[int] = (512, 256),
        top: Sequence[int] = (512, 256),
    ) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.bottom = mlp([N_DENSE, *bottom, dim])
        n = N_CAT + 1
        self.tri: torch.Tensor
        self.register_buffer("tri", torch.triu_indices(n, n, offset=1), persistent=False)
        self.top = nn.Sequential(mlp([dim + n * (n - 1) // 2, *top]), nn.Linear(top[-1], 1))

    def interact(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        t = torch.cat([x.unsqueeze(1), emb], dim=1)  # (B, 27, dim)
        z = torch.bmm(t, t.transpose(1, 2))
        return torch.cat([x, z[:, self.tri[0], self.tri[1]]], dim=1)

    def forward(self, dense: torch.Tensor, cats: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        return self.top(self.interact(x, self.embeddings(cats))).squeeze(1)

"""A reference dense model: the MLP the tests, the benchmark and its peers all serve."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Sequential):
    """``depth`` hidden ReLU layers of ``hidden`` units; built from plain kwargs so a manifest
    (and a peer server) can rebuild it."""

    def __init__(self, in_features: int = 64, hidden: int = 256, out_features: int = 8,
                 depth: int = 2) -> None:  # fmt: skip
        if min(in_features, hidden, out_features, depth) < 1:
            raise ValueError("in_features, hidden, out_features and depth must be >= 1")
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, out_features))
        super().__init__(*layers)


def make_mlp(seed: int = 0, **kwargs: int) -> MLP:
    """An MLP with deterministic weights (``torch.manual_seed(seed)`` scoped to the build)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return MLP(**kwargs)


class CtrRanker(nn.Module):
    """The CTR ranking model the sparse serving benchmark and tests serve: each item carries
    ``features`` feature IDs (one shared sparse table, ``dim`` columns); they are sum-pooled in
    ``groups`` equal groups (feature families), and an MLP scores the pooled vector: one logit
    per item. Built around a store (``store=``) like every coadapt.sparse model, so a trainer
    and a server build it from the same kwargs."""

    def __init__(
        self,
        features: int = 500,
        groups: int = 10,
        dim: int = 8,
        hidden: int = 64,
        table: str = "ctr",
        store: object | None = None,
        seed: int = 0,
    ) -> None:
        from coadapt.sparse.embedding import SparseEmbedding

        super().__init__()
        if features < 1 or groups < 1 or features % groups:
            raise ValueError(
                f"features ({features}) must be a positive multiple of groups ({groups})"
            )
        self.features, self.groups, self.dim = features, groups, dim
        self.embedding = SparseEmbedding(table, dim, store=store, seed=seed)  # type: ignore[arg-type]
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.mlp = nn.Sequential(
                nn.Linear(groups * dim, hidden), nn.ReLU(), nn.Linear(hidden, 1)
            )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b = ids.shape[0]
        if ids.dim() != 2 or ids.shape[1] != self.features:
            raise ValueError(f"ids must be (items, {self.features}), got {tuple(ids.shape)}")
        pooled = self.embedding(ids.reshape(b * self.groups, self.features // self.groups))
        return self.mlp(pooled.reshape(b, self.groups * self.dim)).squeeze(1)

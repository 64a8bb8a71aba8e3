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

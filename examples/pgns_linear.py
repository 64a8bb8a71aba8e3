"""Estimate the PGNS of a linear regression with known noise.

y = x·w* + ε, x ~ N(0, I_d), ε ~ N(0, σ²), evaluated at w = w* + δ with |δ| = 1 and lr = 0.
Per-sample gradients 2x(x·δ − ε) give |G|² = 4|δ|², tr Σ = 4((d + 1)|δ|² + dσ²), hence
φ = tr Σ / |G|² = (d + 1) + dσ² = 21 for d = 10, σ² = 1.
"""

from __future__ import annotations

import argparse
import json
import math

import torch
from torch import nn
from torch.utils.data import TensorDataset

import coadapt.train as ct


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--accum", type=int, default=0)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    d, sigma2, n = 10, 1.0, 60000
    g = torch.Generator().manual_seed(0)
    w_star = torch.randn(d, generator=g)
    delta = torch.randn(d, generator=g)
    delta /= delta.norm()
    x = torch.randn(n, d, generator=g)
    y = x @ w_star + math.sqrt(sigma2) * torch.randn(n, generator=g)
    ctx = ct.init()
    loader = ct.AdaptiveDataLoader(
        TensorDataset(x, y[:, None]),
        batch_size=32 * ctx.world_size * (args.accum + 1),
        max_local_bsz=32,
    )
    lin = nn.Linear(d, 1, bias=False)
    with torch.no_grad():
        lin.weight.copy_((w_star + delta)[None])
    model = ct.AdaptiveModel(
        lin,
        torch.optim.SGD(lin.parameters(), lr=0.0),
        loader,
        grad_smoothing=0.995,
        measure_every=2,
        measure_noise=True,  # a fixed batch: φ is measured only when asked for
    )
    for _ in loader.epochs(100):  # one optimizer step in measure_every is measured
        for xb, yb in loader:
            model.step(nn.functional.mse_loss(model(xb), yb))
            if model.gns.count >= args.steps:
                break
        if model.gns.count >= args.steps:
            break
    if ctx.rank == 0:
        with open(args.out, "w") as fh:
            json.dump(
                {
                    "estimate": model.pgns,
                    "truth": (d + 1) + d * sigma2,
                    "measurements": model.gns.count,
                },
                fh,
            )
    ct.shutdown()


if __name__ == "__main__":
    main()

"""A tiny torch.distributed (gloo) job for the Ray integration test, via ``coadapt.train``.

Every step all-reduces the gradients across the replicas (so every rank must reach rank 0's
address), then sleeps ``--step-time`` so the test can rescale or remove a node mid-run. Rank 0
appends JSON lines to ``--log``: one ``start`` record per attempt (world size, restored step,
node) and one ``step`` record per optimizer step. SIGTERM checkpoints and exits 0; a periodic
checkpoint every ``--save-every`` steps is what a node loss falls back to.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

import coadapt.train as ct


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--log", required=True)
    p.add_argument("--max-steps", type=int, default=30)
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--save-every", type=int, default=5, help="periodic checkpoint (node loss)")
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    ctx = ct.init()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g)
    loader = ct.AdaptiveDataLoader(TensorDataset(x, y), batch_size=16, seed=3)
    net = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    model = ct.AdaptiveModel(net, torch.optim.SGD(net.parameters(), lr=0.05), loader)

    def log(record: dict[str, object]) -> None:
        if ctx.rank == 0:
            with open(args.log, "a") as fh:
                fh.write(json.dumps(record) + "\n")

    log(
        {
            "event": "start",
            "world": ctx.world_size,
            "restored": ctx.restored,
            "steps": model.steps,
            "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
            "nodes": os.environ.get("COADAPT_NUM_NODES"),
            "attempt": os.environ.get("COADAPT_ATTEMPT"),
        }
    )
    done = False
    for _epoch in loader.epochs(1000):
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            if model.step(loss):
                log({"event": "step", "step": model.steps, "world": ctx.world_size})
                if model.steps % args.save_every == 0:
                    ctx.save()  # what a node loss falls back to (SIGTERM saves on its own)
                time.sleep(args.step_time)
                if model.steps >= args.max_steps:
                    done = True
                    break
        if done:
            break
    log({"event": "end", "steps": model.steps, "world": ctx.world_size})
    ct.shutdown()


if __name__ == "__main__":
    main()

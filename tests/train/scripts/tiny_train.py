"""A tiny deterministic training job for the tests (MLP on synthetic data, 256 samples).

Rank 0 appends JSON lines to --log: a "start" record (parameter hash, restored step) and one
"step" record per optimizer step with the global sample indices of that step.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

import coadapt.train as ct


def param_hash(module: nn.Module) -> str:
    h = hashlib.sha256()
    for k, v in sorted(module.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--log", required=True)
    p.add_argument("--max-steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--stop-at-step", type=int, default=None, help="rank 0 SIGTERMs itself")
    p.add_argument("--adam", action="store_true")
    p.add_argument(
        "--hold-at-step",
        type=int,
        default=None,
        help="wait after this step until asked to stop (rescale), at --hold-world",
    )
    p.add_argument(
        "--hold-world",
        type=int,
        default=1,
        help="hold only when running at this many replicas (every rank holds)",
    )
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    ctx = ct.init()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(256, 1, generator=g)
    loader = ct.AdaptiveDataLoader(TensorDataset(x, y), batch_size=args.batch_size, seed=3)
    net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = (
        torch.optim.Adam(net.parameters(), lr=1e-2)
        if args.adam
        else torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    )
    model = ct.AdaptiveModel(net, opt, loader)

    def log(record: dict[str, object]) -> None:
        if ctx.rank == 0:
            with open(args.log, "a") as fh:
                fh.write(json.dumps(record) + "\n")

    log(
        {
            "event": "start",
            "hash": param_hash(net),
            "steps": model.steps,
            "world": ctx.world_size,
            "restored": ctx.restored,
            "epoch": loader.epoch,
            "position": loader.position,
        }
    )
    done = False
    for _epoch in loader.epochs(100):
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            if model.step(loss):
                log(
                    {
                        "event": "step",
                        "step": model.steps,
                        "hash": param_hash(net),
                        "indices": loader.last_global_indices.tolist(),
                    }
                )
                if ctx.rank == 0 and model.steps == args.stop_at_step:
                    os.kill(os.getpid(), signal.SIGTERM)
                if ctx.world_size == args.hold_world and model.steps == args.hold_at_step:
                    deadline = time.monotonic() + 60  # bounded: the test SIGTERMs us
                    while not ctx.stop_requested and time.monotonic() < deadline:
                        time.sleep(0.01)
                if model.steps >= args.max_steps:
                    done = True
                    break
        if done:
            break
    log({"event": "end", "hash": param_hash(net), "steps": model.steps, "pgns": model.pgns})
    ct.shutdown()


if __name__ == "__main__":
    main()

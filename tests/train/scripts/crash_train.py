"""A job for the crash and out-of-memory tests: a tiny MLP trained for --max-steps steps.

Rank 0 appends one JSON line per optimizer step to --log ({"step", "local_bsz",
"accum_steps"}) and a "start" record with the step it resumed from. ``--oom-above M`` makes
every forward on a per-replica batch larger than M raise the CPU allocator's out-of-memory
error, as a replica whose batch does not fit would.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

import coadapt.train as ct


class OomAbove(nn.Module):
    """Identity, except that a batch larger than ``limit`` "does not fit"."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.limit:
            raise RuntimeError(
                "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: "
                "can't allocate memory: you tried to allocate 1073741824 bytes."
            )
        return x


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--log", required=True)
    p.add_argument("--max-steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--oom-above", type=int, default=None)
    p.add_argument("--oom-where", choices=("model", "loop"), default="model")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds of 'compute' a step")
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    ctx = ct.init()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g)
    loader = ct.AdaptiveDataLoader(TensorDataset(x, y), batch_size=args.batch_size, seed=3)
    net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    if args.oom_above is not None and args.oom_where == "model":
        net = nn.Sequential(OomAbove(args.oom_above), *net)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    model = ct.AdaptiveModel(net, opt, loader, adapt=False)
    with open(args.log, "a") as fh:

        def log(record: dict[str, object]) -> None:
            if ctx.rank == 0:
                fh.write(json.dumps(record) + "\n")
                fh.flush()

        log({"event": "start", "steps": model.steps, "local_bsz": loader.local_bsz})
        while model.steps < args.max_steps:
            for xb, yb in loader:
                if args.oom_where == "loop" and args.oom_above is not None:
                    OomAbove(args.oom_above)(xb)
                if args.step_sleep:
                    time.sleep(args.step_sleep)
                if model.step(nn.functional.mse_loss(model(xb), yb)):
                    log(
                        {
                            "event": "step",
                            "step": model.steps,
                            "local_bsz": loader.step_local_bsz,
                            "accum_steps": loader.accum_steps,
                        }
                    )
                    if model.steps >= args.max_steps:
                        break
            if model.steps >= args.max_steps:
                break
        log({"event": "end", "steps": model.steps})
    ct.shutdown()


if __name__ == "__main__":
    main()

"""The training job of ``benchmarks/chaos.py``: coadapt.train on synthetic data, with markers.

An MLP trained with ``AdaptiveDataLoader``/``AdaptiveModel`` as in ``examples/`` (product
defaults for checkpoints and batch adaptation). For the chaos accounting every replica writes
into ``--marker-dir/JOB_ID/``: ``start-A-R-PID.json`` when it starts (attempt, rank, the step
it resumed from), ``end-A-R-PID.json`` when it leaves normally, and rank 0 keeps
``progress.json`` (its latest step, at most every 0.1 s) so a kill can be charged the steps
it lost. ``--expand K`` widens each sample K times inside the model, so the memory of a step
grows with the per-replica batch: with a large batch it is the OOM-inducing job.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import coadapt.train as ct


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


class Widen(nn.Module):
    """Repeat the features ``k`` times: activations (and memory) grow with the batch."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.repeat(1, self.k) if self.k > 1 else x


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument(
        "--marker-dir",
        type=Path,
        default=None,
        help="default: markers/ in the job's own directory (the only place a sandboxed "
        "replica can write besides its checkpoints)",
    )
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-batch-size", type=int, default=128)
    p.add_argument("--step-time", type=float, default=0.01, help="extra seconds per step")
    p.add_argument("--expand", type=int, default=1, help="widen samples K times (OOM job)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    ctx = ct.init()
    job = os.environ.get("COADAPT_JOB_ID", "local")
    attempt = int(os.environ.get("COADAPT_ATTEMPT", "0") or 0)
    if args.marker_dir is not None:
        marks = args.marker_dir / job
    else:
        marks = Path(os.environ["COADAPT_CHECKPOINT_DIR"]).parent / "markers"
    marks.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.samples, 32, generator=g)
    y = (x[:, :4].sum(1) > 0).long()
    loader = ct.AdaptiveDataLoader(
        TensorDataset(x, y),
        batch_size=args.batch_size,
        seed=args.seed,
        max_batch_size=args.max_batch_size,
    )
    net = nn.Sequential(Widen(args.expand), nn.Linear(32 * args.expand, 64), nn.ReLU())
    net.append(nn.Linear(64, 2))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    model = ct.AdaptiveModel(net, opt, loader)
    tag = f"{attempt}-{ctx.rank}-{os.getpid()}"
    write_json(
        marks / f"start-{tag}.json",
        {"pid": os.getpid(), "attempt": attempt, "rank": ctx.rank,
         "start_step": model.steps, "time": time.time()},
    )  # fmt: skip
    last_mark = 0.0
    status = "exception"
    try:
        for epoch in loader.epochs(args.epochs):
            model.train()
            for xb, yb in loader:
                model.step(F.cross_entropy(model(xb), yb))
                if args.step_time > 0:
                    time.sleep(args.step_time)
                now = time.time()
                if ctx.rank == 0 and now - last_mark >= 0.1:
                    last_mark = now
                    write_json(
                        marks / "progress.json",
                        {"step": model.steps, "attempt": attempt, "pid": os.getpid(), "time": now},
                    )
            if ctx.rank == 0 and (epoch % 10 == 0 or epoch == args.epochs - 1):
                print(f"epoch {epoch} step {model.steps} batch {loader.batch_size}", flush=True)
        status = "finished"
    except SystemExit:
        status = "stopped"  # checkpointed for a rescale
        raise
    finally:
        write_json(
            marks / f"end-{tag}.json",
            {"status": status, "step": model.steps, "time": time.time()},
        )
    ct.shutdown()


if __name__ == "__main__":
    main()

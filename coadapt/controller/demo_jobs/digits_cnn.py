"""A small CNN on scikit-learn's digits, trained with coadapt.train (adaptive batch + LR).

    coadapt run-local -n 2 --checkpoint-dir /tmp/ck examples/digits_cnn.py --epochs 30

Elastic, with replicas forked from a warm process that has imported torch and scikit-learn:

    coadapt run-local -n 1 --elastic --checkpoint-dir /tmp/ck \
        --preload sklearn.datasets,sklearn.model_selection examples/digits_cnn.py
    echo 2 > /tmp/ck/replicas && kill -USR1 <run-local pid>
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import TensorDataset

import coadapt.train as ct


def digits() -> tuple[TensorDataset, torch.Tensor, torch.Tensor]:
    x, y = load_digits(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x / 16.0, y, test_size=0.2, random_state=0)

    def t(a: object) -> torch.Tensor:
        return torch.tensor(a, dtype=torch.float32).reshape(-1, 1, 8, 8)

    train = TensorDataset(t(xtr), torch.tensor(ytr))
    return train, t(xte), torch.tensor(yte)


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=32, help="M0, the batch the LR is for")
    p.add_argument("--max-batch-size", type=int, default=512)
    p.add_argument("--max-local-bsz", type=int, default=256)
    p.add_argument("--fixed", action="store_true", help="pin the batch size at M0")
    p.add_argument(
        "--measure-noise",
        action="store_true",
        help="measure the gradient noise even with --fixed (as an adaptive job does)",
    )
    p.add_argument("--target-accuracy", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--timing-file", default=None, help="write per-step times (benchmark)")
    p.add_argument(
        "--per-sample-fetch",
        action="store_true",
        help="fetch sample by sample + default_collate, as torch's DataLoader does "
        "(default: one batched index per tensor)",
    )
    args = p.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    ctx = ct.init()
    train, xte, yte = digits()
    loader = ct.AdaptiveDataLoader(
        train,
        batch_size=args.batch_size,
        seed=args.seed,
        max_batch_size=args.batch_size if args.fixed else args.max_batch_size,
        max_local_bsz=args.max_local_bsz,
        batched_fetch=False if args.per_sample_fetch else None,
    )
    net = CNN()
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    model = ct.AdaptiveModel(
        net, opt, loader, retune_every=20, measure_noise=True if args.measure_noise else None
    )
    start, step_times, t_prev = time.perf_counter(), [], 0.0
    cpu_times: list[float] = []  # per-step CPU time of this thread: robust to machine load
    step_ends: list[float] = []  # when each timed step ended (benchmarks pair windows)
    cpu_prev = 0.0
    for epoch in loader.epochs(args.epochs):
        model.train()
        t_prev = 0.0
        for x, y in loader:
            if model.step(F.cross_entropy(model(x), y)):
                now, cpu_now = time.perf_counter(), time.thread_time()
                if t_prev:
                    step_times.append(now - t_prev)
                    cpu_times.append(cpu_now - cpu_prev)
                    step_ends.append(now)
                t_prev, cpu_prev = now, cpu_now
                if args.max_steps is not None and model.steps >= args.max_steps:
                    break
        model.eval()
        with torch.no_grad():
            acc = float((net(xte).argmax(1) == yte).float().mean())
        elapsed = time.perf_counter() - start
        ct.report("accuracy", acc, model.steps)
        if ctx.rank == 0:
            print(
                f"epoch {epoch} step {model.steps} batch {loader.batch_size} "
                f"(m={loader.local_bsz}, s={loader.accum_steps}) lr x{model.lr_scale:.2f} "
                f"pgns {model.pgns:.1f} acc {acc:.4f} t {elapsed:.1f}s",
                flush=True,
            )
        if args.target_accuracy is not None and acc >= args.target_accuracy:
            if ctx.rank == 0:
                print(f"TARGET {acc:.4f} reached at {elapsed:.2f}s", flush=True)
            break
        if args.max_steps is not None and model.steps >= args.max_steps:
            break
    if args.timing_file and ctx.rank == 0:
        with open(args.timing_file, "w") as fh:
            json.dump(
                {
                    "step_times": step_times,
                    "step_cpu_times": cpu_times,
                    "step_ends": step_ends,
                    "elapsed": time.perf_counter() - start,
                },
                fh,
            )
    ct.shutdown()


if __name__ == "__main__":
    main()

"""A long training where the batch size matters: an MLP student learns a random ReLU teacher.

Issue 19's first time-to-accuracy races ended in under a second, so the adaptive job's first
40-50 steps (profiling, noise measurement) were most of its run. Here the user's batch (32,
LR 0.02, SGD + momentum) needs ~5000 steps to 70% test accuracy: seconds at one replica, tens
of seconds at two (each step there pays an all-reduce). The data is generated (no download):
x ~ N(0, I) in 32 dimensions, labels sampled from softmax(teacher(x) / 0.3) where the teacher
is a fixed random 32-64-64-10 ReLU network, so the task is learnable (Bayes accuracy ~88%)
and has real label noise, hence real gradient noise that grows relative to the gradient as
training converges. 131072 training samples keep it from overfitting within the race, and
8192 test samples keep the accuracy's sampling noise near 0.5%. The student is small per
sample, so on a CPU its throughput grows with the batch (the step's fixed cost dominates).

    coadapt run-local -n 2 --checkpoint-dir /tmp/ck examples/teacher_long.py --epochs 3
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import coadapt.train as ct

DIM, CLASSES, HIDDEN, WIDTH = 32, 10, 64, 256
TASK_SEED = 1234  # the teacher and the data are fixed; --seed changes init and order only
TEMPERATURE, LOGIT_STD = 0.3, 3.0


def data(
    n_train: int = 131072, n_test: int = 8192
) -> tuple[TensorDataset, torch.Tensor, torch.Tensor]:
    """(train set, test inputs, test labels) from the fixed random ReLU teacher."""
    g = torch.Generator().manual_seed(TASK_SEED)
    w1 = torch.randn(DIM, HIDDEN, generator=g) * (2 / DIM) ** 0.5
    w2 = torch.randn(HIDDEN, HIDDEN, generator=g) * (2 / HIDDEN) ** 0.5
    w3 = torch.randn(HIDDEN, CLASSES, generator=g) * (1 / HIDDEN) ** 0.5
    x = torch.randn(n_train + n_test, DIM, generator=g)
    logits = torch.relu(torch.relu(x @ w1) @ w2) @ w3
    logits = logits / logits.std() * LOGIT_STD
    probs = F.softmax(logits / TEMPERATURE, dim=1)
    y = torch.multinomial(probs, 1, generator=g).squeeze(1)
    return TensorDataset(x[:n_train], y[:n_train]), x[n_train:], y[n_train:]


def student() -> nn.Module:
    return nn.Sequential(
        nn.Linear(DIM, WIDTH),
        nn.ReLU(),
        nn.Linear(WIDTH, WIDTH),
        nn.ReLU(),
        nn.Linear(WIDTH, CLASSES),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--batch-size", type=int, default=32, help="M0, the batch the LR is for")
    p.add_argument("--max-batch-size", type=int, default=1024)
    p.add_argument("--fixed", action="store_true", help="pin the batch size at M0")
    p.add_argument("--target-accuracy", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    ctx = ct.init()
    train, xte, yte = data()
    loader = ct.AdaptiveDataLoader(
        train,
        batch_size=args.batch_size,
        seed=args.seed,
        max_batch_size=args.batch_size if args.fixed else args.max_batch_size,
    )
    net = student()
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    model = ct.AdaptiveModel(net, opt, loader)
    start = time.perf_counter()
    for epoch in loader.epochs(args.epochs):
        model.train()
        for x, y in loader:
            model.step(F.cross_entropy(model(x), y))
        model.eval()
        with torch.no_grad():
            acc = float((net(xte).argmax(1) == yte).float().mean())
        ct.report("accuracy", acc, model.steps)
        elapsed = time.perf_counter() - start
        if ctx.rank == 0:
            print(
                f"epoch {epoch} step {model.steps} batch {loader.batch_size} "
                f"lr x{model.lr_scale:.2f} pgns {model.pgns:.1f} acc {acc:.4f} t {elapsed:.1f}s",
                flush=True,
            )
        if args.target_accuracy is not None and acc >= args.target_accuracy:
            if ctx.rank == 0:
                print(f"TARGET {acc:.4f} reached at {elapsed:.2f}s", flush=True)
            break
    ct.shutdown()


if __name__ == "__main__":
    main()

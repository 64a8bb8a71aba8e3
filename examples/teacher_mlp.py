"""A wide MLP learning a random teacher network's noisy labels, trained with coadapt.train.

The data is generated (no download): inputs x ~ N(0, I), labels drawn from softmax(teacher(x)
/ temperature), so the task has real label noise and hence real gradient noise. The student is
small per sample, so on a CPU its step time is dominated by per-step work and the throughput
grows with the batch almost linearly up to a few hundred samples: the workload where choosing
a larger batch should pay (benchmarks/tta_bench.py).

    coadapt run-local -n 2 --checkpoint-dir /tmp/ck examples/teacher_mlp.py --epochs 5
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import coadapt.train as ct

DIM, CLASSES, WIDTH = 32, 10, 256
TASK_SEED = 1234  # the teacher and the data are fixed; --seed changes init and order only


def data(
    n_train: int = 16384, n_test: int = 2048, temperature: float = 0.5
) -> tuple[TensorDataset, torch.Tensor, torch.Tensor]:
    """(train set, test inputs, test labels) from the fixed random teacher."""
    g = torch.Generator().manual_seed(TASK_SEED)
    w1 = torch.randn(DIM, 64, generator=g) / DIM**0.5
    w2 = torch.randn(64, CLASSES, generator=g) * 2.0
    x = torch.randn(n_train + n_test, DIM, generator=g)
    logits = torch.tanh(x @ w1) @ w2
    y = torch.multinomial(F.softmax(logits / temperature, dim=1), 1, generator=g).squeeze(1)
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
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.05)
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
    model = ct.AdaptiveModel(net, opt, loader, retune_every=20)
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

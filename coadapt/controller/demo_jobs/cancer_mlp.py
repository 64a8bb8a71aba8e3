"""An MLP with AdamW on scikit-learn's breast-cancer data, trained with coadapt.train.

AdamW gets the square-root LR rule and Adam-pre-conditioned noise measurement by default.

    coadapt run-local -n 2 --checkpoint-dir /tmp/ck examples/cancer_mlp.py --epochs 60
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch import nn
from torch.utils.data import TensorDataset

import coadapt.train as ct


def data() -> tuple[TensorDataset, torch.Tensor, torch.Tensor]:
    x, y = load_breast_cancer(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    scaler = StandardScaler().fit(xtr)

    def t(a: object) -> torch.Tensor:
        return torch.tensor(a, dtype=torch.float32)

    return (
        TensorDataset(t(scaler.transform(xtr)), torch.tensor(ytr)),
        t(scaler.transform(xte)),
        torch.tensor(yte),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-batch-size", type=int, default=256)
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
    net = nn.Sequential(
        nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 2)
    )
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs)
    model = ct.AdaptiveModel(net, opt, loader, scheduler=sched, retune_every=20)
    start = time.perf_counter()
    for epoch in loader.epochs(args.epochs):
        model.train()
        for x, y in loader:
            model.step(F.cross_entropy(model(x), y))
        sched.step()
        model.eval()
        with torch.no_grad():
            acc = float((net(xte).argmax(1) == yte).float().mean())
        ct.report("accuracy", acc, model.steps)
        elapsed = time.perf_counter() - start
        if ctx.rank == 0 and (epoch % 5 == 0 or epoch == args.epochs - 1):
            print(
                f"epoch {epoch} step {model.steps} batch {loader.batch_size} "
                f"lr x{model.lr_scale:.2f} pgns {model.pgns:.1f} acc {acc:.4f} "
                f"t {elapsed:.1f}s",
                flush=True,
            )
        if args.target_accuracy is not None and acc >= args.target_accuracy:
            if ctx.rank == 0:
                print(f"TARGET {acc:.4f} reached at {elapsed:.2f}s", flush=True)
            break
    ct.shutdown()


if __name__ == "__main__":
    main()

"""An MLP on scikit-learn's digits for hyper-parameter tuning (examples/tune_digits_mlp.yaml).

Each epoch reports the test accuracy with ``coadapt.train.report("accuracy", acc, step=epoch)``
(epochs counted from 1, so a trial's curve ends at step ``--epochs``: the experiment's
``max_steps``). It runs in a couple of seconds, under the controller or on its own:

    python examples/tune_digits_mlp.py --lr 0.05 --hidden 64 --optimizer sgd --momentum 0.9
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

import coadapt.train as ct


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--hidden", type=int, default=64, help="width of the two hidden layers")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    p.add_argument("--momentum", type=float, default=0.0, help="SGD momentum (sgd only)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    ct.init()
    x, y = load_digits(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x / 16.0, y, test_size=0.25, random_state=0, stratify=y)
    xtr_t, ytr_t = torch.tensor(xtr, dtype=torch.float32), torch.tensor(ytr)
    xte_t, yte_t = torch.tensor(xte, dtype=torch.float32), torch.tensor(yte)
    net = nn.Sequential(
        nn.Linear(64, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, 10),
    )
    opt: torch.optim.Optimizer = (
        torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum)
        if args.optimizer == "sgd"
        else torch.optim.Adam(net.parameters(), lr=args.lr)
    )
    gen = torch.Generator().manual_seed(args.seed)
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        net.train()
        order = torch.randperm(len(xtr_t), generator=gen)
        for i in range(0, len(order), args.batch_size):
            idx = order[i : i + args.batch_size]
            loss = F.cross_entropy(net(xtr_t[idx]), ytr_t[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            acc = float((net(xte_t).argmax(1) == yte_t).float().mean())
        last_loss = float(loss.detach())
        ct.report("accuracy", acc, step=epoch)
        if not math.isfinite(last_loss):  # diverged: stop wasting the slot
            print(f"epoch {epoch}: diverged (loss {last_loss})", flush=True)
            break
        print(
            f"epoch {epoch} loss {last_loss:.4f} accuracy {acc:.4f} "
            f"t {time.perf_counter() - start:.1f}s",
            flush=True,
        )
    ct.shutdown()


if __name__ == "__main__":
    main()

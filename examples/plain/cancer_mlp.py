"""Plain PyTorch (DDP) twin of examples/cancer_mlp.py."""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=16, help="total batch size")
    p.add_argument("--target-accuracy", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    x, y = load_breast_cancer(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    scaler = StandardScaler().fit(xtr)

    def t(a: object) -> torch.Tensor:
        return torch.tensor(a, dtype=torch.float32)

    train = TensorDataset(t(scaler.transform(xtr)), torch.tensor(ytr))
    xte_t, yte_t = t(scaler.transform(xte)), torch.tensor(yte)
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        train, world, rank, seed=args.seed, drop_last=True
    )
    loader = DataLoader(train, batch_size=args.batch_size // world, sampler=sampler, drop_last=True)
    net = nn.Sequential(
        nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 2)
    )
    model = DistributedDataParallel(net) if world > 1 else net
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs)
    start = time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for xb, yb in loader:
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        sched.step()
        model.eval()
        with torch.no_grad():
            acc = float((net(xte_t).argmax(1) == yte_t).float().mean())
        elapsed = time.perf_counter() - start
        if rank == 0 and (epoch % 5 == 0 or epoch == args.epochs - 1):
            print(f"epoch {epoch} acc {acc:.4f} t {elapsed:.1f}s", flush=True)
        if args.target_accuracy is not None and acc >= args.target_accuracy:
            if rank == 0:
                print(f"TARGET {acc:.4f} reached at {elapsed:.2f}s", flush=True)
            break
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

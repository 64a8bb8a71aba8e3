"""Plain PyTorch (DDP) twin of examples/digits_cnn.py, the benchmark's baseline."""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


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
    p.add_argument("--batch-size", type=int, default=32, help="total batch size")
    p.add_argument("--target-accuracy", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--timing-file", default=None)
    args = p.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    x, y = load_digits(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x / 16.0, y, test_size=0.2, random_state=0)

    def t(a: object) -> torch.Tensor:
        return torch.tensor(a, dtype=torch.float32).reshape(-1, 1, 8, 8)

    train = TensorDataset(t(xtr), torch.tensor(ytr))
    xte_t, yte_t = t(xte), torch.tensor(yte)
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        train, world, rank, seed=args.seed, drop_last=True
    )
    loader = DataLoader(train, batch_size=args.batch_size // world, sampler=sampler, drop_last=True)
    net = CNN()
    model = DistributedDataParallel(net) if world > 1 else net
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    start, step_times, steps = time.perf_counter(), [], 0
    cpu_times: list[float] = []  # per-step CPU time of this thread: robust to machine load
    step_ends: list[float] = []  # when each timed step ended (benchmarks pair windows)
    cpu_prev = 0.0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        t_prev = 0.0
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            steps += 1
            now, cpu_now = time.perf_counter(), time.thread_time()
            if t_prev:
                step_times.append(now - t_prev)
                cpu_times.append(cpu_now - cpu_prev)
                step_ends.append(now)
            t_prev, cpu_prev = now, cpu_now
            if args.max_steps is not None and steps >= args.max_steps:
                break
        model.eval()
        with torch.no_grad():
            acc = float((net(xte_t).argmax(1) == yte_t).float().mean())
        elapsed = time.perf_counter() - start
        if rank == 0:
            print(f"epoch {epoch} step {steps} acc {acc:.4f} t {elapsed:.1f}s", flush=True)
        if args.target_accuracy is not None and acc >= args.target_accuracy:
            if rank == 0:
                print(f"TARGET {acc:.4f} reached at {elapsed:.2f}s", flush=True)
            break
        if args.max_steps is not None and steps >= args.max_steps:
            break
    if args.timing_file and rank == 0:
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
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

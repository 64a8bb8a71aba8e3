"""Per-step cost of coadapt.train vs plain PyTorch, measured in ONE process (1 replica).

Separate processes differ in more than the library (imports, allocator state, machine load
drifting between runs), which blurs a few-percent comparison on a ~7 ms toy step. Here the
plain loop (DataLoader, SGD) and the library loop (AdaptiveDataLoader + AdaptiveModel, noise
measurement on, batch pinned at 64) alternate in the same interpreter on the same data, so the
ratio isolates what the library itself adds per step.

    python benchmarks/inproc_overhead.py --json out/inproc.json

``--callgrind plain|library`` runs one loop under ``valgrind --tool=callgrind
--instr-atstart=no`` (``train_bench.instructions_ratio`` starts it): after a warm-up the script
switches instrumentation on for ``--steps`` steps only, so the count is instructions per
steady-state step, independent of the machine's load. With the torchrun variables set (RANK,
WORLD_SIZE=2, ...) each rank is one such process and the plain loop runs under DDP with a
DistributedSampler, the library's under its own comm hook.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from digits_cnn import CNN, digits

import coadapt.train as ct


def plain_ms(train: torch.utils.data.Dataset, steps: int) -> float:
    """The plain loop: DataLoader and SGD, under DDP with a DistributedSampler when this
    process is one of several ranks (``--callgrind`` at two replicas)."""
    torch.manual_seed(0)
    net = CNN()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    world = dist.get_world_size() if dist.is_initialized() else 1
    model: torch.nn.Module = net
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] | None = None
    if world > 1:
        model = DistributedDataParallel(net)
        sampler = DistributedSampler(train, world, dist.get_rank(), seed=0, drop_last=True)
    loader = DataLoader(
        train, batch_size=64 // world, shuffle=sampler is None, sampler=sampler, drop_last=True
    )
    done, start, epoch = 0, time.perf_counter(), 0
    while done < steps:
        if sampler is not None:
            sampler.set_epoch(epoch)
        epoch += 1
        for x, y in loader:
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            done += 1
            if done >= steps:
                break
    return (time.perf_counter() - start) / steps * 1000


def library_ms(
    train: torch.utils.data.Dataset,
    steps: int,
    batched: bool,
    tag: int,
    checkpoint_interval: float | None = None,
) -> float:
    torch.manual_seed(0)
    loader = ct.AdaptiveDataLoader(
        train,
        batch_size=64,
        max_batch_size=64,
        seed=0,
        name=f"loader-{tag}",
        batched_fetch=None if batched else False,
    )
    net = CNN()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    model = ct.AdaptiveModel(
        net, opt, loader, name=f"model-{tag}", checkpoint_interval=checkpoint_interval
    )
    done, start = 0, time.perf_counter()
    for _ in loader.epochs(10**6):
        for x, y in loader:
            if model.step(F.cross_entropy(model(x), y)):
                done += 1
            if done >= steps:
                break
        if done >= steps:
            break
    return (time.perf_counter() - start) / steps * 1000


def callgrind_steps(variant: str, steps: int) -> None:
    """Warm up, then count two runs of one loop, of ``steps`` and ``2 * steps`` steps, each
    dumped on its own: both include the loop's set-up once, so their difference is ``steps``
    steady-state steps (instrumentation is on only around the two runs)."""
    train, _, _ = digits()

    def control(*args: str) -> None:
        subprocess.run(
            ["callgrind_control", *args, str(os.getpid())], check=True, capture_output=True
        )

    if variant == "plain":
        run = lambda n, tag: plain_ms(train, n)  # noqa: E731
    elif variant == "library":
        # No time-based checkpoints: callgrind runs a step ~50x slower, so their cadence
        # (every 0.5 s in a young job, 0.1% of real time) would fire ~50x as often per step.
        run = lambda n, tag: library_ms(train, n, False, tag, 0.0)  # noqa: E731
    else:
        raise SystemExit(f"--callgrind takes plain or library, not {variant!r}")
    run(5, 0)
    control("-i", "on")
    run(steps, 1)
    control("-d")
    run(2 * steps, 2)
    control("-d")
    control("-i", "off")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--callgrind", default=None, help="plain|library: count one loop's steps")
    args = p.parse_args()
    torch.set_num_threads(1)
    os.environ["COADAPT_CHECKPOINT_DIR"] = tempfile.mkdtemp(prefix="coadapt-inproc-")
    ct.init()
    if args.callgrind:
        callgrind_steps(args.callgrind, args.steps)
        ct.shutdown()
        return 0
    train, _, _ = digits()
    plain, lib, libb = [], [], []
    plain_ms(train, 50)  # warm up both paths
    library_ms(train, 50, False, -1)
    for i in range(args.repeats):  # interleaved: load drift hits all three alike
        plain.append(plain_ms(train, args.steps))
        lib.append(library_ms(train, args.steps, False, 2 * i))
        libb.append(library_ms(train, args.steps, True, 2 * i + 1))
    res = {
        "plain_ms": statistics.median(plain),
        "library_ms": statistics.median(lib),
        "library_batched_ms": statistics.median(libb),
    }
    res["overhead_inproc_1r"] = res["library_ms"] / res["plain_ms"]
    res["overhead_inproc_batched_1r"] = res["library_batched_ms"] / res["plain_ms"]
    for key, value in res.items():
        print(f"{key:<28}{value:>10.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2))
    ct.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

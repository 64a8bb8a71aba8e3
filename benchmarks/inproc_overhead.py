"""Per-step cost of coadapt.train vs plain PyTorch, measured in ONE process (1 replica).

Separate processes differ in more than the library (imports, allocator state, machine load
drifting between runs), which blurs a few-percent comparison on a ~7 ms toy step. Here the
plain loop (DataLoader, SGD) and the library loop (AdaptiveDataLoader + AdaptiveModel, noise
measurement on, batch pinned at 64) alternate in the same interpreter on the same data, so the
ratio isolates what the library itself adds per step.

    python benchmarks/inproc_overhead.py --json out/inproc.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from digits_cnn import CNN, digits

import coadapt.train as ct


def plain_ms(train: torch.utils.data.Dataset, steps: int) -> float:
    torch.manual_seed(0)
    net = CNN()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(train, batch_size=64, shuffle=True, drop_last=True)
    done, start = 0, time.perf_counter()
    while done < steps:
        for x, y in loader:
            F.cross_entropy(net(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            done += 1
            if done >= steps:
                break
    return (time.perf_counter() - start) / steps * 1000


def library_ms(train: torch.utils.data.Dataset, steps: int, batched: bool, tag: int) -> float:
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
    model = ct.AdaptiveModel(net, opt, loader, name=f"model-{tag}")
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    os.environ["COADAPT_CHECKPOINT_DIR"] = tempfile.mkdtemp(prefix="coadapt-inproc-")
    ct.init()
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

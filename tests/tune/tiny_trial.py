"""A tiny trial for the live tuning test: reports "accuracy" per epoch with coadapt.train.

Its final accuracy is a smooth function of ``--x`` (best at 0.3), reached over ``--epochs``
epochs of ``--sleep`` seconds; SIGTERM (a cancel) ends it at the next epoch boundary.
"""

from __future__ import annotations

import argparse
import sys
import time

import coadapt.train as train


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--x", type=float, required=True)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--sleep", type=float, default=0.5)
    args = p.parse_args()
    ctx = train.init()
    final = 1.0 - (args.x - 0.3) ** 2
    for epoch in range(1, args.epochs + 1):
        if ctx.stop_requested:
            break
        time.sleep(args.sleep)
        train.report("accuracy", final * (1.0 - 0.5**epoch), step=epoch)
        print(f"epoch {epoch}", flush=True)
    train.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

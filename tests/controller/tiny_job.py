"""A tiny, torch-free training job that speaks the coadapt.train environment contract.

It "trains" by sleeping ``--step-time`` per step, checkpoints its step counter to
``COADAPT_CHECKPOINT_DIR`` (rank 0), turns SIGTERM into "checkpoint and exit 0", posts
coadapt.train-shaped records (progress, goodput, metric) to ``COADAPT_METRICS_URL``, and
appends one line per start to ``runs.jsonl`` so tests can check resumption.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path
from types import FrameType
from typing import Any

STOP = False


def on_term(signum: int, frame: FrameType | None) -> None:
    global STOP
    STOP = True


def post(record: dict[str, Any]) -> None:
    url = os.environ.get("COADAPT_METRICS_URL")
    if not url or os.environ.get("RANK", "0") != "0":
        return
    body = {
        "job_id": os.environ.get("COADAPT_JOB_ID"),
        "rank": 0,
        "restarts": int(os.environ.get("COADAPT_RESTARTS", "0")),
        "time": time.time(),
        **record,
    }
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=2) as resp:
            resp.read()
    except OSError:
        pass  # best effort, like coadapt.train's sink


def main() -> int:
    signal.signal(signal.SIGTERM, on_term)
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--fail-once-at", type=int, default=None)
    p.add_argument("--fail-always", action="store_true")
    args = p.parse_args()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    ckdir = Path(os.environ.get("COADAPT_CHECKPOINT_DIR", "ck"))
    ckdir.mkdir(parents=True, exist_ok=True)
    ck = ckdir / "state.json"
    step = json.loads(ck.read_text())["step"] if ck.exists() else 0
    if rank == 0:
        with open(ckdir / "runs.jsonl", "a") as fh:
            fh.write(
                json.dumps(
                    {
                        "start_step": step,
                        "world": world,
                        "pid": os.getpid(),
                        "restarts": os.environ.get("COADAPT_RESTARTS"),
                    }
                )
                + "\n"
            )
    print(f"rank {rank}/{world} starting at step {step}", flush=True)
    if args.fail_always:
        print("failing on purpose", flush=True)
        return 5

    def save() -> None:
        if rank == 0:
            tmp = ck.with_suffix(".tmp")
            tmp.write_text(json.dumps({"step": step}))
            os.replace(tmp, ck)

    batch = 32 * world
    while step < args.steps:
        if STOP:
            save()
            post({"kind": "stopped", "checkpoint": str(ck)})
            print(f"rank {rank} stopped at step {step}", flush=True)
            return 0
        time.sleep(args.step_time)
        step += 1
        if args.fail_once_at is not None and step == args.fail_once_at and rank == 0:
            marker = ckdir / "failed-once"
            if not marker.exists():
                marker.write_text("x")
                save()
                print("injected failure", flush=True)
                return 3
        if step % 5 == 0:
            save()
            post(
                {
                    "kind": "progress",
                    "step": step,
                    "epoch": step // 10,
                    "batch_size": batch,
                    "local_bsz": 32,
                    "accum_steps": 0,
                    "replicas": world,
                    "loss": 1.0 / step,
                }
            )
            post(
                {
                    "kind": "goodput",
                    "step": step,
                    "pgns": 100.0,
                    "perf": {
                        "alpha_grad": 0.01,
                        "beta_grad": 0.001,
                        "alpha_local": 0.005,
                        "beta_local": 0.001,
                        "alpha_node": 0.01,
                        "beta_node": 0.001,
                        "gamma": 1.0,
                    },
                    "grad": {"sqr": 1.0, "var": 3.0},
                    "profile": [],
                    "current": [32, 0],
                    "current_goodput": 1000.0 * world,
                    "best": [32, 0],
                    "best_goodput": 1000.0 * world,
                }
            )
    save()
    post({"kind": "metric", "name": "accuracy", "value": 0.9, "step": step})
    print(f"rank {rank} done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

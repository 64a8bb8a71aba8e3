"""API and scheduling-round benchmark of the live controller (SQLite default).

1. Starts ``coadapt server`` (SQLite in a temp state dir, 4 CPU slots, pollux) and submits
   ``--jobs`` (1,000) job specs over the REST API from ``--clients`` threads: p50/p99/max
   latency, throughput, and a check that every submitted job is listed (none lost).
2. In-process: 1,000 pending jobs in a fresh SQLite store, then times the scheduling round
   (snapshot from the DB → ``policy.optimize`` → desired replicas written back) and a full
   reconcile step, with the fake executor.

    .venv/bin/python benchmarks/api_bench.py --json out/api_bench.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coadapt.controller.client import Client  # noqa: E402
from coadapt.controller.subprocess_server import running_controller  # noqa: E402

SPEC = {
    "name": "bench",
    "command": ["true"],
    "working_dir": "/",
    "batch_size": 32,
    "max_batch_size": 256,
    "max_replicas": 2,
    "max_restarts": 0,
}


def bench_api(jobs: int, clients: int, policy: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        state.mkdir(parents=True)
        server_args = ["--slots", "4", "--policy", policy, "--interval", "60"]
        with running_controller(state, Path(tmp) / "server.log", server_args) as controller:
            url = controller.url
            token = controller.admin_token
            latencies: list[float] = []
            ids: list[str] = []
            errors: list[str] = []
            lock = threading.Lock()

            def worker(n: int, k: int) -> None:
                with Client(url, token) as c:
                    for i in range(n):
                        spec = {**SPEC, "name": f"bench-{k}-{i}"}
                        t = time.perf_counter()
                        try:
                            job = c.submit(spec)
                        except Exception as exc:  # recorded and reported as lost
                            with lock:
                                errors.append(str(exc))
                            continue
                        dt = time.perf_counter() - t
                        with lock:
                            latencies.append(dt)
                            ids.append(job["id"])

            per = [jobs // clients + (1 if k < jobs % clients else 0) for k in range(clients)]
            threads = [threading.Thread(target=worker, args=(n, k)) for k, n in enumerate(per)]
            start = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - start
            with Client(url, token) as c:
                listed = {j["id"] for j in c.jobs()}
            lost = sorted(set(ids) - listed)
            lat = np.array(latencies) * 1000
            return {
                "jobs": jobs,
                "clients": clients,
                "accepted": len(ids),
                "errors": len(errors),
                "lost": len(lost) + len(errors),
                "wall_s": wall,
                "per_s": len(ids) / wall,
                "p50_ms": float(np.percentile(lat, 50)),
                "p99_ms": float(np.percentile(lat, 99)),
                "max_ms": float(lat.max()),
                "mean_ms": float(lat.mean()),
            }


def bench_round(jobs: int, policy: str, rounds: int, slots: int) -> dict[str, Any]:
    from coadapt.controller.db import sqlite_url
    from coadapt.controller.reconciler import Controller, ControllerConfig
    from coadapt.controller.snapshot import build_snapshot
    from coadapt.controller.spec import parse_spec
    from coadapt.controller.states import JobState
    from coadapt.controller.store import Store
    from coadapt.executors import FakeExecutor
    from coadapt.policies import make_policy

    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(sqlite_url(Path(tmp) / "bench.db"))
        tenant, _ = store.create_tenant("bench", 0.0)
        for i in range(jobs):
            store.create_job(tenant, parse_spec({**SPEC, "name": f"p{i}"}), float(i) * 0.01)
        clock = [100.0]
        pol = make_policy(policy)
        ctl = Controller(
            store,
            FakeExecutor(slots=slots),
            pol,
            ControllerConfig(state_dir=Path(tmp), interval=1e9),
            clock=lambda: clock[0],
        )
        sched, steps, optimize, snap = [], [], [], []
        for r in range(rounds):
            clock[0] += 60
            active = store.list_jobs(
                states=(JobState.PENDING, JobState.RUNNING, JobState.RESCALING)
            )
            t = time.perf_counter()
            snapshot = build_snapshot(active, slots, clock[0], 30.0)
            snap.append(time.perf_counter() - t)
            t = time.perf_counter()
            pol.optimize(snapshot, {}, np.random.default_rng([0, 1000 + r]))
            optimize.append(time.perf_counter() - t)
            t = time.perf_counter()
            ctl.schedule(clock[0])
            sched.append(time.perf_counter() - t)
            t = time.perf_counter()
            ctl.step()
            steps.append(time.perf_counter() - t)
        running = len(store.replicas(statuses=("live",)))
        store.close()

    def ms(xs: list[float]) -> dict[str, float]:
        return {"median_ms": statistics.median(xs) * 1000, "max_ms": max(xs) * 1000}

    return {
        "pending_jobs": jobs,
        "slots": slots,
        "rounds": rounds,
        "policy": policy,
        "snapshot": ms(snap),
        "optimize": ms(optimize),
        "schedule_round": ms(sched),
        "reconcile_step": ms(steps),
        "replicas_running_after": running,
    }


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--policy", default="pollux")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--slots", type=int, default=16, help="slots of the in-process round bench")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    console = Console()
    api = bench_api(args.jobs, args.clients, args.policy)
    rnd = bench_round(args.jobs, args.policy, args.rounds, args.slots)
    t = Table(title=f"coadapt controller benchmark (SQLite, policy {args.policy})")
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_row(f"submissions ({api['clients']} clients)", f"{api['accepted']}/{api['jobs']}")
    t.add_row("lost submissions", str(api["lost"]))
    t.add_row(
        "submit p50 / p99 / max (ms)",
        f"{api['p50_ms']:.1f} / {api['p99_ms']:.1f} / {api['max_ms']:.1f}",
    )
    t.add_row("submit throughput (jobs/s)", f"{api['per_s']:.0f}")
    for key in ("snapshot", "optimize", "schedule_round", "reconcile_step"):
        t.add_row(
            f"{key.replace('_', ' ')} with {rnd['pending_jobs']} pending (median / max ms)",
            f"{rnd[key]['median_ms']:.0f} / {rnd[key]['max_ms']:.0f}",
        )
    console.print(t)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"api": api, "round": rnd}, indent=2))
    return 0 if api["lost"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""What the kept-alive metrics connection buys: records/s to a live controller, two ways.

A job's replicas send their metric records to ``POST /api/v1/jobs/{id}/metrics`` of the real
controller (``coadapt server``, SQLite). :class:`coadapt.train.metrics.MetricsSink` keeps one
``httpx.Client`` connection open; the alternative it replaced opened a new TCP connection per
record (``urllib.request`` per record). This sends ``--records`` event records per repeat
each way, interleaved over ``--repeats`` repeats (so load drifts hit both alike), and reports
the median per-record latency and sender CPU time of each (the CPU a replica's drain thread
takes from training), and the median of the per-repeat ratios with a 95 % bootstrap interval.

    .venv/bin/python benchmarks/metrics_channel.py --json out/metrics_channel.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coadapt.controller.client import Client  # noqa: E402
from coadapt.controller.store import Store  # noqa: E402
from coadapt.controller.subprocess_server import running_controller  # noqa: E402

JOB = {
    "name": "metrics-target",
    "command": ["sleep", "600"],
    "working_dir": "/",
    "batch_size": 32,
    "min_replicas": 1,
    "max_replicas": 1,
}


def _record(i: int) -> dict[str, Any]:
    return {"kind": "metric", "name": "loss", "value": 1.0 / (i + 1), "step": i}


Timing = tuple[float, float]  # (wall seconds, sender CPU seconds) per record


def _timed(send: Any, n: int) -> Timing:
    w0, c0 = time.perf_counter(), time.process_time()
    for i in range(n):
        send(i)
    return (time.perf_counter() - w0) / n, (time.process_time() - c0) / n


def _kept_alive(url: str, n: int) -> Timing:
    """One kept-alive connection (what MetricsSink does)."""
    with httpx.Client(timeout=10.0) as client:
        client.post(url, json=_record(0)).raise_for_status()  # connect outside the timing
        return _timed(lambda i: client.post(url, json=_record(i)).raise_for_status(), n)


def _fresh(url: str, n: int) -> Timing:
    """A new connection per record: the channel before commit 7376942 did exactly this, one
    ``urllib.request.urlopen`` per record."""

    def send(i: int) -> None:
        req = urllib.request.Request(
            url,
            data=json.dumps(_record(i)).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=10.0) as resp:
            resp.read()

    return _timed(send, n)


def _bootstrap_ci(ratios: list[float], seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    arr = np.asarray(ratios)
    medians = np.median(rng.choice(arr, size=(10_000, arr.size), replace=True), axis=1)
    lo, hi = np.percentile(medians, [2.5, 97.5])
    return float(lo), float(hi)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=200, help="records per repeat and way")
    ap.add_argument("--repeats", type=int, default=10, help="interleaved repeats (>= 2)")
    ap.add_argument("--json", dest="json_out", help="write the result here")
    args = ap.parse_args(argv)
    if args.records < 1 or args.repeats < 2:
        ap.error("--records must be >= 1 and --repeats >= 2")
    console = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="coadapt-metrics-") as tmp:
        state = Path(tmp) / "state"
        with running_controller(state, Path(tmp) / "controller.log", ["--slots", "1"]) as ctl:
            with Client(ctl.url, ctl.admin_token) as api:
                job_id = api.submit(JOB)["id"]
            store = Store.open(f"sqlite:///{state / 'coadapt.db'}", run_migrations=False)
            try:
                token = store.job_token(job_id)
            finally:
                store.close()
            url = f"{ctl.url}/api/v1/jobs/{job_id}/metrics?token={token}"
            kept: list[Timing] = []
            fresh: list[Timing] = []
            for r in range(args.repeats):
                order = (_kept_alive, _fresh) if r % 2 == 0 else (_fresh, _kept_alive)
                for fn in order:
                    (kept if fn is _kept_alive else fresh).append(fn(url, args.records))
                console.print(
                    f"repeat {r + 1}/{args.repeats}: kept-alive {kept[-1][0] * 1e3:.2f} ms, "
                    f"new connection {fresh[-1][0] * 1e3:.2f} ms per record"
                )
    result: dict[str, Any] = {
        "name": "metrics_channel",
        "records_per_repeat": args.records,
        "repeats": args.repeats,
        "load_average_1m": os.getloadavg()[0],
    }
    for i, what in enumerate(("wall", "cpu")):
        ratios = [f[i] / k[i] for k, f in zip(kept, fresh, strict=True)]
        result[f"kept_alive_{what}_ms_per_record"] = statistics.median(k[i] for k in kept) * 1e3
        result[f"new_connection_{what}_ms_per_record"] = (
            statistics.median(f[i] for f in fresh) * 1e3
        )
        result[f"{what}_ratio_new_over_kept"] = statistics.median(ratios)
        result[f"{what}_ratio_ci95"] = list(_bootstrap_ci(ratios))
    table = Table(title="metrics channel: per-record POST to a live controller (SQLite)")
    for col in ("connection", "wall ms/record", "sender CPU ms/record"):
        table.add_column(col)
    for label, key in (("kept alive (httpx)", "kept_alive"), ("new (urllib)", "new_connection")):
        wall, cpu = result[f"{key}_wall_ms_per_record"], result[f"{key}_cpu_ms_per_record"]
        table.add_row(label, f"{wall:.2f}", f"{cpu:.3f}")
    for what in ("wall", "cpu"):
        lo, hi = result[f"{what}_ratio_ci95"]
        Console().print(
            f"{what}: new/kept-alive ratio median {result[f'{what}_ratio_new_over_kept']:.2f} "
            f"(95% bootstrap CI {lo:.2f}-{hi:.2f})"
        )
    Console().print(table)
    Console().print(f"load average {result['load_average_1m']:.1f}")
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

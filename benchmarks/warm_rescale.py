"""Controller-driven rescale of a torch job under the default isolation: warm vs cold.

    python benchmarks/warm_rescale.py --repeats 5 --json /tmp/warm_rescale.json

A real :class:`~coadapt.controller.reconciler.Controller` loop (SQLite store, the local
executor with ``--isolation auto`` resolved as ``coadapt server`` resolves it: namespaces and
the run-as user ``nobody`` when run as root) runs ``examples/digits_cnn.py`` at 1 replica;
then the policy asks for 2. Timed from that policy change (``Controller.poke``) to the new
attempt's ``first_step`` record at 2 replicas: SIGTERM, checkpoint, exit, the controller
noticing, launch of 2 replicas (forked from the job's sandboxed zygote, or ``python`` +
``import torch`` cold with ``COADAPT_WARM=0``), rendezvous, restore, first optimizer step.
Warm and cold runs alternate (drifting machine load hits both alike); each run is a fresh
job in a fresh state dir, and its zygote (started by the first attempt, outside the timing,
as for a job that has been running) is waited for before the rescale.

``--spawn N`` adds the mechanism alone, less sensitive to a busy machine: N launches of a
script that imports ``coadapt.train`` and torch and prints the time, through the same
sandboxed executor, timed from ``LocalExecutor.launch`` to that line (the replica ready to
work), warm (forked from the job's zygote) and cold (``COADAPT_WARM=0``).

Prints a table (median, min, max per mode and the cold/warm ratio) and writes JSON.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coadapt.controller.reconciler import Controller, ControllerConfig  # noqa: E402
from coadapt.controller.spec import parse_spec  # noqa: E402
from coadapt.controller.store import Store  # noqa: E402
from coadapt.executors import LocalExecutor, ReplicaHandle, ReplicaSpec  # noqa: E402
from coadapt.executors.memlimit import detect, parse_size  # noqa: E402
from coadapt.executors.sandbox import resolve  # noqa: E402
from coadapt.policies import (  # noqa: E402
    Allocation,
    BatchMode,
    ClusterSnapshot,
    Decision,
    PolicyState,
)
from coadapt.train.zygote import MAX_MESSAGE  # noqa: E402

SCRIPT = ROOT / "examples" / "digits_cnn.py"


@dataclass
class FixedPolicy:
    """Job -> replica count on the one node (the benchmark sets it; deterministic)."""

    want: dict[str, int] = field(default_factory=dict)
    name: str = "fixed"
    batch_mode: BatchMode = BatchMode.ADAPTIVE

    def optimize(
        self, snapshot: ClusterSnapshot, state: PolicyState, rng: np.random.Generator
    ) -> Decision:
        out: dict[str, Allocation] = {}
        for job in snapshot.jobs:
            out[job] = (self.want.get(job, 0),) + (0,) * (len(snapshot.nodes) - 1)
        return Decision(out)


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    return out


def _wait(what: str, pred: Callable[[], Any], timeout: float, logs: Path) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.02)
    tail = "".join(p.read_text()[-1500:] for p in sorted(logs.rglob("*.log")))
    raise RuntimeError(f"timed out waiting for {what}; logs:\n{tail}")


def _zygote_ready(since: float) -> bool:
    """A zygote socket made after ``since`` answers "ready" (its imports are done)."""
    sock_dir = Path(tempfile.gettempdir()) / f"coadapt-zygotes-{os.getuid()}"
    for path in sock_dir.glob("*.sock"):
        if path.stat().st_mtime < since:
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
            conn.settimeout(1.0)
            try:
                conn.connect(str(path))
                if b"ready" in conn.recv(MAX_MESSAGE):
                    return True
            except OSError:
                continue
    return False


def _kill_zygotes(job_dir: Path) -> None:
    """The run's own zygote (it watches the job's runs dir): not left idling."""
    watch = str(job_dir / "runs").encode()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd[1:3] == [b"-m", b"coadapt.train.zygote"] and watch in cmd:
            os.kill(int(pid), signal.SIGKILL)


def rescale_once(warm: bool, isolation: str, memory: str | None) -> dict[str, Any]:
    """One fresh job, 1 -> 2 replicas through the controller; seconds to the first step."""
    top = Path(tempfile.mkdtemp(prefix="coadapt-warm-rescale-"))
    top.chmod(0o755)
    state = top / "state"
    jobs = state / "jobs"
    jobs.mkdir(parents=True)
    state.chmod(0o700)
    jobs.chmod(0o700)
    limit = detect(parse_size(memory)) if memory else None
    iso = resolve(isolation, hide=(str(state), str(jobs)), jobs_root=str(jobs), memory=limit)
    executor = LocalExecutor(slots=2, isolation=iso if iso.active else None)
    store = Store.open(f"sqlite:///{state / 'coadapt.db'}")
    tenant, _ = store.create_tenant("bench", time.time())
    policy = FixedPolicy()
    config = ControllerConfig(
        state_dir=state, interval=5.0, stop_grace=60.0, backoff_base=1.0, min_round_gap=0.1
    )
    ctl = Controller(store, executor, policy, config)
    stop = threading.Event()
    loop = threading.Thread(target=ctl.run, args=(stop, 0.05), daemon=True)
    job_id = ""
    try:
        loop.start()
        spec = {
            "name": "digits",
            "script": str(SCRIPT),
            "args": ["--epochs", "100000"],
            "batch_size": 32,
            "max_batch_size": 512,
            "min_replicas": 1,
            "max_replicas": 2,
            "env": {
                "COADAPT_WARM": "1" if warm else "0",
                "COADAPT_METRICS_FILE": "metrics.jsonl",  # relative: the job's own dir
                "OMP_NUM_THREADS": "1",
            },
        }
        since = time.time() - 1.0
        job_id = store.create_job(tenant, parse_spec(spec), time.time()).id
        metrics = jobs / job_id / "metrics.jsonl"
        policy.want[job_id] = 1
        ctl.poke()
        _wait(
            "100 steps at 1 replica",
            lambda: any(r.get("step", 0) >= 100 for r in _records(metrics)),
            180,
            top,
        )
        if warm:
            _wait("the job's zygote", lambda: _zygote_ready(since), 120, top)
        t0 = time.time()
        policy.want[job_id] = 2
        ctl.poke()
        first = _wait(
            "the first step at 2 replicas",
            lambda: next(
                (
                    r
                    for r in _records(metrics)
                    if r.get("kind") == "first_step" and r.get("replicas") == 2
                ),
                None,
            ),
            180,
            top,
        )
        seconds = float(first["time"]) - t0
        logs = "".join(p.read_text() for p in (jobs / job_id / "logs").glob("attempt-2*.log"))
        events = [
            (round(e.time - t0, 2), e.kind, e.message[:80])
            for e in store.events(job_id)
            if e.time >= t0
        ]
        launched = next(t for t, kind, msg in events if msg.startswith("attempt 2:"))
        return {
            "mode": "warm" if warm else "cold",
            "seconds": seconds,
            "launch_to_first_step_s": seconds - launched,
            "events": events,
            "first_step_record": first,
            "isolation": iso.describe()["mode"],
            "run_as": iso.describe()["run_as"],
            "memory_per_slot": iso.describe()["memory_per_slot"],
            "attempt2_started_cold": logs.count("starting cold"),
        }
    finally:
        stop.set()
        loop.join(timeout=30)
        if job_id:
            for rep in store.replicas(job_id):
                if rep.pid is not None:
                    handle = ReplicaHandle(rep.pid, rep.start_ticks, rep.run_dir, rep.rank)
                    executor.stop(handle, force=True)
                    executor.poll(handle)
            _kill_zygotes(jobs / job_id)
        time.sleep(0.5)
        for h in list(getattr(executor, "_children", {}).values()):
            h.wait(timeout=10)
        shutil.rmtree(top, ignore_errors=True)


SPAWNED = """# a coadapt.train job (the executor looks for that name)
import time
import coadapt.train, torch
print("running", time.time(), flush=True)
"""


def spawn_times(n: int, isolation: str, memory: str | None) -> dict[str, list[float]]:
    """Seconds from ``launch`` to the replica's first line, warm and cold, ``n`` of each."""
    top = Path(tempfile.mkdtemp(prefix="coadapt-warm-spawn-"))
    top.chmod(0o755)
    state = top / "state"
    jobs = state / "jobs"
    job = jobs / "spawn"
    job.mkdir(parents=True)
    (job / "job.py").write_text(SPAWNED)
    limit = detect(parse_size(memory)) if memory else None
    iso = resolve(isolation, hide=(str(state), str(jobs)), jobs_root=str(jobs), memory=limit)
    ex = LocalExecutor(slots=1, isolation=iso if iso.active else None)
    out: dict[str, list[float]] = {"warm": [], "cold": []}
    attempt = 0
    try:
        for mode in ["warm-up"] + ["warm", "cold"] * n:
            attempt += 1
            spec = ReplicaSpec(
                job_id="spawn",
                attempt=attempt,
                rank=0,
                world_size=1,
                argv=(sys.executable, str(job / "job.py")),
                cwd=str(job),
                run_dir=str(job / "runs" / str(attempt)),
                log_path=str(job / "logs" / f"attempt-{attempt}.log"),
                slot=0,
                env={
                    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "OMP_NUM_THREADS": "1",
                    "COADAPT_WARM": "0" if mode == "cold" else "1",
                },
            )
            t0 = time.time()
            handle = ex.launch(spec)
            log = Path(spec.log_path)
            deadline = time.monotonic() + 120
            while not ex.poll(handle).done and time.monotonic() < deadline:
                time.sleep(0.01)
            text = log.read_text()
            line = next((ln for ln in text.splitlines() if ln.startswith("running")), None)
            if line is None:
                raise RuntimeError(f"the replica did not run:\n{text[-2000:]}")
            if mode == "warm-up":  # the first launch starts the zygote: wait until it is ready
                _wait("the job's zygote", functools.partial(_zygote_ready, t0 - 1.0), 120, top)
                continue
            if mode == "warm" and "starting cold" in text:
                raise RuntimeError(f"a warm launch started cold:\n{text[-2000:]}")
            out[mode].append(float(line.split()[1]) - t0)
            print(f"  spawn {mode}: {out[mode][-1]:.3f} s", file=sys.stderr)
    finally:
        _kill_zygotes(job)
        shutil.rmtree(top, ignore_errors=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=5, help="runs per mode (median of these)")
    p.add_argument("--isolation", default="auto", help="as coadapt server --isolation")
    p.add_argument("--memory-per-slot", default=None, help="as coadapt server, e.g. 4G")
    p.add_argument("--spawn", type=int, default=0, help="also time N bare launches per mode")
    p.add_argument("--json", default=None, help="write results here")
    args = p.parse_args()
    spawn: dict[str, list[float]] = {}
    if args.spawn:
        spawn = spawn_times(args.spawn, args.isolation, args.memory_per_slot)
    runs: list[dict[str, Any]] = []
    for i in range(args.repeats):
        for warm in (True, False) if i % 2 == 0 else (False, True):
            run = rescale_once(warm, args.isolation, args.memory_per_slot)
            print(f"  run {i + 1} {run['mode']}: {run['seconds']:.2f} s", file=sys.stderr)
            runs.append(run)
    table: dict[str, dict[str, float]] = {}
    ratio = launch_ratio = float("nan")
    if runs:
        for mode in ("warm", "cold"):
            xs = [r["seconds"] for r in runs if r["mode"] == mode]
            ls = [r["launch_to_first_step_s"] for r in runs if r["mode"] == mode]
            table[mode] = {
                "median_s": statistics.median(xs),
                "min_s": min(xs),
                "max_s": max(xs),
                "launch_to_first_step_median_s": statistics.median(ls),
            }
        ratio = table["cold"]["median_s"] / table["warm"]["median_s"]
        launch_ratio = (
            table["cold"]["launch_to_first_step_median_s"]
            / table["warm"]["launch_to_first_step_median_s"]
        )
        print(
            f"rescale 1 -> 2 replicas, isolation {runs[0]['isolation']} "
            f"(run as {runs[0]['run_as']}), memory per slot {runs[0]['memory_per_slot']}, "
            f"{args.repeats} runs each"
        )
        print(f"{'mode':<6} {'median s':>9} {'min s':>7} {'max s':>7} {'launch->step s':>15}")
        for mode, row in table.items():
            print(
                f"{mode:<6} {row['median_s']:9.2f} {row['min_s']:7.2f} {row['max_s']:7.2f} "
                f"{row['launch_to_first_step_median_s']:15.2f}"
            )
        print(
            f"cold / warm (medians): {ratio:.1f}x whole rescale, {launch_ratio:.1f}x launch->step"
        )
        if any(r["attempt2_started_cold"] for r in runs if r["mode"] == "warm"):
            print("warning: some warm runs' replicas started cold (see runs in the JSON)")
    if spawn:
        ws, cs = statistics.median(spawn["warm"]), statistics.median(spawn["cold"])
        print(
            f"launch -> torch imported ({args.spawn} each, medians): warm {ws:.3f} s, "
            f"cold {cs:.3f} s, cold / warm {cs / ws:.1f}x"
        )
    if args.json:
        result = {
            "table": table,
            "ratio_cold_over_warm": ratio,
            "ratio_launch_to_first_step": launch_ratio,
            "isolation": args.isolation,
            "memory_per_slot": args.memory_per_slot,
            "runs": runs,
            "spawn_s": spawn,
        }
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

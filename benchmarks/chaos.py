"""Chaos benchmark of the live controller: random kill -9s of the controller and of replicas.

Runs a real ``coadapt server`` (loopback, SQLite, a temp state dir) and real coadapt.train
jobs (``benchmarks/chaos_job.py``: the examples' MLP training on synthetic data, writing
per-attempt marker files), then, at seeded random times within ``--duration``:

- ``--controller-kills`` times: SIGKILL the controller, wait 1-3 s, start a new one on the
  same state dir and port (it must re-adopt the running replicas);
- ``--replica-kills`` times: SIGKILL rank 0 of a running job (it must resume from its
  checkpoint); the steps it lost are the last step it reached (its ``progress.json``, read
  just before the kill) minus the step the next attempt started from (its start marker).

With ``--memory-per-slot SIZE`` supported by the server it also submits ``--oom-jobs`` jobs
whose per-replica batch does not fit in SIZE: they must be OOM-killed, retried with a
smaller batch by the controller, and finish.

Jobs write their markers into ``markers/`` of their own job directory (a sandboxed replica
sees nothing else), and as replicas live in their own PID namespaces, processes are found
from the host's side: the shim's pid file of each attempt (``runs/A/rankR.pid``, the
supervisor the executor starts) and that supervisor's descendants. A monitor scans every
0.5 s: "run twice" is two attempts of one job with live replicas at the same time, or a
replica started after its job SUCCEEDED. At the end it
prints jobs submitted / succeeded / lost / run twice, steps lost per replica kill, OOM
retries and their final batch, against the goals (0 lost, 0 twice, <= 2% of a job's steps
lost per replica kill, every OOM job finishes).

    .venv/bin/python benchmarks/chaos.py --duration 180 --controller-kills 5 \\
        --replica-kills 5 --json out/chaos.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coadapt.controller.client import Client, ClientError  # noqa: E402
from coadapt.controller.subprocess_server import (  # noqa: E402
    RunningController,
    free_port,
    running_controller,
)

JOB_SCRIPT = Path(__file__).resolve().parent / "chaos_job.py"
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def starts(markers: Path) -> list[dict[str, Any]]:
    """A job's start markers (one per replica process), oldest first."""
    out = [read_json(p) for p in markers.glob("start-*.json")]
    return sorted((s for s in out if s), key=lambda s: s["time"])


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def supervisor(run_dir: Path, rank: int) -> int | None:
    """The host pid of a live replica supervisor (the shim), None once it has exited."""
    rec = read_json(run_dir / f"rank{rank}.pid")
    if rec is None or (run_dir / f"rank{rank}.exit").exists():
        return None
    fields = _stat(int(rec["pid"]))
    if fields is None or fields[0] in ("Z", "X"):
        return None
    if rec.get("start_ticks") is not None and int(fields[19]) != int(rec["start_ticks"]):
        return None  # the pid was reused
    return int(rec["pid"])


def training_process(root: int) -> int | None:
    """The host pid of the training process under supervisor ``root`` (its descendant that
    runs chaos_job.py; in a PID namespace it is the sandbox init's child)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    todo, found = [root], None
    while todo:
        pid = todo.pop()
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if JOB_SCRIPT.name.encode() in cmd and b"coadapt.executors" not in cmd:
            found = pid  # the deepest match: the interpreter running the script
        todo.extend(children.get(pid, []))
    return found


def server_supports(flag: str) -> bool:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, "-m", "coadapt.cli", "server", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    return flag in res.stdout


@dataclass
class Monitor:
    """Scans every ``every`` seconds for two attempts of one job with live replicas."""

    jobs_dir: Path
    every: float = 0.5
    overlaps: dict[str, list[int]] = field(default_factory=dict)  # job -> attempts seen together
    scans: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.wait(self.every):
            self.scan()

    def scan(self) -> None:
        self.scans += 1
        if not self.jobs_dir.exists():
            return
        for job_dir in self.jobs_dir.iterdir():
            live = set()
            for run in (job_dir / "runs").glob("*"):
                ranks = (int(p.stem.removeprefix("rank")) for p in run.glob("rank*.pid"))
                if run.name.isdigit() and any(supervisor(run, r) for r in ranks):
                    live.add(int(run.name))
            if len(live) > 1:
                self.overlaps[job_dir.name] = sorted(live)

    def stop(self) -> None:
        self._stop.set()


@dataclass
class Kill:
    kind: str  # "controller" or "replica"
    at: float  # seconds since start
    job: str | None = None
    attempt: int | None = None
    last_step: int | None = None
    restart_step: int | None = None
    job_steps: int | None = None

    @property
    def lost(self) -> int | None:
        if self.last_step is None or self.restart_step is None:
            return None
        return self.last_step - self.restart_step

    @property
    def lost_pct(self) -> float | None:
        lost = self.lost
        if lost is None or not self.job_steps:
            return None
        return 100.0 * lost / self.job_steps


class Chaos:
    def __init__(self, args: argparse.Namespace, work: Path, console: Console) -> None:
        self.args = args
        self.work = work
        self.console = console
        self.rng = random.Random(args.seed)
        self.state = work / "state"
        self.state.mkdir(parents=True, exist_ok=True)
        self.jobs_dir = self.state / "jobs"
        self.port = free_port()
        self.oom = args.oom_jobs > 0 and server_supports("--memory-per-slot")
        self.server_args = [
            "--slots",
            str(args.slots),
            "--interval",
            "5",
            "--tick",
            "0.3",
            "--restart-delay",
            "2",
            "--stop-grace",
            "10",
            "--backoff",
            "0.5",
        ]
        if self.oom:
            self.server_args += ["--memory-per-slot", args.memory_per_slot]
        self.t0 = time.monotonic()
        self.jobs: dict[str, str] = {}  # id -> "normal" | "oom"
        self.kills: list[Kill] = []
        self.skipped: list[str] = []
        self.controller_starts = 0

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def say(self, text: str) -> None:
        self.console.print(f"[{self.elapsed():6.1f}s] {text}", highlight=False)

    def start_controller(self, stack: ExitStack) -> RunningController:
        rc = stack.enter_context(
            running_controller(
                self.state, self.work / "controller.log", self.server_args, port=self.port
            )
        )
        self.controller_starts += 1
        return rc

    def spec(self, i: int, oom: bool) -> dict[str, Any]:
        a = self.args
        if oom:
            batch, args = (
                a.oom_batch,
                [
                    "--expand",
                    str(a.oom_expand),
                    "--samples",
                    str(2 * a.oom_batch),
                    "--epochs",
                    "3",
                    "--step-time",
                    "0",
                ],
            )
            name, max_batch, max_replicas = f"oom-{i}", a.oom_batch, 1
        else:
            batch, args = 16, ["--epochs", str(a.epochs), "--step-time", str(a.step_time)]
            name, max_batch, max_replicas = f"chaos-{i}", 128, 2
        return {
            "name": name,
            "script": JOB_SCRIPT.name,
            "working_dir": str(JOB_SCRIPT.parent),
            "args": [
                *args,
                "--batch-size",
                str(batch),
                "--max-batch-size",
                str(max_batch),
                "--seed",
                str(i),
            ],
            "batch_size": batch,
            "max_batch_size": max_batch,
            "min_replicas": 1,
            "max_replicas": max_replicas,
            "max_restarts": 20,
        }

    def kill_replica(self, client: Client, kill: Kill) -> bool:
        """SIGKILL rank 0 of a random running normal job; False if none is killable now."""
        candidates = []
        for job, kind in self.jobs.items():
            view = client.job(job)
            if kind != "normal" or view["state"] != "RUNNING":
                continue
            attempt = int(view["attempt"])
            shim = supervisor(self.jobs_dir / job / "runs" / str(attempt), 0)
            pid = training_process(shim) if shim is not None else None
            prog = read_json(self.markers(job) / "progress.json")
            if pid and prog and prog["attempt"] == attempt and prog["step"] > 0:
                candidates.append((job, attempt, pid))
        if not candidates:
            return False
        job, attempt, pid = self.rng.choice(candidates)
        prog = read_json(self.markers(job) / "progress.json") or {}
        os.kill(pid, signal.SIGKILL)
        kill.job, kill.attempt, kill.last_step = job, attempt, prog.get("step")
        self.say(
            f"kill -9 replica of {job} (attempt {attempt}, pid {pid}) at step {kill.last_step}"
        )
        return True

    def markers(self, job: str) -> Path:
        """Where ``chaos_job.py`` of ``job`` writes its markers (its own job directory)."""
        return self.jobs_dir / job / "markers"

    def run(self) -> dict[str, Any]:
        a = self.args
        times = sorted(
            [
                (self.rng.uniform(0.1, 0.7) * a.duration, "controller")
                for _ in range(a.controller_kills)
            ]
            + [(self.rng.uniform(0.1, 0.7) * a.duration, "replica") for _ in range(a.replica_kills)]
        )
        arrivals = [(i * a.duration * 0.3 / max(a.jobs, 1), i, False) for i in range(a.jobs)]
        arrivals += [(0.0, i, True) for i in range(a.oom_jobs if self.oom else 0)]
        arrivals.sort()
        monitor = Monitor(self.jobs_dir)
        thread = threading.Thread(target=monitor.run, daemon=True)
        thread.start()
        self.say(
            f"controller on 127.0.0.1:{self.port}, {a.slots} slots; {a.jobs} jobs, "
            f"{len(arrivals) - a.jobs} OOM jobs, kills at "
            + ", ".join(f"{t:.0f}s {k[0]}" for t, k in times)
        )
        if not self.oom and a.oom_jobs:
            self.say("[yellow]the server has no --memory-per-slot: OOM jobs not run")
        deadline = a.duration + a.drain
        last_report = 0.0
        views: dict[str, dict[str, Any]] = {}
        stack = ExitStack()
        try:
            rc = self.start_controller(stack)
            client = stack.enter_context(Client(rc.url, rc.admin_token, retry_for=120))
            while True:
                now = self.elapsed()
                while arrivals and arrivals[0][0] <= now:
                    _, i, oom = arrivals.pop(0)
                    job = client.submit(self.spec(i, oom))["id"]
                    self.jobs[job] = "oom" if oom else "normal"
                    self.say(f"submitted {job} ({'OOM' if oom else 'normal'} job {i})")
                if times and times[0][0] <= now:
                    at, kind = times.pop(0)
                    kill = Kill(kind, now)
                    if kind == "controller":
                        rc.process.kill()
                        rc.process.wait(timeout=30)
                        self.say("kill -9 controller")
                        time.sleep(self.rng.uniform(1.0, 3.0))
                        stack.close()
                        stack = ExitStack()
                        rc = self.start_controller(stack)
                        client = stack.enter_context(Client(rc.url, rc.admin_token, retry_for=120))
                        self.say(f"controller restarted (start #{self.controller_starts})")
                        self.kills.append(kill)
                    elif self.kill_replica(client, kill):
                        self.kills.append(kill)
                    elif now - at < 60:
                        times.insert(0, (at, kind))  # nothing running yet: try again soon
                    else:
                        self.skipped.append(f"replica kill at {at:.0f}s: no running job")
                views = {j: client.job(j) for j in self.jobs}
                done = not arrivals and all(v["state"] in TERMINAL for v in views.values())
                if (done and not times) or now > deadline:
                    break
                if now - last_report >= 15:
                    last_report = now
                    counts: dict[str, int] = {}
                    for v in views.values():
                        counts[v["state"]] = counts.get(v["state"], 0) + 1
                    steps = " ".join(f"{v['name']}:{v['step']}" for v in views.values())
                    self.say(f"jobs {counts}; steps {steps}")
                time.sleep(0.5)
            events = {j: client.events(j) for j in self.jobs}
        finally:
            monitor.stop()
            thread.join(timeout=5)
            stack.close()
        return self.summary(views, events, monitor)

    def summary(
        self,
        views: dict[str, dict[str, Any]],
        events: dict[str, list[dict[str, Any]]],
        monitor: Monitor,
    ) -> dict[str, Any]:
        twice: dict[str, str] = {
            f"{j}": f"attempts {a} alive at once" for j, a in monitor.overlaps.items()
        }
        wall0 = time.time() - self.elapsed()
        for job, v in views.items():
            fin = v.get("finished_at")
            if v["state"] == "SUCCEEDED" and fin:
                late = [s for s in starts(self.markers(job)) if s["time"] > fin]
                if late:
                    twice[job] = f"{len(late)} replica(s) started after SUCCEEDED"
        for k in self.kills:
            if k.kind != "replica" or k.job is None or k.attempt is None:
                continue
            nxt = [
                s
                for s in starts(self.markers(k.job))
                if s["rank"] == 0 and s["attempt"] > k.attempt and s["time"] > wall0 + k.at
            ]
            if nxt:
                k.restart_step = int(nxt[0]["start_step"])
            k.job_steps = views[k.job].get("step")
        normal = [j for j, kind in self.jobs.items() if kind == "normal"]
        ooms = [j for j, kind in self.jobs.items() if kind == "oom"]
        lost_pcts = [k.lost_pct for k in self.kills if k.lost_pct is not None]
        oom_rows = []
        for j in ooms:
            v = views[j]
            oom_events = [e for e in events[j] if "oom" in f"{e['kind']} {e['message']}".lower()]
            oom_rows.append(
                {
                    "job": j,
                    "state": v["state"],
                    "oom_events": len(oom_events),
                    "failures": v["failures"],
                    "final_batch": v["batch_size"],
                    "final_local_bsz": v.get("local_bsz"),
                    "memory_limit": v.get("memory_limit"),  # the cap the controller learned
                }
            )
        result = {
            "config": {
                k: (str(v) if isinstance(v, Path) else v) for k, v in vars(self.args).items()
            },
            "seconds": round(self.elapsed(), 1),
            "controller_starts": self.controller_starts,
            "jobs_submitted": len(normal),
            "jobs_succeeded": sum(views[j]["state"] == "SUCCEEDED" for j in normal),
            "jobs_lost": sorted(j for j in normal if views[j]["state"] != "SUCCEEDED"),
            "run_twice": twice,
            "monitor_scans": monitor.scans,
            "controller_kills": sum(k.kind == "controller" for k in self.kills),
            "replica_kills": [
                {
                    "job": k.job,
                    "attempt": k.attempt,
                    "at_s": round(k.at, 1),
                    "last_step": k.last_step,
                    "restart_step": k.restart_step,
                    "lost_steps": k.lost,
                    "job_steps": k.job_steps,
                    "lost_pct": None if k.lost_pct is None else round(k.lost_pct, 2),
                }
                for k in self.kills
                if k.kind == "replica"
            ],
            "skipped": self.skipped,
            "oom_supported": self.oom,
            "oom_jobs": oom_rows,
            "jobs": {
                j: {
                    "name": v["name"],
                    "state": v["state"],
                    "step": v["step"],
                    "attempt": v["attempt"],
                    "failures": v["failures"],
                    "restarts": v["restarts"],
                    "reason": v.get("reason"),
                }
                for j, v in views.items()
            },
        }
        result["goals"] = {
            "0 lost": not result["jobs_lost"],
            "0 run twice": not twice,
            "<=2% steps lost per replica kill": bool(lost_pcts) and max(lost_pcts) <= 2.0,
            "every OOM job finishes": self.oom
            and bool(oom_rows)
            and all(r["state"] == "SUCCEEDED" for r in oom_rows),
        }
        return result


def render(result: dict[str, Any], console: Console) -> None:
    t = Table(title=f"chaos benchmark ({result['seconds']:.0f} s)")
    t.add_column("measure")
    t.add_column("value", justify="right")
    lost = [k["lost_pct"] for k in result["replica_kills"] if k["lost_pct"] is not None]
    rows = [
        ("jobs submitted", result["jobs_submitted"]),
        ("jobs succeeded", result["jobs_succeeded"]),
        ("jobs lost", len(result["jobs_lost"])),
        ("jobs run twice", len(result["run_twice"])),
        ("controller kill -9s (restarts)", result["controller_kills"]),
        ("replica kill -9s", len(result["replica_kills"])),
        (
            "steps lost per replica kill",
            ", ".join(f"{k['lost_steps']}/{k['job_steps']}" for k in result["replica_kills"])
            or "-",
        ),
        ("max % of a job's steps lost", f"{max(lost):.2f}%" if lost else "-"),
        (
            "OOM jobs",
            "not supported by this server"
            if not result["oom_supported"]
            else len(result["oom_jobs"]),
        ),
    ]
    for r in result["oom_jobs"]:
        rows.append(
            (
                f"  {r['job']}",
                f"{r['state']}, {r['oom_events']} OOM event(s), "
                f"final batch {r['final_batch']} (m={r['final_local_bsz']})",
            )
        )
    for name, ok in result["goals"].items():
        rows.append((f"goal: {name}", "met" if ok else "NOT met"))
    for name, value in rows:
        t.add_row(name, str(value))
    console.print(t)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--duration", type=float, default=180, help="kills happen in [10%%, 70%%]")
    p.add_argument("--drain", type=float, default=180, help="extra seconds for jobs to finish")
    p.add_argument("--controller-kills", type=int, default=5)
    p.add_argument("--replica-kills", type=int, default=5)
    p.add_argument("--jobs", type=int, default=4)
    p.add_argument(
        "--epochs",
        type=int,
        default=120,
        help="epochs of each normal job (long enough that 2%% of it exceeds a checkpoint period)",
    )
    p.add_argument("--step-time", type=float, default=0.01)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--oom-jobs", type=int, default=1)
    p.add_argument("--memory-per-slot", default="2G")
    p.add_argument("--oom-batch", type=int, default=4096, help="initial per-replica batch")
    p.add_argument("--oom-expand", type=int, default=4096, help="sample widening of OOM jobs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", type=Path, default=None, help="default: a temp dir (removed)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    for name in ("duration", "controller_kills", "replica_kills", "jobs", "slots", "epochs"):
        if getattr(args, name) < (1 if name in ("duration", "slots", "epochs") else 0):
            p.error(f"--{name.replace('_', '-')}: {getattr(args, name)} is out of range")
    console = Console()
    with tempfile.TemporaryDirectory(prefix="coadapt-chaos-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        try:
            result = Chaos(args, work, console).run()
        except ClientError as exc:
            console.print(f"[red]chaos: {exc.render()} (controller log: {work / 'controller.log'})")
            return 1
    render(result, console)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
        console.print(f"wrote {args.json}")
    return 0 if all(result["goals"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())

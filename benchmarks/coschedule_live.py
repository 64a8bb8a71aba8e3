"""Serving and training on one machine, live (issue 17, live half of the co-scheduling bench).

A real ``coadapt server`` (local executor, ``--slots 4``, loopback, a temp state dir) runs two
elastic training jobs (``benchmarks/chaos_job.py``: the examples' MLP on synthetic data, with
per-attempt start/end markers) beside one deployment of a small dense MLP. A bounded open-loop
ramp (``benchmarks/serve/ramp.py``: ``base`` for ``warm_s``, x5 over 60 s, held, back over 60 s)
goes through the deployment's gateway while a monitor samples, every second, the deployment's
replicas (ready / desired / granted) and each training job's replicas. Reported:

* p99 per 5 s vs the SLO (the ramp's own latencies, from each request's scheduled send time);
* ``scale_up_s``: from the first sample where the autoscaler wanted more replicas than were
  ready to the first sample with that many ready (plus each new replica's cold start, row
  ``ready_at - started_at``);
* the training jobs' replicas over time (shrink while serving grows, regrow after);
* errors (no answer, or a status other than 2xx/503) and 503s (shed);
* training progress lost per restart: the step an attempt reached when it stopped (its end
  marker) minus the step the next attempt resumed from (its start marker), against the steps
  of one checkpoint interval (``coadapt.train`` checkpoints on SIGTERM, and every 120 s).

Row ``name: "coadapt-live"`` with the issue's fields (``slo_attainment``, ``train_avg_jct_s`` =
None: the jobs are stopped at the end, not run to completion, ``scale_up_s``, ``errors``).

    .venv/bin/python benchmarks/coschedule_live.py --json out/coschedule_live.json
    .venv/bin/python benchmarks/coschedule_bench.py --live --json out/coschedule.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_common import env as bench_env  # noqa: E402
from benchmarks.bench_common import load_average  # noqa: E402
from benchmarks.serve.ramp import RampResult, Schedule, format_rows, run_ramp  # noqa: E402
from coadapt.controller.client import Client, ClientError  # noqa: E402
from coadapt.ports import free_port  # noqa: E402

JOB_SCRIPT = ROOT / "benchmarks" / "chaos_job.py"
MODEL_KW = {"in_features": 16, "hidden": 64, "out_features": 4, "depth": 2}
CHECKPOINT_INTERVAL_S = 120.0  # coadapt.train's periodic checkpoint (it also saves on SIGTERM)


@dataclass
class Sample:
    t: float  # seconds since the ramp started (negative: before it)
    ready: int
    starting: int
    desired: int | None
    granted: int | None
    jobs: dict[str, int]  # job id -> replicas


@dataclass
class Monitor:
    """Samples the deployment and the jobs every ``every`` seconds on its own thread."""

    api: Client
    deployment: str
    jobs: list[str]
    t0: float
    every: float = 1.0
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.wait(self.every):
            with contextlib.suppress(ClientError, OSError, KeyError):
                self.samples.append(self.sample())

    def sample(self) -> Sample:
        view = self.api.deployment(self.deployment)
        counts = view["deployment"]["replicas"]
        statuses = [r["status"] for r in view["replicas"]]
        return Sample(
            t=time.time() - self.t0,
            ready=statuses.count("ready"),
            starting=statuses.count("starting"),
            desired=counts.get("desired"),
            granted=counts.get("granted"),
            jobs={j: int(self.api.job(j)["replicas"]) for j in self.jobs},
        )

    def stop(self) -> None:
        self._stop.set()


def publish_model(root: Path) -> None:
    """A small dense MLP as version 1 of ``root`` (what the deployment serves)."""
    from coadapt.serve import artifacts
    from coadapt.serve.models import make_mlp

    artifacts.publish(
        make_mlp(0, **MODEL_KW),
        root,
        factory="coadapt.serve.models:make_mlp",
        factory_kwargs={"seed": 0, **MODEL_KW},
    )


def job_spec(i: int, step_time: float) -> dict[str, Any]:
    return {
        "name": f"train-{i}",
        "script": JOB_SCRIPT.name,
        "working_dir": str(JOB_SCRIPT.parent),
        "args": [
            "--epochs",
            "100000",
            "--step-time",
            str(step_time),
            "--batch-size",
            "16",
            "--max-batch-size",
            "128",
            "--seed",
            str(i),
        ],
        "batch_size": 16,
        "max_batch_size": 128,
        "min_replicas": 1,
        "max_replicas": 3,
        "max_restarts": 50,
    }


def wait(pred: Any, timeout: float, what: str, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ClientError, OSError):
            got = pred()
            if got:
                return got
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def lost_steps(jobs_dir: Path, job: str) -> list[dict[str, Any]]:
    """Per restart of ``job``: the step its previous attempt stopped at (rank 0's end marker)
    and the step the new attempt resumed from (its start marker)."""
    marks = jobs_dir / job / "markers"
    ends: dict[int, int] = {}
    starts: dict[int, int] = {}
    for p in marks.glob("*.json"):
        kind, _, rest = p.stem.partition("-")
        parts = rest.split("-")
        if kind not in ("start", "end") or len(parts) != 3 or parts[1] != "0":
            continue
        with contextlib.suppress(OSError, ValueError, KeyError):
            data = json.loads(p.read_text())
            attempt = int(parts[0])
            if kind == "start":
                starts[attempt] = int(data["start_step"])
            else:
                ends[attempt] = int(data["step"])
    out = []
    for attempt in sorted(starts):
        prev = max((a for a in ends if a < attempt), default=None)
        if prev is None:
            continue
        out.append({"attempt": attempt, "stopped_at": ends[prev], "resumed_from": starts[attempt],
                    "lost": ends[prev] - starts[attempt]})  # fmt: skip
    return out


def scale_up(samples: Sequence[Sample]) -> float | None:
    """Seconds from the first sample (after the ramp began) wanting more replicas than were
    ready to the first sample with that many ready; None if it never scaled up."""
    base = next((s.ready for s in samples if s.t >= 0), None)
    for i, s in enumerate(samples):
        if s.t < 0 or s.desired is None or base is None or s.desired <= base:
            continue
        want = s.desired
        done = next((x for x in samples[i:] if x.ready >= want), None)
        return None if done is None else round(done.t - s.t, 1)
    return None


def run_live(args: argparse.Namespace) -> dict[str, Any]:
    """One live run; returns the row and its details."""
    work = Path(args.work or tempfile.mkdtemp(prefix="coadapt-live-"))
    state = work / "state"
    state.mkdir(parents=True, exist_ok=True)
    root = work / "models" / "mlp"
    publish_model(root)
    port = free_port()
    log_path = work / "controller.log"
    argv = [sys.executable, "-m", "coadapt.cli", "server", "--state-dir", str(state),
            "--port", str(port), "--slots", "4", "--interval", str(args.interval),
            "--tick", "0.5", "--stop-grace", "20", "--restart-delay", "5",
            "--isolation", "none"]  # fmt: skip
    with open(log_path, "ab") as log:
        server = subprocess.Popen(argv, cwd=ROOT, env=bench_env(), stdout=log, stderr=log)
    api: Client | None = None
    jobs: list[str] = []
    load_before = load_average()
    try:
        url = f"http://127.0.0.1:{port}"
        probe = Client(url, None)
        wait(lambda: probe.healthy() or server.poll() is not None, 60, "the controller")
        probe.close()
        if server.poll() is not None:
            raise RuntimeError(f"the controller exited; see {log_path}")
        api = client = Client(url, (state / "admin-token").read_text().strip())
        api.request("POST", "/api/v1/models", json={"name": "mlp", "root": str(root)})
        dep = api.create_deployment({
            "name": "web", "model": "mlp", "slo_ms": args.slo_ms, "min_replicas": 1,
            "max_replicas": args.max_replicas, "scale_to_zero_s": None,
            "capacity_rps": args.capacity_rps, "ready_s": args.ready_s,
        })  # fmt: skip
        jobs += [api.submit(job_spec(i, args.step_time))["id"] for i in range(2)]
        gateway = f"http://127.0.0.1:{dep['gateway_port']}"

        def settled() -> bool:
            view = client.deployment("web")
            ready = [r for r in view["replicas"] if r["status"] == "ready"]
            return bool(ready) and all(client.job(j)["state"] == "RUNNING" for j in jobs)

        wait(settled, 180, "a ready replica and both jobs running")
        time.sleep(args.settle_s)  # training fills the rest; allocations steady
        schedule = Schedule.ramp(
            args.base, args.factor, args.warm_s, args.up_s, args.peak_s, args.down_s, args.cool_s
        )
        t0 = time.time()
        mon = Monitor(api, "web", jobs, t0)
        thread = threading.Thread(target=mon.run, name="monitor", daemon=True)
        thread.start()
        body = json.dumps({"instances": [[0.1] * MODEL_KW["in_features"]]}).encode()
        result: RampResult = run_ramp(gateway, "mlp", body, schedule, timeout_s=10.0,
                                      connections=64, max_requests=50_000)  # fmt: skip
        time.sleep(args.after_s)  # training regrows once serving shrinks back
        mon.stop()
        thread.join(timeout=10)
        replicas = api.deployment("web")["replicas"]
        views = {j: api.job(j) for j in jobs}
    finally:
        if api is not None:
            with contextlib.suppress(ClientError, OSError):
                for j in jobs:
                    api.cancel(j)
                api.delete_deployment("web")
                time.sleep(5)
            api.close()
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        _kill_under(state)
    return summarise(args, result, mon.samples, replicas, views, state, load_before)


def _kill_under(state: Path) -> None:
    """Stop every replica and gateway still running from ``state`` (they outlive a controller
    by design): each leads its own session."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if str(state).encode() in (entry / "cmdline").read_bytes():
                os.killpg(int(entry.name), signal.SIGKILL)


def summarise(
    args: argparse.Namespace,
    result: RampResult,
    samples: list[Sample],
    replicas: list[dict[str, Any]],
    views: dict[str, dict[str, Any]],
    state: Path,
    load_before: list[float],
) -> dict[str, Any]:
    slo_s = args.slo_ms / 1000.0
    rows = result.rows(5.0)
    up = scale_up(samples)
    cold = [round(r["ready_at"] - r["started_at"], 2) for r in replicas if r["ready_at"]]
    first_ok = min((s.t for s in samples if s.t >= 0 and s.ready > 1), default=None) if up else None
    after = [r for r in rows if first_ok is None or r["t0"] >= first_ok]
    over = [r for r in after if r["p99_ms"] is not None and r["p99_ms"] > args.slo_ms]
    jobs: dict[str, Any] = {}
    for j, v in views.items():
        series = [s.jobs.get(j, 0) for s in samples]
        before = series[0] if series else None
        low = min(series) if series else None
        restarts = lost_steps(state / "jobs", j)
        steps = v.get("step") or 0
        elapsed = max(1e-9, time.time() - (v.get("started_at") or time.time()))
        jobs[j] = {
            "replicas_at_ramp_start": before,
            "min_replicas_during": low,
            "replicas_at_end": series[-1] if series else None,
            "shrank": before is not None and low is not None and low < before,
            "regrew": bool(series) and low is not None and series[-1] > low,
            "restarts": restarts,
            "max_lost_steps": max((r["lost"] for r in restarts), default=0),
            "steps": steps,
            "steps_per_checkpoint_interval": round(steps / elapsed * CHECKPOINT_INTERVAL_S),
        }
    totals = [sum(smp.jobs.values()) for smp in samples]
    row = {
        "name": "coadapt-live",
        "slo_attainment": result.slo_attainment(slo_s),
        "train_avg_jct_s": None,  # the jobs run through the ramp and are stopped, not finished
        "scale_up_s": up,
        "errors": result.errors,
        "shed_503": result.shed,
        "requests": len(result.samples),
        "slo_ms": args.slo_ms,
        "p99_windows_over_slo_after_scale_up": len(over),
        "cold_starts_s": cold,
        "max_ready_replicas": max((s.ready for s in samples), default=0),
        # training's slots together (a job at its minimum may be preempted instead of shrunk)
        "training_slots_before_min_end": [totals[0], min(totals), totals[-1]] if totals else None,
        "training_shrank_and_regrew": bool(totals)
        and min(totals) < totals[0]
        and totals[-1] > min(totals),
        "max_lost_steps": max((v["max_lost_steps"] for v in jobs.values()), default=0),
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }
    return {
        "row": row,
        "p99_per_5s": rows,
        "timeline": [s.__dict__ for s in samples],
        "jobs": jobs,
        "ramp": {
            "base": args.base,
            "factor": args.factor,
            "up_s": args.up_s,
            "peak_s": args.peak_s,
            "down_s": args.down_s,
        },
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The live run's options (shared with ``coschedule_bench.py --live``)."""
    g = p.add_argument_group("live run (--live)")
    g.add_argument("--base", type=float, default=6.0, help="requests/s before and after")
    g.add_argument("--factor", type=float, default=5.0, help="peak = factor x base")
    g.add_argument("--warm-s", type=float, default=15.0)
    g.add_argument("--up-s", type=float, default=60.0)
    g.add_argument("--peak-s", type=float, default=15.0)
    g.add_argument("--down-s", type=float, default=60.0)
    g.add_argument("--cool-s", type=float, default=15.0)
    g.add_argument("--slo-ms", type=float, default=100.0, help="p99 SLO of the deployment")
    g.add_argument("--capacity-rps", type=float, default=12.0,
                   help="the deployment's prior requests/s per replica at the SLO")  # fmt: skip
    g.add_argument("--ready-s", type=float, default=8.0, help="prior cold start of a replica")
    g.add_argument("--max-replicas", type=int, default=3)
    g.add_argument("--interval", type=float, default=10.0, help="full policy rounds, s")
    g.add_argument("--step-time", type=float, default=0.02, help="training: extra s per step")
    g.add_argument("--settle-s", type=float, default=15.0, help="wait before the ramp")
    g.add_argument("--after-s", type=float, default=45.0, help="watch training regrow, s")
    g.add_argument("--work", type=Path, default=None, help="keep the run's files here")


def print_report(report: dict[str, Any]) -> None:
    row = report["row"]
    print(format_rows(report["p99_per_5s"]))
    print(
        f"coadapt-live: SLO p99 <= {row['slo_ms']:g} ms attained by "
        f"{row['slo_attainment']:.2%} of {row['requests']} requests; scale-up "
        f"{row['scale_up_s']} s (cold starts {row['cold_starts_s']} s); errors {row['errors']}, "
        f"503s {row['shed_503']}; 5-s windows over the SLO after the scale-up "
        f"{row['p99_windows_over_slo_after_scale_up']}; training slots before/min/end "
        f"{row['training_slots_before_min_end']} (shrank and regrew: "
        f"{row['training_shrank_and_regrew']}); max steps lost per restart "
        f"{row['max_lost_steps']}; load average {row['load_average_before']} -> "
        f"{row['load_average_after']}"
    )
    for j, v in report["jobs"].items():
        print(f"  {j}: replicas {v['replicas_at_ramp_start']} -> min {v['min_replicas_during']}"
              f" -> {v['replicas_at_end']}; restarts {len(v['restarts'])}, lost "
              f"{[r['lost'] for r in v['restarts']]} steps (one checkpoint interval ~ "
              f"{v['steps_per_checkpoint_interval']} steps)")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(p)
    p.add_argument("--json", type=Path, metavar="OUT")
    args = p.parse_args(argv)
    report = run_live(args)
    print_report(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": [report["row"]], "live": report}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

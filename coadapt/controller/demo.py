"""The live demo: a real controller, real training jobs (package data), re-allocated live.

:func:`run_live_demo` starts ``coadapt server`` on embedded defaults (temporary state dir,
SQLite, local executor with CPU slots), submits training jobs that arrive over time, shows a
live table of allocations, batch sizes, goodput and progress while the scheduler re-allocates,
and ends with a per-job report (JCT, re-allocations, final batch size, final metric) and a PNG
timeline of the allocations.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table

from coadapt.controller.client import Client, ClientError
from coadapt.controller.specfile import load_spec_file
from coadapt.controller.subprocess_server import ControllerStartError, running_controller

#: The demo's jobs ship inside the package (copies of ``examples/``; see its README).
EXAMPLES = Path(__file__).resolve().parent / "demo_jobs"
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


@dataclass(frozen=True)
class DemoJob:
    """One arrival: an example spec, when it arrives (s), and argument overrides."""

    example: str  # file name of the spec under examples/
    arrival: float
    name: str
    args: tuple[str, ...] = ()


#: Four jobs arriving within 15 s, so they overlap and the policy has to share the slots
#: even on a fast machine (alone, digits-a takes ~15 s on a fast 2-core VM, minutes on a slow
#: one); a few minutes in all on 2 cores.
DEFAULT_JOBS = (
    DemoJob("digits_cnn.yaml", 0, "digits-a", ("--epochs", "250", "--seed", "0")),
    DemoJob("cancer_mlp.yaml", 5, "cancer-a", ("--epochs", "300", "--seed", "0")),
    DemoJob("digits_cnn.yaml", 10, "digits-b", ("--epochs", "150", "--seed", "1")),
    DemoJob("cancer_mlp.yaml", 15, "cancer-b", ("--epochs", "250", "--seed", "1")),
)


def _override(args: list[str], extra: tuple[str, ...]) -> list[str]:
    """``args`` with ``--flag value`` pairs of ``extra`` replacing or appending."""
    out = list(args)
    for i in range(0, len(extra) - 1, 2):
        flag, value = extra[i], extra[i + 1]
        if flag in out and out.index(flag) + 1 < len(out):
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return out


def _fmt(x: Any, digits: int = 1) -> str:
    if x is None:
        return "-"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


#: Short state names for the live table (it must fit an 80-column terminal).
_SHORT_STATE = {"RESCALING": "rescale", "SUCCEEDED": "done", "CANCELLED": "cancel"}


def _table(jobs: list[dict[str, Any]], cluster: dict[str, Any], elapsed: float) -> Table:
    """The live table, narrow enough for an 80-column terminal: no vertical rules, short
    headers and states, the slot count (the slot ids are in ``coadapt cluster``) and a job
    name cut (with an ellipsis) only past 14 characters."""
    t = Table(
        title=f"coadapt live demo: t={elapsed:.0f}s, {cluster.get('policy')}, "
        f"{cluster.get('used', 0)}/{cluster.get('slots', 0)} slots busy",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=0,
        pad_edge=False,
    )
    t.add_column("job", no_wrap=True, overflow="ellipsis", min_width=8, max_width=12)
    t.add_column("state", no_wrap=True)
    for col in ("slots", "batch (m×s)", "goodput", "speed", "step", "epoch", "acc", "moves"):
        t.add_column(col, justify="right", no_wrap=True)
    slots = {j["id"]: j["slots"] for j in cluster.get("jobs", [])}
    for j in jobs:
        batch = _fmt(j["batch_size"])
        if j.get("local_bsz") is not None:
            batch += f" ({j['local_bsz']}×{(j.get('accum_steps') or 0) + 1})"
        acc = (j.get("metrics") or {}).get("accuracy")
        goodput = j["goodput"]
        t.add_row(
            j["name"],
            _SHORT_STATE.get(j["state"], j["state"].lower()),
            str(len(slots.get(j["id"], []))),
            batch,
            _fmt(float(goodput), 0) if goodput is not None else "-",
            _fmt(j["speedup"], 2),
            _fmt(j["step"]),
            _fmt(j["epoch"]),
            _fmt(acc, 3),
            str(j["restarts"]),
        )
    return t


def _timeline(
    client: Client, jobs: list[dict[str, Any]], t0: float, path: Path, slots: int
) -> None:
    """Stacked slots-per-job over time, from the controller's allocation events."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    end = max((j["finished_at"] or time.time()) for j in jobs) - t0
    grid = np.linspace(0, max(end, 1.0), 600)
    series = []
    for j in jobs:
        steps = [
            (e["time"] - t0, int((e["data"] or {}).get("replicas", 0)))
            for e in client.events(j["id"])
            if e["kind"] == "alloc"
        ]
        level = np.zeros_like(grid)
        for when, k in steps:
            level[grid >= when] = k
        series.append(level)
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.stackplot(grid, *series, labels=[j["name"] for j in jobs], step="post", alpha=0.85)
    ax.set_xlabel("seconds since the demo started")
    ax.set_ylabel("slots")
    ax.set_ylim(0, slots + 0.5)
    ax.set_title("allocations over time (each re-allocation is a checkpoint-restart)")
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_live_demo(
    out_dir: Path,
    slots: int = 4,
    policy: str = "pollux",
    jobs: tuple[DemoJob, ...] = DEFAULT_JOBS,
    interval: float = 10.0,
    timeout: float = 1800.0,  # a slow 2-core machine needs ~10x a fast one's minute
    console: Console | None = None,
) -> int:
    """Run the live demo; returns 0 when every job succeeded."""
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=150)  # logs and CI: do not squeeze the table to 80
    out_dir = Path(out_dir).resolve()
    state = out_dir / "state"
    state.mkdir(parents=True, exist_ok=True)
    missing = [j.example for j in jobs if not (EXAMPLES / j.example).exists()]
    if missing:
        console.print(f"[red]coadapt demo: examples not found: {missing} (in {EXAMPLES})")
        return 2
    server_args = [
        "--slots",
        str(slots),
        "--policy",
        policy,
        "--interval",
        str(interval),
        "--tick",
        "0.5",
        "--restart-delay",
        "5",
        "--stop-grace",
        "30",
    ]
    try:
        with (
            running_controller(
                state, out_dir / "controller.log", server_args, stop_timeout=15
            ) as controller,
            Client(controller.url, controller.admin_token) as client,
        ):
            console.print(
                f"dashboard: {controller.url}/#token={controller.admin_token} "
                "(open it while the demo runs)"
            )
            return _drive(client, jobs, slots, out_dir, timeout, console)
    except ControllerStartError as exc:
        console.print(f"[red]coadapt demo: {exc}")
        return 1
    except ClientError as exc:
        console.print(f"[red]coadapt demo: {exc.render()}")
        return 1


def _drive(
    client: Client,
    arrivals: tuple[DemoJob, ...],
    slots: int,
    out_dir: Path,
    timeout: float,
    console: Console,
) -> int:
    t0 = time.time()
    pending = sorted(arrivals, key=lambda j: j.arrival)
    ids: list[str] = []
    last_print = 0.0
    live = (
        Live(console=console, refresh_per_second=2, transient=False)
        if console.is_terminal
        else None
    )
    if live is not None:
        live.start()
    try:
        while True:
            now = time.time() - t0
            while pending and pending[0].arrival <= now:
                job = pending.pop(0)
                spec = load_spec_file(EXAMPLES / job.example)
                spec["name"] = job.name
                spec["args"] = _override(list(spec.get("args", [])), job.args)
                ids.append(client.submit(spec)["id"])
            views = [client.job(i) for i in ids]
            table = _table(views, client.cluster(), now)
            if live is not None:
                live.update(table)
            elif now - last_print >= 15:
                console.print(table)
                last_print = now
            if not pending and views and all(v["state"] in TERMINAL for v in views):
                break
            if now > timeout:
                console.print(f"[yellow]demo timeout after {timeout:.0f}s: cancelling")
                for v in views:
                    if v["state"] not in TERMINAL:
                        client.cancel(v["id"])
                break
            time.sleep(1.0)
    finally:
        if live is not None:
            live.stop()
    views = [client.job(i) for i in ids]
    return _report(client, views, slots, t0, out_dir, console)


def _report(
    client: Client,
    views: list[dict[str, Any]],
    slots: int,
    t0: float,
    out_dir: Path,
    console: Console,
) -> int:
    table = Table(title="per-job report")
    for col in (
        "job",
        "state",
        "JCT (s)",
        "re-allocations",
        "failures",
        "final batch",
        "final accuracy",
        "slot-seconds",
    ):
        table.add_column(col, justify="left" if col in ("job", "state") else "right")
    rows = []
    for v in views:
        jct = (v["finished_at"] - v["submit_time"]) if v["finished_at"] else None
        acc = (v.get("metrics") or {}).get("accuracy")
        rows.append(
            {
                "id": v["id"],
                "name": v["name"],
                "state": v["state"],
                "jct": jct,
                "reallocations": v["restarts"],
                "failures": v["failures"],
                "final_batch_size": v["batch_size"],
                "final_accuracy": acc,
                "attained_service": v["attained_service"],
            }
        )
        table.add_row(
            v["name"],
            v["state"],
            _fmt(jct),
            str(v["restarts"]),
            str(v["failures"]),
            _fmt(v["batch_size"]),
            _fmt(acc, 4),
            _fmt(v["attained_service"], 0),
        )
    console.print(table)
    png = out_dir / "live-timeline.png"
    _timeline(client, views, t0, png, slots)
    (out_dir / "live-report.json").write_text(json.dumps({"jobs": rows}, indent=2))
    console.print(
        f"timeline: {png}  report: {out_dir / 'live-report.json'}  "
        f"logs: {out_dir / 'state' / 'jobs'}"
    )
    return 0 if all(v["state"] == "SUCCEEDED" for v in views) else 1

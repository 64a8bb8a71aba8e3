"""Heterogeneous GPUs and GPU sharing in the simulator (issue 18).

Runs the Pollux artifact's workloads (``pollux-1`` .. ``pollux-8``) on the homogeneous ``16x4``
and on a 64-GPU cluster of three types (16 V100 + 16 P100 + 32 K80, 4 per node) under
``pollux`` (the default policy), ``pollux-unaware`` (if registered), the Gavel-style
``gavel`` (rows ``gavel-maxmin``) and ``tiresias``, two simulations at a time; then the
generated ``packing`` workload (96 one-GPU jobs, :mod:`coadapt.sim.synthetic`) on ``4x4`` with
and without GPU sharing. Writes one row per workload x cluster x policy (x packing):

    python benchmarks/hetero_bench.py --json benchmarks/data/hetero_results.json
    python benchmarks/hetero_bench.py --workloads 1 2 --policies gavel tiresias --json out.json
    python benchmarks/hetero_bench.py --clusters homogeneous --policies pollux --no-packing \
        --workloads 1 2 --pollux-options '{"remaining_power": 1.0, "settle": 2}'  # lever screen

JCT, makespan, restarts and utilisation are deterministic (simulated time); ``round_ms_p50``
is the policy's wall time per round and depends on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from coadapt.policies import (
    POLICY_NAMES,
    BatchMode,
    ClusterSnapshot,
    Decision,
    Policy,
    PolicyState,
    make_policy,
)
from coadapt.sim import (
    SimConfig,
    SimulationError,
    load_workload,
    parse_cluster,
    simulate,
    summarise,
)
from coadapt.sim.synthetic import packing_workload

HOMOGENEOUS = "16x4"
HETEROGENEOUS = "v100:4x4,p100:4x4,k80:8x4"
PACKING_CLUSTER = "4x4"
POLICIES = ("pollux", "pollux-unaware", "gavel", "tiresias")
PACKING_POLICIES = ("pollux", "gavel")
WORKLOADS = tuple(range(1, 9))
#: Row labels (the issue names the Gavel-style baseline ``gavel-…``).
LABELS = {"gavel": "gavel-maxmin"}


@dataclass
class Timed:
    """A policy whose rounds are timed (wall clock, this process)."""

    inner: Policy
    round_ms: list[float] = field(default_factory=list)
    name: str = ""
    batch_mode: BatchMode = BatchMode.FIXED

    def __post_init__(self) -> None:
        self.name, self.batch_mode = self.inner.name, self.inner.batch_mode

    def optimize(
        self, snapshot: ClusterSnapshot, state: PolicyState, rng: np.random.Generator
    ) -> Decision:
        started = time.perf_counter()
        decision = self.inner.optimize(snapshot, state, rng)
        self.round_ms.append((time.perf_counter() - started) * 1000.0)
        return decision


# workload, cluster, policy, packing, seed, options of the pollux policy (JSON; "" = none)
Task = tuple[str, str, str, bool, int, str]


def run_one(task: Task) -> dict[str, Any]:
    workload_name, cluster, policy, packing, seed, options = task
    workload = (
        packing_workload(seed=seed) if workload_name == "packing" else load_workload(workload_name)
    )
    kwargs = json.loads(options) if options and policy == "pollux" else {}
    timed = Timed(make_policy(policy, **kwargs))
    row: dict[str, Any] = {
        "workload": workload_name,
        "cluster": cluster,
        "policy": LABELS.get(policy, policy),
        "packing": packing,
    }
    started = time.perf_counter()
    try:
        result = simulate(
            workload, parse_cluster(cluster), timed, SimConfig(seed=seed, packing=packing)
        )
    except SimulationError as exc:
        row["error"] = str(exc)
        return row
    s = summarise(result, time.perf_counter() - started)
    row.update(
        avg_jct_s=s.avg_jct_s,
        p99_jct_s=s.p99_jct_s,
        makespan_s=s.makespan_s,
        restarts_per_job=s.restarts / s.num_jobs,
        round_ms_p50=float(np.median(timed.round_ms)) if timed.round_ms else float("nan"),
        round_ms_mean=float(np.mean(timed.round_ms)) if timed.round_ms else float("nan"),
        gpu_util=s.gpu_util,
        effective_util=s.effective_util,
        completed=s.completed,
        num_jobs=s.num_jobs,
        sim_wall_s=s.sim_wall_s,
    )
    return row


def tasks(
    policies: list[str],
    workloads: list[int],
    clusters: list[str],
    packing: bool,
    seed: int,
    options: str = "",
) -> list[Task]:
    out: list[Task] = []
    for w in workloads:
        for cluster in clusters:
            out += [(f"pollux-{w}", cluster, p, True, seed, options) for p in policies]
    if packing:
        for p in (p for p in PACKING_POLICIES if p in policies):
            out += [("packing", PACKING_CLUSTER, p, flag, seed, options) for flag in (False, True)]
    return out


def averages(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per cluster and policy: the mean of avg JCT and restarts/job over the artifact workloads
    (only where every workload finished)."""
    out: dict[str, dict[str, float]] = {}
    for cluster in (HOMOGENEOUS, HETEROGENEOUS):
        mine = [r for r in rows if r["cluster"] == cluster and r["workload"] != "packing"]
        for policy in sorted({r["policy"] for r in mine}):
            sel = [r for r in mine if r["policy"] == policy]
            if any("error" in r for r in sel):
                continue
            out.setdefault(cluster, {})[policy] = float(np.mean([r["avg_jct_s"] for r in sel]))
            out[cluster][f"{policy}:restarts_per_job"] = float(
                np.mean([r["restarts_per_job"] for r in sel])
            )
    return out


def print_table(rows: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="Heterogeneous clusters and GPU sharing (JCT in hours)")
    cols = ("workload", "cluster", "policy", "pack", "avg JCT", "p99 JCT", "makespan")
    short = {HETEROGENEOUS: "3-type"}
    for col in (*cols, "restarts/job", "round ms", "GPU util", "eff. util"):
        table.add_column(col, justify="left" if col in cols[:4] else "right")
    for r in rows:
        cluster = short.get(r["cluster"], r["cluster"])
        head = (r["workload"], cluster, r["policy"], "yes" if r["packing"] else "no")
        if "error" in r:
            table.add_row(*head, "failed (see the log)")
            continue
        table.add_row(
            *head,
            f"{r['avg_jct_s'] / 3600:.3f}",
            f"{r['p99_jct_s'] / 3600:.2f}",
            f"{r['makespan_s'] / 3600:.2f}",
            f"{r['restarts_per_job']:.2f}",
            f"{r['round_ms_p50']:.1f}",
            f"{r['gpu_util']:.2f}",
            f"{r['effective_util']:.2f}",
        )
    console.print(table)


def merged(rows: list[dict[str, Any]], old: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` plus the rows of ``old`` not re-run here, in table order."""
    fresh = {_key(r) for r in rows}
    return sorted([*rows, *(r for r in old if _key(r) not in fresh)], key=_sort_key)


def write_report(path: Path, rows: list[dict[str, Any]], started: float) -> None:
    """Write the report atomically (a temporary file renamed over ``path``), so a reader, or
    a run killed mid-write, never leaves a truncated JSON behind."""
    report = {
        "rows": rows,
        "averages": averages(rows),
        "total_wall_s": time.perf_counter() - started,
        "note": "round_ms_p50 is wall time and depends on the machine's load",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(report, indent=1) + "\n")
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the results from other users
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def collect(
    results: Iterable[dict[str, Any]],
    old: list[dict[str, Any]],
    out: Path | None,
    started: float,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Gather the finished rows (merged over ``old``), rewriting ``out`` after each one: a
    full run takes an hour, and a run that is killed keeps the rows it finished."""
    rows: list[dict[str, Any]] = []
    for row in results:
        rows.append(row)
        if on_row is not None:
            on_row(row)
        if out is not None:
            write_report(out, merged(rows, old), started)
    result = merged(rows, old)
    if out is not None:  # also when nothing ran; the final wall time
        write_report(out, result, started)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument(
        "--workloads", nargs="*", type=int, default=list(WORKLOADS), choices=WORKLOADS, metavar="N"
    )
    parser.add_argument(
        "--clusters",
        nargs="+",
        default=["homogeneous", "heterogeneous"],
        choices=["homogeneous", "heterogeneous"],
        help=f"{HOMOGENEOUS} and/or {HETEROGENEOUS}",
    )
    parser.add_argument("--no-packing", action="store_true", help="skip the packing workload")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--pollux-options",
        default="",
        metavar="JSON",
        help="screen levers: keyword options of the pollux policy, e.g. '{\"remaining_power\": 1}'",
    )
    parser.add_argument("--json", type=Path, metavar="OUT")
    parser.add_argument(
        "--merge",
        type=Path,
        metavar="OLD",
        help="start from OLD's rows (a previous --json), replacing the ones re-run here",
    )
    args = parser.parse_args()
    console = Console(width=150)
    policies = [p for p in args.policies if p in POLICY_NAMES]
    for p in sorted(set(args.policies) - set(policies)):
        console.print(f"note: policy {p!r} is not registered here; its rows are skipped")
    named = {"homogeneous": HOMOGENEOUS, "heterogeneous": HETEROGENEOUS}
    clusters = [named[c] for c in args.clusters]
    if args.pollux_options:
        try:
            opts = json.loads(args.pollux_options)
            make_policy("pollux", **opts)
        except (ValueError, TypeError) as exc:
            parser.error(
                f"--pollux-options: {exc}; accepted: a JSON object of PolluxPolicy options"
            )
        if not isinstance(opts, dict):
            parser.error("--pollux-options: accepted: a JSON object of PolluxPolicy options")
    todo = tasks(
        policies, args.workloads, clusters, not args.no_packing, args.seed, args.pollux_options
    )
    started = time.perf_counter()
    old = json.loads(args.merge.read_text())["rows"] if args.merge is not None else []
    with (
        multiprocessing.get_context("spawn").Pool(args.processes) as pool,
        Progress(console=Console(stderr=True)) as progress,
    ):
        bar = progress.add_task("simulating", total=len(todo))

        def log(row: dict[str, Any]) -> None:
            progress.advance(bar)
            what = f"{row['policy']} {row['workload']} {row['cluster']} pack={row['packing']}"
            if "error" in row:
                progress.console.log(f"{what}: failed: {row['error']}")
            else:
                progress.console.log(f"{what}: {row['avg_jct_s'] / 3600:.3f} h")

        rows = collect(pool.imap_unordered(run_one, todo), old, args.json, started, log)
    print_table(rows, console)
    for cluster, avgs in averages(rows).items():
        text = ", ".join(f"{k} {v / 3600:.3f} h" for k, v in avgs.items() if ":" not in k)
        console.print(f"mean avg JCT on {cluster}: {text}")
    return 0


def _key(row: dict[str, Any]) -> tuple[str, str, str, bool]:
    return row["workload"], row["cluster"], row["policy"], row["packing"]


def _sort_key(row: dict[str, Any]) -> tuple[int, int, int, bool]:
    """Workload (artifact ones by number, then packing), cluster, policy as in POLICIES."""
    w = row["workload"]
    number = int(w.split("-")[1]) if w.startswith("pollux-") else len(WORKLOADS) + 1
    clusters = (HOMOGENEOUS, HETEROGENEOUS, PACKING_CLUSTER)
    labels = [LABELS.get(p, p) for p in POLICIES]
    policy = labels.index(row["policy"]) if row["policy"] in labels else len(labels)
    return number, clusters.index(row["cluster"]), policy, row["packing"]


if __name__ == "__main__":
    raise SystemExit(main())

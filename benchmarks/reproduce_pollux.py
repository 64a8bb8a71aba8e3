"""Reproduce the Pollux artifact's simulator results (OSDI'21 Fig. 8a, 1.0x job load).

Runs the eight bundled workloads (``pollux-1`` .. ``pollux-8``, 160 jobs each) on a 16x4
cluster under pollux (the default), pollux-unaware, tiresias and optimus, two simulations at a
time, and compares the average JCT with the authors' ``results-jobload/<policy>-1.0/summary.json``
(bundled as ``coadapt/sim/data/reference``; both pollux variants are compared with the authors'
Pollux).

    python benchmarks/reproduce_pollux.py --json out/reproduce_pollux.json
    python benchmarks/reproduce_pollux.py --policies tiresias --workloads 6
    python benchmarks/reproduce_pollux.py --load 1.5     # held out: 240 jobs per workload

Targets: tiresias and optimus within ±5% of the authors per workload (they are deterministic:
exact is expected); pollux-unaware (the authors' objective) within ±15% of the authors' 0.764 h
over the 8 workloads; both pollux variants at least 30% below both baselines. The default
``pollux`` (issue 18): average JCT at most 0.85x the authors' and restarts per job at most half
of ``pollux-unaware``'s (the artifact's summaries record no restarts; pollux-unaware, which
reproduces the authors' JCT, stands in for them).

``--load`` runs the artifact's other relative job loads (0.5x, 1.5x, 2.0x: 80, 240, 320 jobs
per workload) against the authors' results at that load. The default's levers were chosen at
1.0x only, so these are held-out checks: the reproduction tolerances apply at every load, the
default's targets (and the 30% margin over the baselines) only at 1.0x, where the issue set them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from coadapt.policies import make_policy
from coadapt.sim import SimConfig, load_workload, parse_cluster, simulate, summarise
from coadapt.sim.workload import JOB_LOADS, bundled_name

POLICIES = ("pollux", "pollux-unaware", "tiresias", "optimus")
WORKLOADS = tuple(range(1, 9))
TOLERANCE = {"tiresias": 0.05, "optimus": 0.05, "pollux-unaware": 0.15}
#: The default pollux's targets against the authors' Pollux (issue 18).
POLLUX_JCT_RATIO = 0.85
POLLUX_RESTART_RATIO = 0.5
#: Whose published summary each policy is compared with.
AUTHORS = {
    "pollux": "pollux",
    "pollux-unaware": "pollux",
    "tiresias": "tiresias",
    "optimus": "optimus",
}


@dataclass(frozen=True)
class Run:
    policy: str
    workload: int
    avg_jct_s: float
    makespan_s: float
    restarts: int
    jobs: int
    wall_s: float
    jcts: dict[str, float]


def reference(policy: str, load: str = "1.0") -> dict[str, Any]:
    """The authors' summary for ``policy`` at relative job ``load``."""
    ref = resources.files("coadapt.sim").joinpath("data").joinpath("reference")
    data: dict[str, Any] = json.loads(ref.joinpath(f"{policy}-{load}.json").read_text("utf-8"))
    return data


def run_one(task: tuple[str, int, int, str]) -> Run:
    policy, index, seed, load = task
    workload = load_workload(bundled_name(index, load))
    started = time.perf_counter()
    result = simulate(workload, parse_cluster("16x4"), make_policy(policy), SimConfig(seed=seed))
    wall = time.perf_counter() - started
    summary = summarise(result, wall)
    return Run(
        policy,
        index,
        summary.avg_jct_s,
        summary.makespan_s,
        summary.restarts,
        len(result.jobs),
        wall,
        {j.name: j.jct for j in result.jobs if j.jct is not None},
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument(
        "--workloads", nargs="+", type=int, default=list(WORKLOADS), choices=WORKLOADS, metavar="N"
    )
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--load", default="1.0", choices=JOB_LOADS, help="relative job load (default 1.0)"
    )
    parser.add_argument("--json", type=Path, metavar="OUT")
    args = parser.parse_args()
    targeted = args.load == "1.0"  # the default's targets were set (and its levers chosen) here

    tasks = [(p, w, args.seed, args.load) for p in args.policies for w in args.workloads]
    started = time.perf_counter()
    runs: list[Run] = []
    with (
        multiprocessing.get_context("spawn").Pool(args.processes) as pool,
        Progress(console=Console(stderr=True)) as progress,
    ):
        bar = progress.add_task("simulating", total=len(tasks))
        for run in pool.imap_unordered(run_one, tasks):
            runs.append(run)
            progress.advance(bar)
            progress.console.log(
                f"{run.policy} workload-{run.workload}: "
                f"{run.avg_jct_s / 3600:.3f} h ({run.wall_s:.0f} s wall)"
            )
    total_wall = time.perf_counter() - started

    console = Console()
    table = Table(
        title=f"Average JCT (hours): coadapt.sim vs the authors' simulator, 16x4, "
        f"{args.load}x job load"
    )
    for col in ("workload", "policy", "coadapt", "authors", "deviation", "restarts/job", "wall s"):
        table.add_column(col, justify="left" if col in ("workload", "policy") else "right")
    refs = {p: reference(AUTHORS[p], args.load) for p in args.policies}
    by_key = {(r.policy, r.workload): r for r in runs}
    report: dict[str, Any] = {"load": args.load, "policies": {}, "total_wall_s": total_wall}
    for w in args.workloads:
        for p in args.policies:
            r = by_key[p, w]
            ref = refs[p]["avgs"][f"workload-{w}"]
            table.add_row(
                f"workload-{w}",
                p,
                f"{r.avg_jct_s / 3600:.3f}",
                f"{ref / 3600:.3f}",
                f"{(r.avg_jct_s - ref) / ref:+.2%}",
                f"{r.restarts / r.jobs:.2f}",
                f"{r.wall_s:.1f}",
            )
        table.add_section()
    ok = True
    for p in args.policies:
        runs_p = [by_key[p, w] for w in args.workloads]
        ours = sum(r.avg_jct_s for r in runs_p) / len(runs_p)
        theirs = sum(refs[p]["avgs"][f"workload-{w}"] for w in args.workloads) / len(runs_p)
        dev = (ours - theirs) / theirs
        restarts_per_job = sum(r.restarts / r.jobs for r in runs_p) / len(runs_p)
        per_wl = {}
        for r in runs_p:
            key = f"workload-{r.workload}"
            ref_jcts = refs[p]["jcts"][key]
            per_wl[key] = {
                "avg_jct_s": r.avg_jct_s,
                "authors_avg_jct_s": refs[p]["avgs"][key],
                "deviation": (r.avg_jct_s - refs[p]["avgs"][key]) / refs[p]["avgs"][key],
                "makespan_s": r.makespan_s,
                "restarts": r.restarts,
                "restarts_per_job": r.restarts / r.jobs,
                "wall_s": r.wall_s,
                "jobs_matching_authors": sum(
                    abs(v - ref_jcts.get(k, float("nan"))) < 1e-6 for k, v in r.jcts.items()
                ),
            }
        if p in ("tiresias", "optimus"):
            ok &= all(abs(v["deviation"]) <= TOLERANCE[p] for v in per_wl.values())
        elif p in TOLERANCE:
            ok &= abs(dev) <= TOLERANCE[p]
        report["policies"][p] = {
            "avg_jct_s": ours,
            "authors_avg_jct_s": theirs,
            "deviation": dev,
            "restarts_per_job": restarts_per_job,
            "workloads": per_wl,
        }
        table.add_row(
            "average",
            p,
            f"{ours / 3600:.3f}",
            f"{theirs / 3600:.3f}",
            f"{dev:+.2%}",
            f"{restarts_per_job:.2f}",
            f"{sum(r.wall_s for r in runs_p) / len(runs_p):.1f}",
            style="bold",
        )
    console.print(table)
    pol = report["policies"]
    # Held-out loads print the same figures, marked, and leave them out of the verdict.
    mark = "target" if targeted else "held out, no target; at 1.0x"
    for mine in ("pollux", "pollux-unaware"):
        for base in ("tiresias", "optimus"):
            if mine in pol and base in pol:
                gain = 1 - pol[mine]["avg_jct_s"] / pol[base]["avg_jct_s"]
                report[f"{mine}_vs_{base}"] = gain
                ok &= gain >= 0.30 or not targeted
                console.print(f"{mine} avg JCT is {gain:.1%} below {base} ({mark} >= 30%)")
    if "pollux" in pol:
        jct_ratio = pol["pollux"]["avg_jct_s"] / pol["pollux"]["authors_avg_jct_s"]
        report["pollux_jct_vs_authors"] = jct_ratio
        ok &= jct_ratio <= POLLUX_JCT_RATIO or not targeted
        console.print(
            f"pollux avg JCT is {jct_ratio:.3f}x the authors' ({mark} <= {POLLUX_JCT_RATIO}x)"
        )
        if "pollux-unaware" in pol:
            ratio = pol["pollux"]["restarts_per_job"] / pol["pollux-unaware"]["restarts_per_job"]
            report["pollux_restarts_vs_unaware"] = ratio
            ok &= ratio <= POLLUX_RESTART_RATIO or not targeted
            console.print(
                f"pollux restarts/job are {ratio:.2f}x pollux-unaware's "
                f"({mark} <= {POLLUX_RESTART_RATIO}x)"
            )
    report["targets_met"] = ok
    console.print(f"targets met: {ok}; total wall {total_wall:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""One scheduling round of ``pollux`` vs the paper's GA (``pollux-ga``) at growing scale.

Snapshots mix the six applications of the Pollux traces: each job's throughput model is fitted
(with coadapt's own fitter) on the placements it "has run" (those with at most the GPUs it
held), its gradient statistics come from the validation trace at a random epoch, and about half
of the jobs are already running. Same seed, same snapshots.

    python benchmarks/policy_scaling.py --json out/policy_scaling.json

Goals (issues 2 and 18): pollux <= 100 ms at 64 GPUs and <= 1 s at 2048 GPUs on 2 cores, on
homogeneous and on heterogeneous snapshots (``--hetero``: a quarter of the nodes V100, a
quarter P100, half K80; each job's compute terms slowed per type, some jobs restricted to
types), fitness >= pollux-ga's wherever both ran (homogeneous only: the GA is type-blind).
The GA is skipped above ``--ga-max-gpus`` (minutes per round).
The GA is reported cold (one round from the current allocation, as the first round of a live
scheduler) and warm (after ``--ga-warm-rounds`` rounds with its population carried over);
"vs best GA" compares with the better of the two.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import time
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from coadapt.goodput import (
    BatchLimits,
    GoodputModel,
    GradParams,
    Observations,
    PerfParams,
    fit_perf_params,
)
from coadapt.policies import (
    Allocation,
    ClusterSnapshot,
    JobInfo,
    NodeInfo,
    PolicyState,
    make_policy,
)

SIZES = [(64, 32), (64, 160), (256, 128), (1024, 512), (2048, 1024)]
APPS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")


@dataclass(frozen=True)
class AppTrace:
    name: str
    rows: list[tuple[int, int, int, float, float]]  # nodes, replicas, local_bsz, step, sync
    grad: list[tuple[float, float]]  # (sqr, var) per epoch at M0
    m0: int
    max_batch: int
    min_local: int
    max_local: int


def load_app(name: str) -> AppTrace:
    root = resources.files("coadapt.sim") / "data" / "traces" / name
    rows = []
    with (root / "placements.csv").open() as f:
        for rec in csv.DictReader(f):
            digits = [int(c) for c in rec["placement"]]
            rows.append(
                (
                    len(digits),
                    sum(digits),
                    int(rec["local_bsz"]),
                    float(rec["step_time"]),
                    float(rec["sync_time"]),
                )
            )
    sizes = sorted(
        int(p.name.split("-")[1].split(".")[0])
        for p in root.iterdir()
        if p.name.startswith("validation-")
    )
    grad = []
    with (root / f"validation-{sizes[0]}.csv").open() as f:
        for rec in csv.DictReader(f):
            grad.append((float(rec["grad_sqr"]), float(rec["grad_var"])))
    bsz = [r[2] for r in rows]
    return AppTrace(name, rows, grad, sizes[0], sizes[-1], min(bsz), max(bsz))


def fitted_model(app: AppTrace, held: int, rng: np.random.Generator) -> GoodputModel:
    seen = [r for r in app.rows if r[1] <= max(held, 1)]
    pick = rng.choice(len(seen), size=min(len(seen), 12), replace=False)
    n, k, m, step, sync = (np.array([seen[i][c] for i in pick], dtype=float) for c in range(5))
    perf: PerfParams = fit_perf_params(
        Observations.build(n, k, m, step, grad_time=np.maximum(step - sync, 1e-6))
    )
    sqr, var = app.grad[int(rng.integers(len(app.grad)))]
    return GoodputModel(perf, GradParams(sqr, var), app.m0)


def make_snapshot(gpus: int, jobs: int, seed: int, apps: dict[str, AppTrace]) -> ClusterSnapshot:
    rng = np.random.default_rng(seed)
    nodes = tuple(NodeInfo(f"node-{i}", 4) for i in range(gpus // 4))
    free = np.full(len(nodes), 4)
    infos: dict[str, JobInfo] = {}
    current: dict[str, Allocation] = {}
    now = 50_000.0
    for j in range(jobs):
        app = apps[APPS[int(rng.integers(len(APPS)))]]
        held = int(rng.choice([0, 1, 2, 4, 8, 16]))
        model = fitted_model(app, held, rng) if held else None
        pinned = app.max_batch if app.name == "ncf" else None
        name = f"{app.name}-{j}"
        infos[name] = JobInfo(
            name=name,
            submit_time=now - float(rng.uniform(60, 40_000)),
            num_restarts=int(rng.integers(0, 4)),
            max_replicas=1 if app.name == "ncf" else min(64, app.max_batch // app.min_local),
            max_gpus_held=held,
            goodput=model,
            limits=BatchLimits(
                app.m0, app.max_batch, app.min_local, app.max_local, pinned_batch=pinned
            ),
        )
        if held and rng.random() < 0.5 and free.sum() >= held:
            alloc = np.zeros(len(nodes), dtype=np.int64)
            for n in np.argsort(-free, kind="stable"):
                take = min(int(free[n]), held - int(alloc.sum()))
                alloc[n] = take
                if alloc.sum() == held:
                    break
            if np.count_nonzero(alloc) == 1 or all(free[alloc > 0] == 4):
                free -= alloc
                current[name] = tuple(int(x) for x in alloc)
    return ClusterSnapshot(now=now, nodes=nodes, jobs=infos, current=current)


#: Compute-time slowdown per GPU type (V100 = 1), the range of Gavel's measured ratios.
TYPE_SLOWDOWN = {"v100": (1.0, 1.0), "p100": (1.3, 2.2), "k80": (2.5, 5.5)}


def heterogeneous(snap: ClusterSnapshot, seed: int) -> ClusterSnapshot:
    """``snap`` on three GPU types: nodes re-typed (1/4 V100, 1/4 P100, 1/2 K80), each fitted
    job given a model per type, one job in five restricted to two types; running jobs keep
    their GPUs (a job spanning types counts as on the type where it holds most)."""
    rng = np.random.default_rng(seed)
    n = len(snap.nodes)
    kinds = ["v100"] * (n // 4) + ["p100"] * (n // 4)
    kinds += ["k80"] * (n - len(kinds))
    nodes = tuple(replace(node, gpu_type=t) for node, t in zip(snap.nodes, kinds, strict=True))
    jobs: dict[str, JobInfo] = {}
    for name, job in snap.jobs.items():
        by_type: dict[str, GoodputModel] | None = None
        if job.goodput is not None:
            by_type = {}
            for t, (lo, hi) in TYPE_SLOWDOWN.items():
                slow = float(rng.uniform(lo, hi))
                perf = replace(
                    job.goodput.perf,
                    alpha_grad=job.goodput.perf.alpha_grad * slow,
                    beta_grad=job.goodput.perf.beta_grad * slow,
                )
                by_type[t] = replace(job.goodput, perf=perf)
        allowed = ("v100", "k80") if rng.random() < 0.2 else None
        jobs[name] = replace(job, goodput_by_type=by_type, gpu_types=allowed)
    return replace(snap, nodes=nodes, jobs=jobs)


def warm_ga_fitness(snap: ClusterSnapshot, rounds: int) -> float:
    """The GA's fitness after ``rounds`` rounds on the same snapshot, its population carried
    over as in a live scheduler — the GA's best case, not a cold start."""
    policy = make_policy("pollux-ga")
    rng = np.random.default_rng(0)
    fitness = float("nan")
    state: PolicyState = {}
    for _ in range(rounds):
        decision = policy.optimize(snap, state, rng)
        state = decision.state
        fitness = decision.diagnostics.get("fitness", float("nan"))
    return fitness


def run_policy(name: str, snap: ClusterSnapshot, repeats: int) -> tuple[float, float]:
    times = []
    fitness = float("nan")
    for _ in range(repeats):
        policy = make_policy(name)
        start = time.perf_counter()
        decision = policy.optimize(snap, {}, np.random.default_rng(0))
        times.append((time.perf_counter() - start) * 1000)
        fitness = decision.diagnostics.get("fitness", float("nan"))
    return statistics.median(times), fitness


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="write results here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="rounds per pollux timing")
    parser.add_argument("--ga-max-gpus", type=int, default=256)
    parser.add_argument("--sizes", type=str, default=None, help="e.g. 64x32,256x128")
    parser.add_argument(
        "--hetero", action="store_true", help="also time pollux on heterogeneous snapshots"
    )
    parser.add_argument(
        "--ga-warm-rounds",
        type=int,
        default=5,
        help="also run the GA this many rounds with its population carried over (0: skip)",
    )
    args = parser.parse_args(argv)
    sizes = SIZES
    if args.sizes:
        sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]  # type: ignore[misc]
    console = Console(stderr=True)
    apps = {name: load_app(name) for name in APPS}
    results: list[dict[str, Any]] = []
    table = Table(title="One scheduling round (median ms; FITNESS_p, p = -1)")
    for col in ("GPUs", "jobs", "cluster", "policy", "latency ms", "fitness", "vs best GA"):
        table.add_column(col, justify="right")
    for gpus, jobs in sizes:
        snap = make_snapshot(gpus, jobs, args.seed + gpus + jobs, apps)
        console.log(f"{gpus} GPUs / {jobs} jobs: pollux")
        ms, fit = run_policy("pollux", snap, args.repeats)
        results.append(
            {
                "gpus": gpus,
                "jobs": jobs,
                "cluster": "homogeneous",
                "policy": "pollux",
                "latency_ms": ms,
                "fitness": fit,
            }
        )
        ga_fit = None
        if gpus <= args.ga_max_gpus:
            console.log(f"{gpus} GPUs / {jobs} jobs: pollux-ga (100 x 100)")
            ga_ms, ga_fit = run_policy("pollux-ga", snap, 1)
            row: dict[str, Any] = {
                "gpus": gpus,
                "jobs": jobs,
                "cluster": "homogeneous",
                "policy": "pollux-ga",
                "latency_ms": ga_ms,
                "fitness": ga_fit,
            }
            if args.ga_warm_rounds > 0:
                console.log(
                    f"{gpus} GPUs / {jobs} jobs: pollux-ga, {args.ga_warm_rounds} warm rounds"
                )
                warm = warm_ga_fitness(snap, args.ga_warm_rounds)
                row["fitness_warm"] = warm
                ga_fit = max(ga_fit, warm)
            results.append(row)
        ratio = f"{fit / ga_fit:.3f}x" if ga_fit else "GA skipped"
        table.add_row(str(gpus), str(jobs), "homog.", "pollux", f"{ms:.1f}", f"{fit:.4f}", ratio)
        if ga_fit is not None:
            last = results[-1]
            warm_fit = last.get("fitness_warm")
            shown = f"{last['fitness']:.4f}" + (
                f" (warm {warm_fit:.4f})" if warm_fit is not None else ""
            )
            table.add_row(
                str(gpus), str(jobs), "homog.", "pollux-ga", f"{last['latency_ms']:.0f}", shown, ""
            )
        if args.hetero:
            hsnap = heterogeneous(snap, args.seed + gpus)
            for name in ("pollux", "pollux-unaware"):
                console.log(f"{gpus} GPUs / {jobs} jobs, three types: {name}")
                h_ms, h_fit = run_policy(name, hsnap, args.repeats)
                results.append(
                    {
                        "gpus": gpus,
                        "jobs": jobs,
                        "cluster": "heterogeneous",
                        "policy": name,
                        "latency_ms": h_ms,
                        "fitness": h_fit,
                    }
                )
                table.add_row(
                    str(gpus), str(jobs), "3 types", name, f"{h_ms:.1f}", f"{h_fit:.4f}", ""
                )
    Console().print(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

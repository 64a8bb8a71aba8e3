"""Seed 003's multi-tenant tuning experiment, with tasks that really train here.

Four tenants each tune a real model on a dataset bundled with scikit-learn to its own target
accuracy (parallelism 4 each) on a cluster too small for all (6 slots): FIFO, seed 003's
Algorithm 1 and ``ei-per-gpu`` (expected improvement toward target per GPU-second), over
several seeds.

    python benchmarks/tune_tenants.py --record            # train every configuration (minutes)
    python benchmarks/tune_tenants.py --json out/tune_tenants.json     # replay (default)

``--record`` trains every configuration of each task's discrete space for real (torch, CPU,
one thread; per-epoch held-out accuracy and measured epoch seconds) and measures a trial
process' start-up (a fresh interpreter importing torch and loading the data), writing the curve
bank ``benchmarks/data/tune_curves.json`` with its provenance. The replay runs the simulator
(:mod:`coadapt.tune.sim`: real samplers, real pruning rule, the policies the controller runs)
on that bank. Each seed draws its own sampler seeds and its own order of arrival (the tenants
submit together, 1 ms apart in a seeded random order: FIFO's outcome depends on who came
first).

Targets: each tenant's target is the 90th percentile of its task's per-configuration best
accuracy, so about one random configuration in ten reaches it (several trials' work). Totals:
``makespan`` is the time from the first arrival until every target is reached (what "reaches
all targets sooner" means; the reported ratio uses it) and ``sum`` the sum of the tenants'
times to target (also reported, with its own ratio).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BANK = ROOT / "benchmarks" / "data" / "tune_curves.json"
POLICIES = ("fifo", "algorithm1", "ei-per-gpu")

#: task -> (dataset, model, epochs, discrete space)
TASKS: dict[str, tuple[str, str, int, dict[str, list[Any]]]] = {
    "digits-mlp": (
        "digits",
        "mlp",
        10,
        {
            "lr": [0.001, 0.003, 0.01, 0.03, 0.1, 0.3],
            "hidden": [16, 64, 256],
            "momentum": [0.0, 0.9],
            "batch_size": [16, 64, 256],
        },
    ),
    "cancer-mlp": (
        "breast_cancer",
        "mlp",
        10,
        {
            "lr": [0.0003, 0.001, 0.003, 0.01, 0.03, 0.1],
            "hidden": [8, 32, 128],
            "momentum": [0.0, 0.9],
            "batch_size": [8, 32, 128],
        },
    ),
    "wine-mlp": (
        "wine",
        "mlp",
        10,
        {
            "lr": [0.001, 0.003, 0.01, 0.03, 0.1, 0.3],
            "hidden": [8, 32, 128],
            "momentum": [0.0, 0.9],
            "batch_size": [4, 16, 64],
        },
    ),
    "digits-cnn": (
        "digits",
        "cnn",
        6,
        {
            "lr": [0.003, 0.01, 0.03, 0.1],
            "channels": [4, 8, 16],
            "momentum": [0.0, 0.9],
            "batch_size": [16, 64],
        },
    ),
}


# -- recording ----------------------------------------------------------------------------
def _data(name: str) -> tuple[Any, Any, Any, Any]:
    import numpy as np
    from sklearn import datasets
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    loader = {
        "digits": datasets.load_digits,
        "breast_cancer": datasets.load_breast_cancer,
        "wine": datasets.load_wine,
    }[name]
    x, y = loader(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    scaler = StandardScaler().fit(xtr)
    return (
        scaler.transform(xtr).astype(np.float32),
        scaler.transform(xte).astype(np.float32),
        ytr.astype(np.int64),
        yte.astype(np.int64),
    )


def train_epochs(task: str, params: dict[str, Any]) -> Iterator[tuple[float, float]]:
    """Train one configuration; yield (held-out accuracy, seconds) after each epoch."""
    import torch
    from torch import nn

    dataset, model_kind, epochs, _ = TASKS[task]
    xtr, xte, ytr, yte = _data(dataset)
    torch.manual_seed(0)
    classes = int(ytr.max()) + 1
    xtr_t, xte_t = torch.from_numpy(xtr), torch.from_numpy(xte)
    ytr_t, yte_t = torch.from_numpy(ytr), torch.from_numpy(yte)
    model: nn.Module
    if model_kind == "mlp":
        model = nn.Sequential(
            nn.Linear(xtr.shape[1], params["hidden"]),
            nn.ReLU(),
            nn.Linear(params["hidden"], classes),
        )
    else:
        c = params["channels"]
        xtr_t, xte_t = xtr_t.view(-1, 1, 8, 8), xte_t.view(-1, 1, 8, 8)
        model = nn.Sequential(
            nn.Conv2d(1, c, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(c * 16, classes),
        )
    opt = torch.optim.SGD(model.parameters(), lr=params["lr"], momentum=params["momentum"])
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(0)
    bs = params["batch_size"]
    for _ in range(epochs):
        started = time.perf_counter()
        model.train()
        perm = torch.randperm(len(xtr_t), generator=gen)
        for i in range(0, len(perm), bs):
            idx = perm[i : i + bs]
            opt.zero_grad()
            loss = loss_fn(model(xtr_t[idx]), ytr_t[idx])
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            acc = float((model(xte_t).argmax(1) == yte_t).float().mean())
        yield (acc if math.isfinite(acc) else 0.0), time.perf_counter() - started


def train_config(task: str, params: dict[str, Any]) -> tuple[list[float], list[float]]:
    """Train one configuration; per-epoch held-out accuracy and epoch seconds."""
    pairs = list(train_epochs(task, params))
    return [a for a, _ in pairs], [s for _, s in pairs]


def run_trial(task: str, argv: list[str]) -> int:
    """The trial program of ``--live``: train one configuration, report each epoch."""
    import torch

    import coadapt.train as train

    torch.set_num_threads(1)
    space = TASKS[task][3]
    raw = dict(zip(argv[::2], argv[1::2], strict=False))
    params: dict[str, Any] = {}
    for name, choices in space.items():
        text = raw.get(f"--{name}")
        match = [c for c in choices if str(c) == text or repr(c) == text]
        if not match:
            print(f"--{name}: {text!r} is not one of {choices}", file=sys.stderr)
            return 2
        params[name] = match[0]
    ctx = train.init()
    for epoch, (acc, _) in enumerate(train_epochs(task, params), 1):
        train.report("accuracy", acc, step=epoch)
        print(f"epoch {epoch}: accuracy {acc:.4f}", flush=True)
        if ctx.stop_requested:
            break
    train.shutdown()
    return 0


def startup_seconds(dataset: str, repeats: int = 3) -> float:
    """Median wall time of a fresh trial process: interpreter, torch, sklearn, the data."""
    code = f"import torch, sklearn.datasets as d; d.load_{dataset}(return_X_y=True)"
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def record(out: Path) -> None:
    import sklearn
    import torch
    from rich.progress import Progress

    torch.set_num_threads(1)
    jobs = [
        (task, dict(zip(space, values, strict=True)))
        for task, (_, _, _, space) in TASKS.items()
        for values in itertools.product(*space.values())
    ]
    bank: dict[str, Any] = {"tasks": {}}
    started = time.perf_counter()
    with Progress() as progress:
        bar = progress.add_task("training configurations", total=len(jobs) + len(TASKS))
        for task, (dataset, model, epochs, space) in TASKS.items():
            bank["tasks"][task] = {
                "dataset": dataset,
                "model": model,
                "epochs": epochs,
                "space": space,
                "startup_s": startup_seconds(dataset),
                "configs": [],
            }
            progress.advance(bar)
        for task, params in jobs:
            accs, secs = train_config(task, params)
            bank["tasks"][task]["configs"].append(
                {
                    "params": params,
                    "accuracy": [round(a, 5) for a in accs],
                    "epoch_s": [round(s, 5) for s in secs],
                }
            )
            progress.advance(bar)
    bank["provenance"] = {
        "command": "python benchmarks/tune_tenants.py --record",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} {platform.processor() or ''}".strip(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "sklearn": sklearn.__version__,
        "threads": 1,
        "seconds": round(time.perf_counter() - started, 1),
        "note": "per-epoch held-out accuracy (25% stratified split, seed 0) and measured "
        "epoch seconds of every configuration; startup_s: a fresh interpreter "
        "importing torch and loading the dataset (median of 3)",
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(bank, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {out} ({len(jobs)} configurations, {bank['provenance']['seconds']} s)")


# -- replay -------------------------------------------------------------------------------
def targets(bank: dict[str, Any], quantile: float) -> dict[str, float]:
    out = {}
    for name, task in bank.items():
        best = task.best_accuracies()
        k = min(math.floor(quantile * (len(best) - 1)), len(best) - 1)
        out[name] = math.floor(best[k] * 1000) / 1000
    return out


def replay(args: argparse.Namespace) -> dict[str, Any]:
    import random
    from dataclasses import replace

    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from coadapt.tune.sim import SimTenant, load_bank, simulate, summary

    bank = load_bank(args.bank)
    if args.startup_scale != 1.0:  # sensitivity: warm trial workers (0) vs fresh processes
        bank = {n: replace(t, startup_s=t.startup_s * args.startup_scale) for n, t in bank.items()}
    names = [n for n in TASKS if n in bank][: args.tenants]
    goal = targets({n: bank[n] for n in names}, args.quantile)
    es = {"rule": args.early_stopping, "grace_steps": 3, "min_peers": 3}
    runs: dict[str, list[Any]] = {p: [] for p in args.policies}
    solo: dict[str, list[float | None]] = {n: [] for n in names}
    with Progress() as progress:
        bar = progress.add_task("replaying", total=(len(args.policies) + 1) * args.seeds)
        for seed in range(args.seeds):
            order = names[:]
            random.Random(seed).shuffle(order)
            tenants = [
                SimTenant(
                    name=n,
                    task=bank[n],
                    target=goal[n],
                    arrival=order.index(n) * args.arrival_gap,
                    parallelism=args.parallelism,
                    sampler=args.sampler,
                    max_trials=args.max_trials,
                    early_stopping=es,
                    sampler_seed=seed * 1000 + i,
                )
                for i, n in enumerate(names)
            ]
            for policy in args.policies:
                runs[policy].append(simulate(tenants, args.slots, policy, seed))
                progress.advance(bar)
            for t in tenants:  # alone on the cluster, same sampler seed: a lower bound
                alone = replace(t, arrival=0.0)
                solo[t.name].append(simulate([alone], args.slots, "fifo", seed).sum_s)
            progress.advance(bar)
    out: dict[str, Any] = {
        "policies": {},
        "seeds": args.seeds,
        "slots": args.slots,
        "parallelism": args.parallelism,
        "sampler": args.sampler,
        "early_stopping": es,
        "targets": goal,
        "startup_scale": args.startup_scale,
        "arrival_gap_s": args.arrival_gap,
        "total_is": "makespan: first arrival until every tenant reached its target",
    }
    for policy, rs in runs.items():
        mk = [r.makespan_s for r in rs]
        sm = [r.sum_s for r in rs]
        mean, std = summary(mk)
        smean, sstd = summary(sm)
        out["policies"][policy] = {
            "total_s_mean": mean,
            "total_s_std": std,
            "sum_s_mean": smean,
            "sum_s_std": sstd,
            "unfinished_runs": sum(v is None for v in mk),
            "per_tenant_s": {
                n: dict(
                    zip(("mean", "std"), summary([r.time_to_target[n] for r in rs]), strict=True)
                )
                for n in names
            },
            "trials_mean": {n: sum(r.trials[n] for r in rs) / len(rs) for n in names},
            "pruned_mean": {n: sum(r.pruned[n] for r in rs) / len(rs) for n in names},
            "busy_fraction_mean": sum(r.busy_fraction for r in rs) / len(rs),
            "per_seed_total_s": mk,
        }
    # No policy can bring a tenant below its time alone on the cluster (same sampler seed),
    # so the makespan is at least the slowest tenant's solo time, seed by seed.
    bound: list[float | None] = []
    for k in range(args.seeds):
        times = [v[k] for v in solo.values()]
        bound.append(None if any(a is None for a in times) else max(a or 0.0 for a in times))
    out["solo_s"] = {
        n: dict(zip(("mean", "std"), summary(v), strict=True)) for n, v in solo.items()
    }
    out["makespan_lower_bound_s_mean"] = summary(bound)[0]
    sums = [sum(v[k] or 0.0 for v in solo.values()) for k in range(args.seeds)]
    out["sum_lower_bound_s_mean"] = summary(sums)[0]
    base_mk = out["policies"].get("fifo", {}).get("total_s_mean")
    if base_mk is not None:
        out["best_possible_ratio_fifo_over_any"] = base_mk / out["makespan_lower_bound_s_mean"]
    ours = out["policies"].get("ei-per-gpu")
    base = out["policies"].get("fifo")
    if ours and base:
        out["ratio_fifo_over_ours"] = base["total_s_mean"] / ours["total_s_mean"]
        out["ratio_fifo_over_ours_sum"] = base["sum_s_mean"] / ours["sum_s_mean"]
    console = Console()
    table = Table(
        title=f"time to target (s), {args.seeds} seeds, {args.slots} slots, "
        f"parallelism {args.parallelism}, sampler {args.sampler}"
    )
    table.add_column("policy")
    for n in names:
        table.add_column(f"{n}\n(target {goal[n]:.3f})", justify="right")
    table.add_column("makespan", justify="right")
    table.add_column("sum", justify="right")
    for policy, r in out["policies"].items():
        table.add_row(
            policy,
            *[
                f"{r['per_tenant_s'][n]['mean']:.1f} ± {r['per_tenant_s'][n]['std']:.1f}"
                for n in names
            ],
            f"{r['total_s_mean']:.1f} ± {r['total_s_std']:.1f}",
            f"{r['sum_s_mean']:.1f} ± {r['sum_s_std']:.1f}",
        )
    console.print(table)
    if "best_possible_ratio_fifo_over_any" in out:
        console.print(
            "lower bound on any policy's makespan (the slowest tenant alone on the cluster): "
            f"{out['makespan_lower_bound_s_mean']:.1f} s, i.e. at most "
            f"{out['best_possible_ratio_fifo_over_any']:.2f}x below fifo; "
            f"on the sum: {out['sum_lower_bound_s_mean']:.1f} s"
        )
    if "ratio_fifo_over_ours" in out:
        console.print(
            f"fifo / ei-per-gpu: makespan {out['ratio_fifo_over_ours']:.2f}x, "
            f"sum {out['ratio_fifo_over_ours_sum']:.2f}x (goal >= 1.5x on makespan)"
        )
    return out


def live(args: argparse.Namespace) -> dict[str, Any]:
    """One seed on a real controller: four tenants, real trial processes (this file's
    ``--trial`` mode), for each policy; times to target from the metric arrival times."""
    import random
    import tempfile

    from rich.progress import Progress

    from coadapt.controller.client import Client
    from coadapt.controller.subprocess_server import running_controller
    from coadapt.tune.sim import load_bank

    bank = load_bank(args.bank)
    names = [n for n in TASKS if n in bank][: args.tenants]
    goal = targets({n: bank[n] for n in names}, args.quantile)
    order = names[:]
    random.Random(0).shuffle(order)
    es = {"rule": args.early_stopping, "grace_steps": 3, "min_peers": 3}
    out: dict[str, Any] = {
        "policies": {},
        "seeds": 1,
        "slots": args.slots,
        "targets": goal,
        "mode": "live",
        "order": order,
    }
    for policy in args.policies:
        with tempfile.TemporaryDirectory(prefix="tune-live-") as tmp:
            state = Path(tmp) / "state"
            server_args = [
                "--slots",
                str(args.slots),
                "--tune-policy",
                policy,
                "--interval",
                "2",
                "--tick",
                "0.2",
                "--stop-grace",
                "5",
            ]
            with (
                running_controller(state, Path(tmp) / "controller.log", server_args) as ctl,
                Client(ctl.url, ctl.admin_token) as admin,
            ):
                ids: dict[str, str] = {}
                for n in order:
                    token = admin.create_tenant(f"tenant-{n}")["token"]
                    spec = {
                        "name": n,
                        "space": {
                            p: {"type": "categorical", "choices": v}
                            for p, v in bank[n].space.items()
                        },
                        "objective": {"metric": "accuracy", "direction": "maximize"},
                        "sampler": args.sampler,
                        "seed": 0,
                        "parallelism": args.parallelism,
                        "max_trials": args.max_trials,
                        "target": goal[n],
                        "max_steps": bank[n].epochs,
                        "early_stopping": es,
                        "max_retries": 1,
                        "dead_after_s": 120,
                        "trial": {
                            "script": str(Path(__file__).resolve()),
                            "args": ["--trial", n],
                            "working_dir": str(ROOT),
                            "env": {"OMP_NUM_THREADS": "1"},
                            "min_replicas": 1,
                            "max_replicas": 1,
                        },
                    }
                    with Client(ctl.url, token) as c:
                        ids[n] = c.request("POST", "/api/v1/experiments", json=spec)["experiment"][
                            "id"
                        ]
                deadline = time.monotonic() + args.live_timeout
                with Progress() as progress:
                    bar = progress.add_task(f"live {policy}: targets reached", total=len(order))
                    while True:
                        exps = admin.request("GET", "/api/v1/experiments")["experiments"]
                        ended = sum(e["state"] != "RUNNING" for e in exps)
                        progress.update(bar, completed=ended)
                        if ended == len(order) or time.monotonic() > deadline:
                            break
                        time.sleep(1.0)
                per: dict[str, float | None] = {}
                trials: dict[str, int] = {}
                for n in order:
                    d = admin.request("GET", f"/api/v1/experiments/{ids[n]}")
                    created = d["experiment"]["created_at"]
                    hit = [h[0] for h in d["best_history"] if h[1] >= goal[n]]
                    per[n] = hit[0] - created if hit else None
                    trials[n] = len(d["trials"])
                for e in admin.request("GET", "/api/v1/experiments")["experiments"]:
                    if e["state"] == "RUNNING":
                        admin.request("POST", f"/api/v1/experiments/{e['id']}/cancel")
                time.sleep(2.0)  # let the loop cancel the trial jobs before the stop
        reached = [v for v in per.values() if v is not None]
        out["policies"][policy] = {
            "total_s_mean": max(reached) if len(reached) == len(order) else None,
            "total_s_std": 0.0,
            "sum_s_mean": sum(reached) if len(reached) == len(order) else None,
            "per_tenant_s": {n: {"mean": per[n], "std": 0.0} for n in names},
            "trials": trials,
        }
        print(f"{policy}: " + ", ".join(f"{n} {_s(per[n])}" for n in names), flush=True)
    return out


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}s"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--record", action="store_true", help="train every configuration for real")
    p.add_argument("--live", action="store_true", help="one seed on a real controller")
    p.add_argument("--live-timeout", type=float, default=300.0, help="seconds per policy")
    p.add_argument("--trial", default=None, help=argparse.SUPPRESS)  # a --live trial
    p.add_argument("--bank", type=Path, default=BANK)
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--slots", type=int, default=6)
    p.add_argument("--tenants", type=int, default=4)
    p.add_argument("--parallelism", type=int, default=4)
    p.add_argument("--sampler", default="random", help="random (seed 003) or tpe")
    p.add_argument("--early-stopping", default="median", help="none, median, asha, curve")
    p.add_argument("--quantile", type=float, default=0.9, help="target quantile of the bank")
    p.add_argument("--max-trials", type=int, default=200, help="per tenant (seed 003: 200)")
    p.add_argument("--policies", nargs="+", default=list(POLICIES))
    p.add_argument(
        "--arrival-gap",
        type=float,
        default=0.001,
        help="seconds between the tenants' submissions (in a seeded random order)",
    )
    p.add_argument(
        "--startup-scale",
        type=float,
        default=1.0,
        help="multiply the measured trial start-up (0: as if trials ran in warm workers)",
    )
    args, rest = p.parse_known_args(argv)
    if args.trial is not None:
        return run_trial(args.trial, rest)
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.record:
        record(args.bank)
        return 0
    if not args.bank.exists():
        print(f"no curve bank at {args.bank}; run with --record first", file=sys.stderr)
        return 2
    out = live(args) if args.live else replay(args)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

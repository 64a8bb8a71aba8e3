"""Seed 003's multi-tenant tuning experiment, with tasks that really train here.

Four tenants each tune a real model on a dataset bundled with scikit-learn to its own target
held-out log-loss (parallelism 4 each) on a cluster too small for all (6 slots): FIFO, seed 003's
Algorithm 1 and ``ei-per-gpu`` (expected improvement toward target per GPU-second, with
preemption; ``ei-per-gpu-no-preempt`` is the same policy with preemption off, an ablation),
over several seeds, on two curve banks and their mix:

* ``light`` (``benchmarks/data/tune_curves.json``): the bundled datasets as they are, 48-108
  configurations per task. A trial is ~2-3.5 s of process start-up and 0.01-0.5 s of
  training, so learning curves and early stopping barely matter.
* ``heavy`` (``benchmarks/data/tune_curves_heavy.json``, the headline): training sets enlarged
  deterministically to ~24k samples (digits: every +-1-pixel shift plus pixel noise; tabular:
  Gaussian jitter; the held-out split stays the original), a 2-conv-layer CNN and 2-layer
  MLPs, 15-20 epochs, 24 configurations per task: a trial is mostly training, as in DL tuning.
* ``mixed`` (replay only): the first two tasks of each bank, so two tenants' trials cost
  6-9x the other two's, as on a cluster shared by teams tuning models of different sizes.

    python benchmarks/tune_tenants.py --record --bank heavy   # train every configuration
    python benchmarks/tune_tenants.py --json out/tune_tenants.json     # replay all three

``--record`` trains every configuration of a bank's discrete space for real (torch, CPU,
one thread per process, ``--workers`` processes; per-epoch held-out accuracy, held-out
log-loss and epoch seconds) and measures a trial process' start-up (a fresh interpreter
importing torch and building the data), writing the bank with its provenance. The replay
runs the simulator (:mod:`coadapt.tune.sim`: real samplers, real pruning rule, the policies
the controller runs) on that bank. Each seed draws its own sampler seeds and its own order
of arrival (the tenants submit together, 1 ms apart in a seeded random order: FIFO's outcome
depends on who came first). Every policy runs the same experiment specs (sampler,
early-stopping rule, objective, targets). ``--hindsight`` also replays FIFO in every order of
arrival and reports each seed's best order, an upper bound on what ordering tenants can gain.

Objective and targets (``--objective``, ``--quantile``), by one rule for every task of both
banks, fixed before any policy was compared on it: each tenant minimises its held-out
log-loss (mean cross-entropy, nats), and its target is the 0.9 quantile of the task's
per-configuration best loss ranked from worst to best, i.e. its 10th percentile (ceiled to 4
decimals), so about one random configuration in ten reaches it. ``--objective accuracy``
replays the earlier targets: the 90th percentile of per-configuration best held-out accuracy
(floored to 3 decimals). On these small held-out splits (45-450 samples) accuracy saturates:
the accuracy targets land on or next to 1.0, which most configurations reach (heavy bank:
wine 23/24, digits-cnn 8/24), so every tenant is done within one round of trials and there
is little left to schedule; the loss keeps ranking configurations that are all "right".

Totals: ``makespan`` is the time from the first arrival until every target is reached (what
"reaches all targets sooner" means; the reported ratio uses it) and ``sum`` the sum of the
tenants' times to target (also reported, with its own ratio).
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BANK = ROOT / "benchmarks" / "data" / "tune_curves.json"
HEAVY_BANK = ROOT / "benchmarks" / "data" / "tune_curves_heavy.json"
#: A held-out log-loss above this (or non-finite: a diverged model) is recorded as this.
LOSS_CAP = 100.0
POLICIES = ("fifo", "algorithm1", "ei-per-gpu", "ei-per-gpu-no-preempt")
#: Labels that are a policy with parameters: ablations of ei-per-gpu's preemption (off, or
#: at a lower worth ratio than the default 3); pass them to ``--policies``.
VARIANTS: dict[str, tuple[str, dict[str, float]]] = {
    "ei-per-gpu-no-preempt": ("ei-per-gpu", {"preempt_ratio": 0.0}),
    "ei-per-gpu-preempt-1.5": ("ei-per-gpu", {"preempt_ratio": 1.5}),
    "ei-per-gpu-preempt-1": ("ei-per-gpu", {"preempt_ratio": 1.0}),
}


@dataclass(frozen=True)
class TaskDef:
    """One tenant's task: what is trained on what, for how many epochs, over which space."""

    dataset: str
    model: str  # mlp (1 hidden layer), mlp2 (2 hidden layers), cnn, cnn2 (2 conv layers)
    epochs: int
    space: dict[str, list[Any]]
    augment: int = 0  # 0: the bundled split as is; n: training set enlarged to ~n samples


#: The light bank: the bundled datasets as they are (a trial is mostly process start-up).
TASKS: dict[str, TaskDef] = {
    "digits-mlp": TaskDef(
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
    "cancer-mlp": TaskDef(
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
    "wine-mlp": TaskDef(
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
    "digits-cnn": TaskDef(
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

#: The heavy bank: training dominates start-up, as in DL tuning. The training sets are
#: enlarged deterministically to ~24k samples (digits: every ±1-pixel shift of each training
#: image plus pixel noise; tabular: Gaussian jitter of the standardised training rows); the
#: held-out 25% stays the untouched original split. 24 configurations each.
HEAVY_MLP_SPACE: dict[str, list[Any]] = {  # the same 12 MLP configurations on each dataset
    "lr": [0.0003, 0.001, 0.003, 0.01, 0.03, 0.1],
    "hidden": [256, 512],
    "batch_size": [16, 32],
}
HEAVY_TASKS: dict[str, TaskDef] = {
    "digits-cnn": TaskDef(
        "digits",
        "cnn2",
        15,
        {"lr": [0.003, 0.01, 0.03, 0.1], "channels": [8, 16, 32], "batch_size": [32, 64]},
        augment=24_000,
    ),
    "digits-mlp": TaskDef(
        "digits",
        "mlp2",
        20,
        HEAVY_MLP_SPACE,
        augment=24_000,
    ),
    "cancer-mlp": TaskDef(
        "breast_cancer",
        "mlp2",
        20,
        HEAVY_MLP_SPACE,
        augment=24_000,
    ),
    "wine-mlp": TaskDef(
        "wine",
        "mlp2",
        20,
        HEAVY_MLP_SPACE,
        augment=24_000,
    ),
}

BANKS: dict[str, tuple[Path, dict[str, TaskDef]]] = {
    "light": (BANK, TASKS),
    "heavy": (HEAVY_BANK, HEAVY_TASKS),
}
#: The ``mixed`` replay: tenants whose trials differ 6-9x in cost, as on a shared cluster where
#: one team tunes a CNN and another a small MLP. Rule, fixed before it was run: the first two
#: tasks of the heavy bank and the first two of the light one, each with its own recorded curves.
MIXED: tuple[tuple[str, int], ...] = (("heavy", 2), ("light", 2))


def task_def(name: str) -> TaskDef:
    """A task by name; ``heavy:<name>`` for the heavy bank's (what ``--live`` trials get)."""
    kind, _, task = name.rpartition(":")
    return BANKS[kind or "light"][1][task]


# -- recording ----------------------------------------------------------------------------
def _data(name: str, augment: int = 0) -> tuple[Any, Any, Any, Any]:
    """Standardised train/held-out split (25%, stratified, seed 0); with ``augment``, the
    training set enlarged deterministically (seed 0) to about that many samples."""
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
    if augment:
        rng = np.random.default_rng(0)
        if name == "digits":  # images: every ±1-pixel shift (zero fill), then pixel noise
            img = xtr.reshape(-1, 8, 8)
            shifted = []
            for dy, dx in itertools.product((-1, 0, 1), repeat=2):
                s = np.zeros_like(img)
                s[:, max(dy, 0) : 8 + min(dy, 0), max(dx, 0) : 8 + min(dx, 0)] = img[
                    :, max(-dy, 0) : 8 + min(-dy, 0), max(-dx, 0) : 8 + min(-dx, 0)
                ]
                shifted.append(s.reshape(len(img), 64))
            reps = max(round(augment / (9 * len(xtr))), 1)
            base = np.concatenate(shifted * reps)
            xtr = np.clip(base + rng.normal(0.0, 1.0, base.shape), 0.0, 16.0)
            ytr = np.tile(ytr, 9 * reps)
        else:  # tabular: Gaussian jitter of 0.3 standard deviations per feature
            sd = xtr.std(axis=0, keepdims=True)
            reps = max(round(augment / len(xtr)), 1)
            base = np.concatenate([xtr] * reps)
            xtr = base + rng.normal(0.0, 0.3, base.shape) * sd
            ytr = np.tile(ytr, reps)
    scaler = StandardScaler().fit(xtr)
    return (
        scaler.transform(xtr).astype(np.float32),
        scaler.transform(xte).astype(np.float32),
        ytr.astype(np.int64),
        yte.astype(np.int64),
    )


def _model(kind: str, features: int, classes: int, params: dict[str, Any]) -> Any:
    from torch import nn

    if kind == "mlp":
        h = params["hidden"]
        return nn.Sequential(nn.Linear(features, h), nn.ReLU(), nn.Linear(h, classes))
    if kind == "mlp2":
        h = params["hidden"]
        return nn.Sequential(
            nn.Linear(features, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, classes)
        )
    c = params["channels"]
    if kind == "cnn":
        return nn.Sequential(
            nn.Conv2d(1, c, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(c * 16, classes),
        )
    return nn.Sequential(
        nn.Conv2d(1, c, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(c, 2 * c, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * c * 16, 64),
        nn.ReLU(),
        nn.Linear(64, classes),
    )


def train_epochs(
    task: str, params: dict[str, Any], clock: Callable[[], float] = time.perf_counter
) -> Iterator[tuple[float, float, float]]:
    """Train one configuration; yield (held-out accuracy, held-out log-loss, seconds by
    ``clock``) after each epoch. The log-loss is the mean cross-entropy (nats) of the held-out
    split; a non-finite one (a diverged model) is reported as ``LOSS_CAP``."""
    import torch
    from torch import nn

    td = task_def(task)
    xtr, xte, ytr, yte = _data(td.dataset, td.augment)
    torch.manual_seed(0)
    classes = int(ytr.max()) + 1
    xtr_t, xte_t = torch.from_numpy(xtr), torch.from_numpy(xte)
    ytr_t, yte_t = torch.from_numpy(ytr), torch.from_numpy(yte)
    if td.model.startswith("cnn"):
        xtr_t, xte_t = xtr_t.view(-1, 1, 8, 8), xte_t.view(-1, 1, 8, 8)
    model = _model(td.model, xtr.shape[1], classes, params)
    opt = torch.optim.SGD(model.parameters(), lr=params["lr"], momentum=params.get("momentum", 0.9))
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(0)
    bs = params["batch_size"]
    for _ in range(td.epochs):
        started = clock()
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
            logits = model(xte_t)
            acc = float((logits.argmax(1) == yte_t).float().mean())
            loss = float(loss_fn(logits, yte_t))
        yield (
            (acc if math.isfinite(acc) else 0.0),
            (min(loss, LOSS_CAP) if math.isfinite(loss) else LOSS_CAP),
            clock() - started,
        )


def train_config(
    task: str, params: dict[str, Any], clock: Callable[[], float] = time.perf_counter
) -> tuple[list[float], list[float], list[float]]:
    """Train one configuration; per-epoch held-out accuracy, held-out log-loss and epoch
    seconds."""
    rows = list(train_epochs(task, params, clock))
    return [a for a, _, _ in rows], [lo for _, lo, _ in rows], [s for _, _, s in rows]


def run_trial(task: str, argv: list[str]) -> int:
    """The trial program of ``--live``: train one configuration, report each epoch."""
    import torch

    import coadapt.train as train

    torch.set_num_threads(1)
    space = task_def(task).space
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
    for epoch, (acc, loss, _) in enumerate(train_epochs(task, params), 1):
        train.report("accuracy", acc, step=epoch)
        train.report("loss", loss, step=epoch)
        print(f"epoch {epoch}: accuracy {acc:.4f} loss {loss:.4f}", flush=True)
        if ctx.stop_requested:
            break
    train.shutdown()
    return 0


def startup_seconds(td: TaskDef, repeats: int = 3) -> float:
    """Median wall time of a fresh trial process: interpreter, torch, sklearn, the data (for
    an augmented task, building the enlarged training set too)."""
    if td.augment:
        code = (
            f"import sys, torch; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            f"import tune_tenants as t; t._data({td.dataset!r}, {td.augment})"
        )
    else:
        code = f"import torch, sklearn.datasets as d; d.load_{td.dataset}(return_X_y=True)"
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def _record_one(
    kind: str, task: str, params: dict[str, Any]
) -> tuple[list[float], list[float], list[float]]:
    """One configuration in a worker process (one torch thread). Epochs are timed by the
    process' CPU time: with one thread that is what a dedicated core takes, unaffected by
    anything else running on the machine (the light bank, recorded alone and one at a time,
    used the wall clock)."""
    import torch

    torch.set_num_threads(1)
    return train_config(f"{kind}:{task}", params, time.process_time)


def record(kind: str, out: Path, workers: int) -> None:
    """Train every configuration of bank ``kind`` for real, ``workers`` processes at once."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    import sklearn
    import torch
    from rich.progress import Progress

    tasks = BANKS[kind][1]
    jobs = [
        (task, dict(zip(td.space, values, strict=True)))
        for task, td in tasks.items()
        for values in itertools.product(*td.space.values())
    ]
    bank: dict[str, Any] = {"tasks": {}}
    started = time.perf_counter()
    results: dict[int, tuple[list[float], list[float], list[float]]] = {}

    def cost(i: int) -> float:  # longest first, so the workers finish together
        task, params = jobs[i]
        width = params.get("channels", 0) * 8 or params.get("hidden", 1)
        return tasks[task].epochs * width / params["batch_size"]

    with Progress() as progress:
        bar = progress.add_task(
            f"{kind} bank: start-up, then training configurations", total=len(jobs) + len(tasks)
        )
        for task, td in tasks.items():  # measured alone, before the workers load the cores
            bank["tasks"][task] = {
                "dataset": td.dataset,
                "model": td.model,
                "epochs": td.epochs,
                "augment": td.augment,
                "space": td.space,
                "startup_s": startup_seconds(td),
                "configs": [],
            }
            progress.advance(bar)
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = {
                pool.submit(_record_one, kind, *jobs[i]): i
                for i in sorted(range(len(jobs)), key=cost, reverse=True)
            }
            for fut in as_completed(futures):
                results[futures[fut]] = fut.result()
                progress.advance(bar)
    for i, (task, params) in enumerate(jobs):
        accs, losses, secs = results[i]
        bank["tasks"][task]["configs"].append(
            {
                "params": params,
                "accuracy": [round(a, 5) for a in accs],
                "loss": [round(lo, 6) for lo in losses],
                "epoch_s": [round(s, 5) for s in secs],
            }
        )
    note = (
        "per-epoch held-out accuracy and held-out log-loss (mean cross-entropy in nats, "
        f"non-finite or above {LOSS_CAP:g} stored as {LOSS_CAP:g}) "
        "(25% stratified split, seed 0) and measured "
        "epoch seconds of every configuration; startup_s: a fresh interpreter "
        "importing torch and loading the dataset (median of 3)"
    )
    if kind == "heavy":
        note += (
            ", including building the enlarged training set. Training sets enlarged "
            "deterministically (seed 0) to ~24k samples: digits = every +-1-pixel shift of each "
            "training image (zero fill) plus N(0, 1) pixel noise (pixels 0..16); tabular = "
            "Gaussian jitter of 0.3 feature standard deviations. The held-out split is the "
            "original, untouched. Configurations trained "
            f"{workers} at a time (one process and one torch thread each); epoch_s is the "
            "process CPU time of the epoch (one thread: a dedicated core's time)"
        )
    bank["provenance"] = {
        "command": f"python benchmarks/tune_tenants.py --record --bank {kind} --workers {workers}",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} {platform.processor() or ''}".strip(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "sklearn": sklearn.__version__,
        "threads": 1,
        "workers": workers,
        "seconds": round(time.perf_counter() - started, 1),
        "note": note,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(bank, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {out} ({len(jobs)} configurations, {bank['provenance']['seconds']} s)")


# -- replay -------------------------------------------------------------------------------
#: The objectives a replay can tune: a recorded curve and its direction.
OBJECTIVES: dict[str, str] = {"accuracy": "maximize", "loss": "minimize"}


def targets(bank: dict[str, Any], quantile: float, metric: str = "accuracy") -> dict[str, float]:
    """Each task's target: the ``quantile`` of its per-configuration best ``metric`` ranked
    from worst to best (so about one configuration in ``1 / (1 - quantile)`` reaches it),
    rounded toward easier: accuracy floored to 3 decimals, log-loss ceiled to 4 (losses of
    the small tasks go down to ~0.003 nats)."""
    direction = OBJECTIVES[metric]
    out = {}
    for name, task in bank.items():
        best = task.best_values(metric, direction)  # worst first
        k = min(math.floor(quantile * (len(best) - 1)), len(best) - 1)
        if direction == "maximize":
            out[name] = math.floor(best[k] * 1000) / 1000
        else:
            out[name] = math.ceil(best[k] * 10_000) / 10_000
    return out


def tenant_tasks(kind: str, paths: dict[str, Path]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recorded tasks a replay of ``kind`` tunes (name -> task, in the bank's order) and
    their banks' provenance; ``mixed`` takes tasks of both banks, named ``<bank>-<task>``."""
    from dataclasses import replace

    from coadapt.tune.sim import load_bank

    parts = MIXED if kind == "mixed" else ((kind, len(BANKS[kind][1])),)
    tasks: dict[str, Any] = {}
    prov: dict[str, Any] = {}
    for bank_kind, count in parts:
        path = paths[bank_kind]
        bank = load_bank(path)
        for n in [n for n in BANKS[bank_kind][1] if n in bank][:count]:
            name = n if kind != "mixed" else f"{bank_kind}-{n}"
            tasks[name] = replace(bank[n], name=name)
        prov[bank_kind] = {
            "file": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
            **json.loads(path.read_text(encoding="utf-8")).get("provenance", {}),
        }
    return tasks, prov


def _simulate_one(policy: str, seed: int, tenants: list[Any], slots: int) -> Any:
    """One replay (``solo``: the tenant alone under fifo; ``order``: fifo with the tenants'
    arrivals in a given order); a process pool's unit of work."""
    from coadapt.tune.sim import simulate

    name, params = VARIANTS.get(policy, ("fifo" if policy in ("solo", "order") else policy, {}))
    return simulate(tenants, slots, name, seed, params=params)


def replay(args: argparse.Namespace, kind: str, paths: dict[str, Path]) -> dict[str, Any]:
    """Every policy on bank ``kind`` over ``args.seeds`` seeds; the results and the table."""
    import random
    from dataclasses import replace

    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from coadapt.tune.sim import SimTenant, summary

    bank, prov = tenant_tasks(kind, paths)
    if args.startup_scale != 1.0:  # sensitivity: warm trial workers (0) vs fresh processes
        bank = {n: replace(t, startup_s=t.startup_s * args.startup_scale) for n, t in bank.items()}
    names = list(bank)[: args.tenants]
    goal = targets({n: bank[n] for n in names}, args.quantile, args.objective)
    es = {"rule": args.early_stopping, "grace_steps": 3, "min_peers": 3}
    runs: dict[str, list[Any]] = {p: [] for p in args.policies}
    solo: dict[str, list[float | None]] = {n: [] for n in names}
    work: list[tuple[str, int, list[SimTenant]]] = []  # (policy or "solo", seed, tenants)
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
                metric=args.objective,
                direction=OBJECTIVES[args.objective],
            )
            for i, n in enumerate(names)
        ]
        work += [(policy, seed, tenants) for policy in args.policies]
        # alone on the cluster, same sampler seed: a lower bound
        work += [("solo", seed, [replace(t, arrival=0.0)]) for t in tenants]
        if args.hindsight:  # fifo in every order of arrival: the best static order, in hindsight
            work += [
                (
                    "order",
                    seed,
                    [replace(t, arrival=p.index(t.name) * args.arrival_gap) for t in tenants],
                )
                for p in itertools.permutations(names)
            ]
    done: dict[int, Any] = {}
    with Progress() as progress:
        bar = progress.add_task(f"replaying the {kind} bank", total=len(work))
        if args.jobs > 1:  # independent, deterministic runs: any order gives the same results
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor, as_completed

            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=args.jobs, mp_context=ctx) as pool:
                futures = {
                    pool.submit(_simulate_one, w[0], w[1], w[2], args.slots): i
                    for i, w in enumerate(work)
                }
                for fut in as_completed(futures):
                    done[futures[fut]] = fut.result()
                    progress.advance(bar)
        else:
            for i, w in enumerate(work):
                done[i] = _simulate_one(w[0], w[1], w[2], args.slots)
                progress.advance(bar)
    orders: dict[int, list[Any]] = {}
    for i, (policy, seed, tenants) in enumerate(work):
        if policy == "solo":
            solo[tenants[0].name].append(done[i].sum_s)
        elif policy == "order":
            orders.setdefault(seed, []).append(done[i])
        else:
            runs[policy].append(done[i])
    trial_s = {
        n: {
            "startup_s": bank[n].startup_s,
            "training_s_mean": sum(sum(c.epoch_s) for c in bank[n].configs.values())
            / len(bank[n].configs),
        }
        for n in names
    }
    out: dict[str, Any] = {
        "policies": {},
        "seeds": args.seeds,
        "bank": kind,
        "bank_provenance": prov if kind == "mixed" else prov[kind],
        "trial_seconds": trial_s,
        "slots": args.slots,
        "parallelism": args.parallelism,
        "sampler": args.sampler,
        "early_stopping": es,
        "objective": {"metric": args.objective, "direction": OBJECTIVES[args.objective]},
        "quantile": args.quantile,
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
            "preempted_mean": {n: sum(r.preempted[n] for r in rs) / len(rs) for n in names},
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
        out["best_possible_ratio_fifo_over_any_sum"] = (
            out["policies"]["fifo"]["sum_s_mean"] / out["sum_lower_bound_s_mean"]
        )
    if orders:
        # Each seed's best order for each measure, chosen after the fact: an upper bound on
        # what any policy that only orders tenants (static priorities) could gain over fifo.
        best_mk = [
            min((r.makespan_s for r in rs if r.makespan_s is not None), default=None)
            for rs in orders.values()
        ]
        best_sum = [
            min((r.sum_s for r in rs if r.sum_s is not None), default=None)
            for rs in orders.values()
        ]
        out["hindsight_order"] = {
            "what": "fifo in every order of the tenants' arrivals; each seed's best order "
            "for each measure, chosen after the fact",
            "orders_per_seed": len(next(iter(orders.values()))),
            "makespan_s_mean": summary(best_mk)[0],
            "sum_s_mean": summary(best_sum)[0],
        }
        if base_mk is not None:
            out["hindsight_order"]["ratio_fifo_over_it"] = (
                base_mk / out["hindsight_order"]["makespan_s_mean"]
            )
            out["hindsight_order"]["ratio_fifo_over_it_sum"] = (
                out["policies"]["fifo"]["sum_s_mean"] / out["hindsight_order"]["sum_s_mean"]
            )
    ours = out["policies"].get("ei-per-gpu")
    base = out["policies"].get("fifo")
    if ours and base:
        out["ratio_fifo_over_ours"] = base["total_s_mean"] / ours["total_s_mean"]
        out["ratio_fifo_over_ours_sum"] = base["sum_s_mean"] / ours["sum_s_mean"]
    console = Console()
    table = Table(
        title=f"{kind} bank, {args.objective} targets: time to target (s), {args.seeds} seeds, "
        f"{args.slots} slots, "
        f"parallelism {args.parallelism}, sampler {args.sampler}"
    )
    table.add_column("policy")
    for n in names:
        table.add_column(f"{n}\n(target {goal[n]:.4g})", justify="right")
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
    console.print(
        "a trial: "
        + ", ".join(
            f"{n} {v['startup_s']:.1f} s start-up + {v['training_s_mean']:.1f} s training"
            for n, v in trial_s.items()
        )
    )
    for policy, r in out["policies"].items():
        console.print(
            f"{policy}: trials/pruned/preempted per tenant (mean) "
            + ", ".join(
                f"{n} {r['trials_mean'][n]:.1f}/{r['pruned_mean'][n]:.1f}/"
                f"{r['preempted_mean'][n]:.1f}"
                for n in names
            )
        )
    if "best_possible_ratio_fifo_over_any" in out:
        console.print(
            "lower bound on any policy's makespan (the slowest tenant alone on the cluster): "
            f"{out['makespan_lower_bound_s_mean']:.1f} s, i.e. at most "
            f"{out['best_possible_ratio_fifo_over_any']:.2f}x below fifo; "
            f"on the sum: {out['sum_lower_bound_s_mean']:.1f} s "
            f"(at most {out['best_possible_ratio_fifo_over_any_sum']:.2f}x)"
        )
    if "ratio_fifo_over_it" in out.get("hindsight_order", {}):
        h = out["hindsight_order"]
        console.print(
            f"best static order in hindsight (fifo, best of {h['orders_per_seed']} arrival "
            f"orders per seed): makespan {h['makespan_s_mean']:.1f} s "
            f"({h['ratio_fifo_over_it']:.2f}x below fifo), sum {h['sum_s_mean']:.1f} s "
            f"({h['ratio_fifo_over_it_sum']:.2f}x)"
        )
    if "ratio_fifo_over_ours" in out:
        console.print(
            f"fifo / ei-per-gpu: makespan {out['ratio_fifo_over_ours']:.2f}x, "
            f"sum {out['ratio_fifo_over_ours_sum']:.2f}x (goal >= 1.5x on makespan)"
        )
    return out


def live(args: argparse.Namespace, kind: str, path: Path) -> dict[str, Any]:
    """One seed on a real controller: four tenants, real trial processes (this file's
    ``--trial`` mode), for each policy; times to target from the metric times (when each
    trial reported the value, as the controller stores them)."""
    import random
    import tempfile

    from rich.progress import Progress

    from coadapt.controller.client import Client
    from coadapt.controller.subprocess_server import running_controller

    bank, _ = tenant_tasks(kind, {kind: path})
    names = list(bank)[: args.tenants]
    goal = targets({n: bank[n] for n in names}, args.quantile, args.objective)
    direction = OBJECTIVES[args.objective]
    order = names[:]
    random.Random(0).shuffle(order)
    es = {"rule": args.early_stopping, "grace_steps": 3, "min_peers": 3}
    out: dict[str, Any] = {
        "policies": {},
        "seeds": 1,
        "slots": args.slots,
        "targets": goal,
        "objective": {"metric": args.objective, "direction": direction},
        "mode": "live",
        "bank": kind,
        "order": order,
    }
    for policy in [q for q in args.policies if q not in VARIANTS]:  # no ablations live
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
                        "objective": {"metric": args.objective, "direction": direction},
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
                            "args": ["--trial", f"{kind}:{n}"],
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
                timeline: dict[str, list[dict[str, Any]]] = {}
                for n in order:
                    d = admin.request("GET", f"/api/v1/experiments/{ids[n]}")
                    created = d["experiment"]["created_at"]
                    hit = [
                        h[0]
                        for h in d["best_history"]
                        if (h[1] >= goal[n] if direction == "maximize" else h[1] <= goal[n])
                    ]
                    per[n] = hit[0] - created if hit else None
                    trials[n] = len(d["trials"])
                    timeline[n] = [
                        {
                            "number": t["number"],
                            "state": t["state"],
                            "value": t["value"],
                            "created_s": round(t["created_at"] - created, 2),
                            "ended_s": None
                            if t["ended_at"] is None
                            else round(t["ended_at"] - created, 2),
                            "steps": len(t["curve"]),
                        }
                        for t in d["trials"]
                    ]
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
            "timeline": timeline,  # each trial: seconds from its experiment's submission
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
    p.add_argument(
        "--bank",
        choices=("light", "heavy", "mixed", "both", "all"),
        default="all",
        help="light: the bundled datasets as they are (start-up dominates); heavy: enlarged "
        "training sets, training dominates (the headline, as in DL tuning); mixed: two "
        "tenants of each (trials 6-9x apart in cost); both: heavy and light; all: the three",
    )
    p.add_argument("--bank-file", type=Path, default=None, help="read/write this file instead")
    p.add_argument("--workers", type=int, default=2, help="--record: processes at once")
    p.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="replay: processes at once"
    )
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--slots", type=int, default=6)
    p.add_argument("--tenants", type=int, default=4)
    p.add_argument("--parallelism", type=int, default=4)
    p.add_argument("--sampler", default="random", help="random (seed 003) or tpe")
    p.add_argument("--early-stopping", default="median", help="none, median, asha, curve")
    p.add_argument(
        "--objective",
        choices=tuple(OBJECTIVES),
        default="loss",
        help="what each tenant tunes: held-out log-loss (minimised; the default: it does not "
        "saturate) or held-out accuracy (maximised; on these small held-out splits the "
        "targets saturate at or near 1.0)",
    )
    p.add_argument(
        "--quantile",
        type=float,
        default=0.9,
        help="target: this quantile of the per-configuration best values, worst to best",
    )
    p.add_argument("--max-trials", type=int, default=200, help="per tenant (seed 003: 200)")
    p.add_argument("--policies", nargs="+", default=list(POLICIES))
    p.add_argument(
        "--hindsight",
        action="store_true",
        help="also replay fifo in every order of the tenants' arrivals (tenants! runs a seed) "
        "and report each seed's best order: what ordering tenants could gain at most",
    )
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
    kinds = {"all": ["heavy", "light", "mixed"], "both": ["heavy", "light"]}.get(
        args.bank, [args.bank]
    )
    if args.bank_file is not None and kinds not in (["heavy"], ["light"]):
        p.error("--bank-file needs --bank light or --bank heavy")
    if kinds == ["mixed"] and (args.record or args.live):
        p.error("--bank mixed replays tasks of the heavy and light banks: record or run those")
    recorded = [k for k in kinds if k != "mixed"] or ["heavy", "light"]
    files = {k: args.bank_file or BANKS[k][0] for k in recorded}
    if args.record:
        for k in recorded:
            record(k, files[k], args.workers)
        return 0
    missing = [str(f) for f in files.values() if not f.exists()]
    if missing:
        print(f"no curve bank at {', '.join(missing)}; run with --record", file=sys.stderr)
        return 2
    if args.live:
        out = live(args, kinds[0], files[kinds[0]])
    else:
        # The headline is the first bank (heavy, with --bank all or both): training dominates
        # a trial there, as in DL tuning; every bank's results are under "banks".
        sections = {k: replay(args, k, files) for k in kinds}
        out = {**sections[kinds[0]], "headline_bank": kinds[0], "banks": sections}
        if kinds[0] == "heavy":
            out["headline_note"] = (
                "top-level numbers are the heavy bank's: enlarged training sets so that "
                "training (not process start-up) dominates a trial, as in DL tuning"
            )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

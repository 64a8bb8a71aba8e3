"""``--record``: train every configuration of a bank and write its curves with provenance."""

from __future__ import annotations

import itertools
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from _tune.tasks import BANKS, LOSS_CAP, TaskDef
from _tune.training import train_config


def startup_seconds(td: TaskDef, repeats: int = 3) -> float:
    """Median wall time of a fresh trial process: interpreter, torch, sklearn, the data (for
    an augmented task, building the enlarged training set too)."""
    if td.augment:
        code = (
            f"import sys, torch; sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r}); "
            f"from _tune.training import _data; _data({td.dataset!r}, {td.augment})"
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

"""What the training benchmarks share: launching a run-local job, statistics, machine load.

``train_bench.py`` (overhead, rescale, PGNS) and ``tta_bench.py`` (time to accuracy) both start
jobs through ``python -m coadapt.train.launch`` and report medians with bootstrap intervals;
one copy of that lives here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def env() -> dict[str, str]:
    """The environment for a launched job: loopback gloo, this checkout on the path."""
    out = dict(os.environ)
    out.setdefault("GLOO_SOCKET_IFNAME", "lo")
    out["PYTHONPATH"] = str(ROOT)
    return out


def launch_command(replicas: int, script: Path, args: Sequence[str], ckpt: Path) -> list[str]:
    """``python -m coadapt.train.launch -n replicas ... script args``."""
    return [
        sys.executable,
        "-m",
        "coadapt.train.launch",
        "-n",
        str(replicas),
        "--checkpoint-dir",
        str(ckpt),
        str(script),
        *args,
    ]


def run_local(
    replicas: int,
    script: Path,
    args: Sequence[str],
    ckpt: Path | None = None,
    timeout: float = 300,
    launcher: Sequence[str] = (),
) -> str:
    """Run ``script`` under ``coadapt.train.launch -n replicas``; its stdout (raises on failure).

    ``launcher`` prefixes the command (e.g. ``perf stat ...``).
    """
    if ckpt is None:  # a fresh directory: no stale checkpoint, metrics not in the cwd
        ckpt = Path(tempfile.mkdtemp(prefix="coadapt-bench-"))
    cmd = [*launcher, *launch_command(replicas, script, args, ckpt)]
    proc = subprocess.run(
        cmd,
        cwd=ROOT,
        env=env(),
        timeout=timeout,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        tail = f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        raise RuntimeError(f"{script.name} failed ({proc.returncode}):\n{tail}")
    return proc.stdout + proc.stderr if launcher else proc.stdout


def bootstrap_ratio_ci(
    num: Sequence[float], den: Sequence[float], seed: int = 0, rounds: int = 10_000
) -> tuple[float, float, float]:
    """(median ratio, 2.5%, 97.5%) of median(num) / median(den), resampling paired repeats.

    Repeats are interleaved (repeat i of both ran back to back), so they are resampled in
    pairs: load that drifts between repeats moves both sides of a pair alike.
    """
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if a.shape != b.shape or a.size < 2:
        raise ValueError(f"need two paired samples of >= 2 values, got {a.size} and {b.size}")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.size, size=(rounds, a.size))
    ratios = np.median(a[idx], axis=1) / np.median(b[idx], axis=1)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(np.median(a) / np.median(b)), float(lo), float(hi)


def bootstrap_median_ci(
    values: Sequence[float], seed: int = 0, rounds: int = 10_000
) -> tuple[float, float, float]:
    """(median, 2.5%, 97.5%) of the median of ``values``, resampling them (>= 2 values)."""
    a = np.asarray(values, dtype=float)
    if a.size < 2:
        raise ValueError(f"need >= 2 values for an interval, got {a.size}")
    rng = np.random.default_rng(seed)
    meds = np.median(a[rng.integers(0, a.size, size=(rounds, a.size))], axis=1)
    lo, hi = np.percentile(meds, [2.5, 97.5])
    return float(np.median(a)), float(lo), float(hi)


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (the machine's business while we measured)."""
    return [round(x, 2) for x in os.getloadavg()]

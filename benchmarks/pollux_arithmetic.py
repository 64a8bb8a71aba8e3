"""How much the default pollux's 16x4 figure moves with the machine's arithmetic.

The simulated schedules are deterministic on one machine, but they follow the last bits of the
goodput fits and of the batch choice: BLAS kernels and numpy's SIMD loops differ between CPUs,
a flipped near-tie changes a decision, and the schedules drift apart from there. So the
figure ``reproduce_pollux.py`` prints for ``pollux`` is one draw of a spread. This script
measures the spread on one machine: it re-runs ``reproduce_pollux.py --policies pollux`` with
the arithmetic of other CPUs where this one can execute it (OpenBLAS' kernels for older cores
via ``OPENBLAS_CORETYPE``, numpy's SIMD loops capped at AVX2 or SSE4 via
``NPY_DISABLE_CPU_FEATURES``, the numpy batch choice instead of the compiled one via
``COADAPT_NO_JIT``) and prints every variant's mean JCT against the target.

    python benchmarks/pollux_arithmetic.py --json out/pollux_arithmetic.json

On a CPU without AVX-512 the variants that need it are skipped; off x86-64 only the JIT variant
changes anything. Each variant is one full 8-workload run (about a minute on a 2-core Zen 4).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.* as a script
from benchmarks.reproduce_pollux import POLLUX_JCT_RATIO

HERE = Path(__file__).resolve().parent
#: numpy's dispatch groups above the x86-64-v2 baseline, newest first.
NUMPY_ABOVE_AVX2 = ("X86_V4", "AVX512_ICL", "AVX512_SPR")
NUMPY_ABOVE_SSE4 = ("X86_V3", *NUMPY_ABOVE_AVX2)
#: OpenBLAS core types and the CPU flags their kernels need.
OPENBLAS_CORES = {
    "SkylakeX": ("avx512f", "avx512dq", "avx512bw", "avx512vl"),
    "Haswell": ("avx2", "fma"),
    "Zen": ("avx2", "fma"),
    "Sandybridge": ("avx",),
}
#: (name, OpenBLAS core, numpy groups disabled, JIT off)
VARIANTS = (
    ("this machine", None, (), False),
    ("blas SkylakeX", "SkylakeX", (), False),
    ("blas Haswell", "Haswell", (), False),
    ("blas Zen", "Zen", (), False),
    ("numpy <= AVX2", None, NUMPY_ABOVE_AVX2, False),
    ("blas Haswell, numpy <= AVX2", "Haswell", NUMPY_ABOVE_AVX2, False),
    ("blas Sandybridge, numpy <= SSE4", "Sandybridge", NUMPY_ABOVE_SSE4, False),
    ("numpy batch choice (no JIT)", None, (), True),
)


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def numpy_groups() -> set[str]:
    """numpy's dispatch groups this CPU runs (only those may be disabled)."""
    try:
        from numpy._core import _multiarray_umath as umath  # numpy >= 2
    except ImportError:
        from numpy.core import _multiarray_umath as umath  # type: ignore[no-redef]
    features: dict[str, bool] = umath.__cpu_features__
    return {g for g in umath.__cpu_dispatch__ if features.get(g, False)}


def runnable(
    flags: set[str], groups: set[str]
) -> list[tuple[str, str | None, tuple[str, ...], bool]]:
    """The variants this CPU can execute: OpenBLAS kernels whose instructions it has, numpy
    caps that disable a group it runs (disabling one it lacks would change nothing)."""
    return [
        (name, core, tuple(g for g in disabled if g in groups), no_jit)
        for name, core, disabled, no_jit in VARIANTS
        if (core is None or all(f in flags for f in OPENBLAS_CORES[core]))
        and (not disabled or groups & set(disabled))
    ]


def variant_env(core: str | None, groups: tuple[str, ...], no_jit: bool) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("OPENBLAS_CORETYPE", "NPY_DISABLE_CPU_FEATURES", "COADAPT_NO_JIT"):
        env.pop(key, None)
    if core is not None:
        env["OPENBLAS_CORETYPE"] = core
    if groups:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(groups)
    if no_jit:
        env["COADAPT_NO_JIT"] = "1"
    return env


def run_variant(env: dict[str, str], processes: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        cmd = [sys.executable, str(HERE / "reproduce_pollux.py"), "--policies", "pollux"]
        cmd += ["--processes", str(processes), "--json", str(out)]
        done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=False)
        if not out.exists():
            raise RuntimeError(f"reproduce_pollux.py exited {done.returncode} without a result")
        report: dict[str, Any] = json.loads(out.read_text())
    pol = report["policies"]["pollux"]
    return {
        "avg_jct_s": pol["avg_jct_s"],
        "authors_avg_jct_s": pol["authors_avg_jct_s"],
        "jct_vs_authors": pol["avg_jct_s"] / pol["authors_avg_jct_s"],
        "restarts_per_job": pol["restarts_per_job"],
        "workloads": {k: v["avg_jct_s"] for k, v in pol["workloads"].items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--json", type=Path, metavar="OUT")
    args = parser.parse_args()
    console = Console(width=150)
    flags, groups = cpu_flags(), numpy_groups()
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    todo = runnable(flags, groups)
    for i, (name, core, disabled, no_jit) in enumerate(todo, 1):
        console.log(f"[{i}/{len(todo)}] {name}: simulating the 8 workloads")
        t0 = time.perf_counter()
        env = variant_env(core, disabled, no_jit)
        row = {"variant": name, **run_variant(env, args.processes)}
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        console.log(f"[{i}/{len(todo)}] {name}: {row['avg_jct_s'] / 3600:.4f} h")
    table = Table(title="pollux, 16x4, mean of the 8 workloads, per arithmetic variant")
    for col in ("variant", "avg JCT (h)", "x authors'", "restarts/job", "workloads that moved"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    first = rows[0]["workloads"]
    for r in rows:
        moved = [
            f"{k.removeprefix('workload-')}: {v / 3600:.3f}"
            for k, v in r["workloads"].items()
            if v != first[k]
        ]
        table.add_row(
            r["variant"],
            f"{r['avg_jct_s'] / 3600:.4f}",
            f"{r['jct_vs_authors']:.4f}",
            f"{r['restarts_per_job']:.2f}",
            ", ".join(moved) or "-",
        )
    console.print(table)
    ratios = [r["jct_vs_authors"] for r in rows]
    met = sum(x <= POLLUX_JCT_RATIO for x in ratios)
    summary = {
        "min_ratio": min(ratios),
        "max_ratio": max(ratios),
        "variants_meeting_target": met,
        "variants": len(rows),
        "target_ratio": POLLUX_JCT_RATIO,
        "total_wall_s": time.perf_counter() - started,
    }
    console.print(
        f"x authors' from {summary['min_ratio']:.4f} to {summary['max_ratio']:.4f}; "
        f"{met} of {len(rows)} variants within the target (<= {POLLUX_JCT_RATIO}x)"
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Sampler check: the shipped samplers (``gp-ei``, ``tpe``, ``random``) on standard functions.

Every run goes through the same path as the controller: an :class:`ExperimentSpec`,
:func:`create_study` (in-memory storage), :func:`ask_params` and ``study.tell``. Functions:
Hartmann-6 (6-D, optimum −3.32237; within 1% = best ≤ −3.2891), Branin (2-D, optimum
0.397887; best ≤ 0.40187) and Hartmann-3 (3-D, optimum −3.86278; best ≤ −3.82415), 100 trials
each. The gate: on every function, ``gp-ei`` gets within 1% of the optimum on at least as many
seeds as ``random`` (a Bayesian optimiser that does not beat random search is broken).

``gp-ei`` is Optuna's :class:`~optuna.samplers.GPSampler` since issue 14. Our own GP-EI sampler
had to beat it clearly here (≥ 20 seeds, more than one function) to keep its code; it did not
(Hartmann-6, 20 seeds: 17/20 vs 16/20 within 1%; Branin: 20/20 both), so it was removed.
``--pair A,B`` prints a seed-by-seed comparison of two arms (default ``gp-ei,tpe``).

    .venv/bin/python benchmarks/sampler_check.py --seeds 20 --jobs 2 --json /tmp/sampler_check.json
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna

from coadapt.tune.samplers import ask_params, create_study
from coadapt.tune.spec import parse_experiment

#: Hartmann-6 (Dixon & Szegő 1978), on [0, 1]^6: f(x) = -Σ α_i exp(-Σ_j A_ij (x_j - P_ij)^2).
ALPHA = np.array([1.0, 1.2, 3.0, 3.2])
A = np.array(
    [
        [10.0, 3.0, 17.0, 3.5, 1.7, 8.0],
        [0.05, 10.0, 17.0, 0.1, 8.0, 14.0],
        [3.0, 3.5, 1.7, 10.0, 17.0, 8.0],
        [17.0, 8.0, 0.05, 10.0, 0.1, 14.0],
    ]
)
P = 1e-4 * np.array(
    [
        [1312, 1696, 5569, 124, 8283, 5886],
        [2329, 4135, 8307, 3736, 1004, 9991],
        [2348, 1451, 3522, 2883, 3047, 6650],
        [4047, 8828, 8732, 5743, 1091, 381],
    ]
)
OPTIMUM = -3.32237  # Hartmann-6's


def hartmann6(x: np.ndarray) -> float:
    return float(-np.sum(ALPHA * np.exp(-np.sum(A * (x - P) ** 2, axis=1))))


#: Hartmann-3, on [0, 1]^3.
A3 = np.array([[3.0, 10.0, 30.0], [0.1, 10.0, 35.0], [3.0, 10.0, 30.0], [0.1, 10.0, 35.0]])
P3 = 1e-4 * np.array(
    [[3689, 1170, 2673], [4699, 4387, 7470], [1091, 8732, 5547], [381, 5743, 8828]]
)


def hartmann3(x: np.ndarray) -> float:
    return float(-np.sum(ALPHA * np.exp(-np.sum(A3 * (x - P3) ** 2, axis=1))))


def branin(x: np.ndarray) -> float:
    """Branin-Hoo on [-5, 10] × [0, 15]; three global minima of 0.397887."""
    x1, x2 = float(x[0]), float(x[1])
    b, c, t = 5.1 / (4 * math.pi**2), 5 / math.pi, 1 / (8 * math.pi)
    return (x2 - b * x1**2 + c * x1 - 6) ** 2 + 10 * (1 - t) * math.cos(x1) + 10


@dataclass(frozen=True)
class Function:
    name: str
    f: Callable[[np.ndarray], float]
    bounds: tuple[tuple[float, float], ...]
    optimum: float

    @property
    def threshold(self) -> float:
        """Within 1% of the optimum (in the right direction for either sign)."""
        return self.optimum + 0.01 * abs(self.optimum)


FUNCTIONS = {
    "hartmann6": Function("hartmann6", hartmann6, ((0.0, 1.0),) * 6, -3.32237),
    "branin": Function("branin", branin, ((-5.0, 10.0), (0.0, 15.0)), 0.397887),
    "hartmann3": Function("hartmann3", hartmann3, ((0.0, 1.0),) * 3, -3.86278),
}


def experiment(sampler: str, seed: int, trials: int, fn: str = "hartmann6") -> dict[str, Any]:
    func = FUNCTIONS[fn]
    return {
        "name": f"{fn}-{sampler}",
        "space": {
            f"x{i}": {"type": "float", "low": lo, "high": hi}
            for i, (lo, hi) in enumerate(func.bounds)
        },
        "objective": {"metric": "value", "direction": "minimize"},
        "sampler": sampler,
        "seed": seed,
        "max_trials": trials,
        "trial": {"command": "true"},
    }


def run(sampler: str, seed: int, trials: int, fn: str = "hartmann6") -> dict[str, Any]:
    func = FUNCTIONS[fn]
    spec = parse_experiment(experiment(sampler, seed, trials, fn))
    study = create_study(optuna.storages.InMemoryStorage(), f"{sampler}-{seed}", spec)
    best, hit, ask_s = np.inf, None, []
    start = time.perf_counter()
    for i in range(trials):
        t0 = time.perf_counter()
        trial, params = ask_params(study, spec)
        ask_s.append(time.perf_counter() - t0)
        value = func.f(np.array([params[f"x{j}"] for j in range(len(func.bounds))]))
        study.tell(trial, value)
        best = min(best, value)
        if hit is None and best <= func.threshold:
            hit = i + 1
    gap = 100.0 * (best - func.optimum) / abs(func.optimum)
    return {
        "function": fn,
        "sampler": sampler,
        "seed": seed,
        "trials": trials,
        "best": best,
        "gap_pct": gap,
        "trials_to_1pct": hit,
        "ok": hit is not None,
        "wall_s": time.perf_counter() - start,
        "ask_s_mean": float(np.mean(ask_s)),
        "ask_ms_at_50": 1000 * float(np.mean(ask_s[45:55])) if trials >= 55 else None,
        "ask_ms_at_100": 1000 * float(np.mean(ask_s[-10:])),
    }


def compare(rows: list[dict[str, Any]], a: str, b: str) -> dict[str, dict[str, Any]]:
    """Per function, ``a`` against ``b`` seed by seed (same seed, same function).

    "Better" is a lower best value by more than 1e-4 of the optimum's magnitude (both reach
    the optimum to that precision on easy seeds, which is a tie, not a win).
    """
    out: dict[str, dict[str, Any]] = {}
    for fn in dict.fromkeys(r["function"] for r in rows):
        ra = {r["seed"]: r for r in rows if r["function"] == fn and r["sampler"] == a}
        rb = {r["seed"]: r for r in rows if r["function"] == fn and r["sampler"] == b}
        seeds = sorted(set(ra) & set(rb))
        if not seeds:
            continue
        tol = 1e-4 * abs(FUNCTIONS[fn].optimum)
        d = [ra[s]["best"] - rb[s]["best"] for s in seeds]

        def med(rs: dict[int, dict[str, Any]], seeds: list[int] = seeds) -> float | None:
            hits = [rs[s]["trials_to_1pct"] for s in seeds if rs[s]["ok"]]
            return float(np.median(hits)) if hits else None

        out[fn] = {
            "seeds": len(seeds),
            "a_better": sum(x < -tol for x in d),
            "b_better": sum(x > tol for x in d),
            "ties": sum(abs(x) <= tol for x in d),
            "a_hits": sum(ra[s]["ok"] for s in seeds),
            "b_hits": sum(rb[s]["ok"] for s in seeds),
            "a_median_to_1pct": med(ra),
            "b_median_to_1pct": med(rb),
            "a_wall_s": float(np.mean([ra[s]["wall_s"] for s in seeds])),
            "b_wall_s": float(np.mean([rb[s]["wall_s"] for s in seeds])),
        }
    return out


def _run(job: tuple[str, int, int, str]) -> dict[str, Any]:
    """One run in a worker process (quiet Optuna, one BLAS/torch thread each)."""
    optuna.logging.set_verbosity(logging.WARNING)
    return run(*job)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (default 5)")
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--samplers", default="gp-ei,tpe,random")
    ap.add_argument("--functions", default=",".join(FUNCTIONS))
    ap.add_argument("--pair", default="gp-ei,tpe", help="two arms compared seed by seed")
    ap.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes)")
    ap.add_argument("--json", dest="json_out", default=None, help="write the results here")
    args = ap.parse_args()
    optuna.logging.set_verbosity(logging.WARNING)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    fns = args.functions.split(",")
    samplers = args.samplers.split(",")
    unknown = [f for f in fns if f not in FUNCTIONS]
    if unknown:
        ap.error(f"--functions: unknown {unknown}; accepted: {', '.join(FUNCTIONS)}")
    pair = args.pair.split(",")
    if len(pair) != 2:
        ap.error("--pair takes two sampler names, e.g. gp-ei,tpe")

    jobs = [
        (s, seed, args.trials, fn) for fn in fns for s in samplers for seed in range(args.seeds)
    ]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = list(pool.map(_run, jobs))
    for r in rows:
        print(
            f"{r['function']:9s} {r['sampler']:7s} seed {r['seed']:2d}: best {r['best']:.5f} gap "
            f"{r['gap_pct']:.2f}% 1% at {r['trials_to_1pct']} ({r['wall_s']:.1f}s, "
            f"ask {r['ask_ms_at_100']:.0f} ms at the end)"
        )

    summary: dict[str, dict[str, Any]] = {}
    print(
        f"\n{'function':10s}{'sampler':8s}{'within 1%':>10s}{'median gap %':>13s}"
        f"{'worst gap %':>12s}{'median to 1%':>13s}{'s a run':>8s}"
    )
    for fn in fns:
        for sampler in samplers:
            mine = [r for r in rows if r["function"] == fn and r["sampler"] == sampler]
            hits = [r["trials_to_1pct"] for r in mine if r["ok"]]
            s = summary.setdefault(fn, {})[sampler] = {
                "seeds_within_1pct": sum(r["ok"] for r in mine),
                "seeds": len(mine),
                "median_gap_pct": float(np.median([r["gap_pct"] for r in mine])),
                "worst_gap_pct": float(np.max([r["gap_pct"] for r in mine])),
                "median_trials_to_1pct": float(np.median(hits)) if hits else None,
                "mean_wall_s": float(np.mean([r["wall_s"] for r in mine])),
            }
            to1 = "-" if s["median_trials_to_1pct"] is None else f"{s['median_trials_to_1pct']:g}"
            print(
                f"{fn:10s}{sampler:8s}{s['seeds_within_1pct']:>4d}/{s['seeds']:<5d}"
                f"{s['median_gap_pct']:13.2f}{s['worst_gap_pct']:12.2f}{to1:>13s}"
                f"{s['mean_wall_s']:8.1f}"
            )
    paired = compare(rows, pair[0], pair[1])
    for fn, c in paired.items():
        print(
            f"\n{fn}: {pair[0]} vs {pair[1]}, paired by seed: {pair[0]} better on "
            f"{c['a_better']}, worse on {c['b_better']}, tied on {c['ties']} of {c['seeds']}; "
            f"within 1%: {c['a_hits']} vs {c['b_hits']}; median trials to 1%: "
            f"{c['a_median_to_1pct']} vs {c['b_median_to_1pct']}; mean wall "
            f"{c['a_wall_s']:.1f} s vs {c['b_wall_s']:.1f} s"
        )
    failed = [
        fn
        for fn, by in summary.items()
        if "gp-ei" in by
        and "random" in by
        and by["gp-ei"]["seeds_within_1pct"] < by["random"]["seeds_within_1pct"]
    ]
    print(f"\ngate (gp-ei within 1% on at least as many seeds as random): {failed or 'passed'}")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "functions": {
                        n: {"optimum": FUNCTIONS[n].optimum, "threshold": FUNCTIONS[n].threshold}
                        for n in summary
                    },
                    "trials": args.trials,
                    "optuna": optuna.__version__,
                    "runs": rows,
                    "summary": summary,
                    "paired": {"a": pair[0], "b": pair[1], "by_function": paired},
                    "gate_failed": failed,
                },
                f,
                indent=2,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

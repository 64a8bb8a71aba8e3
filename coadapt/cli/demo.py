"""``coadapt demo``: the main job on embedded defaults, with nothing to set up.

By default it runs the live demo (:func:`coadapt.controller.demo.run_live_demo`): a real
controller on 127.0.0.1 with SQLite and CPU slots, real training jobs (package data in
``coadapt/controller/demo_jobs``, so it works from an installed package) arriving over time,
a live table while Pollux re-allocates, a per-job report and a PNG timeline.
``--simulation`` instead replays a bundled Pollux workload in the simulator with pollux,
tiresias and optimus.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from coadapt.cli.output import missing_extra


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo", help="run real jobs on a local controller (or --simulation: replay a trace)"
    )
    parser.add_argument("--out", type=Path, default=Path("demo-out"), help="output folder")
    parser.add_argument("--slots", type=int, default=4, help="CPU slots of the live demo")
    parser.add_argument("--policy", default="pollux", help="scheduling policy (live demo)")
    parser.add_argument(
        "--simulation",
        action="store_true",
        help="replay a bundled workload with pollux, tiresias and optimus instead",
    )
    parser.add_argument("--workload", default="pollux-6", help="bundled name or CSV path")
    parser.add_argument("--cluster", default="16x4", help="NODESxGPUS (default 16x4)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if not args.simulation:
        if why := missing_extra(("torch", "sklearn", "matplotlib"), "train", "the live demo"):
            print(f"coadapt demo: {why}; `coadapt demo --simulation` runs without them")
            return 2
        from coadapt.controller.demo import run_live_demo

        return run_live_demo(out, slots=args.slots, policy=args.policy)
    from coadapt.cli import sim

    argv = ["simulate", "--workload", args.workload, "--cluster", args.cluster]
    argv += ["--policy", "pollux", "--policy", "tiresias", "--policy", "optimus"]
    argv += ["--json", str(out / "simulation.json")]
    no_plot = missing_extra(("matplotlib",), "train", "the plot")
    if no_plot is None:
        argv += ["--plot", str(out / "simulation.png")]
    parser = argparse.ArgumentParser(prog="coadapt")
    sim.add_parser(parser.add_subparsers())
    sim_args = parser.parse_args(argv)
    code = int(sim_args.func(sim_args))
    if code == 0:
        plot = f"plot: {out / 'simulation.png'}" if no_plot is None else f"no plot ({no_plot})"
        print(f"results: {out / 'simulation.json'}  {plot}")
    return code

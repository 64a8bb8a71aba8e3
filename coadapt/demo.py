"""``coadapt demo``: the main job on embedded defaults, with nothing to set up.

Until the live controller exists, the demo replays a bundled Pollux workload in the
simulator with Pollux and the two baselines from the paper, prints their comparison, and
draws JCT CDFs and utilisation into ``--out``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo", help="replay a bundled workload with pollux, tiresias and optimus"
    )
    parser.add_argument("--workload", default="pollux-6", help="bundled name or CSV path")
    parser.add_argument("--cluster", default="16x4", help="NODESxGPUS (default 16x4)")
    parser.add_argument("--out", type=Path, default=Path("demo-out"), help="output folder")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from coadapt.cli import main

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    argv = [
        "simulate", "--workload", args.workload, "--cluster", args.cluster,
        "--policy", "pollux", "--policy", "tiresias", "--policy", "optimus",
        "--json", str(out / "simulation.json"), "--plot", str(out / "simulation.png"),
    ]
    code = main(argv)
    if code == 0:
        print(f"results: {out / 'simulation.json'}  plot: {out / 'simulation.png'}")
    return code

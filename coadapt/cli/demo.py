"""``coadapt demo``: the main job on embedded defaults, with nothing to set up.

By default it runs the live demo (:func:`coadapt.controller.demo.run_live_demo`): a real
controller on 127.0.0.1 with SQLite and CPU slots, real training jobs (package data in
``coadapt/controller/demo_jobs``, so it works from an installed package) arriving over time,
a live table while Pollux re-allocates, a per-job report and a PNG timeline.
``--simulation`` instead replays a bundled Pollux workload in the simulator with pollux,
tiresias and optimus.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from coadapt.cli.output import EXIT_INPUT, missing_extra

app = typer.Typer(add_completion=False)


@app.command("demo")
def demo(
    out: Annotated[Path, typer.Option(metavar="DIR", help="output folder")] = Path("demo-out"),
    slots: Annotated[int, typer.Option(min=1, help="CPU slots of the live demo")] = 4,
    policy: Annotated[str, typer.Option(help="scheduling policy (live demo)")] = "pollux",
    simulation: Annotated[
        bool,
        typer.Option(
            "--simulation", help="replay a bundled workload with pollux, tiresias and optimus"
        ),
    ] = False,
    workload: Annotated[
        str, typer.Option(metavar="NAME|FILE", help="bundled name or CSV (--simulation)")
    ] = "pollux-6",
    cluster: Annotated[
        str, typer.Option(metavar="NODESxGPUS", help="cluster shape (--simulation)")
    ] = "16x4",
) -> int:
    """Run real training jobs on a local controller and report what Pollux did (or, with
    --simulation, replay a trace in the simulator)."""
    out.mkdir(parents=True, exist_ok=True)
    if not simulation:
        if why := missing_extra(("torch", "sklearn", "matplotlib"), "train", "the live demo"):
            print(f"coadapt demo: {why}; `coadapt demo --simulation` runs without them")
            return EXIT_INPUT
        from coadapt.controller.demo import run_live_demo

        return run_live_demo(out, slots=slots, policy=policy)
    from coadapt.cli import sim
    from coadapt.sim.engine import SimConfig

    no_plot = missing_extra(("matplotlib",), "train", "the plot")
    code = sim.run(
        workload,
        cluster,
        ["pollux", "tiresias", "optimus"],
        SimConfig(),
        json_out=out / "simulation.json",
        plot_out=out / "simulation.png" if no_plot is None else None,
    )
    if code == 0:
        plot = f"plot: {out / 'simulation.png'}" if no_plot is None else f"no plot ({no_plot})"
        print(f"results: {out / 'simulation.json'}  {plot}")
    return code

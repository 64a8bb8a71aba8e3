"""The ``coadapt simulate`` sub-command: run policies on a workload and compare them.

Input errors (malformed workload, unknown application or policy, cluster typos) print one
line naming the culprit and the accepted forms and exit with status 2.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from coadapt.cli.output import EXIT_INPUT, missing_extra
from coadapt.policies import POLICY_NAMES, make_policy
from coadapt.sim.cluster import parse_cluster
from coadapt.sim.engine import SimConfig, simulate
from coadapt.sim.errors import SimInputError, SimulationError
from coadapt.sim.metrics import PolicySummary, summarise
from coadapt.sim.workload import BUNDLED_HELP, load_workload

app = typer.Typer(add_completion=False)


@app.command(
    "simulate",
    help="Trace-driven simulation of a GPU cluster (Pollux OSDI'21 traces): replay a workload "
    "under one or more policies and compare their job completion times. "
    f"Bundled workloads: {BUNDLED_HELP}.",
)
def simulate_command(
    workload: Annotated[
        str,
        typer.Option(
            metavar="NAME|FILE",
            show_default=False,
            help="bundled workload name or CSV (name,time,application,num_replicas,batch_size)",
        ),
    ],
    cluster: Annotated[
        str,
        typer.Option(
            metavar="[TYPE:]NODESxGPUS[,...]",
            help="cluster shape: 16x4, or GPU types per group, e.g. v100:4x4,p100:4x4,k80:8x4",
        ),
    ] = "16x4",
    policy: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME",
            show_default=False,
            help=f"policy to run, repeatable; one of {', '.join(POLICY_NAMES)} (default: pollux)",
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="seed of the policies' randomness")] = 0,
    interval: Annotated[float, typer.Option(metavar="SECONDS", help="scheduling interval")] = 60.0,
    restart_delay: Annotated[
        float, typer.Option(metavar="SECONDS", help="what a re-allocation costs a job")
    ] = 30.0,
    interference: Annotated[
        float, typer.Option(help="slowdown of distributed jobs sharing a node")
    ] = 0.0,
    json_out: Annotated[
        Path | None,
        typer.Option("--json", metavar="OUT", show_default=False, help="write per-policy results"),
    ] = None,
    plot_out: Annotated[
        Path | None,
        typer.Option(
            "--plot", metavar="OUT.png", show_default=False, help="plot JCT CDFs and GPU use"
        ),
    ] = None,
) -> int:
    try:
        config = SimConfig(
            interval=interval, restart_delay=restart_delay, interference=interference, seed=seed
        )
    except SimInputError as exc:
        return _input_error(exc)
    return run(workload, cluster, policy, config, json_out=json_out, plot_out=plot_out)


def _policy_names(names: list[str] | None) -> list[str]:
    chosen = names or ["pollux"]
    for name in chosen:
        if name not in POLICY_NAMES:
            raise SimInputError(
                f"--policy: unknown policy {name!r}; accepted: {', '.join(POLICY_NAMES)}"
            )
    return chosen


def _simulate_all(
    workload_spec: str, cluster_spec: str, policies: list[str] | None, config: SimConfig
) -> list[PolicySummary]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

    names = _policy_names(policies)
    workload = load_workload(workload_spec)
    cluster = parse_cluster(cluster_spec)
    summaries: list[PolicySummary] = []
    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("jobs  t={task.fields[sim_h]:.1f} h"),
        console=console,
        transient=True,
    ) as bar:
        for name in names:
            task = bar.add_task(f"{name:>9}", total=len(workload.jobs), sim_h=0.0)

            def tick(done: int, total: int, now: float, task: TaskID = task) -> None:
                bar.update(task, completed=done, total=total, sim_h=now / 3600.0)

            started = time.perf_counter()
            result = simulate(workload, cluster, make_policy(name), config, progress=tick)
            summaries.append(summarise(result, time.perf_counter() - started))
    return summaries


def _print_table(summaries: list[PolicySummary]) -> None:
    from rich.console import Console
    from rich.table import Table

    first = summaries[0]
    table = Table(title=f"{first.workload} on {first.cluster} ({first.num_jobs} jobs)")
    for col in (
        "policy",
        "avg JCT (h)",
        "p99 JCT (h)",
        "makespan (h)",
        "restarts",
        "GPU-hours",
        "wall (s)",
    ):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for s in summaries:
        table.add_row(
            s.policy,
            f"{s.avg_jct_s / 3600:.3f}",
            f"{s.p99_jct_s / 3600:.3f}",
            f"{s.makespan_s / 3600:.2f}",
            str(s.restarts),
            f"{s.gpu_hours:.1f}",
            f"{s.sim_wall_s:.1f}",
        )
    Console().print(table)


def plot(summaries: list[PolicySummary], out: Path) -> None:
    """JCT CDFs (left) and GPU utilisation over time (right) of all policies, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax_cdf, ax_util) = plt.subplots(1, 2, figsize=(11, 4))
    for s in summaries:
        jcts = np.sort(np.asarray(s.jcts())) / 3600.0
        ax_cdf.step(
            jcts,
            np.arange(1, jcts.size + 1) / max(jcts.size, 1),
            where="post",
            label=f"{s.policy} (avg {s.avg_jct_s / 3600:.2f} h)",
        )
        util = np.asarray(s.utilisation, dtype=np.float64).reshape(-1, 2)
        ax_util.plot(util[:, 0] / 3600.0, util[:, 1], label=s.policy, linewidth=0.8)
    ax_cdf.set(xscale="log", xlabel="JCT (hours)", ylabel="fraction of jobs", title="JCT CDF")
    ax_util.set(
        xlabel="time (hours)",
        ylabel="allocated GPUs / total",
        ylim=(0, 1.05),
        title="GPU utilisation",
    )
    for ax in (ax_cdf, ax_util):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def _input_error(exc: SimInputError) -> int:
    print(f"coadapt simulate: error: {exc}", file=sys.stderr)
    return EXIT_INPUT


def run(
    workload: str,
    cluster: str,
    policies: list[str] | None,
    config: SimConfig,
    *,
    json_out: Path | None = None,
    plot_out: Path | None = None,
) -> int:
    """Simulate, print the comparison table, write the JSON and plot; returns the exit status
    (``coadapt demo --simulation`` calls it too)."""
    if plot_out is not None and (why := missing_extra(("matplotlib",), "train", "--plot")):
        print(f"coadapt simulate: error: {why}", file=sys.stderr)
        return EXIT_INPUT
    try:
        summaries = _simulate_all(workload, cluster, policies, config)
    except SimInputError as exc:
        return _input_error(exc)
    except SimulationError as exc:
        print(f"coadapt simulate: simulation failed: {exc}", file=sys.stderr)
        return 1
    _print_table(summaries)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps([s.to_json() for s in summaries], indent=1) + "\n")
    if plot_out is not None:
        plot(summaries, plot_out)
    return 0

"""``coadapt tune``: submit, list, show and cancel tuning experiments on a live controller.

Finds the controller and token like the job commands (``--server``/``$COADAPT_SERVER``/the
state dir's ``server.json``; ``--token``/``$COADAPT_TOKEN``/the local admin token) and uses the
same exit codes: 0 ok, 2 invalid input (a bad spec is rejected locally, naming each field,
before anything is sent), 3 controller unreachable.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from coadapt.cli.output import (
    EXIT_INPUT,
    JsonOpt,
    OutputOpt,
    RetryOpt,
    ServerOpt,
    StateDirOpt,
    Target,
    TokenOpt,
    fmt,
    missing_extra,
    print_json,
    run_client,
    table,
    wants_json,
)
from coadapt.controller.client import DEFAULT_RETRY_S, Client

app = typer.Typer(add_completion=False)
tune_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Multi-tenant hyper-parameter tuning experiments on the controller.",
)
app.add_typer(tune_app, name="tune")

ExperimentsArg = Annotated[list[str], typer.Argument(metavar="EXP...", show_default=False)]


@tune_app.command("submit")
def submit(
    files: Annotated[list[Path], typer.Argument(metavar="FILE...", help="experiment spec files")],
    server: ServerOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    retry: RetryOpt = DEFAULT_RETRY_S,
) -> int:
    """Submit experiment specs (YAML/JSON); prints each new experiment's id.

    A bad spec is rejected before anything is sent, naming each field (exit 2)."""
    from coadapt.tune.spec import load_experiment_file

    def go(client: Client) -> int:
        for path in files:
            spec = load_experiment_file(path)  # SpecError -> exit 2, naming the fields
            body = spec.model_dump(mode="json")
            out = client.request("POST", "/api/v1/experiments", json=body)
            print(out["experiment"]["id"])
        return 0

    return run_client(Target(server, token, state_dir, retry), go)


@tune_app.command("ls")
def ls(
    json_: JsonOpt = False,
    output: OutputOpt = "table",
    server: ServerOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    retry: RetryOpt = DEFAULT_RETRY_S,
) -> int:
    """List experiments: state, trials, objective, best value and target."""

    def go(client: Client) -> int:
        exps = client.request("GET", "/api/v1/experiments")["experiments"]
        if wants_json(output, json_):
            print_json(exps)
            return 0
        rows = [
            [
                e["id"],
                e["name"],
                e["tenant"],
                e["state"],
                str(e["n_trials"]),
                str(e["n_running"]),
                f"{e['objective']['metric']} ({e['objective']['direction'][:3]})",
                fmt(e["best_value"], 4),
                fmt(e["target"], 4),
            ]
            for e in exps
        ]
        header = ["ID", "NAME", "TENANT", "STATE", "TRIALS", "RUNNING", "OBJECTIVE", "BEST"]
        table(rows, [*header, "TARGET"])
        return 0

    return run_client(Target(server, token, state_dir, retry), go)


def _params(p: dict[str, Any]) -> str:
    return " ".join(f"{k}={fmt(v, 4) if isinstance(v, float) else v}" for k, v in p.items())


def _peak(curve: list[list[float]], direction: str) -> float | None:
    """The trial's best reported value (what the experiment's best and target use)."""
    values = [float(p[1]) for p in curve if len(p) > 1 and isinstance(p[1], int | float)]
    if not values:
        return None
    return max(values) if direction == "maximize" else min(values)


@tune_app.command("show")
def show(
    experiment: Annotated[str, typer.Argument(metavar="EXP", help="experiment id")],
    json_: JsonOpt = False,
    output: OutputOpt = "table",
    plot: Annotated[
        Path | None,
        typer.Option(
            metavar="OUT.png",
            show_default=False,
            help="write best value over time and the trials' curves (needs matplotlib)",
        ),
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    retry: RetryOpt = DEFAULT_RETRY_S,
) -> int:
    """Show an experiment: its trials, the best value so far, optionally a PNG."""

    def go(client: Client) -> int:
        data = client.request("GET", f"/api/v1/experiments/{experiment}")
        if wants_json(output, json_):
            print_json(data)
        else:
            _print_experiment(data)
        if plot is not None:
            if why := missing_extra(("matplotlib",), "train", "--plot"):
                print(f"coadapt: {why}", file=sys.stderr)
                return EXIT_INPUT
            plot_experiment(data, plot)
            print(f"wrote {plot}", file=sys.stderr)
        return 0

    return run_client(Target(server, token, state_dir, retry), go)


def _print_experiment(data: dict[str, Any]) -> None:
    e = data["experiment"]
    obj = e["objective"]
    print(f"{e['id']}  {e['name']}  ({e['tenant']})  {e['state']}")
    print(f"  objective: {obj['direction']} {obj['metric']}, target {fmt(e['target'], 4)}")
    print(
        f"  best so far: {fmt(e['best_value'], 4)} (trial #{fmt(e['best_trial'])}; the best"
        " value reported at any step, PEAK below; VALUE is a trial's final report)"
    )
    print(
        f"  trials: {e['n_trials']} ({e['n_running']} running); sampler {e['sampler']}, "
        f"parallelism {e['parallelism']}"
    )
    if e.get("policy_note"):
        print(f"  scheduler: {e['policy_note']}")
    if e.get("reason"):
        print(f"  reason: {e['reason']}")
    rows = [
        [
            str(t["number"]),
            t["state"],
            fmt(t["value"], 4),
            fmt(_peak(t["curve"], obj["direction"]), 4),
            str(len(t["curve"])),
            str(t["attempts"]),
            t["job_id"] or "-",
            _params(t["params"]),
        ]
        for t in data["trials"]
    ]
    table(rows, ["#", "STATE", "VALUE", "PEAK", "STEPS", "ATTEMPTS", "JOB", "PARAMS"])


def plot_experiment(data: dict[str, Any], out: Path) -> None:
    """Best value over time (left) and every trial's learning curve (right) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    e = data["experiment"]
    t0 = float(e["created_at"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    hist = data["best_history"]
    if hist:
        xs = [h[0] - t0 for h in hist]
        ys = [h[1] for h in hist]
        end = (e.get("finished_at") or hist[-1][0]) - t0
        ax1.step([*xs, max(end, xs[-1])], [*ys, ys[-1]], where="post", color="C0", label="best")
        ax1.plot(xs, ys, "o", color="C0", ms=3)
    for t in data["trials"]:
        if t["value"] is not None and t["ended_at"] is not None:
            ax1.plot(t["ended_at"] - t0, t["value"], ".", color="0.6", ms=4)
    if e.get("target") is not None:
        for ax in (ax1, ax2):
            ax.axhline(e["target"], color="C3", ls="--", lw=1, label="target")
    ax1.set_xlabel("seconds since submission")
    ax1.set_ylabel(e["objective"]["metric"])
    ax1.set_title(f"{e['name']}: best so far")
    colours = {"SUCCEEDED": "C2", "PRUNED": "C1", "FAILED": "C3", "RUNNING": "C0"}
    for t in data["trials"]:
        curve = [
            p for p in t["curve"] if all(isinstance(v, int | float) and math.isfinite(v) for v in p)
        ]
        if curve:
            ax2.plot(
                [p[0] for p in curve],
                [p[1] for p in curve],
                lw=1,
                alpha=0.7,
                color=colours.get(t["state"], "0.5"),
            )
    ax2.set_xlabel("step")
    ax2.set_ylabel(e["objective"]["metric"])
    ax2.set_title("trials (green done, orange pruned, red failed)")
    ax1.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


@tune_app.command("cancel")
def cancel(
    experiments: ExperimentsArg,
    server: ServerOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    retry: RetryOpt = DEFAULT_RETRY_S,
) -> int:
    """Cancel experiments; prints each one's id and state (exit 2 if one already ended)."""

    def go(client: Client) -> int:
        for exp_id in experiments:
            out = client.request("POST", f"/api/v1/experiments/{exp_id}/cancel")
            print(f"{out['experiment']['id']} {out['experiment']['state']}")
        return 0

    return run_client(Target(server, token, state_dir, retry), go)

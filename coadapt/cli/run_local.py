"""``coadapt run-local -n K script.py [args]``: K replicas of a training script on this machine.

The launcher itself is :func:`coadapt.train.launch.launch` (standard library only, so it is
ready to spawn in milliseconds); this module is its command line. Everything after the script
goes to the script untouched, options included.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from coadapt.cli.output import EXIT_INPUT

app = typer.Typer(add_completion=False)


@app.command(
    "run-local",
    # Stop parsing options at the script: `run-local -n 2 train.py --epochs 3` gives
    # `--epochs 3` to train.py.
    context_settings={"allow_interspersed_args": False},
)
def run_local(
    script: Annotated[str, typer.Argument(metavar="SCRIPT", help="training script")],
    args: Annotated[
        list[str] | None,
        typer.Argument(metavar="ARGS...", show_default=False, help="arguments of the script"),
    ] = None,
    replicas: Annotated[
        int, typer.Option("-n", "--replicas", min=1, help="number of replicas")
    ] = 1,
    checkpoint_dir: Annotated[
        str | None,
        typer.Option(
            metavar="DIR",
            show_default=False,
            help="directory for checkpoints (enables restart/rescale)",
        ),
    ] = None,
    job_id: Annotated[
        str | None, typer.Option(show_default=False, help="job id reported with metrics")
    ] = None,
    restarts: Annotated[int, typer.Option(min=0, help="restart count to report")] = 0,
    elastic: Annotated[
        bool,
        typer.Option(
            "--elastic",
            help="stay up across rescales: SIGUSR1 restarts the job at the replica count in "
            "the control file (implies --zygote)",
        ),
    ] = False,
    control_file: Annotated[
        str | None,
        typer.Option(
            metavar="FILE",
            show_default=False,
            help="file holding the replica count to rescale to on SIGUSR1 "
            "(default: <checkpoint-dir>/replicas)",
        ),
    ] = None,
    zygote: Annotated[
        bool,
        typer.Option(
            "--zygote",
            help="fork replicas from a warm process that has imported torch once (faster "
            "start, one import for all replicas)",
        ),
    ] = False,
    preload: Annotated[
        str,
        typer.Option(
            metavar="MODULES",
            help="comma-separated modules the zygote imports before forking "
            "(e.g. sklearn.datasets)",
        ),
    ] = "",
) -> int:
    """Run K replicas of a training script on this machine, with the torchrun-compatible
    environment; exits with the worst replica's exit code.

    SIGINT/SIGTERM are forwarded (SIGTERM asks a job to checkpoint and exit); if one replica
    fails the others are stopped. With --elastic, SIGUSR1 rescales to the count in the
    control file, forking the new replicas from a warm zygote."""
    from coadapt.train.launch import LaunchError, launch

    try:
        return launch(
            script,
            list(args or []),
            replicas,
            checkpoint_dir,
            job_id,
            restarts,
            zygote=zygote,
            preload=[m.strip() for m in preload.split(",") if m.strip()],
            elastic=elastic,
            control_file=control_file,
        )
    except LaunchError as exc:
        print(f"coadapt run-local: {exc}", file=sys.stderr)
        return EXIT_INPUT

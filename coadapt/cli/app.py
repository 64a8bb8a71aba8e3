"""The root ``coadapt`` command: a Typer app whose sub-commands load only when used.

Each feature module (:mod:`~coadapt.cli.controller`, :mod:`~.tune`, :mod:`~.sim`,
:mod:`~.demo`, :mod:`~.run_local`) owns a small Typer app with its commands. The root lists
them from :data:`COMMANDS` (name, one-line help, panel) and imports a module only when one of
its commands runs, is asked for ``--help`` or completes: ``coadapt --help`` then costs Typer
and rich, not NumPy, SciPy or httpx, and a controller-only install (no torch) lists every
command.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from coadapt import __version__


def _controller() -> typer.Typer:
    from coadapt.cli import controller

    return controller.app


def _tune() -> typer.Typer:
    from coadapt.cli import tune

    return tune.app


def _sim() -> typer.Typer:
    from coadapt.cli import sim

    return sim.app


def _demo() -> typer.Typer:
    from coadapt.cli import demo

    return demo.app


def _serve() -> typer.Typer:
    from coadapt.cli import serve

    return serve.app


def _model() -> typer.Typer:
    from coadapt.cli import model

    return model.app


def _deploy() -> typer.Typer:
    from coadapt.cli import deploy

    return deploy.app


def _run_local() -> typer.Typer:
    from coadapt.cli import run_local

    return run_local.app


@dataclass(frozen=True)
class Entry:
    """One root sub-command: the app defining it, its line in ``coadapt --help``, its panel."""

    load: Callable[[], typer.Typer]
    summary: str
    panel: str


CLUSTER, TUNING, SERVING = "Cluster", "Tuning", "Serving"
OFFLINE = "Local runs and simulation"

#: Every root sub-command, in the order ``coadapt --help`` lists them.
COMMANDS: dict[str, Entry] = {
    "server": Entry(_controller, "Run the controller (API + dashboard + scheduler).", CLUSTER),
    "submit": Entry(_controller, "Submit job specs (YAML/JSON).", CLUSTER),
    "ls": Entry(_controller, "List jobs.", CLUSTER),
    "show": Entry(_controller, "Show one job and its events.", CLUSTER),
    "logs": Entry(_controller, "Print (or follow) a job's log.", CLUSTER),
    "cancel": Entry(_controller, "Cancel jobs.", CLUSTER),
    "wait": Entry(_controller, "Wait for jobs to finish (exit 0 if all succeeded).", CLUSTER),
    "cluster": Entry(_controller, "Slots, allocations, goodput and batch sizes.", CLUSTER),
    "tenant": Entry(_controller, "Manage tenants (admin token).", CLUSTER),
    "tune": Entry(_tune, "Multi-tenant hyper-parameter tuning experiments.", TUNING),
    "serve": Entry(_serve, "Serve trained models (versions, batching, hot swap).", SERVING),
    "model": Entry(_model, "Model registry: versions, gates, promote, rollback.", SERVING),
    "deploy": Entry(_deploy, "Deployments: serve a model within a latency SLO.", SERVING),
    "run-local": Entry(_run_local, "Run K replicas of a training script here.", OFFLINE),
    "simulate": Entry(_sim, "Replay a workload on a simulated cluster.", OFFLINE),
    "demo": Entry(_demo, "Run real jobs on a local controller (or replay a trace).", OFFLINE),
}


class LazyGroup(TyperGroup):
    """The root group: lists :data:`COMMANDS` without importing them, loads one on use."""

    _listing = False  # True while only names and lines are needed: root help, completion

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        if self._listing:  # the help needs a name, a line and a panel: no import
            return TyperCommand(name=cmd_name, help=entry.summary, rich_help_panel=entry.panel)
        if cmd_name not in self.commands:
            built = typer.main.get_command(entry.load())
            command = built.commands[cmd_name] if isinstance(built, TyperGroup) else built
            command.short_help = entry.summary
            self.commands[cmd_name] = command
        return self.commands[cmd_name]

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def shell_complete(self, ctx: Any, incomplete: str) -> Any:
        """``coadapt <TAB>``: the names and their lines, without importing every module."""
        self._listing = True
        try:
            return super().shell_complete(ctx, incomplete)
        finally:
            self._listing = False

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        """An unknown command names the closest known ones (Typer's own suggestion only sees
        the commands already loaded)."""
        try:
            return super().resolve_command(ctx, args)
        except typer.TyperException as exc:
            close = difflib.get_close_matches(args[0], list(COMMANDS)) if args else []
            if close and "Did you mean" not in exc.message:
                exc.message = f"{exc.message.rstrip('.')}. Did you mean {close[0]!r}?"
            raise

    def invoke(self, ctx: Any) -> Any:
        """Ctrl-C and a closed pipe end a command quietly, with the usual exit codes."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            print("coadapt: interrupted", file=sys.stderr)
            raise typer.Exit(130) from None
        except BrokenPipeError:  # `coadapt ls | head`: the reader left; not an error of ours
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush is silent
            raise typer.Exit(0) from None


app = typer.Typer(
    cls=LazyGroup,
    name="coadapt",
    no_args_is_help=True,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Goodput-optimised, co-adaptive scheduling and elastic training for deep learning.\n\n"
    "Exit codes: 0 ok, 1 a job failed or timed out, 2 invalid input, 3 controller "
    "unreachable. `coadapt COMMAND --help` shows a command's options.",
)


def _print_version(value: bool) -> None:
    if value:
        print(f"coadapt {__version__}")
        raise typer.Exit(0)


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """Goodput-optimised, co-adaptive scheduling and elastic training for deep learning."""

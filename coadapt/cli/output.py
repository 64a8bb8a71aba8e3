"""What every client sub-command shares: its options, finding the controller, exit codes,
tables.

Client commands find the controller from ``--server``, ``$COADAPT_SERVER``, the local state
dir's ``server.json``, or the default port; the token from ``--token``, ``$COADAPT_TOKEN``,
or the local state dir's ``admin-token``. Exit codes: 0 ok, 1 a job failed / timed out,
2 invalid input (4xx), 3 controller unreachable.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from coadapt.controller.client import DEFAULT_RETRY_S, Client, ClientError
from coadapt.controller.errors import ControllerError
from coadapt.controller.paths import ADMIN_TOKEN_FILE, DEFAULT_PORT, SERVER_FILE, default_state_dir

#: Exit status of a command given invalid input (also click's usage-error status).
EXIT_INPUT = 2
#: Exit status when the controller cannot be reached.
EXIT_UNREACHABLE = 3


def _non_negative_seconds(value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise typer.BadParameter(f"{value!r} is invalid; accepted: seconds >= 0")
    return value


# The options every client command takes, after the command (`coadapt ls --server URL`).
ServerOpt = Annotated[
    str | None,
    typer.Option(
        "--server",
        metavar="URL",
        show_default=False,
        help="controller URL (default: $COADAPT_SERVER, the state dir's server.json, or "
        f"http://127.0.0.1:{DEFAULT_PORT})",
    ),
]
TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token",
        metavar="TOKEN",
        show_default=False,
        help="API token (default: $COADAPT_TOKEN or the local admin token)",
    ),
]
StateDirOpt = Annotated[
    str | None,
    typer.Option(
        "--state-dir",
        metavar="DIR",
        show_default=False,
        help="local state dir (default: $COADAPT_STATE_DIR or ~/.coadapt)",
    ),
]
RetryOpt = Annotated[
    float,
    typer.Option(
        "--retry",
        metavar="SECONDS",
        callback=_non_negative_seconds,
        help="how long a read retries an unreachable (restarting) controller (0: fail at once)",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON (same as -o json)")]
OutputOpt = Annotated[
    Literal["table", "json"],
    typer.Option("-o", "--output", metavar="table|json", help="output format"),
]


@dataclass(frozen=True)
class Target:
    """Where a client command sends its requests; each field None means "look it up"."""

    server: str | None = None
    token: str | None = None
    state_dir: str | None = None
    retry: float = DEFAULT_RETRY_S


def resolve_state_dir(path: str | None) -> Path:
    return Path(path) if path else default_state_dir()


def make_client(target: Target) -> Client:
    state = resolve_state_dir(target.state_dir)
    url = target.server or os.environ.get("COADAPT_SERVER")
    if not url:
        try:
            url = json.loads((state / SERVER_FILE).read_text())["url"]
        except (OSError, ValueError, KeyError):
            url = f"http://127.0.0.1:{DEFAULT_PORT}"
    token = target.token or os.environ.get("COADAPT_TOKEN")
    if not token:
        try:
            token = (state / ADMIN_TOKEN_FILE).read_text().strip()
        except OSError:
            token = None
    return Client(str(url), token, retry_for=target.retry, stderr=sys.stderr)


def exit_code(exc: ClientError) -> int:
    return EXIT_UNREACHABLE if exc.status == 0 else (EXIT_INPUT if 400 <= exc.status < 500 else 1)


def run_client(target: Target, fn: Callable[[Client], int]) -> int:
    """Run ``fn`` on a client of ``target``; controller errors become a message on stderr and
    the exit code of the module docstring, never a traceback."""
    try:
        with make_client(target) as client:
            return int(fn(client))
    except ClientError as exc:
        print(f"coadapt: {exc.render()}", file=sys.stderr)
        return exit_code(exc)
    except ControllerError as exc:
        print(f"coadapt: {exc.message}", file=sys.stderr)
        for d in exc.details:
            print(f"  {d.get('field')}: {d.get('message')}", file=sys.stderr)
        return EXIT_INPUT


def wants_json(output: str, json_flag: bool) -> bool:
    return json_flag or output == "json"


def print_json(data: Any) -> None:
    """The machine-readable form: indented JSON exactly as the API returned it."""
    print(json.dumps(data, indent=2))


def fmt(x: Any, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def table(rows: list[list[str]], header: list[str]) -> None:
    """Print ``rows`` under ``header`` as a rich table: bold header, aligned columns, no
    borders. On a terminal long cells wrap to its width; in a pipe or a file the table keeps
    its natural width (one line per row, no colour), so ``grep`` and ``wc -l`` still work.
    ``NO_COLOR`` turns colour off on a terminal too (rich reads it)."""
    from rich.console import Console
    from rich.table import Table

    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)
    ]
    grid = Table(box=None, pad_edge=False, padding=(0, 2, 0, 0), header_style="bold")
    for h in header:
        grid.add_column(h, overflow="fold")
    for r in rows:
        grid.add_row(*r)
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=sum(widths) + 2 * len(widths) + 1)
    console.print(grid)


def missing_extra(modules: tuple[str, ...], extra: str, what: str) -> str | None:
    """A one-line fix when ``what`` needs modules a core install lacks, else None.

    torch, scikit-learn and matplotlib live in the ``train`` extra so that a controller-only
    install stays small; the commands that need them say so instead of a traceback."""
    import importlib.util

    absent = [m for m in modules if importlib.util.find_spec(m) is None]
    if not absent:
        return None
    return (
        f"{what} needs {', '.join(absent)}, which this install lacks; install it with "
        f"pip install 'coadapt[{extra}]' (or `make demo` / `make install` in a checkout)"
    )

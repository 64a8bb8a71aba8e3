"""What every client sub-command shares: finding the controller, exit codes, tables.

Client commands find the controller from ``--server``, ``$COADAPT_SERVER``, the local state
dir's ``server.json``, or the default port; the token from ``--token``, ``$COADAPT_TOKEN``,
or the local state dir's ``admin-token``. Exit codes: 0 ok, 1 a job failed / timed out,
2 invalid input (4xx), 3 controller unreachable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from coadapt.controller.client import DEFAULT_RETRY_S, Client, ClientError
from coadapt.controller.errors import ControllerError
from coadapt.controller.paths import ADMIN_TOKEN_FILE, DEFAULT_PORT, SERVER_FILE, default_state_dir


def state_dir(args: argparse.Namespace) -> Path:
    return Path(args.state_dir) if getattr(args, "state_dir", None) else default_state_dir()


def make_client(args: argparse.Namespace) -> Client:
    state = state_dir(args)
    url = args.server or os.environ.get("COADAPT_SERVER")
    if not url:
        try:
            url = json.loads((state / SERVER_FILE).read_text())["url"]
        except (OSError, ValueError, KeyError):
            url = f"http://127.0.0.1:{DEFAULT_PORT}"
    token = args.token or os.environ.get("COADAPT_TOKEN")
    if not token:
        try:
            token = (state / ADMIN_TOKEN_FILE).read_text().strip()
        except OSError:
            token = None
    retry = getattr(args, "retry", DEFAULT_RETRY_S)
    return Client(str(url), token, retry_for=retry, stderr=sys.stderr)


def exit_code(exc: ClientError) -> int:
    return 3 if exc.status == 0 else (2 if 400 <= exc.status < 500 else 1)


def run_client(fn: Any) -> Any:
    def wrapper(args: argparse.Namespace) -> int:
        try:
            with make_client(args) as client:
                return int(fn(client, args))
        except ClientError as exc:
            print(f"coadapt: {exc.render()}", file=sys.stderr)
            return exit_code(exc)
        except ControllerError as exc:
            print(f"coadapt: {exc.message}", file=sys.stderr)
            for d in exc.details:
                print(f"  {d.get('field')}: {d.get('message')}", file=sys.stderr)
            return 2

    return wrapper


def fmt(x: Any, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def table(rows: list[list[str]], header: list[str]) -> None:
    """Print ``rows`` under ``header`` as a rich table: bold header, aligned columns, no
    borders. On a terminal long cells wrap to its width; in a pipe or a file the table keeps
    its natural width (one line per row, no colour), so ``grep`` and ``wc -l`` still work."""
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

"""The ``coadapt`` command: the one CLI package, on Typer (click) with rich help and tables.

:mod:`~coadapt.cli.app` is the root command and the list of sub-commands; each feature
module owns its commands: :mod:`~.controller` (``server``, ``submit``, ``ls``, ...),
:mod:`~.tune` (``tune ...``), :mod:`~.sim` (``simulate``), :mod:`~.demo` (``demo``) and
:mod:`~.run_local` (``run-local``); :mod:`~.output` holds what the client commands share.
The CLI sits on top of everything: nothing in the package imports it (``python -m
coadapt.cli`` runs it).

:func:`main` is the programmatic entry (tests call it) and the console script: it returns
the exit status instead of raising ``SystemExit``, and turns a usage error (unknown option,
bad value) into one line on stderr and exit status 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``coadapt`` with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    import typer

    from coadapt.cli.app import app

    command = typer.main.get_command(app)
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        code = command.main(args=args, prog_name="coadapt", standalone_mode=False)
    except typer.TyperException as exc:  # click's usage errors (exit 2) and the like
        if type(exc).__name__ != "NoArgsIsHelpError":  # that one has printed the help
            print(_one_line(exc), file=sys.stderr)
        return int(exc.exit_code)
    except typer.Abort:
        print("coadapt: aborted", file=sys.stderr)
        return 1
    return int(code or 0)


def _one_line(exc: Exception) -> str:
    """``coadapt ls: error: No such option: --bogus (see `coadapt ls --help`)``."""
    ctx = getattr(exc, "ctx", None)
    where = ctx.command_path if ctx is not None else "coadapt"
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    hint = f" (see `{where} --help`)" if ctx is not None else ""
    return f"{where}: error: {message}{hint}"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

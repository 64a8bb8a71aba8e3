"""The ``coadapt`` command: one entry point, one sub-command per feature.

Each feature module owns its sub-command (``add_parser(subparsers)`` registering
``func=run``); this module only assembles them and maps :class:`CoadaptError`-style input
errors to exit code 2 with a one-line message.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from coadapt import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="coadapt",
        description="Goodput-optimised, co-adaptive scheduling and elastic training for "
        "deep learning.",
    )
    parser.add_argument("--version", action="version", version=f"coadapt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    from coadapt.sim import cli as sim_cli

    sim_cli.add_parser(sub)
    from coadapt.train import launch

    launch.add_parser(sub)
    from coadapt.controller import cli as controller_cli

    controller_cli.add_parsers(sub)
    from coadapt.tune import cli as tune_cli

    tune_cli.add_parsers(sub)
    from coadapt import demo

    demo.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(func(args))
    except KeyboardInterrupt:
        print("coadapt: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `coadapt ls | head`: the reader left; not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush is silent
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""The ``coadapt`` command: the one CLI package, one module per feature's sub-commands.

:mod:`~coadapt.cli.controller` (``server``, ``submit``, ``ls``, ...), :mod:`~.tune`
(``tune ...``), :mod:`~.sim` (``simulate``), :mod:`~.demo` (``demo``) and the training
launcher's ``launch`` (:mod:`coadapt.train.launch`); :mod:`~.output` holds what the client
commands share. Each module registers its sub-commands (``add_parser(s)(subparsers)`` setting
``func``); this module only assembles them. The CLI sits on top of everything: nothing in the
package imports it (``python -m coadapt.cli`` runs it).
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
    # Imported here, not at the top: ``coadapt --help`` should not pay for NumPy or FastAPI.
    from coadapt.cli import controller, demo, sim, tune
    from coadapt.train import launch

    sim.add_parser(sub)
    launch.add_parser(sub)
    controller.add_parsers(sub)
    tune.add_parsers(sub)
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

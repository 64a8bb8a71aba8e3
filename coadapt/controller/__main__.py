"""``python -m coadapt.controller COMMAND ...``: the controller's CLI without ``coadapt.cli``."""

from __future__ import annotations

import argparse
import sys

from coadapt.controller.cli import add_parsers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="coadapt")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_parsers(sub)
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(func(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

"""What ``coadapt serve ...`` and ``python -m coadapt.serve`` do, behind either command line.

Each function prints its result and returns the exit code: 0 ok, 1 a refused version or a
server that did not start, 2 bad input.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _root(path: str) -> bool:
    if Path(path).is_dir():
        return True
    print(f"error: {path} is not a directory (a model's version root)", file=sys.stderr)
    return False


def list_versions(root: str) -> int:
    """Complete versions, oldest first; ``*`` marks the live one."""
    from coadapt.serve import artifacts

    if not _root(root):
        return 2
    live = artifacts.live_version(root)
    for v in artifacts.list_versions(root):
        m = artifacts.read_manifest(root, v)
        mark = "*" if v == live else " "
        print(f"{mark} {v}  {m.kind:5}  parent={m.parent or '-'}  step={m.lineage.step}")
    return 0


def check_version(root: str, version: str, activate: bool = False) -> int:
    """Load ``version`` fully (checksums, shapes, finite values); make it live if asked."""
    from coadapt.serve import artifacts

    if not _root(root):
        return 2
    try:
        artifacts.load_state(root, version)
        if activate:
            artifacts.set_live(root, version)
    except artifacts.ArtifactError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{version}: ok" + (" (live)" if activate else ""))
    return 0


def run_server(models: Sequence[str], **options: Any) -> int:
    """Serve ``NAME=DIR`` models until SIGTERM/SIGINT; ``options`` are :class:`ServeConfig`'s."""
    from coadapt.serve.config import ServeConfig
    from coadapt.serve.workers import Supervisor

    named: dict[str, str] = {}
    for spec in models:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            print(f"error: --model {spec!r} must look like NAME=DIR", file=sys.stderr)
            return 2
        named[name] = path
    try:
        config = ServeConfig(models=named, **options)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        sup = Supervisor(config)
    except OSError as exc:
        print(f"error: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 1
    try:
        return sup.run()
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

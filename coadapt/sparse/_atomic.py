"""Crash-safe file replacement: a reader sees the old file or the whole new one, never half."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_writer(dest: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Write to a temp file beside ``dest``; on a clean exit fsync it, rename it over ``dest``
    and fsync the directory (so the rename survives a power loss); on an error remove it."""
    path = Path(dest)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    except OSError:  # some filesystems refuse a directory fsync
        pass
    finally:
        os.close(dfd)

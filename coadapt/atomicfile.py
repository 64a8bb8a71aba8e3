"""Crash-safe file replacement: a reader sees the old file or the whole new one, never half.

Shared by everything that writes state a crash must not tear (sparse tables and checkpoints,
model versions and the LIVE pointer).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_writer(dest: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Write to a temp file beside ``dest``; on a clean exit fsync it, rename it over ``dest``
    and fsync the directory (so the rename survives a power loss); on an error remove it."""
    path = Path(dest)
    # pid + a fresh counter: two threads of one process may write the same file at once.
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{time.monotonic_ns()}")
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(path.parent)


def atomic_write(dest: str | os.PathLike[str], data: bytes) -> None:
    """:func:`atomic_writer` for bytes already in memory."""
    with atomic_writer(dest) as f:
        f.write(data)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries (a rename, a new file) survive a power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse a directory fsync
        pass
    finally:
        os.close(fd)

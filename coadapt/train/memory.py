"""Out-of-memory co-adaptation, the job's half: notice an OOM, remember the batch that did
not fit, exit so the controller retries smaller, and never pick that batch again.

A replica that runs out of memory (``torch.cuda.OutOfMemoryError``, a host ``MemoryError``,
or the CPU allocator's "can't allocate memory") records the per-replica micro-batch ``m``
that failed in ``<checkpoint dir>/memory.json`` (it must outlive the process) and on the
metrics channel, then exits with :data:`OOM_EXIT_CODE`. The next attempt caps ``m`` at the
smaller of that file's limit and ``ReplicaEnv.max_local_bsz`` (the controller's learned limit),
so the total batch is kept with more accumulation steps instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coadapt.protocol import OomRecord

# Same value as coadapt.executors.base.OOM_EXIT_CODE (not imported: the library must not
# pull in the executors); a test checks they agree.
OOM_EXIT_CODE = 86
MEMORY_FILE = "memory.json"
_CPU_OOM = ("DefaultCPUAllocator: can't allocate memory", "CUDA out of memory")


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is the process running out of (GPU or host) memory."""
    if isinstance(exc, MemoryError):
        return True
    try:
        import torch

        if isinstance(exc, torch.cuda.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):  # pragma: no cover - torch is a dependency
        pass
    return isinstance(exc, RuntimeError) and any(s in str(exc) for s in _CPU_OOM)


def shrink(failed_local_bsz: int) -> int:
    """The per-replica batch to try after ``failed_local_bsz`` ran out of memory: half (the
    memory of activations is about linear in ``m``), at least 1."""
    return max(int(failed_local_bsz) // 2, 1)


@dataclass(frozen=True)
class MemoryLimit:
    """A learned per-replica batch cap and the batch whose OOM taught it."""

    max_local_bsz: int
    oom_local_bsz: int
    ooms: int = 1

    def to_json(self) -> dict[str, int]:
        return {
            "max_local_bsz": self.max_local_bsz,
            "oom_local_bsz": self.oom_local_bsz,
            "ooms": self.ooms,
        }


def read_limit(checkpoint_dir: Path | None) -> MemoryLimit | None:
    """The limit a previous attempt recorded (None when there is none or it is unreadable)."""
    if checkpoint_dir is None:
        return None
    try:
        data: Any = json.loads((checkpoint_dir / MEMORY_FILE).read_text())
        return MemoryLimit(
            int(data["max_local_bsz"]), int(data["oom_local_bsz"]), int(data.get("ooms", 1))
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def record_oom(checkpoint_dir: Path | None, failed_local_bsz: int) -> MemoryLimit:
    """Remember that ``failed_local_bsz`` did not fit (atomically, merged with the old limit)."""
    old = read_limit(checkpoint_dir)
    cap = shrink(failed_local_bsz)
    if old is not None:
        cap = min(cap, old.max_local_bsz)
    limit = MemoryLimit(cap, int(failed_local_bsz), (old.ooms if old else 0) + 1)
    if checkpoint_dir is not None:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        tmp = checkpoint_dir / (MEMORY_FILE + ".tmp")
        tmp.write_text(json.dumps(limit.to_json()))
        os.replace(tmp, checkpoint_dir / MEMORY_FILE)
    return limit


def effective_cap(*caps: int | None) -> int | None:
    """The strictest of the given per-replica batch caps (None: no cap at all)."""
    known = [int(c) for c in caps if c is not None]
    return min(known) if known else None


def exit_for_oom(
    exc: BaseException,
    checkpoint_dir: Path | None,
    failed_local_bsz: int,
    emit: Callable[[OomRecord], None],
    close: Callable[[], None],
) -> None:
    """Record the OOM, flush the metrics channel and leave with :data:`OOM_EXIT_CODE`.

    ``os._exit``: the failing rank must not run atexit handlers or ``finally`` blocks that
    would enter a collective and hang on the other ranks; the controller stops those.
    """
    limit = record_oom(checkpoint_dir, failed_local_bsz)
    emit(
        OomRecord(
            local_bsz=int(failed_local_bsz), max_local_bsz=limit.max_local_bsz, error=str(exc)
        )
    )
    with contextlib.suppress(Exception):
        close()
    print(
        f"coadapt: out of memory at per-replica batch {failed_local_bsz} ({type(exc).__name__}); "
        f"the next attempt uses at most {limit.max_local_bsz} (exit {OOM_EXIT_CODE})",
        file=sys.stderr,
        flush=True,
    )
    os._exit(OOM_EXIT_CODE)

"""Checkpoint generations of a sharded model: which files form one consistent cut.

Shards save in parallel, so a crash can stop a save after some shards wrote and before others
did. Each save is therefore a *generation* ``seq`` (1, 2, ...): every shard writes its own file
``shard-<i>-of-<n>.g<seq>.ckpt`` (header ``meta.seq == seq``), the trainer writes
``dense.g<seq>.pt`` (dense parameters, dense optimizer state, the stream offset), and only then
``MANIFEST.json`` naming ``seq`` is renamed into place. **Complete** means: the manifest names
it. A generation whose manifest was never written is ignored (its files are overwritten by the
next attempt), so a crash between shard writes never mixes generations: every reader — a
restarted shard server, a restarted trainer — loads the manifest's ``seq`` and nothing newer.
Files older than the previous generation are pruned after a manifest is written.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from coadapt.atomicfile import atomic_writer

__all__ = [
    "MANIFEST",
    "Manifest",
    "dense_file",
    "prune_generations",
    "read_manifest",
    "shard_file",
    "write_manifest",
]

MANIFEST = "MANIFEST.json"
_GEN = re.compile(r"\.g(\d{8})\.(ckpt|pt)$")


def shard_file(ckpt_dir: str | os.PathLike[str], shard: int, num_shards: int, seq: int) -> Path:
    """The file shard ``shard`` of ``num_shards`` writes for generation ``seq``."""
    return Path(ckpt_dir) / f"shard-{shard:03d}-of-{num_shards:03d}.g{seq:08d}.ckpt"


def dense_file(ckpt_dir: str | os.PathLike[str], seq: int) -> Path:
    """The trainer's dense state (parameters, optimizer, offset) of generation ``seq``."""
    return Path(ckpt_dir) / f"dense.g{seq:08d}.pt"


@dataclass(frozen=True)
class Manifest:
    """The last complete generation: written after every file it names is durable."""

    seq: int
    num_shards: int
    offset: str | None
    samples: int
    extra: dict[str, Any] = field(default_factory=dict)


def read_manifest(ckpt_dir: str | os.PathLike[str]) -> Manifest | None:
    """The committed generation, or ``None`` when nothing was ever committed."""
    path = Path(ckpt_dir) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as exc:  # renamed into place whole, so this is not a torn write
        raise ValueError(f"{path}: not a checkpoint manifest ({exc}); remove it") from exc
    try:
        return Manifest(**data)
    except TypeError as exc:
        raise ValueError(f"{path}: unexpected manifest fields ({exc})") from exc


def write_manifest(ckpt_dir: str | os.PathLike[str], manifest: Manifest) -> None:
    """Commit ``manifest.seq``: an atomic rename, the last step of a checkpoint."""
    with atomic_writer(Path(ckpt_dir) / MANIFEST) as f:
        f.write(json.dumps(asdict(manifest)).encode())


def prune_generations(ckpt_dir: str | os.PathLike[str], committed: int) -> int:
    """Delete generation files older than ``committed - 1``; returns how many were removed.

    The previous generation is kept so that a reader that read the manifest just before the
    commit can still open its files.
    """
    removed = 0
    for p in Path(ckpt_dir).iterdir():
        m = _GEN.search(p.name)
        if m and int(m.group(1)) < committed - 1:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                removed += 1
    return removed

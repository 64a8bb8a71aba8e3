"""Atomic checkpoints with one-deep fallback.

A rescale is "checkpoint, exit, restart at the new size", so a checkpoint that is half
written when the process dies must never be mistaken for a good one. We write
``<dir>/checkpoint.pt.tmp``, fsync it, keep the previous good file as ``checkpoint.prev.pt``
and ``os.replace`` the new one into ``checkpoint.pt``. On load, a corrupt or truncated
``checkpoint.pt`` falls back to ``checkpoint.prev.pt`` with a warning naming both files; if
neither loads, :class:`CheckpointError` names every file tried and why.
"""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_NAME = "checkpoint.pt"
PREVIOUS_NAME = "checkpoint.prev.pt"
_FORMAT = "coadapt.train/1"


class CheckpointError(RuntimeError):
    """No usable checkpoint could be read (corrupt, truncated or of another format)."""


def save_checkpoint(directory: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` atomically; the last good checkpoint becomes the fallback."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    final = d / CHECKPOINT_NAME
    tmp = d / (CHECKPOINT_NAME + ".tmp")
    buf = io.BytesIO()
    torch.save({"format": _FORMAT, "payload": payload}, buf)
    with open(tmp, "wb") as fh:
        fh.write(buf.getbuffer())
        fh.flush()
        os.fsync(fh.fileno())
    if final.exists():
        os.replace(final, d / PREVIOUS_NAME)
    os.replace(tmp, final)
    return final


def _read(path: Path) -> dict[str, Any]:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated: {exc}") from exc
    if not isinstance(obj, dict) or obj.get("format") != _FORMAT:
        raise CheckpointError(f"checkpoint {path} is not a {_FORMAT} checkpoint")
    payload = obj["payload"]
    if not isinstance(payload, dict):
        raise CheckpointError(f"checkpoint {path} has no payload dictionary")
    return payload


def load_checkpoint(directory: str | Path) -> dict[str, Any] | None:
    """The newest readable checkpoint in ``directory``; ``None`` when there is none at all."""
    d = Path(directory)
    candidates = [p for p in (d / CHECKPOINT_NAME, d / PREVIOUS_NAME) if p.exists()]
    if not candidates:
        return None
    errors: list[str] = []
    for i, path in enumerate(candidates):
        try:
            payload = _read(path)
        except CheckpointError as exc:
            errors.append(str(exc))
            continue
        if i > 0:
            warnings.warn(
                f"coadapt: {errors[0]}; resuming from the previous checkpoint {path}",
                RuntimeWarning,
                stacklevel=2,
            )
        return payload
    raise CheckpointError(
        "; ".join(errors) + " (no usable checkpoint; delete the directory to start from scratch)"
    )

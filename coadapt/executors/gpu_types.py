"""GPU type names: what a node's slots are, as the scheduler and job specs spell it.

One short lower-case name per GPU generation (``a100``, ``v100``, ``t4``), so a job spec's
``gpu_types: [a100]``, ``coadapt server --slots a100:4`` and a detected "NVIDIA
A100-SXM4-80GB" all meet on the same word. A machine or cluster that declares nothing is one
type, :data:`~coadapt.policies.base.DEFAULT_GPU_TYPE` (``gpu``), CPU slots included, so a
policy sees the homogeneous cluster it always saw.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from coadapt.policies.base import DEFAULT_GPU_TYPE

#: A GPU type name: lower-case letters, digits, '_' or '-', starting with a letter.
TYPE_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
TYPE_ACCEPTED = "1-32 characters: lower-case letters, digits, '_' or '-', starting with a letter"
SLOTS_ACCEPTED = (
    "a count (e.g. 4: CPU slots, or the GPUs when the machine has them) or TYPE:COUNT[,...] "
    f"(e.g. a100:4 or a100:2,t4:2; TYPE is {TYPE_ACCEPTED})"
)
#: Words of a device name that say nothing about its generation.
_VENDOR = frozenset(("nvidia", "tesla", "geforce", "quadro", "amd", "radeon", "instinct"))
#: Families whose generation is the next word ("RTX 3090" -> ``rtx3090``).
_FAMILY = frozenset(("rtx", "gtx", "titan"))
#: Ray's resource key of a node's accelerator model (``accelerator_type:A100``).
RAY_ACCELERATOR_PREFIX = "accelerator_type:"

__all__ = [
    "DEFAULT_GPU_TYPE",
    "RAY_ACCELERATOR_PREFIX",
    "SLOTS_ACCEPTED",
    "TYPE_ACCEPTED",
    "TYPE_NAME",
    "check_type_name",
    "device_type",
    "parse_slots",
    "ray_accelerator_type",
]


def check_type_name(name: object) -> str:
    """``name`` if it is a valid type name, else :class:`ValueError` saying what is accepted."""
    if not isinstance(name, str) or not TYPE_NAME.match(name):
        raise ValueError(f"invalid GPU type {name!r}; accepted: {TYPE_ACCEPTED}")
    return name


def _clean(word: str) -> str:
    """Lower case, only the characters a type name may hold."""
    return re.sub(r"[^a-z0-9_-]", "", word.lower())


def device_type(device_name: str) -> str:
    """The type of a device from its driver name: "NVIDIA A100-SXM4-80GB" -> ``a100``,
    "Tesla V100-SXM2-16GB" -> ``v100``, "NVIDIA GeForce RTX 3090" -> ``rtx3090``; the form
    factor and memory after the first '-' are dropped (one type per generation). A name with
    nothing usable is :data:`DEFAULT_GPU_TYPE`."""
    words = [w for w in device_name.replace("_", " ").split() if w.lower() not in _VENDOR]
    if not words:
        return DEFAULT_GPU_TYPE
    first = words[0].split("-")[0]
    if first.lower() in _FAMILY and len(words) > 1:
        first += words[1].split("-")[0]
    name = _clean(first)
    if name and not name[0].isalpha():
        name = "gpu" + name
    return name[:32] if name and TYPE_NAME.match(name[:32]) else DEFAULT_GPU_TYPE


def ray_accelerator_type(resources: Mapping[str, float]) -> str | None:
    """The GPU type of a Ray node from its resources (``accelerator_type:A100`` ->
    ``a100``; several: the first by name), or None when Ray names no accelerator."""
    keys = sorted(k for k, v in resources.items() if k.startswith(RAY_ACCELERATOR_PREFIX) and v > 0)
    if not keys:
        return None
    return device_type(keys[0].removeprefix(RAY_ACCELERATOR_PREFIX))


def parse_slots(text: str) -> int | dict[str, int]:
    """``coadapt server --slots``: ``4`` (a count) or ``a100:4`` / ``a100:2,t4:2`` (slots
    per type); :class:`ValueError` naming ``--slots`` and the accepted forms otherwise."""
    raw = text.strip()
    if raw.isdigit():
        count = int(raw)
        if count < 1:
            raise ValueError(f"--slots: {text!r} is invalid; accepted: {SLOTS_ACCEPTED}")
        return count
    out: dict[str, int] = {}
    for part in raw.split(","):
        name, sep, count_text = part.strip().partition(":")
        name, count_text = name.strip().lower(), count_text.strip()  # A100 is a100
        if not sep or not count_text.isdigit() or int(count_text) < 1:
            raise ValueError(
                f"--slots: {part.strip()!r} of {text!r} is not TYPE:COUNT with COUNT >= 1; "
                f"accepted: {SLOTS_ACCEPTED}"
            )
        if not TYPE_NAME.match(name):
            raise ValueError(f"--slots: invalid GPU type {name!r}; accepted: {SLOTS_ACCEPTED}")
        if name in out:
            raise ValueError(
                f"--slots: GPU type {name!r} is given twice in {text!r}; accepted: {SLOTS_ACCEPTED}"
            )
        out[name] = int(count_text)
    return out

"""Per-replica memory limits: one cgroup per replica (v2 ``memory.max`` or v1
``memory.limit_in_bytes``), or ``RLIMIT_AS`` where no cgroup can be made.

Why one cgroup per replica: the kernel's OOM killer then picks a victim inside that replica
only (not a neighbour, not the controller), and the cgroup's ``oom_kill`` counter tells an
out-of-memory kill apart from any other SIGKILL, which is what lets the controller retry with
a smaller per-replica batch instead of counting an ordinary failure.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import signal
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP2 = "cgroup2"
CGROUP1 = "cgroup1"
RLIMIT = "rlimit"
MECHANISMS = (CGROUP2, CGROUP1, RLIMIT)
_GROUP = "coadapt"  # parent of the per-replica cgroups (no processes of its own)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class MemoryLimitError(RuntimeError):
    """A memory limit cannot be parsed or enforced here."""


@dataclass(frozen=True)
class MemoryLimit:
    """How many bytes one replica may use and how that is enforced."""

    mechanism: str  # one of MECHANISMS
    limit_bytes: int
    parent: str | None = None  # cgroup directory the per-replica cgroups are made in

    def describe(self) -> str:
        return f"{self.limit_bytes >> 20} MiB per slot via {self.mechanism}"


def parse_size(text: str) -> int:
    """``64M``, ``2G``, ``1.5GiB``, ``1048576`` -> bytes (binary units)."""
    m = _SIZE.match(text)
    if m is None or float(m.group(1)) <= 0:
        raise MemoryLimitError(
            f"--memory-per-slot: {text!r} is not a size; accepted: a positive number of bytes "
            "with an optional K/M/G/T suffix, e.g. 512M or 16G"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, fstype, super options) of every mount, from /proc/self/mountinfo."""
    out = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        pre, _, post = line.partition(" - ")
        fields, rest = pre.split(), post.split()
        if len(fields) >= 5 and len(rest) >= 3:
            out.append((fields[4], rest[0], rest[2]))
    return out


def _own_cgroup(v1_controller: str | None) -> str:
    """This process's cgroup path in the v2 hierarchy (None) or a v1 controller's."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return "/"
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (v1_controller is None and controllers == "") or (
            v1_controller is not None and v1_controller in controllers.split(",")
        ):
            return path
    return "/"


def _write(path: Path, text: str) -> None:
    with open(path, "w", encoding="ascii") as fh:
        fh.write(text)


def _can_limit(parent: Path, limit_file: str) -> bool:
    """Whether a child cgroup of ``parent`` takes a memory limit (made and removed again)."""
    probe = parent / f"probe-{os.getpid()}"
    probe.mkdir(exist_ok=True)
    try:
        _write(probe / limit_file, str(64 << 20))
    finally:
        probe.rmdir()
    return True


def _try_parent_v2(parent: Path) -> bool:
    """Make ``parent`` a cgroup whose children get the memory controller."""
    try:
        parent.mkdir(exist_ok=True)
        if "memory" not in (parent / "cgroup.controllers").read_text().split():
            _write(parent.parent / "cgroup.subtree_control", "+memory")
        if "memory" not in (parent / "cgroup.subtree_control").read_text().split():
            _write(parent / "cgroup.subtree_control", "+memory")
        return _can_limit(parent, "memory.max")
    except OSError:
        return False


def _try_parent_v1(parent: Path) -> bool:
    try:
        parent.mkdir(exist_ok=True)
        return _can_limit(parent, "memory.limit_in_bytes")
    except OSError:
        return False


def detect(limit_bytes: int, gpus: bool = False) -> MemoryLimit:
    """The best mechanism here: cgroup v2, then cgroup v1, then RLIMIT_AS (not with GPUs:
    CUDA reserves far more address space than it uses, so RLIMIT_AS would break it)."""
    mounts = _mounts()
    for point, fstype, _ in mounts:
        if fstype != "cgroup2":
            continue
        root = Path(point)
        try:
            if "memory" not in (root / "cgroup.controllers").read_text().split():
                continue
        except OSError:
            continue
        own = root / _own_cgroup(None).lstrip("/")
        # The mount's top (needs root), else next to our own cgroup (a delegated subtree).
        for parent in (root / _GROUP, own.parent / _GROUP):
            if _try_parent_v2(parent):
                return MemoryLimit(CGROUP2, limit_bytes, str(parent))
    for point, fstype, opts in mounts:
        if fstype == "cgroup" and "memory" in opts.split(","):
            parent = Path(point) / _own_cgroup("memory").lstrip("/") / _GROUP
            if _try_parent_v1(parent):
                return MemoryLimit(CGROUP1, limit_bytes, str(parent))
    if gpus:
        raise MemoryLimitError(
            "--memory-per-slot: no writable memory cgroup here, and RLIMIT_AS (the fallback) "
            "breaks CUDA; run the controller as root or in a delegated cgroup v2 subtree, "
            "or leave --memory-per-slot unset"
        )
    return MemoryLimit(RLIMIT, limit_bytes)


def create(limit: MemoryLimit, name: str) -> Path | None:
    """A fresh cgroup for one replica with the limit set (None for RLIMIT_AS)."""
    if limit.mechanism == RLIMIT or limit.parent is None:
        return None
    path = Path(limit.parent) / re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    try:
        path.mkdir(exist_ok=True)
        if limit.mechanism == CGROUP2:
            _write(path / "memory.max", str(limit.limit_bytes))
            for knob, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                if (path / knob).exists():
                    _write(path / knob, value)
        else:
            _write(path / "memory.limit_in_bytes", str(limit.limit_bytes))
            if (path / "memory.memsw.limit_in_bytes").exists():  # no escaping into swap
                _write(path / "memory.memsw.limit_in_bytes", str(limit.limit_bytes))
    except OSError as exc:
        raise MemoryLimitError(f"cannot create memory cgroup {path}: {exc}") from exc
    return path


def join(cgroup: Path) -> None:
    """Move the calling process into ``cgroup`` (before it drops privileges)."""
    _write(cgroup / "cgroup.procs", "0")


def apply_rlimit(limit_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))


def _counter(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def oom_kills(cgroup: Path) -> int:
    """How many processes the kernel's OOM killer killed in ``cgroup``."""
    if (cgroup / "memory.events").exists():
        return _counter(cgroup / "memory.events", "oom_kill")
    return _counter(cgroup / "memory.oom_control", "oom_kill")


def release(cgroup: Path, timeout: float = 5.0) -> None:
    """Kill whatever is left in ``cgroup`` (a replica leaves no strays) and remove it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if (cgroup / "cgroup.kill").exists():
                _write(cgroup / "cgroup.kill", "1")
            else:
                for pid in (cgroup / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            cgroup.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return  # an empty cgroup left behind costs nothing; never block the exit record
            time.sleep(0.05)


def move(cgroup: Path, pid: int) -> None:
    """Move process ``pid`` into ``cgroup`` (a replica forked by a sandboxed zygote, from the
    supervisor outside the sandbox, before the replica is let run)."""
    _write(cgroup / "cgroup.procs", str(pid))

"""Process identity on Linux: a PID plus its start time names one process for good."""

from __future__ import annotations

from pathlib import Path


def proc_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (process start time in clock ticks), or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = raw[raw.rfind(")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def proc_state(pid: int) -> str | None:
    """The one-letter state of a process (R, S, Z, ...), or None if it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return fields[0] if fields else None


def _status_field(pid: int, name: str) -> list[str]:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key == name:
                return value.split()
    except OSError:
        pass
    return []


def child_by_inner_pid(parent: int, inner_pid: int) -> int | None:
    """The PID, in our namespace, of ``parent``'s child whose PID in its own (innermost)
    namespace is ``inner_pid`` (the ``NSpid`` line of /proc/PID/status), or None.

    A zygote inside a replica's PID namespace reports the PIDs it sees; the supervisor outside
    needs the real one to move the replica into its memory cgroup.
    """
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if _status_field(pid, "PPid") != [str(parent)]:
            continue
        nspids = _status_field(pid, "NSpid")
        if nspids and nspids[-1] == str(inner_pid):
            return pid
    return None

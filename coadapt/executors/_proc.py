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

"""Two jobs timed in lockstep: they take turns on the machine, a short window each.

Why: the overhead figure (issue 19) compares the library's step with its plain twin's. Run one
job after the other and a 2-core VM's speed moves between the two runs by more than the few
percent being measured: with 10 or 20 interleaved repeats the ratio's 95% interval still
reached 1.07-1.13 while callgrind counted the same instructions per step. Here both jobs start
together, each in its own process group, and the coordinator lets them run in alternating
windows of ``window_s`` (SIGCONT one group, SIGSTOP it again, then the other's turn). Each job
records when every step ended (``--timing-file``'s ``step_ends``, ``time.perf_counter``: the
system-wide monotonic clock, the coordinator's too); a step counts only if it began and ended
inside one of its job's windows, never across a stop. A window of one job and the next window
of the other ran a fraction of a second apart, alone on the machine: their median steps form
a pair, and the pairs' ratios do not move with the load that drifts over seconds.

A window's first step runs on caches the other job just used; both jobs pay that alike.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Timed steps a window must hold for its median to count.
MIN_WINDOW_STEPS = 5
#: Longest wait for a stopped job's threads to reach the stopped state before the other
#: job's window opens anyway (a SIGSTOP reaches each thread when it next enters the kernel
#: or is preempted: well under a millisecond on a quiet machine, more under load).
STOP_SETTLE_S = 0.2


@dataclass(frozen=True)
class Window:
    """One job's turn: it ran from ``start`` to ``end`` (``time.perf_counter`` seconds), when
    it was sent SIGSTOP; ``stopped``: when every thread of it was seen stopped (or the wait
    gave up), the moment the next window may open."""

    job: int
    start: float
    end: float
    stopped: float = float("nan")


def window_medians(
    step_ends: Sequence[float],
    step_times: Sequence[float],
    windows: Sequence[tuple[float, float]],
    min_steps: int = MIN_WINDOW_STEPS,
) -> list[float | None]:
    """The median of the steps that began and ended inside each window (None: fewer than
    ``min_steps``). A step that spans a stop, or ran before the first window, counts nowhere.
    """
    ends = list(step_ends)
    if len(ends) != len(step_times):
        raise ValueError(f"{len(ends)} step ends for {len(step_times)} step times")
    out: list[float | None] = []
    for start, end in windows:
        lo, hi = bisect.bisect_left(ends, start), bisect.bisect_right(ends, end)
        inside = [step_times[i] for i in range(lo, hi) if ends[i] - step_times[i] >= start]
        out.append(statistics.median(inside) if len(inside) >= min_steps else None)
    return out


def pair_ratios(
    windows: Sequence[Window], medians: dict[int, list[float | None]], num: int, den: int
) -> list[float]:
    """``num``'s window median over ``den``'s for each two consecutive windows of the two jobs
    (in either order), where both windows hold enough steps. ``medians[job]`` lists that job's
    window medians in the order of its windows in ``windows``."""
    seen = {num: 0, den: 0}
    value: list[tuple[int, float | None]] = []
    for w in windows:
        value.append((w.job, medians[w.job][seen[w.job]]))
        seen[w.job] += 1
    ratios = []
    for (ja, a), (jb, b) in zip(value[::2], value[1::2], strict=False):
        if ja == jb or a is None or b is None:
            continue
        n, d = (a, b) if ja == num else (b, a)
        ratios.append(n / d)
    return ratios


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (``/proc/*/task/*/children``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            with contextlib.suppress(OSError):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
    return out


def _all_stopped(pids: Sequence[int]) -> bool:
    """Whether every thread of ``pids`` is stopped (or gone)."""
    for p in pids:
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                raw = Path(f"/proc/{p}/task/{t}/stat").read_text()
            except OSError:
                continue
            if raw[raw.rfind(")") + 2 :].split()[0] not in ("T", "t", "Z", "X"):
                return False
    return True


def _wait_stopped(pid: int, timeout_s: float, clock: Callable[[], float]) -> float:
    """Wait (bounded) until the job rooted at ``pid`` is stopped; the time it was seen so."""
    deadline = clock() + timeout_s
    pids = _tree(pid)
    while not _all_stopped(pids) and clock() < deadline:
        time.sleep(0.0002)
    return clock()


def _signal_group(pgid: int, sig: int) -> bool:
    """Signal a job's process group; False when none of it is left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def run_lockstep(
    commands: Sequence[Sequence[str]],
    window_s: float,
    *,
    cwd: Path,
    env: dict[str, str],
    logs: Sequence[Path],
    timeout_s: float = 600.0,
    clock: Callable[[], float] = time.perf_counter,
) -> list[Window]:
    """Start every command in its own process group, stopped, and give them alternating
    windows of ``window_s`` until all have exited; the windows, in order.

    Raises RuntimeError (with the log's tail) if a job fails, TimeoutError past ``timeout_s``
    (every group is killed then)."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for cmd, log in zip(commands, logs, strict=True):
            with open(log, "wb") as fh:
                procs.append(
                    subprocess.Popen(
                        list(cmd), cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )  # fmt: skip
            _signal_group(procs[-1].pid, signal.SIGSTOP)  # it runs in its windows only
        windows: list[Window] = []
        deadline = clock() + timeout_s
        turn = 0
        while any(p.poll() is None for p in procs):
            if clock() > deadline:
                raise TimeoutError(f"lockstep jobs still running after {timeout_s:.0f} s")
            job = turn % len(procs)
            turn += 1
            if procs[job].poll() is not None:
                continue
            start = clock()  # read before the job can run, as ``end`` is before it stops
            _signal_group(procs[job].pid, signal.SIGCONT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                procs[job].wait(timeout=window_s)
            end = clock()
            _signal_group(procs[job].pid, signal.SIGSTOP)
            stopped = _wait_stopped(procs[job].pid, STOP_SETTLE_S, clock)
            windows.append(Window(job, start, end, stopped))
        for i, p in enumerate(procs):
            if p.returncode != 0:
                tail = logs[i].read_text(errors="replace")[-3000:]
                raise RuntimeError(f"lockstep job {i} failed ({p.returncode}):\n{tail}")
        return windows
    finally:
        for p in procs:  # a job left behind (failure, timeout): the whole group goes
            if p.poll() is None:
                _signal_group(p.pid, signal.SIGKILL)
                _signal_group(p.pid, signal.SIGCONT)
                p.wait()


def lockstep_ratios(
    windows: Sequence[Window], timings: Sequence[dict[str, Any]], num: int = 1, den: int = 0
) -> dict[str, list[float]]:
    """Per-pair ratios of wall and CPU step time, ``num``'s job over ``den``'s, from each
    job's timing file (``step_ends``, ``step_times``, ``step_cpu_times``)."""
    out: dict[str, list[float]] = {}
    for key in ("step_times", "step_cpu_times"):
        medians = {
            j: window_medians(
                t["step_ends"], t[key], [(w.start, w.end) for w in windows if w.job == j]
            )
            for j, t in enumerate(timings)
        }
        out[key] = pair_ratios(windows, medians, num, den)
    return out


def job_step_median(
    windows: Sequence[Window], timing: dict[str, Any], job: int, key: str = "step_times"
) -> float | None:
    """The median over ``job``'s windows of their median step (None: no window counted)."""
    meds = window_medians(
        timing["step_ends"], timing[key], [(w.start, w.end) for w in windows if w.job == job]
    )
    kept = [m for m in meds if m is not None]
    return statistics.median(kept) if kept else None


def read_timing(path: Path) -> dict[str, Any]:
    """A job's ``--timing-file`` (it must carry ``step_ends``)."""
    doc = dict(json.loads(path.read_text()))
    if "step_ends" not in doc:
        raise RuntimeError(f"{path} has no step_ends: the script predates lockstep timing")
    return doc

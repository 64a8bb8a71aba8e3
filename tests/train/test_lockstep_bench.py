"""benchmarks/lockstep.py: two jobs that take turns on the machine, and how their steps pair.

The pure parts are checked on hand-made timings; ``run_lockstep`` on two real processes that
time busy steps: a job's steps may end only inside its own windows (stopped, it cannot step)."""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from pathlib import Path

import pytest

from benchmarks.lockstep import (
    Window,
    lockstep_ratios,
    pair_ratios,
    read_timing,
    run_lockstep,
    window_medians,
)

STEPPER = """
import json, sys, time
out, steps = sys.argv[1], int(sys.argv[2])
ends, times, cpus = [], [], []
prev, cprev = time.perf_counter(), time.thread_time()
for _ in range(steps):
    until = time.perf_counter() + 0.002
    while time.perf_counter() < until:
        pass
    now, cnow = time.perf_counter(), time.thread_time()
    ends.append(now); times.append(now - prev); cpus.append(cnow - cprev)
    prev, cprev = now, cnow
json.dump({"step_ends": ends, "step_times": times, "step_cpu_times": cpus}, open(out, "w"))
"""


def test_a_window_counts_only_the_steps_that_began_and_ended_inside_it() -> None:
    # steps of 1 s ending at 1..10; windows [0.5, 4.2] and [6, 10]
    ends = [float(t) for t in range(1, 11)]
    times = [1.0] * 10
    times[7] = 0.5  # the step ending at 8 began at 7.5
    got = window_medians(ends, times, [(0.5, 4.2), (6.0, 10.0)], min_steps=2)
    # first window: steps ending at 2, 3, 4 (the one ending at 1 began at 0, before it)
    assert got == [1.0, pytest.approx(1.0)]
    assert window_medians(ends, times, [(6.0, 10.0)], min_steps=5) == [None]  # 4 steps
    assert window_medians(ends, times, [(4.5, 5.9)], min_steps=1) == [None]  # none inside
    with pytest.raises(ValueError, match="step ends for"):
        window_medians(ends, times[:-1], [(0.0, 1.0)])


def test_pairs_are_consecutive_windows_of_the_two_jobs_in_either_order() -> None:
    windows = [Window(0, 0, 1), Window(1, 1, 2), Window(0, 2, 3), Window(1, 3, 4), Window(0, 4, 5)]
    medians: dict[int, list[float | None]] = {0: [2.0, 4.0, 1.0], 1: [3.0, None]}
    assert pair_ratios(windows, medians, num=1, den=0) == [1.5]  # the second pair lacks steps
    flipped = [Window(1 - w.job, w.start, w.end) for w in windows]
    assert pair_ratios(flipped, {1: [2.0, 4.0, 1.0], 0: [3.0, 6.0]}, num=0, den=1) == [1.5, 1.5]
    # one job went on alone after the other exited: its lone windows pair with nothing
    alone = [Window(0, 0, 1), Window(1, 1, 2), Window(0, 2, 3), Window(0, 3, 4)]
    assert pair_ratios(alone, {0: [1.0, 1.0, 1.0], 1: [2.0]}, num=1, den=0) == [2.0]


def test_two_real_jobs_never_step_outside_their_own_windows(tmp_path: Path) -> None:
    script = tmp_path / "stepper.py"
    script.write_text(STEPPER)
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    cmds = [[sys.executable, str(script), str(o), "400"] for o in outs]
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    windows = run_lockstep(cmds, 0.1, cwd=tmp_path, env={}, logs=logs, timeout_s=120)
    assert [w.job for w in windows[:4]] == [0, 1, 0, 1]
    timings = [read_timing(o) for o in outs]
    assert all(w.start < w.end <= w.stopped for w in windows)
    # a SIGSTOP reaches the job a moment after the window's end was read; the next window
    # opens only once it is seen stopped
    assert all(a.stopped <= b.start for a, b in itertools.pairwise(windows))
    for j, timing in enumerate(timings):
        own = [(w.start, w.stopped) for w in windows if w.job == j]
        stray = [t for t in timing["step_ends"] if not any(a <= t <= b for a, b in own)]
        assert not stray, f"job {j} stepped outside its windows at {stray[:3]}"
    ratios = lockstep_ratios(windows, timings, num=1, den=0)
    assert len(ratios["step_times"]) >= 3
    # the same 2 ms step on both sides: the median pair agrees within a few percent. A single
    # pair may not: a busy step is timed by the wall clock, so a window in which the other test
    # worker took the core stretches it (CI saw one pair at 0.70 beside a dozen at 1.00)
    assert 0.9 < statistics.median(ratios["step_times"]) < 1.1, ratios["step_times"]


def test_a_failing_job_is_reported_with_its_log_and_the_other_is_stopped(tmp_path: Path) -> None:
    script = tmp_path / "stepper.py"
    script.write_text(STEPPER)
    cmds = [
        [sys.executable, "-c", "import sys; print('bad input here'); sys.exit(3)"],
        [sys.executable, str(script), str(tmp_path / "b.json"), "100000"],
    ]
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    with pytest.raises(TimeoutError):  # the long job outlives the limit: both groups killed
        run_lockstep(cmds, 0.05, cwd=tmp_path, env={}, logs=logs, timeout_s=3)
    cmds[1] = [sys.executable, str(script), str(tmp_path / "b.json"), "10"]
    with pytest.raises(RuntimeError, match=r"(?s)job 0 failed \(3\).*bad input here"):
        run_lockstep(cmds, 0.05, cwd=tmp_path, env={}, logs=logs, timeout_s=60)


def test_a_timing_file_without_step_ends_is_refused(tmp_path: Path) -> None:
    old = tmp_path / "t.json"
    old.write_text(json.dumps({"step_times": [0.1], "step_cpu_times": [0.1]}))
    with pytest.raises(RuntimeError, match="no step_ends"):
        read_timing(old)


def test_the_overhead_benchmark_pairs_the_real_library_and_plain_jobs(tmp_path: Path) -> None:
    """``train_bench.lockstep_overhead`` end to end, short: both example scripts still write
    ``step_ends``, their windows pair, and the figures are where a summary expects them."""
    from benchmarks.train_bench import _overhead_keys, lockstep_overhead

    ov = lockstep_overhead(1, tmp_path, steps=120, repeats=2, window_s=0.1)
    keys = _overhead_keys(1, ov)
    assert keys["overhead_1r_window_pairs"] >= 4
    assert 0.7 < keys["overhead_1r"] < 1.4  # the same CNN step on both sides, give or take
    assert keys["overhead_1r_ci_low"] <= keys["overhead_1r"] <= keys["overhead_1r_ci_high"]
    assert set(keys["step_ms_1r"]) == {"plain", "library"}

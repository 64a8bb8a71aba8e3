"""Multi-process (gloo) checkpoint-restart through run-local: 1 → 2 → 1 replicas, SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .helpers import ROOT, TINY, _env, launch, read_log

# Serial: timing-sensitive (`make test` runs these after the parallel part, alone).
pytestmark = [
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals"),
    pytest.mark.serial,
]


def steps(records: list[dict]) -> list[dict]:
    return [r for r in records if r["event"] == "step"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    d = tmp_path_factory.mktemp("full")
    assert launch(1, d / "ck", d / "log", "--max-steps", "30") == 0
    return read_log(d / "log")


def test_sigterm_loses_no_progress(tmp_path: Path, uninterrupted: list[dict]) -> None:
    log, ck = tmp_path / "log", tmp_path / "ck"
    assert launch(1, ck, log, "--max-steps", "30", "--stop-at-step", "11") == 0
    first = steps(read_log(log))
    assert first[-1]["step"] == 12  # signal after step 11 → checkpoint at the next boundary
    assert launch(1, ck, log, "--max-steps", "30") == 0
    records = read_log(log)
    start = [r for r in records if r["event"] == "start"][1]
    assert start["restored"] and start["steps"] == 12 and start["hash"] == first[-1]["hash"]
    # Same data, same parameters, bit for bit, as if never interrupted.
    assert [s["indices"] for s in steps(records)] == [s["indices"] for s in steps(uninterrupted)]
    assert records[-1]["hash"] == uninterrupted[-1]["hash"]


def test_one_two_one_replicas_keep_state_and_data_order(
    tmp_path: Path, uninterrupted: list[dict]
) -> None:
    log, ck = tmp_path / "log", tmp_path / "ck"
    assert launch(1, ck, log, "--max-steps", "30", "--stop-at-step", "5") == 0
    # Phase 2 at two replicas, held at step 10 (so a loaded machine cannot run past the
    # reference's 30 steps before the signal lands), stopped by a SIGTERM to run-local
    # (forwarded to both): they agree through the next all-reduce and stop after step 11.
    cmd = [
        sys.executable,
        "-m",
        "coadapt.train.launch",
        "-n",
        "2",
        "--checkpoint-dir",
        str(ck),
        str(TINY),
        "--log",
        str(log),
        "--max-steps",
        "100000",
        "--hold-at-step",
        "10",
        "--hold-world",
        "2",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            if len(steps(read_log(log))) >= 6 + 4:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, out.decode(errors="replace")
    assert launch(1, ck, log, "--max-steps", "30") == 0

    records = read_log(log)
    starts = [i for i, r in enumerate(records) if r["event"] == "start"]
    assert [records[i]["world"] for i in starts] == [1, 2, 1]
    for i in starts[1:]:
        # The restored parameters are bit-identical to those at the last completed step.
        assert records[i]["restored"]
        assert records[i]["hash"] == records[i - 1]["hash"]
        assert records[i]["steps"] == records[i - 1]["step"]
    # The global data order continues exactly as in an uninterrupted single-replica run.
    got = [s["indices"] for s in steps(records)]
    assert got == [s["indices"] for s in steps(uninterrupted)][: len(got)]
    assert steps(records)[-1]["step"] == 30


def test_elastic_run_local_rescales_through_the_zygote(
    tmp_path: Path, uninterrupted: list[dict]
) -> None:
    """1 → 2 replicas inside one ``run-local --elastic`` job: SIGUSR1 + control file."""
    log, ck = tmp_path / "log", tmp_path / "ck"
    cmd = [
        sys.executable,
        "-m",
        "coadapt.train.launch",
        "-n",
        "1",
        "--elastic",
        "--checkpoint-dir",
        str(ck),
        str(TINY),
        "--log",
        str(log),
        "--max-steps",
        "30",
        "--hold-at-step",
        "6",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        while (
            time.monotonic() < deadline
            and proc.poll() is None
            and not (log.exists() and len(steps(read_log(log))) >= 6)
        ):
            time.sleep(0.05)
        assert proc.poll() is None, "the job ended before it could be rescaled"
        (ck / "replicas").write_text("2\n")
        proc.send_signal(signal.SIGUSR1)
        out, _ = proc.communicate(timeout=90)  # the 2-replica job runs to step 30 and ends
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text
    assert "[launch] rescale 1 -> 2 replicas" in text

    records = read_log(log)
    starts = [i for i, r in enumerate(records) if r["event"] == "start"]
    assert [records[i]["world"] for i in starts] == [1, 2]
    restart = records[starts[1]]
    # Asked to stop while held after step 6 → checkpoint at the next boundary, step 7; the
    # forked replicas resumed from it bit-identically.
    assert restart["restored"] and restart["steps"] == 7
    assert restart["hash"] == records[starts[1] - 1]["hash"]
    got = [s["indices"] for s in steps(records)]
    assert got == [s["indices"] for s in steps(uninterrupted)]
    assert steps(records)[-1]["step"] == 30


def test_launcher_imports_nothing_heavy() -> None:
    """The launcher must spawn in milliseconds: no torch, numpy or scipy at import."""
    code = (
        "import sys, coadapt.train.launch, coadapt.train\n"
        "heavy = [m for m in ('torch', 'numpy', 'scipy') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr

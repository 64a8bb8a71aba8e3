"""run-local: what a replica that dies in native code leaves in the job's output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import ROOT, _env

ABORTS = """
import os


def crash_in_native_code():
    os.abort()  # as a C++ terminate in a collective would


crash_in_native_code()
"""


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "zygote"])
def test_a_replica_killed_by_a_native_abort_prints_its_python_stack(
    tmp_path: Path, warm: bool
) -> None:
    """SIGABRT exits 134 (128 + 6) and the replica's output names the function it was in
    (PYTHONFAULTHANDLER, set for every replica unless the user set it)."""
    script = tmp_path / "aborts.py"
    script.write_text(ABORTS)
    cmd = [sys.executable, "-m", "coadapt.train.launch", "-n", "1"]
    cmd += ["--zygote"] if warm else []
    env = _env()
    env.pop("PYTHONFAULTHANDLER", None)
    proc = subprocess.run(
        [*cmd, str(script)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 134, out[-2000:]
    assert "Fatal Python error: Aborted" in out, out[-2000:]
    assert "crash_in_native_code" in out, out[-2000:]

"""Ray executor against a real multi-node Ray cluster on this machine (ray_scenario.py).

Ray rewrites 127.0.0.1 to the machine's interface address, so the scenario runs inside a
loopback-only network namespace (and its own PID namespace, so nothing it starts can outlive
it): ``unshare -n -p -f -m --mount-proc``. Skipped, with the reason, only where Ray is not
installed or namespaces are not permitted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.executors.ray_support import UNSHARE, why_no_ray
from tests.requirements import unavailable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@pytest.mark.timeout(240)
def test_jobs_span_nodes_rescale_and_survive_node_loss(tmp_path: Path) -> None:
    why = why_no_ray()
    if why is not None:
        print(f"skipping the Ray integration test: {why}")
        unavailable(why)
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0")
    script = f"ip link set lo up && exec {sys.executable} {HERE / 'ray_scenario.py'} {tmp_path}"
    started = time.monotonic()
    proc = subprocess.Popen(
        [*UNSHARE, "sh", "-c", script],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=200)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the PID namespace takes every child with it
        out, _ = proc.communicate()
        pytest.fail(f"the Ray scenario timed out; output:\n{out[-6000:]}")
    wall = time.monotonic() - started
    lines = [ln for ln in out.splitlines() if "network_util.cc" not in ln]
    print("\n".join(ln for ln in lines if ln.startswith(("[", "TIMING"))))
    print(f"TIMING scenario_wall {wall:.1f}")
    assert proc.returncode == 0 and "SCENARIO OK" in out, "\n".join(lines[-80:])

"""Running Ray from the tests: a loopback-only network namespace, and whether one can be had.

Ray rewrites 127.0.0.1 to the machine's interface address, so everything Ray runs inside a
loopback-only network namespace (and its own PID namespace, so nothing it starts can outlive
it): ``unshare -n -p -f -m --mount-proc``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
UNSHARE = ["unshare", "-n", "-p", "-f", "-m", "--mount-proc"]


def why_no_ray() -> str | None:
    """Why Ray cannot be run here (None: it can)."""
    if importlib.util.find_spec("ray") is None:
        return "ray is not installed (pip install 'coadapt[ray]')"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip (util-linux, iproute2) not found"
    probe = subprocess.run(
        [*UNSHARE, "sh", "-c", "ip link set lo up"], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        return f"network/PID namespaces not permitted: {probe.stderr.strip()}"
    return None


def in_namespace(script: Path, *args: str, timeout: float) -> tuple[int | None, str]:
    """Run ``python script ARGS`` in the namespaces; (exit code or None on timeout, output)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0")
    argv = " ".join([sys.executable, str(script), *args])
    proc = subprocess.Popen(
        [*UNSHARE, "sh", "-c", f"ip link set lo up && exec {argv}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the PID namespace takes every child with it
        out, _ = proc.communicate()
        return None, out
    return proc.returncode, out


def run_ray_conformance(work: Path, timeout: float = 180) -> dict[str, dict[str, object]]:
    """The conformance scenarios on Ray (ray_conformance.py): outcome per scenario name,
    plus ``_output`` (the run's output tail) for a scenario that was never reached."""
    results = work / "results.json"
    code, out = in_namespace(HERE / "ray_conformance.py", str(results), str(work), timeout=timeout)
    found: dict[str, dict[str, object]] = {}
    if results.exists():
        found = json.loads(results.read_text())
    lines = [ln for ln in out.splitlines() if "network_util.cc" not in ln]
    status = "timed out" if code is None else f"exit code {code}"
    found["_output"] = {"text": f"Ray conformance run: {status}\n" + "\n".join(lines[-60:])}
    return found

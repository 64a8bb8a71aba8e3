"""Scaling section of the sparse benchmark: W workers x S shard servers, plus a 2-node Ray run.

On a 2-core machine the grid cannot show scaling (2 x 2 runs four busy processes on two cores);
it shows what the extra processes cost. The Ray run (``ray_scaling.py``) places the servers and
the workers on different Ray nodes of a local ``ray.cluster_utils.Cluster``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coadapt.sparse.server import TableSpec, running_servers

N_TABLES, DIM, LR = 26, 64, 0.01


def speed_specs() -> list[TableSpec]:
    """The DLRM's 26 server-side tables (row-wise AdaGrad), as in the speed section."""
    return [TableSpec(f"t{i}", DIM, "rowwise_adagrad", {"lr": LR}) for i in range(N_TABLES)]


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest of the repeats: other load on a shared machine only ever slows a run down."""
    top = max(runs, key=lambda r: float(r["samples_per_s"]))
    return dict(top, repeats=len(runs))


def scaling_section(
    run_workers: Callable[[str, int, int, str], dict[str, Any]],
    workers: list[int],
    servers: list[int],
    steps: int,
    repeats: int,
    ray_run: tuple[int, int] | None,
) -> list[dict[str, Any]]:
    """samples/s of the DLRM for every W workers x S servers, plus a 2-node Ray run."""
    rows: list[dict[str, Any]] = []
    for s in servers:
        with (
            tempfile.TemporaryDirectory() as work,
            running_servers(speed_specs(), s, work) as procs,
        ):
            ports = ",".join(str(p.port) for p in procs)
            for w in workers:
                res = best([run_workers("coadapt", w, steps, ports) for _ in range(repeats)])
                name = f"scaling/coadapt/{w}x{s}"
                rows.append(dict(name=name, workers=w, servers=s, cpus=os.cpu_count(), **res))
    if ray_run is not None:
        rows.append(ray_row(*ray_run, steps))
    return rows


def ray_row(world: int, servers: int, steps: int) -> dict[str, Any]:
    """benchmarks/sparse/ray_scaling.py in a private network + PID namespace (loopback only)."""
    root = Path(__file__).resolve().parents[2]
    name = f"scaling/ray_2node/{world}x{servers}"
    cmd = (
        f"ip link set lo up && exec {sys.executable} -m benchmarks.sparse.ray_scaling "
        f"{world} {servers} {steps}"
    )
    env = dict(
        os.environ, PYTHONPATH=str(root), RAY_USAGE_STATS_ENABLED="0", GLOO_SOCKET_IFNAME="lo"
    )
    unshare = ["unshare", "-n", "-p", "-f", "-m", "--mount-proc", "sh", "-c", cmd]
    try:
        proc = subprocess.run(
            unshare, cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"name": name, "error": f"{type(exc).__name__}: {exc}"}
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"name": name, "error": f"rc {proc.returncode}: {proc.stderr[-1500:]}"}
    return dict(json.loads(lines[-1]), cpus=os.cpu_count())

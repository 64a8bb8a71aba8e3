"""Two-node Ray run of the speed benchmark's DLRM: shard servers on one node, workers on another.

Run inside a private network namespace (Ray binds to every interface; the namespace keeps it on
loopback), as ``benchmarks/sparse_bench.py --scaling`` does::

    unshare -n -p -f -m --mount-proc sh -c \
        'ip link set lo up && python -m benchmarks.sparse.ray_scaling W S STEPS'

``ray.cluster_utils.Cluster`` starts a head (no work) and two nodes, ``ps`` and ``worker``, each
advertising a custom resource. A Ray actor pinned to the ``ps`` node launches the S shard server
processes (so they are that node's children) and reports their ports; W Ray tasks pinned to the
``worker`` node each run one rank of ``sparse_bench.speed_child`` (dense gradients all-reduced
with gloo among them). The last stdout line is a JSON row.
"""

from __future__ import annotations

import json
import sys
import tempfile
from typing import Any

import ray
from ray.cluster_utils import Cluster


@ray.remote(num_cpus=0, resources={"ps": 1})
class Shards:
    """Owns the shard server processes on the ``ps`` node for the actor's lifetime."""

    def __init__(self, n: int) -> None:
        from benchmarks.sparse.scaling import speed_specs
        from coadapt.sparse.server import launch_servers

        self.work = tempfile.TemporaryDirectory()
        self.procs = launch_servers(speed_specs(), n, self.work.name)

    def where(self) -> tuple[str, list[int]]:
        return ray.get_runtime_context().get_node_id(), [p.port for p in self.procs]

    def stop(self) -> None:
        for p in self.procs:
            p.stop()
        self.work.cleanup()


@ray.remote(num_cpus=0, resources={"worker": 1})
def worker(rank: int, world: int, port: int, steps: int, ports: str) -> dict[str, Any]:
    from benchmarks.sparse_bench import speed_child

    out = speed_child("coadapt", rank, world, port, steps, ports)
    out["node"] = ray.get_runtime_context().get_node_id()
    return out


def main(world: int, servers: int, steps: int) -> dict[str, Any]:
    from benchmarks.sparse_bench import SPEED_BATCH
    from coadapt.ports import free_port

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        cluster.add_node(num_cpus=1, resources={"ps": 1})
        cluster.add_node(num_cpus=1, resources={"worker": world})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        shards = Shards.remote(servers)  # type: ignore[attr-defined]
        ps_node, ports = ray.get(shards.where.remote())
        port = free_port() if world > 1 else 0
        arg = ",".join(str(p) for p in ports)
        outs = ray.get([worker.remote(r, world, port, steps, arg) for r in range(world)])
        ray.get(shards.stop.remote())
        secs = max(o["seconds"] for o in outs)
        nodes = {o["node"] for o in outs}
        if ps_node in nodes:
            raise RuntimeError("workers and shard servers landed on the same Ray node")
        return {
            "name": f"scaling/ray_2node/{world}x{servers}",
            "workers": world,
            "servers": servers,
            "nodes": 2,
            "samples_per_s": world * steps * SPEED_BATCH / secs,
            "ms_per_step": 1e3 * secs / steps,
        }
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    w, s, n = (int(a) for a in sys.argv[1:4])
    print(json.dumps(main(w, s, n)), flush=True)

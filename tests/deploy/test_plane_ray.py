"""Deployments on the Ray executor: the plane starts serving replicas as Ray actors on two
nodes, reaches each at its node's address, routes the gateway to both, and drains them.

The scenario (``main``, run as ``python test_plane_ray.py WORKDIR``) runs inside a loopback-only
network namespace (``tests.executors.ray_support``) on a real 2-node
``ray.cluster_utils.Cluster`` whose nodes advertise 127.0.0.2 and 127.0.0.3 (loopback
addresses, but not the gateway's 127.0.0.1): a replica answers only where the plane was told
its node is, so a plane that still addressed replicas at 127.0.0.1 would never see them ready.
The first replica is given a port already taken on its node (as a port picked on the
controller's machine may be on a remote one): it cannot listen, exits, and is started again on
another port. Skipped, with the reason, only where Ray is not installed or namespaces are not
permitted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from tests.executors.ray_support import in_namespace, why_no_ray
from tests.requirements import unavailable

ADDRESSES = ("127.0.0.2", "127.0.0.3")  # the two Ray nodes, in node-name order
TIMEOUT = 150.0  # two replicas import torch on a loaded machine, one of them twice


@pytest.mark.timeout(330)
def test_deployment_replicas_on_two_ray_nodes(tmp_path: Path) -> None:
    why = why_no_ray()
    if why is not None:
        print(f"skipping the Ray deployment test: {why}")
        unavailable(why)
    code, out = in_namespace(Path(__file__), str(tmp_path), timeout=300)
    lines = [ln for ln in out.splitlines() if "network_util.cc" not in ln]
    print("\n".join(ln for ln in lines if ln.startswith("[")))
    assert code == 0 and "PLANE RAY OK" in out, "\n".join(lines[-80:])


# -- the scenario (in the namespace) -----------------------------------------------------------
T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def predict(host: str, port: int) -> int:
    """One JSON prediction from ``host:port``; its HTTP status."""
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        body = json.dumps({"instances": [[0.1] * 6]}).encode()
        conn.request("POST", "/v1/models/mlp:predict", body, {"Content-Type": "application/json"})
        return conn.getresponse().status
    finally:
        conn.close()


def main(work: Path) -> None:
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.placement_group import placement_group_table

    import coadapt.deploy.plane as plane_mod
    from coadapt.controller.db import sqlite_url
    from coadapt.controller.store import Store
    from coadapt.deploy.plane import DeploymentPlane
    from coadapt.deploy.store import DeploymentState, DeploymentStore
    from coadapt.executors.ray_executor import RayExecutor, group_key
    from coadapt.policies.coschedule import Reservation
    from coadapt.ports import free_port
    from coadapt.serve.routing import RouteTable
    from tests.deploy.conftest import deploy_spec, tenants
    from tests.deploy.test_plane import S, grant
    from tests.deploy.test_plane import _predict as predict_local
    from tests.serve.conftest import publish_mlp

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    store = Store.open(sqlite_url(work / "coadapt.db"))
    deploys = DeploymentStore(store)
    try:
        for ip in ADDRESSES:
            cluster.add_node(num_cpus=1, resources={"coadapt_slot": 1}, node_ip_address=ip)
        cluster.wait_for_nodes()
        ex = RayExecutor(address=cluster.address, slot_resource="coadapt_slot")
        nodes = ex.nodes()
        assert [(n.address, n.slots) for n in nodes] == [(a, 1) for a in ADDRESSES], nodes
        a, b = (n.name for n in nodes)
        say(f"ray cluster up: {a}, {b}")

        root = work / "models" / "mlp"
        publish_mlp(root, seed=1)
        rec = deploys.create(
            tenants(store)["alice"],
            deploy_spec(min_replicas=0, max_replicas=2),
            str(root),
            free_port(),
            time.time(),
        )
        plane = DeploymentPlane(deploys, ex, work / "state", stop_grace=5.0)

        # The first replica's port is taken on its node (127.0.0.2) by a listener here.
        taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        taken.bind((ADDRESSES[0], 0))
        taken.listen()
        clash = int(taken.getsockname()[1])
        ports = iter([clash])
        plane_mod.free_port = lambda host="127.0.0.1": next(ports, None) or free_port(host)

        def until(res: Reservation, done: Callable[[], Any], what: str) -> Any:
            """Tick as the control loop does: reconcile, then ``Executor.retain``."""
            deadline = time.monotonic() + TIMEOUT
            while time.monotonic() < deadline:
                plane.reconcile({"web": res}, frozenset(), time.time())
                ex.retain(plane.run_dirs())
                value = done()
                if value:
                    return value
                time.sleep(0.2)
            raise AssertionError(f"timed out waiting for {what}; rows: {deploys.replicas()}")

        def ready() -> list[Any]:
            rows = deploys.replicas(rec.id, statuses=(S.READY,))
            return rows if len(rows) == 2 else []

        both = dataclasses.replace(grant(2), placement={a: 1, b: 1})
        rows = until(both, ready, "2 ready replicas")
        say("2 replicas ready: " + ", ".join(f"{r.node}:{r.port}" for r in rows))
        assert {r.node for r in rows} == {a, b}
        assert {(r.node, plane.address(r.node)) for r in rows} == set(
            zip((a, b), ADDRESSES, strict=True)
        )
        # The clash: that replica exited before it was ready and was started again elsewhere.
        first = deploys.replicas(rec.id)[0]
        assert first.port == clash and first.node == a and first.status is S.EXITED, first
        assert first.exit_code == 1, first
        assert "cannot listen" in Path(first.log_path).read_text(), first.log_path
        assert all(r.port != clash for r in rows)
        taken.close()
        say(f"a replica on a taken port ({clash}) exited and was restarted on another port")

        table = RouteTable.read(plane.run_dir(rec.id) / "gateway")
        assert sorted((bk.host, bk.port) for bk in table.backends) == sorted(
            (plane.address(r.node), r.port) for r in rows
        ), table
        for r in rows:
            host = plane.address(r.node)
            assert host is not None and predict(host, r.port) == 200, r
        gateway = deploys.by_id(rec.id).gateway_port

        def via_gateway() -> bool:
            with contextlib.suppress(OSError):
                return predict_local(gateway) == 200
            return False

        until(both, via_gateway, "a prediction through the gateway")
        say("both replicas and the gateway (127.0.0.1) answer predictions")

        # A reservation of 0: both drain and stop; retain releases their placement groups.
        def stopped() -> bool:
            return all(r.status is S.EXITED for r in deploys.replicas(rec.id))

        until(grant(0), stopped, "replicas stopped")
        table = RouteTable.read(plane.run_dir(rec.id) / "gateway")
        assert table.backends == (), table
        assert plane.run_dirs() == set() and plane.occupied() == set()
        ex.retain(plane.run_dirs())
        groups = placement_group_table()
        mine = {f"coadapt-{group_key(r.run_dir)}" for r in deploys.replicas(rec.id)}
        states = {g["name"]: g["state"] for g in groups.values() if g["name"] in mine}
        assert len(states) == len(mine) == 3 and set(states.values()) == {"REMOVED"}, states
        say("drained: replicas stopped, route table empty, placement groups removed")
        print("PLANE RAY OK", flush=True)
    finally:
        for d in deploys.list(None, tuple(DeploymentState)):
            if d.gateway_pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(d.gateway_pid, signal.SIGKILL)
        store.close()
        with contextlib.suppress(Exception):
            ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

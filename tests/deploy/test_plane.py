"""The deployment plane alone, on real processes: a real LocalExecutor starts ``coadapt serve``
replicas of a published test MLP; the plane is driven tick by tick as the control loop would."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

pytest.importorskip("torch")

from coadapt.controller.store import Store, Tenant
from coadapt.deploy.plane import DeploymentPlane
from coadapt.deploy.store import (
    DeploymentRecord,
    DeploymentState,
    DeploymentStore,
    ServingReplicaStatus,
)
from coadapt.executors import ReplicaHandle, ReplicaSpec
from coadapt.executors._proc import proc_start_ticks
from coadapt.executors.local import LocalExecutor
from coadapt.policies.coschedule import Reservation
from coadapt.ports import free_port
from coadapt.serve.routing import GatewayStats, RouteTable, SecondStats
from tests.deploy.conftest import deploy_spec, tenants
from tests.serve.conftest import publish_mlp

S = ServingReplicaStatus
TIMEOUT = 90.0  # replicas import torch and load the model; the machine may be loaded


def grant(n: int, node: str = "local", admit: float | None = None) -> Reservation:
    return Reservation(
        slots=n,
        desired=n,
        placement={node: n} if n else {},
        capacity_rps=50.0,
        admit_rps=admit,
        retry_after_s=2.0,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and proc_start_ticks(pid) is not None


@dataclass
class Plane:
    plane: DeploymentPlane
    deploys: DeploymentStore
    executor: LocalExecutor
    tenants: dict[str, Tenant]
    root: Path
    state_dir: Path
    executors: list[LocalExecutor] = field(default_factory=list)  # of later planes

    def create(self, who: str = "alice", **spec: Any) -> DeploymentRecord:
        return self.deploys.create(
            self.tenants[who], deploy_spec(**spec), str(self.root), free_port(), time.time()
        )

    def until(
        self,
        reservations: dict[str, Reservation],
        done: Callable[[], bool],
        what: str,
        busy: frozenset[tuple[str, int]] = frozenset(),
    ) -> None:
        """Tick the plane as the control loop does (every 0.2 s here) until ``done``."""
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            self.plane.reconcile(reservations, busy, time.time())
            if done():
                return
            time.sleep(0.2)
        rows = self.deploys.replicas()
        raise AssertionError(f"timed out waiting for {what}; replicas: {rows}")

    def statuses(self, rec: DeploymentRecord) -> list[S]:
        return [r.status for r in self.deploys.replicas(rec.id)]


@pytest.fixture
def world(sqlite_store: Store, tmp_path: Path) -> Iterator[Plane]:
    root = tmp_path / "models" / "mlp"
    publish_mlp(root, seed=1)
    deploys = DeploymentStore(sqlite_store)
    executor = LocalExecutor(slots=2, warm=False)
    plane = DeploymentPlane(deploys, executor, tmp_path / "state", stop_grace=5.0)
    w = Plane(plane, deploys, executor, tenants(sqlite_store), root, tmp_path / "state")
    try:
        yield w
    finally:
        reap(deploys, [executor, *w.executors], [plane, w.plane])


def reap(
    deploys: DeploymentStore, executors: list[LocalExecutor], planes: list[DeploymentPlane]
) -> None:
    """Nothing outlives a test, whatever it did: kill every replica and gateway, and reap
    the ones this process started (no zombie, no ResourceWarning)."""
    handles = [
        ReplicaHandle(r.pid, r.start_ticks, r.run_dir, 0)
        for r in deploys.replicas()
        if r.pid is not None
    ]
    for h in handles:
        executors[0].stop(h, force=True)
    for rec in deploys.list(None, tuple(DeploymentState)):
        if rec.gateway_pid is not None and proc_start_ticks(rec.gateway_pid) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(rec.gateway_pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    for ex in executors:
        for h in handles:
            while not ex.poll(h).done and time.monotonic() < deadline:
                time.sleep(0.05)
    for plane in planes:
        for proc in plane._gateways.values():
            proc.wait(timeout=30)


def _predict(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        body = json.dumps({"instances": [[0.1] * 6]}).encode()
        conn.request("POST", "/v1/models/mlp:predict", body, {"Content-Type": "application/json"})
        return conn.getresponse().status
    finally:
        conn.close()


def test_replicas_follow_the_grant_up_and_down(world: Plane) -> None:
    rec = world.create(min_replicas=0, max_replicas=2)
    assert [d.name for d in world.plane.deployments()] == ["web"]

    world.until({"web": grant(2)}, lambda: world.statuses(rec) == [S.READY, S.READY], "2 ready")
    rows = world.deploys.replicas(rec.id)
    assert sorted(r.slot for r in rows) == [0, 1]  # one replica per slot, never two on one
    assert world.plane.occupied() == {("local", 0), ("local", 1)}
    assert world.plane.run_dirs() == {r.run_dir for r in rows}  # kept on Executor.retain
    table = RouteTable.read(world.state_dir / "deployments" / str(rec.id) / "gateway")
    assert sorted(b.port for b in table.backends) == sorted(r.port for r in rows)
    assert table.deployment == "web" and table.model == "mlp" and table.slo_s == 0.05
    assert all(_predict(r.port) == 200 for r in rows)  # the replicas really serve the model
    before = table.generation

    # A grant of 0: both drain (out of the table first), then stop; their slots are free.
    world.until({"web": grant(0)}, lambda: world.statuses(rec) == [S.EXITED, S.EXITED], "0")
    table = RouteTable.read(world.state_dir / "deployments" / str(rec.id) / "gateway")
    assert table.backends == () and table.generation > before
    assert not any(_alive(r.pid) for r in world.deploys.replicas(rec.id) if r.pid)
    assert world.plane.occupied() == set()


def test_busy_and_occupied_slots_are_never_double_booked(world: Plane) -> None:
    rec = world.create()
    busy = frozenset({("local", 0)})  # a training replica still holds slot 0
    world.until({"web": grant(2)}, lambda: world.statuses(rec) == [S.READY], "1 ready", busy=busy)
    (row,) = world.deploys.replicas(rec.id)
    assert row.slot == 1
    for _ in range(3):  # ticks while slot 0 stays busy start nothing more
        world.plane.reconcile({"web": grant(2)}, busy, time.time())
    assert len(world.deploys.replicas(rec.id)) == 1
    # Slot 0 freed: the second replica comes.
    world.until({"web": grant(2)}, lambda: world.statuses(rec) == [S.READY, S.READY], "2")


def test_a_restarted_plane_adopts_a_replica_whose_pid_was_never_recorded(world: Plane) -> None:
    """The controller died between starting the process and writing its pid: the next plane
    finds the process through the executor and adopts it instead of starting a second one."""
    rec = world.create()
    run_dir = world.state_dir / "deployments" / str(rec.id) / "replicas" / "crash"
    run_dir.mkdir(parents=True)
    port = free_port()
    world.deploys.add_replica(
        rec.id, "local", 0, port, str(run_dir), str(run_dir / "replica.log"), time.time()
    )
    argv = world.plane._argv(rec, port)
    handle = world.executor.launch(
        ReplicaSpec(f"deploy-{rec.id}", 0, 0, 1, argv, str(run_dir), str(run_dir),
                    str(run_dir / "replica.log"), 0, dict(os.environ), "local")
    )  # fmt: skip
    # An orphan row of a launch that never happened: it simply ends.
    ghost = world.deploys.add_replica(
        rec.id, "local", 1, free_port(), str(run_dir / "g"), str(run_dir / "g.log"), time.time()
    )
    deadline = time.monotonic() + 10
    while not (run_dir / "rank0.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    world.executors.append(LocalExecutor(slots=2, warm=False))
    world.plane = DeploymentPlane(world.deploys, world.executors[-1], world.state_dir)
    world.until({"web": grant(1)}, lambda: world.statuses(rec)[0] is S.READY, "adopted ready")
    adopted = world.deploys.replicas(rec.id)
    assert adopted[0].pid == handle.pid  # the very process, not a new one
    assert adopted[1].id == ghost.id and adopted[1].status is S.EXITED
    assert len(adopted) == 2  # nothing else started: one replica granted, one running


def test_same_name_of_two_tenants_is_told_apart(world: Plane) -> None:
    world.create("alice")
    world.create("bob")
    assert [d.name for d in world.plane.deployments()] == ["alice/web", "bob/web"]


def _served_version(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/v1/models/mlp")
        return str(json.loads(conn.getresponse().read())["version"])
    finally:
        conn.close()


def test_pinned_version_then_delete_stops_everything(world: Plane) -> None:
    """An explicit version is served even though a newer one is live in the root; deleting
    stops the replicas, then the gateway, then marks the deployment deleted."""
    newer = publish_mlp(world.root, seed=2)
    assert newer.version == "00000002"
    rec = world.create(version="00000001")
    world.until({"web": grant(1)}, lambda: world.statuses(rec) == [S.READY], "1 ready")
    (row,) = world.deploys.replicas(rec.id)
    assert _served_version(row.port) == "00000001"
    world.deploys.request_delete(world.tenants["alice"], "web", time.time())

    def gone() -> bool:
        return world.deploys.by_id(rec.id).state is DeploymentState.DELETED

    world.until({"web": grant(1)}, gone, "deleted")  # a stale grant does not keep it alive
    final = world.deploys.by_id(rec.id)
    assert final.gateway_pid is None
    assert world.statuses(rec) == [S.EXITED]
    assert world.plane.deployments() == []


class _StatsHandler(BaseHTTPRequestHandler):
    """A stand-in gateway answering ``GET /-/stats`` with fixed figures."""

    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.seen.append(self.path)
        doc = GatewayStats(
            deployment="web",
            generation=3,
            now=1003.5,
            seconds=(
                SecondStats(t=1000, offered=10, served=10, backends=2, latency_q_s=0.02),
                SecondStats(t=1002, offered=30, served=28, shed=2, backends=2, latency_q_s=0.04),
            ),
        ).to_json()
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_demand_comes_from_the_gateway_stats(sqlite_store: Store, tmp_path: Path) -> None:
    """The autoscaler's window is the gateway's per-second figures (a second it did not
    report had no request); an unreachable gateway gives an empty window, not an error."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StatsHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        deploys = DeploymentStore(sqlite_store)
        who = tenants(sqlite_store)
        deploys.create(who["alice"], deploy_spec(), "/nowhere", server.server_address[1], 1.0)
        down = deploys.create(who["alice"], deploy_spec(name="down"), "/nowhere", free_port(), 1.0)
        plane = DeploymentPlane(deploys, LocalExecutor(slots=1, warm=False), tmp_path)
        assert {d.name for d in plane.deployments()} == {"web", "down"}
        w = plane.demand().window("web", 1000.0, 1003.0)
        assert _StatsHandler.seen[-1] == "/-/stats?since=1000"
        assert w.rates == (10.0, 0.0, 30.0) and w.end == 1003.0 and w.replicas == 0
        assert [(s.load_rps, s.latency_s) for s in w.samples] == [(5.0, 0.02), (14.0, 0.04)]
        # the ready replicas the gateway pooled that second: the fit reads them as M/M/c
        assert [s.replicas for s in w.samples] == [2, 2]
        empty = plane.demand().window(down.name, 1000.0, 1003.0)
        assert empty.rates == (0.0, 0.0, 0.0) and empty.samples == ()
        assert plane.autoscaler().name == "slo"
    finally:
        server.shutdown()
        server.server_close()

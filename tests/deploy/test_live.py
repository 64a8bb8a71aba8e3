"""Deployments end to end on a real ``coadapt server`` (local executor, real processes): the
activator's scale to zero and back, a controller kill -9 in the middle of a scale-up, and
priority with load shedding when serving alone exceeds the cluster."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from coadapt.serve.routing import HEALTH_PATH
from tests.controller.livecluster import LiveController, wait_for
from tests.serve.conftest import publish_mlp

TIMEOUT = 120.0  # a serving round (5 s) + a replica's cold start (torch import), loaded machine


def _cmdlines() -> Iterator[tuple[int, str]]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                raw = (entry / "cmdline").read_bytes()
                if raw:
                    yield int(entry.name), raw.replace(b"\0", b" ").decode(errors="replace")


def processes(*parts: str) -> list[int]:
    """PIDs of live processes whose command line holds every one of ``parts``."""
    return [pid for pid, cmd in _cmdlines() if all(p in cmd for p in parts)]


def kill_under(state_dir: Path) -> None:
    """SIGKILL every gateway and replica of ``state_dir`` (they outlive the controller by
    design); each leads its own session, so its children go with it."""
    for pid in processes(str(state_dir)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def post(port: int, model: str = "mlp") -> tuple[int, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        body = json.dumps({"instances": [[0.1] * 6]}).encode()
        conn.request(
            "POST", f"/v1/models/{model}:predict", body, {"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


def gateway_up(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", HEALTH_PATH)
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


class Cluster:
    """A live controller with the test MLP registered as model ``mlp``."""

    def __init__(self, tmp_path: Path, slots: int) -> None:
        self.state_dir = tmp_path / "state"
        self.slots = slots
        self.root = tmp_path / "models" / "mlp"
        publish_mlp(self.root, seed=1)
        self.ctl = LiveController(self.state_dir, slots=slots).start()
        self.api = self.ctl.client()
        self.api.request("POST", "/api/v1/models", json={"name": "mlp", "root": str(self.root)})

    def restart(self) -> None:
        self.api.close()
        self.ctl = LiveController(self.state_dir, slots=self.slots).start()
        self.api = self.ctl.client()

    def deploy(self, **spec: Any) -> dict[str, Any]:
        return self.api.create_deployment({"model": "mlp", "slo_ms": 500, **spec})

    def show(self, name: str) -> dict[str, Any]:
        return self.api.deployment(name)

    def statuses(self, name: str) -> list[str]:
        return [r["status"] for r in self.show(name)["replicas"]]

    def close(self) -> None:
        self.api.close()
        self.ctl.stop()
        kill_under(self.state_dir)


@pytest.fixture
def cluster_of(tmp_path: Path) -> Iterator[Any]:
    made: list[Cluster] = []

    def make(slots: int) -> Cluster:
        made.append(Cluster(tmp_path, slots))
        return made[-1]

    try:
        yield make
    finally:
        for c in made:
            c.close()


def test_scale_to_zero_and_back_answers_the_first_request(cluster_of: Any) -> None:
    c: Cluster = cluster_of(2)
    dep = c.deploy(name="web", min_replicas=0, max_replicas=2, scale_to_zero_s=2, ready_s=5)
    port = dep["gateway_port"]
    wait_for(lambda: gateway_up(port), 60, "the gateway to listen", every=0.2)
    assert post(port)[0] == 200  # through the gateway (held while a first replica starts)
    assert "ready" in c.statuses("web")

    def at_zero() -> bool:
        got = c.statuses("web")
        return bool(got) and all(s == "exited" for s in got)

    # Idle past scale_to_zero_s: the replicas drain and stop; the gateway stays.
    wait_for(at_zero, TIMEOUT, "scale to zero", every=0.5)
    # And back: the first request after zero is held by the activator while its demand makes
    # the autoscaler ask for a replica, and answered once one is ready (not refused, not lost).
    assert post(port)[0] == 200
    assert "ready" in c.statuses("web")
    live = c.show("web")["deployment"]["live"]
    assert live is None or live.get("totals", {}).get("errors", 0) == 0


def test_controller_kill9_during_scale_up_neither_loses_nor_doubles(cluster_of: Any) -> None:
    c: Cluster = cluster_of(2)
    dep = c.deploy(name="web", min_replicas=2, max_replicas=2, scale_to_zero_s=None)
    dep_dir = str(c.state_dir / "deployments" / str(dep["id"]))
    # Kill -9 as soon as the first replica row exists (its process is starting).
    before = wait_for(lambda: c.statuses("web"), TIMEOUT, "the scale-up to begin", every=0.05)
    c.ctl.kill9()
    assert before.count("ready") < 2  # killed mid-way: not every replica was up yet
    c.restart()

    def ready() -> bool:
        return c.statuses("web").count("ready") == 2

    wait_for(ready, TIMEOUT, "2 ready replicas after the restart", every=0.5)
    time.sleep(3)  # a few more ticks: nothing else may start
    view = c.show("web")
    assert view["deployment"]["state"] == "active"  # the deployment was not lost
    alive = [r for r in view["replicas"] if r["status"] != "exited"]
    assert len(alive) == 2
    assert len({(r["node"], r["slot"]) for r in alive}) == 2
    runs = c.state_dir / "jobs" / f"deploy-{dep['id']}" / "runs"  # the replicas' job dir
    shims = processes("coadapt.executors._shim", str(runs))
    assert len(shims) == 2, f"replica processes: {shims}; rows: {view['replicas']}"
    assert len(processes("coadapt.serve.gateway", f"{dep_dir}/gateway")) == 1
    wait_for(lambda: gateway_up(dep["gateway_port"]), 60, "the gateway", every=0.2)
    assert post(dep["gateway_port"])[0] == 200


def test_priority_and_shedding_when_serving_exceeds_the_cluster(cluster_of: Any) -> None:
    c: Cluster = cluster_of(1)
    high = c.deploy(name="high", priority=10, min_replicas=1, max_replicas=1, scale_to_zero_s=None)
    low = c.deploy(name="low", priority=0, min_replicas=1, max_replicas=1, scale_to_zero_s=None)
    wait_for(lambda: c.statuses("high") == ["ready"], TIMEOUT, "high ready", every=0.5)
    assert all(s == "exited" for s in c.statuses("low"))  # the one slot went to "high"
    assert post(high["gateway_port"])[0] == 200

    def shed() -> bool:
        got = c.show("low")["deployment"]["replicas"]
        return got.get("granted") == 0 and got.get("admit_rps") == 0

    wait_for(shed, TIMEOUT, "low's reservation to shed everything", every=0.5)
    wait_for(lambda: gateway_up(low["gateway_port"]), 60, "the gateway", every=0.2)
    started = time.monotonic()
    status, headers = post(low["gateway_port"])
    assert status == 503 and float(headers["retry-after"]) > 0  # refused at once, never held
    assert time.monotonic() - started < 30
    assert post(high["gateway_port"])[0] == 200  # the higher priority keeps being served

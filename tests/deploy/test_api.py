"""The deployment routes in-process (httpx ASGI transport): create against the registry,
tenant isolation, field-naming rejections, 404/409 with the reason, delete, and the gateway's
figures when it answers."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coadapt.controller.api import ApiContext
from coadapt.controller.db import sqlite_url
from coadapt.controller.serving import SERVING_STATE_KEY
from coadapt.controller.store import Store
from coadapt.deploy.store import DeploymentState, DeploymentStore, ServingReplicaStatus
from coadapt.protocol import EventKind
from coadapt.registry.config import parse_model_spec
from coadapt.registry.runner import RegistryRunner
from coadapt.registry.states import VersionState
from coadapt.registry.store import NewVersion
from coadapt.serve.routing import GatewayStats, SecondStats
from coadapt.service import create_app
from tests.controller.conftest import FakeClock
from tests.controller.test_api import SyncASGI
from tests.deploy.conftest import fake_gateway

URL = "/api/v1/deployments"


class Api:
    """The whole app on SQLite with tenants alice, bob and the admin root; alice has model
    ``mlp`` with version 1 passed (live), 2 failed, 3 registered."""

    def __init__(self, store: Store, tmp_path: Path) -> None:
        self.clock = FakeClock()
        self.store = store
        self.tenants, self.tokens = {}, {}
        for name, admin in (("root", True), ("alice", False), ("bob", False)):
            self.tenants[name], self.tokens[name] = store.create_tenant(
                name, self.clock(), is_admin=admin
            )
        self.pokes = 0
        ctx = ApiContext(
            store=store,
            state_dir=tmp_path,
            slots=1,
            policy="fifo",
            clock=self.clock,
            on_change=self.poke,
        )
        runner = RegistryRunner(store, self.clock, state_dir=tmp_path / "state")
        self.client = SyncASGI(create_app(ctx, runner))
        self.deploys = DeploymentStore(store)
        reg = runner.registry
        self.root = str(tmp_path / "mlp")
        model = reg.create_model(
            self.tenants["alice"], parse_model_spec({"name": "mlp", "root": self.root}), 1.0
        )
        for seq, state in (
            ("00000001", VersionState.PASSED),
            ("00000002", VersionState.FAILED),
            ("00000003", None),
        ):
            reg.add_version(
                model.id, NewVersion(seq, "full", None, "0" * 64, 1, None, None, None, 1.0), 1.0
            )
            if state is not None:
                reg.set_state(model.id, seq, VersionState.VALIDATING)
                reg.set_state(
                    model.id, seq, state, reason="auc 0.5 < 0.7" if seq == "00000002" else None
                )
        reg.go_live(model.id, "00000001", "promote", "alice", 2.0)

    def poke(self) -> None:
        self.pokes += 1

    def call(self, method: str, path: str, who: str = "alice", **kw: Any) -> Any:
        return self.client.request(
            method, path, headers={"Authorization": f"Bearer {self.tokens[who]}"}, **kw
        )


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    store = Store.open(sqlite_url(tmp_path / "api.db"))
    yield Api(store, tmp_path)
    store.close()


def test_create_show_list_delete(api: Api) -> None:
    r = api.call("POST", URL, json={"name": "web", "model": "mlp", "slo_ms": 80})
    assert r.status_code == 201, r.text
    dep = r.json()["deployment"]
    assert (dep["name"], dep["tenant"], dep["model"], dep["version"]) == (
        "web",
        "alice",
        "mlp",
        "live",
    )
    assert dep["state"] == "active" and dep["model_root"] == api.root
    assert dep["url"] == f"http://127.0.0.1:{dep['gateway_port']}" and dep["slo_s"] == 0.08
    assert dep["replicas"] == {
        "starting": 0, "ready": 0, "draining": 0, "stopping": 0,
        "desired": None, "granted": None, "admit_rps": None,
    }  # fmt: skip
    assert api.pokes == 1
    events = [e for e in api.store.events(kinds=[EventKind.DEPLOY]) if e.data]
    assert events[-1].data == {"deployment": "web", "deployment_id": dep["id"]}

    # a replica, and the last round's reservation, show in the views
    rec = api.deploys.get(api.tenants["alice"], "web")
    rep = api.deploys.add_replica(rec.id, "local", 1, 45001, "/r", "/r/log", 3.0)
    api.deploys.update_replica(rep.id, status=ServingReplicaStatus.READY, pid=1)
    reservation = {"slots": 2, "desired": 3, "placement": {"local": 2}, "capacity_rps": 40.0,
                   "admit_rps": 80.0, "retry_after_s": 30.0}  # fmt: skip
    api.store.meta_set(
        SERVING_STATE_KEY,
        json.dumps({"serving": {"web": {"reservation": reservation}}, "last_now": 3.0}),
    )
    shown = api.call("GET", f"{URL}/web").json()
    d = shown["deployment"]
    assert (d["replicas"]["ready"], d["replicas"]["desired"], d["replicas"]["granted"]) == (1, 3, 2)
    assert d["placement"] == [["local", 1, "ready"]] and d["live"] is None  # no gateway yet
    assert [(x["slot"], x["status"], x["port"]) for x in shown["replicas"]] == [(1, "ready", 45001)]
    assert [x["name"] for x in api.call("GET", URL).json()["deployments"]] == ["web"]
    assert [x["tenant"] for x in api.call("GET", URL, "root").json()["deployments"]] == ["alice"]

    gone = api.call("DELETE", f"{URL}/web")
    assert gone.status_code == 200 and gone.json()["deployment"]["state"] == "deleting"
    assert api.pokes == 2
    assert [x["state"] for x in api.call("GET", URL).json()["deployments"]] == ["deleting"]
    api.deploys.mark_deleted(rec.id, 9.0)
    assert api.call("GET", URL).json() == {"deployments": []}
    assert api.call("GET", f"{URL}/web").status_code == 404
    assert api.call("POST", URL, json={"name": "web", "model": "mlp"}).status_code == 201


def test_a_strangers_deployment_is_a_404(api: Api) -> None:
    assert api.call("POST", URL, json={"name": "web", "model": "mlp"}).status_code == 201
    assert api.call("GET", URL, "bob").json() == {"deployments": []}
    for method in ("GET", "DELETE"):
        r = api.call(method, f"{URL}/web", "bob")
        assert r.status_code == 404 and "no deployment 'web'" in r.json()["message"]
    # bob cannot deploy alice's model either: it is not his
    r = api.call("POST", URL, "bob", json={"name": "web", "model": "mlp"})
    assert r.status_code == 404 and "no model 'mlp'" in r.json()["message"]
    assert api.deploys.get(api.tenants["alice"], "web").state is DeploymentState.ACTIVE


def test_rejections_name_the_field_or_the_reason(api: Api) -> None:
    r = api.call("POST", URL, json={"name": "Web!", "model": "mlp", "max_replica": 3})
    assert r.status_code == 422
    assert {d["field"] for d in r.json()["details"]} == {"name", "max_replica"}
    assert api.call("POST", URL, json=["web"]).status_code == 422
    r = api.call("POST", URL, json={"name": "web", "model": "nope"})
    assert r.status_code == 404 and "no model 'nope'" in r.json()["message"]
    r = api.call("POST", URL, json={"name": "web", "model": "mlp", "version": "9"})
    assert r.status_code == 409 and "has no version '9'" in r.json()["message"]
    r = api.call("POST", URL, json={"name": "web", "model": "mlp", "version": 2})
    assert r.status_code == 409 and "is failed (auc 0.5 < 0.7)" in r.json()["message"]
    r = api.call("POST", URL, json={"name": "web", "model": "mlp", "version": "3"})
    assert r.status_code == 409 and "only a version that passed its gates" in r.json()["message"]
    assert api.call("GET", URL).json() == {"deployments": []}
    ok = api.call("POST", URL, json={"name": "web", "model": "mlp", "version": 1})
    assert ok.status_code == 201 and ok.json()["deployment"]["version"] == "00000001"
    assert api.deploys.get(api.tenants["alice"], "web").spec.version == "00000001"
    again = api.call("POST", URL, json={"name": "web", "model": "mlp"})
    assert again.status_code == 409 and "exists already" in again.json()["message"]
    other = api.call("POST", URL, json={"name": "api", "model": "mlp"}).json()["deployment"]
    assert other["gateway_port"] != ok.json()["deployment"]["gateway_port"]


def test_no_token_is_a_401(api: Api) -> None:
    assert api.client.request("GET", URL).status_code == 401
    assert api.client.request("POST", URL, json={"name": "w", "model": "mlp"}).status_code == 401


def test_show_has_the_gateways_figures_when_it_answers(api: Api) -> None:
    dep = api.call("POST", URL, json={"name": "web", "model": "mlp"}).json()["deployment"]
    now = time.time()
    t = int(now)
    seconds = tuple(
        SecondStats(
            t=t - k, offered=20, served=19, within_slo=18, shed=1, backends=2, latency_q_s=0.01 * k
        )
        for k in range(1, 4)
    )
    stats = GatewayStats("web", 4, now, seconds, backends=2, held_now=0,
                         totals={"offered": 60, "served": 57, "shed": 3, "errors": 0})  # fmt: skip
    with fake_gateway(dep["gateway_port"], stats):
        live = api.call("GET", f"{URL}/web").json()["deployment"]["live"]
    assert live["requests_per_s"] == pytest.approx(6.0)  # 60 offered over the 10 s window
    assert live["latency_q_s"] == pytest.approx(0.03) and live["backends"] == 2
    assert live["slo_attainment"] == pytest.approx(54 / 57)
    assert (live["shed_total"], live["errors_total"], live["generation"]) == (3, 0, 4)


def test_the_dashboards_serving_slots_anonymise_strangers(api: Api) -> None:
    assert api.call("POST", URL, json={"name": "web", "model": "mlp"}).status_code == 201
    rec = api.deploys.get(api.tenants["alice"], "web")
    for slot in (0, 1):
        api.deploys.add_replica(rec.id, "local", slot, 46000 + slot, "/r", "/r/l", 2.0)
    gone = api.deploys.add_replica(rec.id, "local", 2, 46002, "/r", "/r/l", 2.0)
    api.deploys.update_replica(gone.id, status=ServingReplicaStatus.EXITED)  # not on the map
    mine = api.call("GET", "/api/v1/ui/serving").json()
    assert [d["name"] for d in mine["deployments"]] == ["web"]
    assert mine["replicas"] == [
        {"node": "local", "slot": s, "status": "starting", "deployment": "web", "other": False}
        for s in (0, 1)
    ]
    theirs = api.call("GET", "/api/v1/ui/serving", "bob").json()
    assert theirs["deployments"] == []
    assert theirs["replicas"] == [
        {"node": "local", "slot": s, "status": "starting", "other": True} for s in (0, 1)
    ]


def test_the_schema_declares_the_spec_body_and_errors(api: Api) -> None:
    schema = api.client.request("GET", "/openapi.json").json()
    create = schema["paths"][URL]["post"]
    body = create["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/DeploymentSpec"}
    assert {"401", "404", "409", "422"} <= set(create["responses"])
    props = schema["components"]["schemas"]["DeploymentSpec"]["properties"]
    assert {"name", "model", "version", "slo_ms", "max_replicas", "workers"} <= set(props)
    assert {"401", "404"} <= set(schema["paths"][URL + "/{name}"]["delete"]["responses"])

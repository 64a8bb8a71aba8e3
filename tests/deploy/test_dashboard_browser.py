"""The dashboard's deployments in headless Chromium against a real HTTP server of the app:
serving replicas on the slot map coloured by deployment (another tenant's anonymised), the
Deployments panel (ready/desired, load, p99 vs SLO, shed, errors) and page, and no console
error. Skipped (with the reason) without Chromium, like the other browser tests."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from coadapt.controller.api import ApiContext
from coadapt.controller.db import sqlite_url
from coadapt.controller.serving import SERVING_STATE_KEY
from coadapt.controller.store import Store
from coadapt.deploy.store import DeploymentStore, ServingReplicaStatus
from coadapt.ports import free_port
from coadapt.registry.config import parse_model_spec
from coadapt.registry.runner import RegistryRunner
from coadapt.serve.routing import GatewayStats, SecondStats
from coadapt.service import create_app
from tests.controller.livecluster import wait_for
from tests.controller.test_dashboard_browser import CHROMIUM, CHROMIUM_ARGS, SKIP, Cluster, Tab
from tests.deploy.conftest import deploy_spec, fake_gateway

pytestmark = [pytest.mark.timeout(120)]
if SKIP:
    pytestmark.append(pytest.mark.skip(reason=SKIP))


class AppServer:
    """The whole HTTP app (no control loop) served by uvicorn on 127.0.0.1 in a thread."""

    def __init__(self, store: Store, state_dir: Path) -> None:
        ctx = ApiContext(
            store=store,
            state_dir=state_dir,
            slots=4,
            policy="pollux",
            clock=time.time,
            inventory=lambda: [("local", 4)],
        )
        app = create_app(ctx, RegistryRunner(store, time.time, state_dir=state_dir / "reg"))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> AppServer:
        self.thread.start()
        wait_for(lambda: self.server.started, 20, "the app server to start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Cluster, int]]:
    """alice's ``web`` (2 ready replicas on local #0 and #1, 3 desired) and bob's ``api`` (one
    starting replica on local #2); returns the cluster handle and web's gateway port."""
    store = Store.open(sqlite_url(tmp_path / "dash.db"))
    try:
        tokens, tenants = {}, {}
        for name, admin in (("admin", True), ("alice", False), ("bob", False)):
            tenants[name], tokens[name] = store.create_tenant(name, 1.0, is_admin=admin)
        reg = RegistryRunner(store, time.time, state_dir=tmp_path / "reg").registry
        deploys = DeploymentStore(store)
        ports = {}
        for who, dep, slots, status in (
            ("alice", "web", (0, 1), ServingReplicaStatus.READY),
            ("bob", "api", (2,), ServingReplicaStatus.STARTING),
        ):
            reg.create_model(tenants[who], parse_model_spec({"name": "mlp", "root": "/m"}), 1.0)
            rec = deploys.create(
                tenants[who], deploy_spec(name=dep, slo_ms=25), "/m", free_port(), 1.0
            )
            ports[dep] = rec.gateway_port
            for slot in slots:
                r = deploys.add_replica(rec.id, "local", slot, 47000 + slot, "/r", "/r/l", 2.0)
                deploys.update_replica(r.id, status=status)
        reservation = {"slots": 2, "desired": 3, "placement": {"local": 2}, "capacity_rps": 40.0,
                       "admit_rps": None, "retry_after_s": 30.0}  # fmt: skip
        store.meta_set(
            SERVING_STATE_KEY,
            json.dumps({"serving": {"web": {"reservation": reservation}}, "last_now": 3.0}),
        )
        with AppServer(store, tmp_path) as server:
            yield Cluster(server, tokens), ports["web"]  # type: ignore[arg-type]
    finally:
        store.close()


def test_deployments_on_the_slot_map_and_panel(served: tuple[Cluster, int]) -> None:
    from playwright.sync_api import sync_playwright

    cluster, port = served

    def stats() -> GatewayStats:
        """Fresh figures at each request (the window ends at the gateway's 'now')."""
        now = time.time()
        seconds = tuple(
            SecondStats(
                t=int(now) - k, offered=30, served=29, within_slo=27, shed=1, latency_q_s=0.04
            )
            for k in range(1, 6)
        )
        totals = {"offered": 400, "served": 380, "shed": 12, "errors": 2}
        return GatewayStats("web", 3, now, seconds, backends=2, totals=totals)

    with fake_gateway(port, stats), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            t: Any = Tab(browser, cluster, "alice")
            t.go("#/cluster")
            node = "[data-node='local']"
            t.page.wait_for_selector(f"{node} .slot.serving[data-deployment='web'][data-slot='0']")
            t.page.wait_for_selector(f"{node} .slot.serving[data-deployment='web'][data-slot='1']")
            t.page.wait_for_selector(f"{node} .slot.other.serving[data-slot='2']")
            t.page.wait_for_selector(f"{node} .slot.free[data-slot='3']")
            assert "api" not in t.page.inner_text(node)  # bob's deployment stays anonymous
            row = "#deployments-panel tr[data-deployment='web']"
            t.page.wait_for_selector(f"{row} td.ready:text-is('2 / 3')")
            assert t.page.inner_text(f"{row} td.over-slo").startswith("40 / 25")  # p99 > SLO
            t.shot("deployments-cluster-alice")
            t.go("#/deployments")
            t.page.wait_for_selector("#deployments-table tr[data-deployment='web']")
            assert t.page.locator("#deployments-table tr[data-deployment='api']").count() == 0
            t.shot("deployments-alice")
            assert t.errors == [], t.errors
            t.close()
        finally:
            browser.close()

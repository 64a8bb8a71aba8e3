"""The dashboard's Models view in headless Chromium against a real controller: the model
list, a model's versions with their state, gate results and lineage, the promotion history;
another tenant sees none of it; no console error. Skipped (with the reason) without Chromium,
like the other browser tests; required under CI."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.controller.livecluster import LiveController, wait_for
from tests.controller.test_dashboard_browser import CHROMIUM, CHROMIUM_ARGS, SKIP, Cluster, Tab
from tests.registry.conftest import publish

pytestmark = [pytest.mark.timeout(180)]
if SKIP:
    pytestmark.append(pytest.mark.skip(reason=SKIP))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    ctl = LiveController(tmp_path_factory.mktemp("dash-models") / "state", slots=1).start()
    try:
        tokens = {"admin": ctl.token}
        with ctl.client() as admin:
            for name in ("alice", "bob"):
                tokens[name] = admin.create_tenant(name)["token"]
        yield Cluster(ctl, tokens)
    finally:
        ctl.stop()


def test_models_view(cluster: Cluster, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    root = tmp_path / "ctr"
    publish(root, seed=1)
    with cluster.api("alice") as c:
        assert c.post("/api/v1/models", json={"name": "ctr", "root": str(root)}).is_success

    def settled() -> bool:
        with cluster.api("alice") as c:
            versions = c.get("/api/v1/models/ctr").json()["versions"]
        return bool(versions) and versions[0]["state"] == "live"

    wait_for(settled, 90, "the registry to validate and adopt version 1")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            t: Any = Tab(browser, cluster, "alice")
            t.go("#/models")
            t.page.wait_for_selector("#models-table tr[data-model='ctr'] .model-state.live")
            t.go("#/models/alice/ctr")
            row = "#versions-table tr[data-version='00000001']"
            t.page.wait_for_selector(f"{row} .model-state.live")
            t.page.wait_for_selector(f"{row} .check.passed:text('integrity: passed')")
            t.page.wait_for_selector(f"{row} a[href='#/jobs/job-1']")  # lineage
            t.page.wait_for_selector("#promotions-table td:text-is('adopt')")
            t.shot("models-alice")
            assert t.errors == []
            t.close()
            b: Any = Tab(browser, cluster, "bob")
            b.go("#/models")
            b.page.wait_for_selector("#main .empty:text('no models registered')")
            b.go("#/models/alice/ctr")
            b.page.wait_for_selector("#not-found")
            time.sleep(0.2)
            assert b.errors == [] or all("404" in e for e in b.errors), b.errors
            b.close()
        finally:
            browser.close()

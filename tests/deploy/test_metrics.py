"""``/metrics`` exports deployments: replicas per state, desired, SLO, and the gateway's load,
p99, shed and errors when it answers (absent, not invented, when it does not)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from coadapt.controller.db import sqlite_url
from coadapt.controller.serving import SERVING_STATE_KEY
from coadapt.controller.store import Store
from coadapt.deploy.live import summarize
from coadapt.deploy.store import ServingReplicaStatus
from coadapt.serve.routing import GatewayStats, SecondStats
from tests.deploy.conftest import fake_gateway
from tests.deploy.test_api import URL, Api

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    store = Store.open(sqlite_url(tmp_path / "api.db"))
    yield Api(store, tmp_path)
    store.close()


def scrape(api: Api) -> Samples:
    r = api.call("GET", "/metrics", "root")
    assert r.status_code == 200, r.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(r.text)
        if fam.name.startswith("coadapt_deployment")
        for s in fam.samples
        if not s.name.endswith("_created")
    }


def test_deployment_series(api: Api) -> None:
    assert scrape(api) == {}
    web = api.call("POST", URL, json={"name": "web", "model": "mlp", "slo_ms": 40}).json()
    port = web["deployment"]["gateway_port"]
    rec = api.deploys.get(api.tenants["alice"], "web")
    for slot, status in ((0, ServingReplicaStatus.READY), (1, ServingReplicaStatus.STARTING)):
        rep = api.deploys.add_replica(rec.id, "local", slot, 45000 + slot, "/r", "/r/l", 2.0)
        api.deploys.update_replica(rep.id, status=status)
    reservation = {"slots": 2, "desired": 3, "placement": {"local": 2}, "capacity_rps": 40.0,
                   "admit_rps": None, "retry_after_s": 30.0}  # fmt: skip
    api.store.meta_set(
        SERVING_STATE_KEY,
        json.dumps({"serving": {"web": {"reservation": reservation}}, "last_now": 3.0}),
    )
    d = (("deployment", "web"),)
    without_gateway = scrape(api)
    assert without_gateway == {
        ("coadapt_deployment_replicas", (*d, ("state", "starting"))): 1.0,
        ("coadapt_deployment_replicas", (*d, ("state", "ready"))): 1.0,
        ("coadapt_deployment_replicas", (*d, ("state", "draining"))): 0.0,
        ("coadapt_deployment_replicas", (*d, ("state", "stopping"))): 0.0,
        ("coadapt_deployment_replicas_desired", d): 3.0,
        ("coadapt_deployment_slo_seconds", d): 0.04,
    }
    now = time.time()
    seconds = (SecondStats(t=int(now) - 1, offered=50, served=45, within_slo=44, shed=5,
                           errors=0, backends=1, latency_q_s=0.031),)  # fmt: skip
    totals = {"offered": 900, "served": 880, "shed": 17, "errors": 3}
    stats = GatewayStats("web", 2, now, seconds, backends=1, totals=totals)
    with fake_gateway(port, stats):
        got = scrape(api)
    assert got == {
        **without_gateway,
        ("coadapt_deployment_requests_per_s", d): 5.0,  # 50 in the 10 s window
        ("coadapt_deployment_latency_p99_seconds", d): 0.031,
        ("coadapt_deployment_shed_total", d): 17.0,
        ("coadapt_deployment_errors_total", d): 3.0,
    }
    # a deleted deployment leaves the series
    api.call("DELETE", f"{URL}/web")
    api.deploys.mark_deleted(rec.id, 9.0)
    assert scrape(api) == {}


def test_a_tenant_token_cannot_scrape(api: Api) -> None:
    assert api.call("GET", "/metrics", "alice").status_code == 403


def test_gateway_figures_are_summarised_over_the_last_complete_seconds() -> None:
    now = 1000.7
    seconds = (
        SecondStats(t=989, offered=999, served=999, within_slo=0, latency_q_s=9.0),  # too old
        SecondStats(t=990, offered=40, served=38, within_slo=38, latency_q_s=0.02),
        SecondStats(t=995, offered=10, served=0, shed=10),  # nothing served: no quantile
        SecondStats(t=999, offered=50, served=50, within_slo=45, latency_q_s=0.07),
        SecondStats(t=1000, offered=500, served=500, latency_q_s=5.0),  # still running
    )
    stats = GatewayStats("web", 7, now, seconds, backends=3, held_now=2, cold_starts_s=(4.5,),
                         totals={"offered": 2000, "shed": 10})  # fmt: skip
    got = summarize(stats, window_s=10)
    assert got.requests_per_s == pytest.approx(10.0)  # (40 + 10 + 50) / 10 s
    assert got.latency_q_s == pytest.approx(0.07)  # the worst second
    assert got.slo_attainment == pytest.approx(83 / 88)
    assert (got.generation, got.backends, got.held_now, got.cold_starts_s) == (7, 3, 2, (4.5,))
    assert (got.offered_total, got.served_total, got.shed_total, got.errors_total) == (
        2000, 0, 10, 0,
    )  # fmt: skip
    idle = summarize(GatewayStats("web", 1, now), window_s=10)
    assert (idle.requests_per_s, idle.latency_q_s, idle.slo_attainment) == (0.0, None, None)

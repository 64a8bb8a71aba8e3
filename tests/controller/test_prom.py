"""``GET /metrics``: Prometheus exposition read from the store at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from coadapt.controller.api import ApiContext
from coadapt.controller.snapshot import speedup
from coadapt.controller.states import JobState
from coadapt.controller.store import Store
from coadapt.service import create_app
from tests.controller.conftest import FakeClock
from tests.controller.test_api import Api, SyncASGI, submit
from tests.controller.test_snapshot import PERF

JOB_FAMILIES = ("replicas", "batch_size", "goodput", "speedup", "restarts")


@pytest.fixture
def api(sqlite_store: Store, tmp_path: Path) -> Iterator[Api]:
    clock = FakeClock()
    tokens = {}
    for name, admin in (("root", True), ("alice", False), ("bob", False)):
        tokens[name] = sqlite_store.create_tenant(name, clock(), is_admin=admin)[1]
    ctx = ApiContext(store=sqlite_store, state_dir=tmp_path, slots=4, policy="pollux", clock=clock)
    yield Api(SyncASGI(create_app(ctx)), sqlite_store, tokens)


def scrape(api: Api) -> dict[str, list[Sample]]:
    resp = api.call("GET", "/metrics", "root")
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == CONTENT_TYPE_LATEST
    return {f.name: f.samples for f in text_string_to_metric_families(resp.text)}


def one(samples: list[Sample], **labels: str) -> float:
    [value] = [s.value for s in samples if s.labels == labels]
    return value


def by_job(samples: list[Sample]) -> dict[str, float]:
    return {s.labels["job"]: s.value for s in samples}


def test_cluster_and_job_series_match_the_store(api: Api) -> None:
    store, now = api.store, 2_000.0
    a = submit(api, "alice", name="a")
    b = submit(api, "bob", name="b")
    c = submit(api, "alice", name="c")
    fams = scrape(api)
    assert one(fams["coadapt_slots_total"]) == 4
    assert one(fams["coadapt_slots_allocated"]) == 0
    assert {s.labels["state"]: s.value for s in fams["coadapt_jobs"]} == {
        st.value: (3.0 if st is JobState.PENDING else 0.0) for st in JobState
    }
    assert [(s.name, s.value) for s in fams["coadapt_scheduling_rounds"]] == [
        ("coadapt_scheduling_rounds_total", 0.0)
    ]
    for name in JOB_FAMILIES:  # every family is announced, even without samples
        assert f"coadapt_job_{name}" in fams
    assert {(s.labels["job"], s.labels["tenant"]) for s in fams["coadapt_job_replicas"]} == {
        (a, "alice"),
        (b, "bob"),
        (c, "alice"),
    }
    assert by_job(fams["coadapt_job_batch_size"]) == {a: 32, b: 32, c: 32}  # the spec's
    assert fams["coadapt_job_goodput"] == [] and fams["coadapt_job_speedup"] == []

    # a runs on 2 replicas and has reported; c is cancelled (no per-job series any more)
    store.update_job(a, now, state=JobState.RUNNING, replicas=2, num_restarts=1)
    for rank in range(2):
        store.add_replica(a, 1, rank, rank, "/tmp/r", "/tmp/l", now)
    store.merge_report(
        a,
        {
            "batch_size": 64,
            "goodput": {"current_goodput": 123.5},
            "perf": PERF,
            "grad": {"sqr": 1.0, "var": 2.0},
        },
    )
    assert api.call("POST", f"/api/v1/jobs/{c}/cancel", "alice").status_code == 200
    store.meta_set("policy_round", "7")

    fams = scrape(api)
    assert one(fams["coadapt_slots_allocated"]) == 2
    jobs = {s.labels["state"]: s.value for s in fams["coadapt_jobs"]}
    assert (jobs["PENDING"], jobs["RUNNING"], jobs["CANCELLED"], jobs["FAILED"]) == (1, 1, 1, 0)
    assert sum(jobs.values()) == len(store.list_jobs())
    assert fams["coadapt_scheduling_rounds"][0].value == 7
    assert by_job(fams["coadapt_job_replicas"]) == {a: 2, b: 0}
    assert by_job(fams["coadapt_job_restarts"]) == {a: 1, b: 0}
    assert by_job(fams["coadapt_job_batch_size"]) == {a: 64, b: 32}
    assert by_job(fams["coadapt_job_goodput"]) == {a: 123.5}
    expected = speedup(store.get_job(a), 2)
    assert expected is not None
    assert by_job(fams["coadapt_job_speedup"]) == {a: pytest.approx(expected)}
    assert one(fams["coadapt_job_goodput"], job=a, tenant="alice") == 123.5


def test_metrics_need_the_admin_token(api: Api) -> None:
    assert api.call("GET", "/metrics", None).status_code == 401
    bad = api.call("GET", "/metrics", None, headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401 and bad.json()["error"]
    assert api.call("GET", "/metrics", "alice").status_code == 403


def test_each_app_has_its_own_registry(api: Api, sqlite_store: Store, tmp_path: Path) -> None:
    ctx = ApiContext(
        store=sqlite_store, state_dir=tmp_path, slots=8, policy="fifo", clock=FakeClock()
    )
    other = Api(SyncASGI(create_app(ctx)), sqlite_store, api.tokens)
    assert one(scrape(other)["coadapt_slots_total"]) == 8
    assert one(scrape(api)["coadapt_slots_total"]) == 4

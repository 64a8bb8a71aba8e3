"""GPU types through the API: ``gpu_types`` in a job spec (422 naming the field when it is
ill-formed or names a type no node has), node types in ``/api/v1/cluster``, slots per type in
``/metrics``, and a goodput report filed under the type the job ran on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from coadapt.controller.api import ApiContext
from coadapt.controller.snapshot import ATTEMPT_GPU_TYPE, PERF_GPU_TYPE
from coadapt.controller.spec import parse_spec
from coadapt.controller.store import Store
from coadapt.service import create_app
from tests.controller.conftest import FakeClock, make_spec
from tests.controller.test_api import Api, SyncASGI, submit

NODES = [("n1", 4, "a100"), ("n2", 2, "t4"), ("n3", 2, "t4")]


@pytest.fixture
def api(sqlite_store: Store, tmp_path: Path) -> Iterator[Api]:
    clock = FakeClock()
    tokens = {}
    for name, admin in (("root", True), ("alice", False)):
        tokens[name] = sqlite_store.create_tenant(name, clock(), is_admin=admin)[1]
    ctx = ApiContext(
        store=sqlite_store,
        state_dir=tmp_path,
        slots=8,
        policy="pollux",
        clock=clock,
        inventory=lambda: [(n, k) for n, k, _ in NODES],
        gpu_types=lambda: {n: t for n, _, t in NODES},
    )
    yield Api(SyncASGI(create_app(ctx)), sqlite_store, tokens)


def rejection(api: Api, gpu_types: Any) -> dict[str, Any]:
    resp = api.call("POST", "/api/v1/jobs", json=make_spec(gpu_types=gpu_types))
    assert resp.status_code == 422, resp.text
    [detail] = resp.json()["details"]
    assert detail["field"] == "gpu_types"
    return dict(detail)


def test_a_job_may_restrict_its_gpu_types(api: Api) -> None:
    job = submit(api, gpu_types=["T4", "a100"])
    assert api.call("GET", f"/api/v1/jobs/{job}").json()["spec"]["gpu_types"] == ["t4", "a100"]
    assert parse_spec(make_spec()).gpu_types is None  # no field: any type


@pytest.mark.parametrize(
    ("gpu_types", "says"),
    [
        ("a100", "must be a list"),  # the wrong shape
        ([], "1 to 32"),
        (["a 100"], "invalid GPU type 'a 100'"),
        ([7], "invalid GPU type 7"),
        (["a100", "A100"], "more than once"),
    ],
)
def test_an_ill_formed_gpu_types_is_a_422_naming_the_field(
    api: Api, gpu_types: Any, says: str
) -> None:
    detail = rejection(api, gpu_types)
    assert says in detail["message"]
    assert "GPU type names" in detail["accepted"]


def test_a_type_no_node_has_is_rejected_with_the_clusters_types(api: Api) -> None:
    detail = rejection(api, ["a100", "h100"])
    assert "h100" in detail["message"] and "a100" not in detail["message"].split(";")[0]
    assert "the cluster has a100, t4" in detail["message"]
    assert api.store.list_jobs() == []  # nothing was created


def test_the_cluster_view_and_metrics_carry_types(api: Api) -> None:
    job = submit(api)
    api.store.add_replica(job, 1, 0, 3, "/tmp/r", "/tmp/l", 1.0, node="n1")
    api.store.add_replica(job, 1, 1, 0, "/tmp/r", "/tmp/l", 1.0, node="n3")
    view = api.call("GET", "/api/v1/cluster").json()
    assert view["gpu_types"] == ["a100", "t4"]
    assert [(n["name"], n["gpu_type"], n["slots"], n["used"]) for n in view["nodes"]] == [
        ("n1", "a100", 4, 1),
        ("n2", "t4", 2, 0),
        ("n3", "t4", 2, 1),
    ]
    resp = api.call("GET", "/metrics", "root")
    fams = {f.name: f.samples for f in text_string_to_metric_families(resp.text)}
    slots = {s.labels["gpu_type"]: s.value for s in fams["coadapt_slots"]}
    used = {s.labels["gpu_type"]: s.value for s in fams["coadapt_slots_used"]}
    assert slots == {"a100": 4.0, "t4": 4.0} and used == {"a100": 1.0, "t4": 1.0}
    # A second replica on a held slot (GPU sharing) uses no second slot.
    api.store.add_replica(job, 1, 2, 0, "/tmp/r", "/tmp/l", 1.0, node="n3")
    resp = api.call("GET", "/metrics", "root")
    fams = {f.name: f.samples for f in text_string_to_metric_families(resp.text)}
    assert {s.labels["gpu_type"]: s.value for s in fams["coadapt_slots_used"]}["t4"] == 1.0
    view = api.call("GET", "/api/v1/cluster").json()  # nor in the cluster view
    assert (view["used"], [n["used"] for n in view["nodes"]]) == (2, [1, 0, 1])


def test_the_cluster_view_counts_serving_slots(sqlite_store: Store, tmp_path: Path) -> None:
    api_ = Api(
        SyncASGI(
            create_app(
                ApiContext(
                    store=sqlite_store,
                    state_dir=tmp_path,
                    slots=8,
                    policy="pollux",
                    clock=FakeClock(),
                    inventory=lambda: [(n, k) for n, k, _ in NODES],
                    gpu_types=lambda: {n: t for n, _, t in NODES},
                    serving_slots=lambda: {("n2", 0), ("n2", 1)},
                )
            )
        ),
        sqlite_store,
        {"root": sqlite_store.create_tenant("root", 0.0, is_admin=True)[1]},
    )
    view = api_.call("GET", "/api/v1/cluster", "root").json()
    assert (view["used"], view["serving"]) == (2, 2)
    assert [n["used"] for n in view["nodes"]] == [0, 2, 0]


def test_a_goodput_report_is_filed_under_the_type_the_attempt_runs_on(api: Api) -> None:
    job = submit(api)
    url, token = f"/api/v1/jobs/{job}/metrics", api.store.job_token(job)
    profile = {"kind": "goodput", "grad": {"sqr": 1.0, "var": 2.0}, "current_goodput": 3.0}
    assert api.client.post(url, params={"token": token}, json=profile).status_code == 204
    assert PERF_GPU_TYPE not in (api.store.get_job(job).report or {})  # no type known yet
    api.store.merge_report(job, {ATTEMPT_GPU_TYPE: "t4"})  # as the loop does at launch
    perf = dict.fromkeys(
        ("alpha_grad", "beta_grad", "alpha_local", "beta_local", "alpha_node", "beta_node"), 0.01
    )
    record = {**profile, "perf": {**perf, "gamma": 1.0}}
    assert api.client.post(url, params={"token": token}, json=record).status_code == 204
    assert (api.store.get_job(job).report or {})[PERF_GPU_TYPE] == "t4"

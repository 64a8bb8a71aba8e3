"""The REST API in-process: auth, tenant isolation, validation, errors (never a 5xx)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI

from coadapt.controller.api import ApiContext
from coadapt.controller.states import JobState
from coadapt.controller.store import Store
from coadapt.service import create_app
from tests.controller.conftest import FakeClock, make_spec


class SyncASGI:
    """A synchronous client of an ASGI app in-process (httpx's ASGI transport, one event
    loop per request): no server, no port, and no extra test dependency."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                return await c.request(method, path, **kw)

        return anyio.run(go)

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> httpx.Response:
        return self.request("POST", path, **kw)


class Api:
    def __init__(self, client: SyncASGI, store: Store, tokens: dict[str, str]) -> None:
        self.client, self.store, self.tokens = client, store, tokens
        self.pokes = 0

    def call(self, method: str, path: str, who: str | None = "alice", **kw: Any) -> Any:
        headers = dict(kw.pop("headers", {}))
        if who:
            headers["Authorization"] = f"Bearer {self.tokens[who]}"
        return self.client.request(method, path, headers=headers, **kw)


@pytest.fixture
def api(sqlite_store: Store, tmp_path: Path) -> Iterator[Api]:
    clock = FakeClock()
    tokens = {}
    for name, admin in (("root", True), ("alice", False), ("bob", False)):
        tokens[name] = sqlite_store.create_tenant(name, clock(), is_admin=admin)[1]
    holder: list[Api] = []

    def poke() -> None:
        holder[0].pokes += 1

    ctx = ApiContext(
        store=sqlite_store,
        state_dir=tmp_path,
        slots=4,
        policy="pollux",
        clock=clock,
        on_change=poke,
    )
    holder.append(Api(SyncASGI(create_app(ctx)), sqlite_store, tokens))
    yield holder[0]


def submit(api: Api, who: str = "alice", **overrides: Any) -> str:
    resp = api.call("POST", "/api/v1/jobs", who, json=make_spec(**overrides))
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


def test_submit_list_get_cancel(api: Api) -> None:
    job = submit(api)
    assert api.pokes == 1
    listed = api.call("GET", "/api/v1/jobs").json()
    assert [j["id"] for j in listed] == [job] and listed[0]["state"] == "PENDING"
    got = api.call("GET", f"/api/v1/jobs/{job}").json()
    assert got["tenant"] == "alice" and got["spec"]["max_replicas"] == 4
    assert api.call("GET", "/api/v1/jobs", params={"state": "RUNNING"}).json() == []
    resp = api.call("POST", f"/api/v1/jobs/{job}/cancel")
    assert resp.status_code == 200 and resp.json()["state"] == "CANCELLED"
    again = api.call("POST", f"/api/v1/jobs/{job}/cancel")
    assert again.status_code == 409 and again.json()["error"] == "invalid_transition"
    kinds = [e["kind"] for e in api.call("GET", f"/api/v1/jobs/{job}/events").json()]
    assert kinds == ["submitted", "cancelled"]


def test_tenants_only_see_their_own_jobs(api: Api) -> None:
    mine, theirs = submit(api, "alice"), submit(api, "bob")
    assert [j["id"] for j in api.call("GET", "/api/v1/jobs", "alice").json()] == [mine]
    for method, path in (
        ("GET", ""),
        ("GET", "/logs"),
        ("GET", "/events"),
        ("GET", "/metrics"),
        ("POST", "/cancel"),
    ):
        resp = api.call(method, f"/api/v1/jobs/{theirs}{path}", "alice")
        assert resp.status_code == 404, (method, path, resp.text)
        assert resp.json()["message"] == f"no job {theirs!r}"
    assert api.store.get_job(theirs).state is JobState.PENDING
    cluster = api.call("GET", "/api/v1/cluster", "alice").json()
    assert [j["id"] for j in cluster["jobs"]] == [mine]
    everyone = api.call("GET", "/api/v1/jobs", "root").json()
    assert {j["id"] for j in everyone} == {mine, theirs}


def test_auth_and_admin_only_tenant_creation(api: Api) -> None:
    assert api.call("GET", "/api/v1/jobs", None).status_code == 401
    bad = api.client.get("/api/v1/jobs", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401 and bad.json()["error"] == "unauthorized"
    assert api.call("POST", "/api/v1/tenants", "alice", json={"name": "eve"}).status_code == 403
    made = api.call("POST", "/api/v1/tenants", "root", json={"name": "eve"})
    assert made.status_code == 201
    token = made.json()["token"]
    who = api.client.get("/api/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    assert who.json()["name"] == "eve"
    assert api.call("POST", "/api/v1/tenants", "root", json={"name": "eve"}).status_code == 409
    assert api.call("POST", "/api/v1/tenants", "root", json={"name": "a b"}).status_code == 422


def test_malformed_specs_are_422_naming_the_field(api: Api) -> None:
    resp = api.call("POST", "/api/v1/jobs", json=make_spec(max_replicas=0, bogus=1))
    assert resp.status_code == 422
    body = resp.json()
    fields = {d["field"]: d for d in body["details"]}
    assert set(fields) == {"max_replicas", "bogus"}
    assert "integer in" in fields["max_replicas"]["accepted"]
    assert "unknown field" in fields["bogus"]["message"]
    not_json = api.call(
        "POST", "/api/v1/jobs", content=b"{nope", headers={"Content-Type": "application/json"}
    )
    assert not_json.status_code == 422
    assert api.call("POST", "/api/v1/jobs", json=[1, 2]).status_code == 422
    assert api.call("POST", "/api/v1/jobs").status_code == 422


def test_metrics_ingestion_needs_the_job_token(api: Api) -> None:
    job = submit(api)
    token = api.store.job_token(job)
    url = f"/api/v1/jobs/{job}/metrics"
    record = {
        "kind": "progress",
        "step": 40,
        "epoch": 2,
        "batch_size": 64,
        "local_bsz": 32,
        "accum_steps": 0,
        "loss": 0.5,
        "pgns": None,
    }
    assert api.client.post(url, json=record).status_code == 404
    assert api.client.post(url, params={"token": "x" * 32}, json=record).status_code == 404
    assert api.client.post(url, params={"token": token}, json=record).status_code == 204
    goodput = {
        "kind": "goodput",
        "perf": {
            "alpha_grad": 0.01,
            "beta_grad": 0.001,
            "alpha_local": 0.005,
            "beta_local": 0.001,
            "alpha_node": 0.01,
            "beta_node": 0.001,
            "gamma": 1.0,
        },
        "grad": {"sqr": 1.0, "var": 2.0},
        "current_goodput": 321.0,
    }
    assert api.client.post(url, params={"token": token}, json=goodput).status_code == 204
    metric = {"kind": "metric", "name": "accuracy", "value": 0.75, "step": 40}
    assert api.client.post(url, params={"token": token}, json=metric).status_code == 204
    for junk in (b"[1]", b"nope", b"null"):
        resp = api.client.post(url, params={"token": token}, content=junk)
        assert resp.status_code == 422, junk
    view = api.call("GET", f"/api/v1/jobs/{job}").json()
    assert (view["batch_size"], view["step"], view["goodput"]) == (64, 40, 321.0)
    assert view["metrics"] == {"accuracy": 0.75}
    assert api.call("GET", f"/api/v1/jobs/{job}/metrics").json()[0]["value"] == 0.75


def test_a_metric_keeps_the_time_it_was_reported(api: Api) -> None:
    """A record's own time is kept when it is plausible (up to MAX_RECORD_AGE_S before its
    arrival): a controller busy for a while must not shift curves and times to target."""
    job = submit(api)
    token = api.store.job_token(job)
    url = f"/api/v1/jobs/{job}/metrics"
    now = 1_000.0  # the fixture's clock
    for value, sent in ((1.0, now - 12.5), (2.0, now + 60.0), (3.0, now - 301.0), (4.0, "x")):
        record = {"kind": "metric", "name": "loss", "value": value, "time": sent}
        assert api.client.post(url, params={"token": token}, json=record).status_code == 204
    times = [m["time"] for m in api.call("GET", f"/api/v1/jobs/{job}/metrics").json()]
    # in the past and recent: kept; from the future, too old, or not a number: the arrival
    assert times == [now - 12.5, now, now, now]


def test_logs_chunks_and_offsets(api: Api, tmp_path: Path) -> None:
    job = submit(api)
    api.store.update_job(job, 1.0, state=JobState.RUNNING, attempt=1)
    log = tmp_path / "jobs" / job / "logs" / "attempt-1.rank-0.log"
    log.parent.mkdir(parents=True)
    log.write_text("hello\nworld\n")
    first = api.call("GET", f"/api/v1/jobs/{job}/logs", params={"limit": 6}).json()
    assert first["text"] == "hello\n" and first["next_offset"] == 6
    rest = api.call("GET", f"/api/v1/jobs/{job}/logs", params={"offset": 6}).json()
    assert rest["text"] == "world\n"
    missing = api.call("GET", f"/api/v1/jobs/{job}/logs", params={"attempt": 5})
    assert missing.status_code == 404


@pytest.mark.parametrize(
    ("method", "path", "kw"),
    [
        ("GET", "/api/v1/jobs/%00%ff", {}),
        ("GET", "/api/v1/jobs/" + "x" * 5000, {}),
        ("GET", "/api/v1/jobs", {"params": {"state": "SLEEPING"}}),
        ("GET", "/api/v1/jobs/x/logs", {"params": {"offset": -1}}),
        ("GET", "/api/v1/jobs/x/logs", {"params": {"rank": "a"}}),
        ("GET", "/api/v1/jobs/x/events", {"params": {"after": "z"}}),
        ("POST", "/api/v1/jobs", {"json": {"name": None}}),
        ("POST", "/api/v1/jobs", {"json": {"name": "a", "script": "x", "env": [1]}}),
        ("POST", "/api/v1/jobs", {"json": {"name": "a" * 1000, "script": "x"}}),
        ("POST", "/api/v1/jobs", {"json": {"name": "a", "command": ""}}),
        ("POST", "/api/v1/jobs", {"json": {"name": "a", "command": "'unclosed"}}),
        ("POST", "/api/v1/jobs", {"json": {"name": "a", "script": "x", "batch_size": 1e300}}),
        ("POST", "/api/v1/jobs", {"json": {"name": "a", "script": "x", "max_replicas": 2**70}}),
        ("POST", "/api/v1/tenants", {"json": {"name": 5}}),
        ("POST", "/api/v1/jobs/x/metrics", {"content": b"\xff" * 10}),
        ("DELETE", "/api/v1/jobs", {}),
    ],
)
def test_user_input_never_causes_a_5xx(api: Api, method: str, path: str, kw: Any) -> None:
    resp = api.call(method, path, "alice", **kw)
    assert 400 <= resp.status_code < 500, resp.text


def test_openapi_schema_is_served(api: Api) -> None:
    schema = api.client.get("/openapi.json").json()
    assert "/api/v1/jobs" in schema["paths"] and "/api/v1/cluster" in schema["paths"]
    assert api.client.get("/docs").status_code == 200


def test_cluster_view_follows_the_live_inventory(sqlite_store: Store, tmp_path: Path) -> None:
    """Nodes join and leave (Ray): the cluster view and /metrics read the loop's last view."""
    from prometheus_client.parser import text_string_to_metric_families

    clock = FakeClock()
    token = sqlite_store.create_tenant("root", clock(), is_admin=True)[1]
    nodes = [("a", 2), ("b", 4)]
    ctx = ApiContext(
        store=sqlite_store,
        state_dir=tmp_path,
        slots=1,
        policy="pollux",
        clock=clock,
        inventory=lambda: list(nodes),
    )
    client = SyncASGI(create_app(ctx))
    auth = {"Authorization": f"Bearer {token}"}

    def view() -> tuple[int, list[str], float]:
        body = client.get("/api/v1/cluster", headers=auth).json()
        text = client.get("/metrics", headers=auth).text
        total = next(
            s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name == "coadapt_slots_total"
        )
        return body["slots"], [n["name"] for n in body["nodes"]], total

    assert view() == (6, ["a", "b"], 6.0)
    nodes[:] = [("a", 2)]  # node b left
    assert view() == (2, ["a"], 2.0)

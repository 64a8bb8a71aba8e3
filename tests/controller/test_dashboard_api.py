"""The dashboard's read endpoints in-process (httpx ASGI transport): auth, tenant isolation
and anonymisation, the recorded time series, step times against the throughput model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coadapt.controller.api import ApiContext
from coadapt.controller.dashboard.routes import Rep, total_work, utilisation
from coadapt.controller.states import JobState
from coadapt.controller.store import Store
from coadapt.goodput import PerfParams, iter_time
from coadapt.service import create_app
from tests.controller.conftest import FakeClock
from tests.controller.test_api import Api, SyncASGI, submit
from tests.controller.test_snapshot import PERF


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def api(sqlite_store: Store, tmp_path: Path, clock: FakeClock) -> Iterator[Api]:
    tokens = {}
    for name, admin in (("root", True), ("alice", False), ("bob", False)):
        tokens[name] = sqlite_store.create_tenant(name, clock(), is_admin=admin)[1]
    ctx = ApiContext(store=sqlite_store, state_dir=tmp_path, slots=4, policy="pollux", clock=clock)
    yield Api(SyncASGI(create_app(ctx)), sqlite_store, tokens)


def post(api: Api, job: str, record: dict[str, Any]) -> None:
    resp = api.client.post(
        f"/api/v1/jobs/{job}/metrics", params={"token": api.store.job_token(job)}, json=record
    )
    assert resp.status_code == 204, resp.text


def run(api: Api, job: str, slots: list[int], now: float, node: str = "local") -> None:
    """Mark ``job`` running on ``slots`` (as the reconciler would) with an alloc event."""
    api.store.update_job(
        job,
        now,
        state=JobState.RUNNING,
        replicas=len(slots),
        attempt=1,
        started_at=now,
        event=("alloc", f"{len(slots)} slot(s)"),
        event_data={"replicas": len(slots), "slots": slots},
    )
    for rank, slot in enumerate(slots):
        api.store.add_replica(job, 1, rank, slot, "/tmp/r", "/tmp/l", now)


def test_static_app_is_served_without_a_token(api: Api) -> None:
    index = api.client.get("/")
    assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
    assert "connect-src 'self'" in index.headers["content-security-policy"]
    assert '<script src="/ui/app.js"' in index.text
    for path, kind in (
        ("/ui/app.js", "javascript"),
        ("/ui/style.css", "text/css"),
        ("/ui/favicon.svg", "image/svg"),
    ):
        resp = api.client.get(path)
        assert resp.status_code == 200 and kind in resp.headers["content-type"], path
    assert api.client.get("/ui/nope.js").status_code == 404
    assert api.client.get("/healthz").json()["ok"] is True  # nothing shadowed


def test_ui_endpoints_need_a_token(api: Api) -> None:
    job = submit(api, "alice")
    for path in (
        "/api/v1/ui/features",
        "/api/v1/ui/cluster",
        "/api/v1/ui/jobs",
        f"/api/v1/ui/jobs/{job}",
        "/api/v1/ui/simulations",
    ):
        assert api.call("GET", path, None).status_code == 401, path
        assert api.call("GET", path, "alice").status_code == 200, path


def test_a_tenant_sees_only_its_jobs_and_others_anonymised(api: Api, clock: FakeClock) -> None:
    a = submit(api, "alice", name="alice-job")
    b = submit(api, "bob", name="bob-job")
    run(api, a, [0], clock())
    run(api, b, [1, 2], clock())
    clock.advance(30)

    assert [j["id"] for j in api.call("GET", "/api/v1/ui/jobs", "alice").json()["jobs"]] == [a]
    assert {j["id"] for j in api.call("GET", "/api/v1/ui/jobs", "root").json()["jobs"]} == {a, b}
    missing = api.call("GET", f"/api/v1/ui/jobs/{b}", "alice")
    assert missing.status_code == 404 and missing.json()["error"]
    assert api.call("GET", f"/api/v1/ui/jobs/{b}", "bob").status_code == 200

    view = api.call("GET", "/api/v1/ui/cluster", "alice").json()
    by_slot = {r["slot"]: r for r in view["replicas"]}
    assert by_slot[0]["job_id"] == a and by_slot[0]["name"] == "alice-job"
    assert by_slot[0]["tenant"] == "alice" and not by_slot[0]["other"]
    for slot in (1, 2):
        assert by_slot[slot] == {"node": "local", "slot": slot, "status": "starting", "other": True}
    text = json.dumps(view)
    assert b not in text and "bob" not in text
    series = {s["name"]: s for s in view["utilisation"]["jobs"]}
    assert set(series) == {"alice-job", "other tenants"}
    assert series["other tenants"]["job_id"] is None
    assert series["other tenants"]["points"][-1][1] == 2
    assert view["utilisation"]["total"][-1][1] == 3

    admin = api.call("GET", "/api/v1/ui/cluster", "root").json()
    assert {r["job_id"] for r in admin["replicas"]} == {a, b}
    assert not any(r["other"] for r in admin["replicas"])


def test_timelines_step_times_and_model(api: Api, clock: FakeClock) -> None:
    job = submit(api, "alice", args=["--steps", "100"])
    run(api, job, [0], clock())
    for i in range(1, 5):  # a progress and a goodput record every 10 steps, 2 s apart
        clock.advance(2.0)
        post(
            api,
            job,
            {
                "kind": "progress",
                "step": 10 * i,
                "epoch": 0,
                "batch_size": 32,
                "local_bsz": 32,
                "accum_steps": 0,
                "replicas": 1,
                "lr_scale": 1.0,
                "pgns": 50.0 + i,
                "loss": 1.0 / i,
            },
        )
        post(
            api,
            job,
            {
                "kind": "goodput",
                "step": 10 * i,
                "pgns": 50.0 + i,
                "perf": PERF,
                "grad": {"sqr": 1.0, "var": 2.0},
                "profile": [
                    {
                        "nodes": 1,
                        "replicas": 1,
                        "local_bsz": 32,
                        "accum_steps": 0,
                        "iter_time": 0.2,
                        "count": 5,
                    }
                ],
                "current_goodput": 100.0 * i,
            },
        )
    post(api, job, {"kind": "metric", "name": "accuracy", "value": 0.5, "step": 40})

    # the public metrics list is unchanged: only what the job reported as a metric
    public = api.call("GET", f"/api/v1/jobs/{job}/metrics").json()
    assert [(m["name"], m["value"]) for m in public] == [("accuracy", 0.5)]

    d = api.call("GET", f"/api/v1/ui/jobs/{job}").json()
    assert [p[1] for p in d["series"]["goodput"]] == [100.0, 200.0, 300.0, 400.0]
    assert [p[1] for p in d["series"]["batch_size"]] == [32.0] * 4
    assert [p[2] for p in d["series"]["step"]] == [10, 20, 30, 40]
    assert len(d["series"]["pgns"]) == 8  # both record kinds carry φ
    assert d["user_metrics"] == {"accuracy": [[clock(), 0.5, 40]]}
    assert [p[1] for p in d["alloc"]] == [1.0]
    perf = PerfParams(**PERF)
    expected = float(iter_time(perf, 1, 1, 32, 0))
    assert [p[1] for p in d["step_times"]] == pytest.approx([0.2, 0.2, 0.2])  # 2 s / 10 steps
    assert [p[2] for p in d["step_times"]] == pytest.approx([expected] * 3)
    model = d["model"]
    assert model["source"] == "reported" and model["perf"] == pytest.approx(PERF)
    assert model["profile"][0]["predicted"] == pytest.approx(expected)
    [curve] = model["curves"]
    assert (curve["nodes"], curve["replicas"], curve["accum_steps"]) == (1, 1, 0)
    m, t = curve["points"][0]
    assert t == pytest.approx(float(iter_time(perf, 1, 1, m, 0)))

    jobs = api.call("GET", "/api/v1/ui/jobs").json()["jobs"]
    [row] = [j for j in jobs if j["id"] == job]
    assert row["progress"] == pytest.approx(0.4)
    assert row["eta_s"] == pytest.approx(60 / 5.0)  # 60 steps left at 5 steps/s
    assert row["lr_scale"] == 1.0 and row["total"] == {"unit": "steps", "value": 100.0}
    assert row["allocation"] == {"local": 1}


def test_a_restart_gap_is_not_a_step_time(api: Api, clock: FakeClock) -> None:
    job = submit(api, "alice")
    run(api, job, [0], clock())
    rec = {"kind": "progress", "batch_size": 32, "local_bsz": 32, "accum_steps": 0, "replicas": 1}
    clock.advance(1)
    post(api, job, {**rec, "step": 5})
    clock.advance(1)
    post(api, job, {**rec, "step": 10})
    clock.advance(20)  # checkpoint-restart on the same number of replicas
    api.store.add_event(job, "alloc", "attempt 2", clock(), {"replicas": 1})
    clock.advance(1)
    post(api, job, {**rec, "step": 15})
    d = api.call("GET", f"/api/v1/ui/jobs/{job}").json()
    assert [p[1] for p in d["step_times"]] == pytest.approx([0.2])


def test_features_and_simulation_folder(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = api.call("GET", "/api/v1/ui/features").json()
    served = "/api/v1/experiments" in api.call("GET", "/openapi.json").json()["paths"]
    assert f == {"experiments": served, "simulations_dir": False, "tenant": "alice", "admin": False}
    assert api.call("GET", "/api/v1/ui/simulations").json() == {"configured": False, "files": []}
    sims = tmp_path / "sims"
    sims.mkdir()
    (sims / "a.json").write_text(json.dumps([{"policy": "pollux"}]))
    (sims / "notes.txt").write_text("x")
    monkeypatch.setenv("COADAPT_DASHBOARD_SIM_DIR", str(sims))
    assert api.call("GET", "/api/v1/ui/simulations").json() == {
        "configured": True,
        "files": ["a.json"],
    }
    assert api.call("GET", "/api/v1/ui/simulations/a.json").json() == [{"policy": "pollux"}]
    for bad in ("notes.txt", "..%2Fsecret.json", "missing.json"):
        assert api.call("GET", f"/api/v1/ui/simulations/{bad}").status_code == 404, bad


def test_utilisation_is_a_step_function_per_job() -> None:
    reps = [
        Rep("a", "n1", 0, 0, 1, "exited", 10.0, 20.0),
        Rep("a", "n1", 1, 1, 1, "exited", 10.0, 20.0),
        Rep("a", "n1", 0, 0, 2, "live", 25.0, None),
        Rep("b", "n2", 0, 0, 1, "live", 15.0, None),
    ]
    u = utilisation(reps, {"a"}, 0.0, 30.0)
    assert u["total"] == [
        [0.0, 0.0],
        [10.0, 2.0],
        [15.0, 3.0],
        [20.0, 1.0],
        [25.0, 2.0],
        [30.0, 2.0],
    ]
    [a, other] = u["jobs"]
    assert a["job_id"] == "a" and a["points"] == [
        [0.0, 0.0],
        [10.0, 2.0],
        [20.0, 0.0],
        [25.0, 1.0],
        [30.0, 1.0],
    ]
    assert other["other"] and other["points"] == [[0.0, 0.0], [15.0, 1.0], [30.0, 1.0]]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--steps", "400"], ("steps", 400.0)),
        (["--epochs=30", "--lr", "0.1"], ("epochs", 30.0)),
        (["--max-steps", "x"], None),
        ([], None),
    ],
)
def test_total_work_comes_from_the_arguments(
    api: Api, args: list[str], expected: tuple[str, float] | None
) -> None:
    job = submit(api, "alice", args=args)
    assert total_work(api.store.get_job(job)) == expected

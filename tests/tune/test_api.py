"""The experiment routes in-process (httpx ASGI transport): submit, list, show, cancel,
tenant isolation and field-naming rejections; plus the CLI's plot and local validation."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coadapt.controller.api import ApiContext
from coadapt.controller.db import sqlite_url
from coadapt.controller.states import JobState
from coadapt.controller.store import Store
from coadapt.service import create_app
from coadapt.tune.runner import TuneRunner
from tests.controller.conftest import FakeClock
from tests.controller.test_api import SyncASGI
from tests.tune.test_runner import exp_spec


class Api:
    def __init__(self, store: Store, tmp_path: Path) -> None:
        self.store = store
        self.clock = FakeClock()
        self.tokens: dict[str, str] = {}
        for name, admin in (("root", True), ("alice", False), ("bob", False)):
            self.tokens[name] = store.create_tenant(name, self.clock(), is_admin=admin)[1]
        ctx = ApiContext(store=store, state_dir=tmp_path, slots=4, policy="fifo", clock=self.clock)
        self.client = SyncASGI(create_app(ctx))
        self.runner = TuneRunner(store, 4, "fifo", self.clock)

    def call(self, method: str, path: str, who: str = "alice", **kw: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"}
        return self.client.request(method, path, headers=headers, **kw)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    store = Store.open(sqlite_url(tmp_path / "api.db"))
    a = Api(store, tmp_path)
    yield a
    a.runner.close()
    store.close()


def test_submit_list_show_cancel(api: Api) -> None:
    r = api.call("POST", "/api/v1/experiments", json=exp_spec(target=0.9))
    assert r.status_code == 201, r.text
    exp = r.json()["experiment"]
    assert exp["state"] == "RUNNING" and exp["tenant"] == "alice"
    assert exp["objective"] == {"metric": "accuracy", "direction": "maximize"}
    api.runner.step()
    listing = api.call("GET", "/api/v1/experiments").json()["experiments"]
    assert [e["id"] for e in listing] == [exp["id"]]
    assert listing[0]["n_trials"] == 2 and listing[0]["n_running"] == 2
    assert listing[0]["target"] == 0.9 and listing[0]["created_at"] == 1000.0
    # a trial reports, the loop records the curve
    detail = api.call("GET", f"/api/v1/experiments/{exp['id']}").json()
    job_id = detail["trials"][0]["job_id"]
    api.store.update_job(job_id, api.clock(), state=JobState.RUNNING, started_at=1000.0)
    api.store.add_metric(job_id, "accuracy", 0.5, 1, api.clock.advance(1))
    api.runner.step()
    detail = api.call("GET", f"/api/v1/experiments/{exp['id']}").json()
    assert detail["trials"][0]["curve"] == [[1.0, 0.5]]
    assert set(detail["trials"][0]) >= {"number", "state", "params", "value", "job_id", "curve"}
    assert detail["best_history"] == [[1001.0, 0.5]]
    assert detail["experiment"]["best_value"] == 0.5
    r = api.call("POST", f"/api/v1/experiments/{exp['id']}/cancel")
    assert r.status_code == 200 and r.json()["experiment"]["state"] == "CANCELLED"
    assert api.call("POST", f"/api/v1/experiments/{exp['id']}/cancel").status_code == 409
    api.runner.step()
    assert api.store.get_job(job_id).state is JobState.CANCELLED


def test_tenants_see_only_their_experiments(api: Api) -> None:
    mine = api.call("POST", "/api/v1/experiments", json=exp_spec()).json()["experiment"]
    theirs = api.call("POST", "/api/v1/experiments", json=exp_spec(), who="bob").json()
    theirs = theirs["experiment"]
    ids = [e["id"] for e in api.call("GET", "/api/v1/experiments").json()["experiments"]]
    assert ids == [mine["id"]]
    assert api.call("GET", f"/api/v1/experiments/{theirs['id']}").status_code == 404
    assert api.call("POST", f"/api/v1/experiments/{theirs['id']}/cancel").status_code == 404
    assert api.call("GET", "/api/v1/experiments/nope").status_code == 404
    root = api.call("GET", "/api/v1/experiments", who="root").json()["experiments"]
    assert {e["tenant"] for e in root} == {"alice", "bob"}
    r = api.client.request("GET", "/api/v1/experiments")
    assert r.status_code == 401


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"space": {"lr": {"type": "float", "low": 2.0, "high": 1.0}}}, "space.lr.low"),
        ({"sampler": "annealing"}, "sampler"),
        ({"trial": {"working_dir": "/tmp"}}, "trial"),
        ({"parallelism": 0}, "parallelism"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_bad_specs_are_422_naming_the_field(api: Api, patch: dict[str, Any], field: str) -> None:
    r = api.call("POST", "/api/v1/experiments", json=exp_spec(**patch))
    assert r.status_code == 422, r.text
    body = r.json()
    assert any(d["field"].startswith(field) for d in body["details"]), body
    assert api.call("GET", "/api/v1/experiments").json()["experiments"] == []


def test_gp_ei_on_a_controller_without_torch_is_422_naming_the_extra(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPSampler needs torch: refused at submission, not failed (or swapped) later."""
    real = importlib.util.find_spec

    def no_torch(name: str, *args: Any) -> Any:
        return None if name == "torch" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", no_torch)
    r = api.call("POST", "/api/v1/experiments", json=exp_spec(sampler="gp-ei"))
    assert r.status_code == 422, r.text
    (detail,) = r.json()["details"]
    assert detail["field"] == "sampler" and "coadapt[train]" in detail["message"]
    assert api.call("GET", "/api/v1/experiments").json()["experiments"] == []
    ok = api.call("POST", "/api/v1/experiments", json=exp_spec(sampler="tpe"))
    assert ok.status_code == 201, ok.text


def test_a_non_mapping_body_is_422(api: Api) -> None:
    r = api.call("POST", "/api/v1/experiments", json=[1, 2])
    assert r.status_code == 422


def test_cli_plot_and_local_validation(api: Api, tmp_path: Path) -> None:
    from coadapt.cli import main
    from coadapt.cli.tune import plot_experiment

    exp = api.call("POST", "/api/v1/experiments", json=exp_spec(target=0.9)).json()
    exp_id = exp["experiment"]["id"]
    api.runner.step()
    detail = api.call("GET", f"/api/v1/experiments/{exp_id}").json()
    job_id = detail["trials"][0]["job_id"]
    api.store.update_job(job_id, api.clock(), state=JobState.RUNNING, started_at=1000.0)
    for step, v in enumerate((0.5, 0.7, 0.8), 1):
        api.store.add_metric(job_id, "accuracy", v, step, api.clock.advance(1))
    api.runner.step()
    out = tmp_path / "exp.png"
    plot_experiment(api.call("GET", f"/api/v1/experiments/{exp_id}").json(), out)
    assert out.stat().st_size > 5000 and out.read_bytes()[:4] == b"\x89PNG"
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nspace: {}\nobjective: {metric: acc}\ntrial: {script: t.py}\n")
    # rejected locally (exit 2) before any connection is attempted
    assert main(["tune", "submit", str(bad), "--server", "http://127.0.0.1:9"]) == 2
    assert (
        main(["tune", "ls", "--server", "http://127.0.0.1:9", "--token", "x", "--retry", "0"]) == 3
    )

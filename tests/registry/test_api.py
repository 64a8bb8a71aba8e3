"""The model routes in-process (httpx ASGI transport): tenant isolation, field-naming
rejections, and the promote / delete rules answered as 4xx with the reason."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coadapt.controller.api import ApiContext
from coadapt.controller.db import sqlite_url
from coadapt.controller.store import Store
from coadapt.registry.runner import RegistryRunner
from coadapt.serve import artifacts
from coadapt.service import create_app
from tests.controller.conftest import FakeClock
from tests.controller.test_api import SyncASGI
from tests.registry.conftest import publish


class Api:
    def __init__(self, store: Store, tmp_path: Path) -> None:
        self.clock = FakeClock()
        self.tokens = {
            name: store.create_tenant(name, self.clock(), is_admin=admin)[1]
            for name, admin in (("root", True), ("alice", False), ("bob", False))
        }
        ctx = ApiContext(store=store, state_dir=tmp_path, slots=1, policy="fifo", clock=self.clock)
        self.runner = RegistryRunner(store, self.clock, state_dir=tmp_path / "state")
        self.client = SyncASGI(create_app(ctx, self.runner))

    def call(self, method: str, path: str, who: str = "alice", **kw: Any) -> Any:
        return self.client.request(
            method, path, headers={"Authorization": f"Bearer {self.tokens[who]}"}, **kw
        )


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    store = Store.open(sqlite_url(tmp_path / "api.db"))
    yield Api(store, tmp_path)
    store.close()


def test_models_are_private_to_their_tenant(api: Api, tmp_path: Path) -> None:
    root = tmp_path / "mlp"
    root.mkdir()
    r = api.call("POST", "/api/v1/models", json={"name": "mlp", "root": str(root)})
    assert r.status_code == 201, r.text
    assert r.json()["model"]["tenant"] == "alice"
    assert api.call("GET", "/api/v1/models", "bob").json() == {"models": []}
    assert api.call("GET", "/api/v1/models/mlp", "bob").status_code == 404
    assert api.call("POST", "/api/v1/models/mlp/rollback", "bob").status_code == 404
    assert api.call("DELETE", "/api/v1/models/mlp", "bob").status_code == 404
    listing = api.call("GET", "/api/v1/models", "root").json()["models"]
    assert [(m["name"], m["tenant"]) for m in listing] == [("mlp", "alice")]
    assert api.call("GET", "/api/v1/models/mlp?owner=alice", "root").status_code == 200
    again = api.call("POST", "/api/v1/models", json={"name": "mlp", "root": str(root)})
    assert again.status_code == 409
    assert api.call("DELETE", "/api/v1/models/mlp").json() == {"forgotten": "mlp"}
    assert api.call("GET", "/api/v1/models/mlp").status_code == 404


def test_bad_specs_name_their_fields(api: Api) -> None:
    body = {
        "name": "bad name!",
        "root": "relative/dir",
        "gates": {"metrics": [{"metric": "f1", "min": 1}], "bogus": 1},
    }
    r = api.call("POST", "/api/v1/models", json=body)
    assert r.status_code == 422
    fields = {d["field"] for d in r.json()["details"]}
    assert {"name", "root", "gates.metrics.0.metric", "gates.bogus"} <= fields
    r = api.call("POST", "/api/v1/models", json={"name": "m", "root": "/", "gates": {
        "metrics": [{"metric": "auc", "min": 0.7}]}})  # fmt: skip
    assert r.status_code == 422 and "give replay" in r.text
    assert api.call("POST", "/api/v1/models", json=[1]).status_code == 422


def test_promotion_needs_passed_gates(api: Api, tmp_path: Path) -> None:
    root = tmp_path / "mlp"
    root.mkdir()
    assert api.call("POST", "/api/v1/models", json={"name": "mlp", "root": str(root)}).is_success
    publish(root, seed=1)
    assert api.call("POST", "/api/v1/models/mlp/sync").json() == {"registered": ["00000001"]}
    r = api.call("POST", "/api/v1/models/mlp/promote", json={"version": "00000001"})
    assert r.status_code == 409 and "is registered" in r.json()["message"]
    assert api.call("POST", "/api/v1/models/mlp/promote", json={}).status_code == 422
    alice = api.runner.store.tenant_by_name("alice")
    assert alice is not None
    api.runner.sync(api.runner.registry.find_model("mlp", alice))
    r = api.call("POST", "/api/v1/models/mlp/promote", json={"version": "00000001"})
    assert r.status_code == 200, r.text
    assert r.json()["promotion"]["to_version"] == "00000001"
    assert r.json()["promotion"]["who"] == "alice"
    assert artifacts.live_version(root) == "00000001"
    shown = api.call("GET", "/api/v1/models/mlp").json()
    assert shown["model"]["live"] == "00000001" and shown["model"]["states"] == {"live": 1}
    v = api.call("GET", "/api/v1/models/mlp/versions/00000001").json()["version"]
    assert v["lineage"] == {"job_id": "job-1", "step": 10, "data_offset": 1000}
    assert v["checks"][0]["name"] == "integrity" and v["checks"][0]["status"] == "passed"
    r = api.call("DELETE", "/api/v1/models/mlp/versions/00000001")
    assert r.status_code == 409 and "is live" in r.json()["message"]
    r = api.call("POST", "/api/v1/models/mlp/rollback")
    assert r.status_code == 409 and "no previous live version" in r.json()["message"]
    assert api.call("GET", "/api/v1/models/mlp/versions/00000009").status_code == 404

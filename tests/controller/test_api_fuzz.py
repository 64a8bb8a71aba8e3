"""The OpenAPI schema tells the truth (issue 13, point 6): a bounded schemathesis pass against
a live controller finds no 5xx, schema-valid submissions are accepted and every status it
answers is declared; the doc pages load nothing from the internet.

The full run (>= 5,000 requests) is ``benchmarks/api_fuzz.py``; this is its short form.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from coadapt.controller.api import ApiContext
from coadapt.controller.db import sqlite_url
from coadapt.controller.store import Store
from coadapt.service import create_app
from tests.controller.test_api import SyncASGI
from tests.requirements import unavailable


@pytest.fixture
def client(tmp_path: Path) -> SyncASGI:
    store = Store.open(sqlite_url(tmp_path / "db.sqlite"))
    ctx = ApiContext(store=store, state_dir=tmp_path, slots=1, policy="pollux", clock=lambda: 1.0)
    return SyncASGI(create_app(ctx))


def test_schemathesis_finds_no_5xx(tmp_path: Path) -> None:
    if importlib.util.find_spec("schemathesis") is None:
        unavailable("schemathesis is not installed (pip install -e '.[fuzz]')")
    from benchmarks.api_fuzz import fuzz_server, run_fuzz

    with fuzz_server(tmp_path) as server:
        result = run_fuzz(server, min_requests=300, seed=1, examples=3, time_limit=50.0)
    assert result.requests >= 300, result.as_json()
    assert result.server_errors == [], result.server_errors
    assert result.transport_errors == [], result.transport_errors
    assert result.accepted_submissions.get("POST /api/v1/jobs", 0) > 0, result.as_json()
    assert dict(result.undeclared) == {}, (result.undeclared, result.undeclared_samples)


def test_schema_declares_bodies_errors_and_the_bearer_scheme(client: SyncASGI) -> None:
    schema = client.get("/openapi.json").json()
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    comps = schema["components"]["schemas"]
    assert {"JobSpec", "ExperimentSpec", "ErrorBody", "TenantIn"} <= set(comps)
    assert "HTTPValidationError" not in comps  # FastAPI's 422 body is not what we send
    jobs = schema["paths"]["/api/v1/jobs"]["post"]
    body = jobs["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/JobSpec"}
    assert {"401", "413", "422"} <= set(jobs["responses"])
    # The schema is the validator's: limits and field text come from coadapt.controller.spec.
    args = comps["JobSpec"]["properties"]["args"]
    assert args["maxItems"] == 4096 and "list of strings" in args["description"]
    cancel = schema["paths"]["/api/v1/jobs/{job_id}/cancel"]["post"]
    assert {"401", "404", "409"} <= set(cancel["responses"])
    assert cancel["security"] == [{"HTTPBearer": []}]
    err = cancel["responses"]["404"]["content"]["application/json"]["schema"]
    assert err == {"$ref": "#/components/schemas/ErrorBody"}
    trial = comps["ExperimentSpec"]["properties"]["trial"]
    assert "name" not in trial.get("required", []) and "script" in trial["properties"]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_doc_pages_load_nothing_from_the_internet(client: SyncASGI, page: str) -> None:
    html = client.get(page).text
    assert "http://" not in html and "https://" not in html, html
    assets = re.findall(r'(?:src|href)="(/[^"]+)"', html)
    assert any(a.endswith(".js") for a in assets), html
    for asset in assets:
        resp = client.get(asset)
        assert resp.status_code == 200 and len(resp.content) > 500, asset

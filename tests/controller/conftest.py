"""Fixtures for the controller tests: a store on every backend, a fake clock, builders."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from coadapt.controller.db import sqlite_url
from coadapt.controller.reconciler import Controller
from coadapt.controller.spec import parse_spec
from coadapt.controller.store import Job, Store, Tenant
from coadapt.executors import FakeExecutor
from tests.requirements import unavailable

HERE = Path(__file__).resolve().parent
TINY_JOB = HERE / "tiny_job.py"
PG_CANDIDATES = (
    os.environ.get("COADAPT_TEST_PG_URL", ""),
    "postgresql://postgres@127.0.0.1:5432/test",
    "postgresql://root@127.0.0.1:5432/test",
)


class FakeClock:
    """A clock the test moves by hand (the loop takes ``clock`` as a parameter)."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def _pg_admin() -> tuple[str | None, str]:
    """A working admin URL for PostgreSQL, or None and the reason none answered."""
    import psycopg

    errors = []
    for url in PG_CANDIDATES:
        if not url:
            continue
        try:
            with psycopg.connect(url, connect_timeout=3, autocommit=True) as conn:
                conn.execute("SELECT 1")
            return url, ""
        except psycopg.Error as exc:
            errors.append(f"{url}: {str(exc).strip().splitlines()[0]}")
    return None, "; ".join(errors)


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    url, why = _pg_admin()
    if url is None:
        unavailable(f"PostgreSQL half skipped: no server answered ({why})")
    return url


def _pg_database(admin_url: str) -> Iterator[str]:
    """A uniquely named database for one test, dropped afterwards."""
    import psycopg

    name = f"coadapt_test_{secrets.token_hex(6)}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = admin_url.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database on each backend (the storage conformance suite runs on both)."""
    if request.param == "sqlite":
        yield sqlite_url(tmp_path / "coadapt.db")
        return
    admin = request.getfixturevalue("pg_admin_url")
    yield from _pg_database(admin)


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store.open(db_url)
    yield s
    s.close()


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(sqlite_url(tmp_path / "coadapt.db"))
    yield s
    s.close()


def make_spec(**overrides: Any) -> dict[str, Any]:
    """A valid job spec; override any field (builder, in the Kueue ``MakeWorkload`` style)."""
    spec: dict[str, Any] = {
        "name": "job",
        "script": str(TINY_JOB),
        "args": ["--steps", "10"],
        "working_dir": str(HERE),
        "batch_size": 32,
        "max_batch_size": 256,
        "min_replicas": 1,
        "max_replicas": 4,
        "max_restarts": 2,
    }
    spec.update(overrides)
    return {k: v for k, v in spec.items() if v is not None}


@dataclass
class Rig:
    """A controller on the fake executor with a hand-moved clock (the loop tests' harness)."""

    store: Store
    executor: FakeExecutor
    clock: FakeClock
    controller: Controller
    tenant: Tenant
    policy: Any

    def submit(self, **overrides: Any) -> Job:
        return self.store.create_job(self.tenant, parse_spec(make_spec(**overrides)), self.clock())

    def job(self, job_id: str) -> Job:
        return self.store.get_job(job_id)

    def step(self, n: int = 1, advance: float = 0.0) -> None:
        for _ in range(n):
            self.clock.advance(advance)
            self.controller.step()

"""A job's reported progress reaches the policy: the training library's ``fraction`` (epochs
done over the epochs declared in ``loader.epochs(n)``) is stored with the job's report and
read into ``JobFacts.progress``; nothing declared, or a garbled value, reads as unknown."""

from __future__ import annotations

from typing import Any

import pytest

from coadapt.controller.api import ingest_record
from coadapt.controller.snapshot import job_facts
from coadapt.controller.spec import parse_spec
from coadapt.controller.store import Store
from tests.controller.conftest import make_spec


def _progress(store: Store, record: dict[str, Any] | None) -> float | None:
    tenant = store.create_tenant("alice", 0.0)[0]
    job = store.create_job(tenant, parse_spec(make_spec()), 1.0)
    if record is not None:
        ingest_record(store, job.id, {"kind": "progress", "step": 5, **record}, 2.0)
    return job_facts(store.get_job(job.id)).progress


def test_reported_fraction_is_the_jobs_progress(sqlite_store: Store) -> None:
    assert _progress(sqlite_store, {"epoch": 1, "fraction": 0.25}) == 0.25


@pytest.mark.parametrize("record", [None, {"epoch": 1}, {"fraction": "half"}, {"fraction": None}])
def test_no_declared_length_is_unknown(sqlite_store: Store, record: dict[str, Any] | None) -> None:
    assert _progress(sqlite_store, record) is None

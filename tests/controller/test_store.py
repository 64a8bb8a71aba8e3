"""Storage conformance: the same contract on SQLite and PostgreSQL (STYLE §8)."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from coadapt.controller.db import (
    VERSION_TABLE,
    current_heads,
    head_revisions,
    make_engine,
    migrate,
)
from coadapt.controller.errors import (
    AuthError,
    ConflictError,
    InvalidTransitionError,
    NotFoundError,
    SpecError,
)
from coadapt.controller.models import Base
from coadapt.controller.spec import parse_spec
from coadapt.controller.states import JobState
from coadapt.controller.store import Store
from coadapt.deploy import tables as deploy_tables
from coadapt.protocol import CancelCause
from coadapt.registry import tables as registry_tables
from coadapt.tune import tables as tune_tables
from tests.controller.conftest import make_spec


def test_migration_from_empty_database_matches_the_models(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        assert current_heads(engine) == frozenset()
        migrate(engine)
        migrate(engine)  # idempotent: a restart migrates again
        assert current_heads(engine) == head_revisions()
        with engine.connect() as conn:
            # The tuning tables (coadapt.tune.tables) share the controller's metadata.
            assert tune_tables.TrialRow.metadata is Base.metadata
            assert registry_tables.VersionRow.metadata is Base.metadata  # so are the registry's
            assert deploy_tables.DeploymentRow.metadata is Base.metadata  # and deployments'
            context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            diff = compare_metadata(context, Base.metadata)
        assert diff == [], f"models and migrations disagree: {diff}"
    finally:
        engine.dispose()


def test_upgrade_from_0001_keeps_rows_and_defaults_the_node(db_url: str) -> None:
    """A database written by the single-node release (revision 0001) upgrades in place."""
    engine = make_engine(db_url)
    try:
        migrate(engine, "0001")
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO tenants (id, name, is_admin, created_at) VALUES ('t1', 'a', false, 0)"
            )
            conn.exec_driver_sql(
                "INSERT INTO jobs (id, tenant_id, name, spec, state, priority, submit_time,"
                " updated_at, attempt, replicas, desired_replicas, num_restarts, failures,"
                " not_before, attained_service, max_gpus_held)"
                " VALUES ('j1', 't1', 'old', '{}', 'RUNNING', 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1)"
            )
            conn.exec_driver_sql(
                "INSERT INTO replicas (job_id, attempt, rank, slot, status, run_dir, log_path,"
                " started_at) VALUES ('j1', 1, 0, 0, 'live', '/r', '/l', 0)"
            )
        migrate(engine)
        assert current_heads(engine) == head_revisions()
        with engine.connect() as conn:
            node = conn.exec_driver_sql("SELECT node FROM replicas").scalar_one()
            alloc = conn.exec_driver_sql("SELECT allocation FROM jobs").scalar_one()
        assert node == "local"
        assert alloc is None
    finally:
        engine.dispose()


def test_upgrade_to_0005_derives_the_cancel_cause_from_old_reasons(db_url: str) -> None:
    """Jobs the tuning loop cancelled before ``cancel_cause`` existed keep their meaning."""
    engine = make_engine(db_url)
    rows = {
        "p": ("CANCELLED", "tune: pruned: below the median at step 40"),
        "q": ("CANCELLED", "tune: preempted for #3"),
        "d": ("CANCELLED", "tune: dead: no report for 600s"),
        "e": ("CANCELLED", "tune: experiment ended: target reached"),
        "u": ("CANCELLED", "cancelled by alice"),
        "f": ("FAILED", "tune: pruned lookalike on a failed job"),
        "n": ("SUCCEEDED", None),
    }
    try:
        migrate(engine, "0004")
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO tenants (id, name, is_admin, created_at) VALUES ('t1', 'a', false, 0)"
            )
            for job_id, (state, reason) in rows.items():
                conn.execute(
                    sa.text(
                        "INSERT INTO jobs (id, tenant_id, name, spec, state, priority,"
                        " submit_time, updated_at, attempt, replicas, desired_replicas,"
                        " num_restarts, failures, not_before, attained_service, max_gpus_held,"
                        " reason) VALUES (:id, 't1', 'old', '{}', :state, 0, 0, 0, 1, 0, 0, 0,"
                        " 0, 0, 0, 1, :reason)"
                    ),
                    {"id": job_id, "state": state, "reason": reason},
                )
        migrate(engine)
        assert current_heads(engine) == head_revisions()
        with engine.connect() as conn:
            got = dict(conn.exec_driver_sql("SELECT id, cancel_cause FROM jobs").all())
        assert got == {
            "p": "tune-pruned",
            "q": "tune-preempted",
            "d": "tune-dead",
            "e": "tune-ended",
            "u": "user",
            "f": None,
            "n": None,
        }
        assert {c.value for c in CancelCause} >= {v for v in got.values() if v is not None}
    finally:
        engine.dispose()


def test_tenants_and_tokens(store: Store) -> None:
    alice, token = store.create_tenant("alice", 1.0)
    assert store.authenticate(token) == alice
    with pytest.raises(ConflictError):
        store.create_tenant("alice", 2.0)
    with pytest.raises(AuthError):
        store.authenticate("nope")
    with pytest.raises(AuthError):
        store.authenticate(None)
    store.add_token(alice.id, "extra-token", 3.0)
    store.add_token(alice.id, "extra-token", 3.0)  # idempotent
    assert store.authenticate("extra-token").name == "alice"
    assert [t.name for t in store.tenants()] == ["alice"]


def test_jobs_are_visible_to_their_tenant_only(store: Store) -> None:
    alice, _ = store.create_tenant("alice", 1.0)
    bob, _ = store.create_tenant("bob", 1.0)
    admin, _ = store.create_tenant("root", 1.0, is_admin=True)
    a = store.create_job(alice, parse_spec(make_spec(name="a")), 10.0)
    b = store.create_job(bob, parse_spec(make_spec(name="b")), 11.0)
    assert [j.id for j in store.list_jobs(alice)] == [a.id]
    assert [j.id for j in store.list_jobs(admin)] == [a.id, b.id]
    assert [j.id for j in store.list_jobs()] == [a.id, b.id]  # submission order
    with pytest.raises(NotFoundError):
        store.get_job(b.id, alice)
    with pytest.raises(NotFoundError):
        store.get_job("missing", alice)
    assert store.get_job(b.id, admin).name == "b"
    assert store.get_job(a.id).job_spec.name == "a"


def test_state_machine_is_enforced_and_persisted(store: Store) -> None:
    alice, _ = store.create_tenant("alice", 1.0)
    job = store.create_job(alice, parse_spec(make_spec()), 10.0)
    assert job.state is JobState.PENDING
    job = store.update_job(
        job.id,
        11.0,
        state=JobState.RUNNING,
        replicas=2,
        event=("alloc", "2 slots"),
        event_data={"replicas": 2},
    )
    assert (job.state, job.replicas) == (JobState.RUNNING, 2)
    with pytest.raises(InvalidTransitionError):  # compare-and-set on a stale expectation
        store.update_job(job.id, 12.0, state=JobState.RUNNING, expect=JobState.PENDING)
    job = store.update_job(job.id, 13.0, state=JobState.SUCCEEDED)
    assert job.finished_at == 13.0
    with pytest.raises(InvalidTransitionError):
        store.update_job(job.id, 14.0, state=JobState.CANCELLED)
    assert store.get_job(job.id).state is JobState.SUCCEEDED
    kinds = [e.kind for e in store.events(job.id)]
    assert kinds == ["submitted", "alloc"]
    with pytest.raises(ValueError, match="not job fields"):
        store.update_job(job.id, 15.0, bogus=1)
    with pytest.raises(NotFoundError):
        store.update_job("missing", 15.0)


def test_replicas_events_metrics_and_meta(store: Store) -> None:
    alice, _ = store.create_tenant("alice", 1.0)
    job = store.create_job(alice, parse_spec(make_spec()), 10.0)
    rep = store.add_replica(job.id, 1, 0, 3, "/run", "/log", 11.0)
    assert rep.status == "starting" and rep.pid is None
    rep = store.update_replica(rep.id, status="live", pid=123, start_ticks=2**40)
    assert store.replicas(statuses=("live",)) == [rep]
    assert store.replicas(job.id, attempt=2) == []
    store.update_replica(rep.id, status="exited", exit_code=0, ended_at=12.0)
    assert store.replicas(statuses=("live",)) == []
    store.add_event(None, "controller", "started", 12.0)
    assert [e.kind for e in store.events(kinds=["controller"])] == ["controller"]
    store.add_metric(job.id, "accuracy", 0.5, 7, 13.0)
    assert [(m.name, m.value, m.step) for m in store.metrics(job.id)] == [("accuracy", 0.5, 7)]
    store.merge_report(job.id, {"a": 1})
    store.merge_report(job.id, {"b": {"c": [1.5]}})
    assert store.get_job(job.id).report == {"a": 1, "b": {"c": [1.5]}}
    assert store.meta_setdefault("k", "v1") == "v1"
    assert store.meta_setdefault("k", "v2") == "v1"
    store.meta_set("k", "v3")
    assert store.meta_get("k") == "v3"
    token = store.job_token(job.id)
    assert store.check_job_token(job.id, token)
    assert not store.check_job_token(job.id, token[:-1] + "x")


def test_concurrent_cancel_and_transition_never_both_win(store: Store) -> None:
    """Two threads race to move a RUNNING job; exactly one terminal state results."""
    alice, _ = store.create_tenant("alice", 1.0)
    results: list[str] = []
    for i in range(5):
        job = store.create_job(alice, parse_spec(make_spec(name=f"j{i}")), 10.0)
        store.update_job(job.id, 11.0, state=JobState.RUNNING)

        def move(target: JobState, job_id: str = job.id) -> None:
            try:
                store.update_job(job_id, 12.0, state=target, expect=JobState.RUNNING)
                results.append(target.value)
            except InvalidTransitionError:
                results.append("lost")

        threads = [
            threading.Thread(target=move, args=(t,))
            for t in (JobState.CANCELLED, JobState.SUCCEEDED)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert store.get_job(job.id).state.is_terminal
    assert results.count("lost") == 5


def test_unusable_database_url_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="accepted"):
        Store.open("mysql://nobody@localhost/x")

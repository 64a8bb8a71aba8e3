"""Tuning's own migration branch: what it creates, what it depends on, and databases made
before it existed (the tune tables created by the controller's former 0003, our revision in
Optuna's ``alembic_version``) upgrading without losing a row."""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna
import pytest
import sqlalchemy as sa

from coadapt.controller.db import (
    LEGACY_VERSION_TABLE,
    VERSION_TABLE,
    current_heads,
    head_revisions,
    make_engine,
    migrate,
    normalise_url,
    sqlite_url,
)
from coadapt.controller.store import Store
from coadapt.tune.samplers import ask_params, create_study
from coadapt.tune.spec import parse_experiment
from coadapt.tune.store import TrialState, TuneStore, optuna_db

FROZEN = Path(__file__).resolve().parent / "data" / "pre_branch_0005.db"
SPEC = {
    "name": "old",
    "space": {"lr": {"type": "float", "low": 1e-4, "high": 1.0, "log": True}},
    "objective": {"metric": "loss", "direction": "minimize"},
    "trial": {"script": "train.py", "working_dir": "/tmp"},
    "max_trials": 8,
    "sampler": "tpe",
    "seed": 1,
}


@pytest.fixture(autouse=True)
def _quiet_optuna() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def tables(engine: sa.Engine) -> set[str]:
    return set(sa.inspect(engine).get_table_names())


def test_branches_have_one_head_each() -> None:
    assert head_revisions() == {"0005", "tune_0001", "registry_0001", "deploy_0001"}


def test_the_controller_chain_creates_no_tuning_table(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        migrate(engine, "controller@head")
        assert current_heads(engine) == {"0005"}
        assert not {t for t in tables(engine) if t.startswith("tune_")}
        migrate(engine)  # the tune branch comes on top, the controller's untouched
        assert current_heads(engine) == head_revisions()
        assert {"tune_experiments", "tune_trials"} <= tables(engine)
    finally:
        engine.dispose()


def test_the_tune_branch_needs_only_the_tenants_revision(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        migrate(engine, "tune@head")
        assert current_heads(engine) == {"tune_0001"}  # 0001 is implied by depends_on
        assert {"tenants", "tune_experiments", "tune_trials"} <= tables(engine)
        replica_columns = {c["name"] for c in sa.inspect(engine).get_columns("replicas")}
        assert "node" not in replica_columns  # depends_on pulled 0001 only: 0002 did not run
        migrate(engine)  # the controller's chain goes on from 0001 (not from scratch)
        assert current_heads(engine) == head_revisions()
        replica_columns = {c["name"] for c in sa.inspect(engine).get_columns("replicas")}
        assert "node" in replica_columns
    finally:
        engine.dispose()


def _to_pre_branch_layout(engine: sa.Engine) -> None:
    """What the release before the branch left: one row, ``0005``, in ``alembic_version``."""
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {VERSION_TABLE}")
        # the registry and deployments came after that release
        for table in (
            "registry_promotions",
            "registry_versions",
            "registry_models",
            "deploy_replicas",
            "deploy_deployments",
        ):
            conn.exec_driver_sql(f"DROP TABLE {table}")
        conn.exec_driver_sql(
            f"CREATE TABLE {LEGACY_VERSION_TABLE} (version_num VARCHAR(32) NOT NULL, "
            "CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num))"
        )
        conn.exec_driver_sql(f"INSERT INTO {LEGACY_VERSION_TABLE} VALUES ('0005')")


def test_a_pre_branch_database_upgrades_keeping_every_row(db_url: str) -> None:
    """Rebuilt by stamping on both backends: same schema as the old chain made, old stamp."""
    store = Store.open(db_url)
    tune = TuneStore(store)
    tenant, _ = store.create_tenant("alice", 1.0)
    spec = parse_experiment(SPEC)
    exp = tune.create_experiment(tenant, "old", spec.model_dump(mode="json"), 2.0)
    tune.add_trial(exp.id, 0, {"lr": 0.01}, 3.0)
    _to_pre_branch_layout(store.engine)
    # The old release's Optuna found "0005" there, left it, and skipped its schema check.
    db = optuna.storages.RDBStorage(normalise_url(db_url), skip_compatibility_check=True)
    study = create_study(db, exp.study_name, spec)
    trial, _ = ask_params(study, spec)
    study.tell(trial, 0.5)
    db.engine.dispose()
    store.close()

    store = Store.open(db_url)  # the new release starts: no "table already exists"
    try:
        assert current_heads(store.engine) == head_revisions()
        # Our "0005" moved out; nothing else was there, so the table went with it.
        assert LEGACY_VERSION_TABLE not in tables(store.engine)
        tune = TuneStore(store)
        assert [e.id for e in tune.list_experiments(tenant)] == [exp.id]
        assert [(t.number, t.params) for t in tune.trials(exp.id)] == [(0, {"lr": 0.01})]
        db = optuna_db(db_url)  # Optuna stamps its own revision in a table of its own now
        with store.engine.connect() as conn:
            stamped = conn.exec_driver_sql(f"SELECT version_num FROM {LEGACY_VERSION_TABLE}")
            assert set(stamped.scalars()).isdisjoint(head_revisions() | {"0005"})
        study = create_study(db, exp.study_name, spec)
        assert [t.value for t in study.trials] == [0.5]
        db.engine.dispose()
    finally:
        store.close()


def test_a_frozen_pre_branch_sqlite_file_upgrades(tmp_path: Path) -> None:
    """A file written by the release before the branch (tests/tune/data/make_pre_branch_db.py)."""
    path = tmp_path / "old.db"
    shutil.copy(FROZEN, path)
    url = sqlite_url(path)
    store = Store.open(url)
    try:
        store = _reopened(store, url)  # a second start migrates again, to the same heads
        assert current_heads(store.engine) == head_revisions()
        tune = TuneStore(store)
        (tenant,) = store.tenants()
        (exp,) = tune.list_experiments(tenant)
        assert exp.best_value == 0.25 and exp.best_trial == 1
        got = [(t.number, t.state, t.value) for t in tune.trials(exp.id)]
        assert got == [
            (0, TrialState.SUCCEEDED, 0.5),
            (1, TrialState.SUCCEEDED, 0.25),
            (2, TrialState.PENDING, None),
        ]
        # Optuna reopens the study (it stamps its own revision now) and goes on with it.
        db = optuna_db(url)
        spec = parse_experiment(exp.spec)
        study = create_study(db, exp.study_name, spec)
        states = [t.state for t in study.trials]
        assert states == [optuna.trial.TrialState.COMPLETE] * 2 + [optuna.trial.TrialState.RUNNING]
        study.tell(2, 0.125)
        trial, _ = ask_params(study, spec)
        assert trial.number == 3
        assert study.best_value == 0.125
        db.engine.dispose()
        assert len(store.list_jobs(tenant)) == 1
    finally:
        store.close()


def _reopened(store: Store, url: str) -> Store:
    store.close()
    return Store.open(url)

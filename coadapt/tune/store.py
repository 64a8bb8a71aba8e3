"""Persistence of tuning experiments and trials, on the controller's own database.

:class:`TuneStore` takes the controller :class:`~coadapt.controller.store.Store` and opens its
sessions from the same engine, so the same rules hold: every method is one transaction,
records returned are frozen snapshots, and a tenant only ever sees its own experiments (a
stranger's experiment is a :class:`NotFoundError`, like a missing one).

The Optuna study of an experiment lives in the same database (Optuna's RDBStorage, tables
``studies``, ``trials``, ...): :func:`optuna_db` opens it with the controller's SQLite
discipline (WAL, busy timeout, ``BEGIN IMMEDIATE`` for writes) so the tuning loop, the job
loop and the API threads never fail each other with "database is locked".
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any

from sqlalchemy import event, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError

from coadapt.controller.db import normalise_url
from coadapt.controller.errors import InvalidTransitionError, NotFoundError
from coadapt.controller.store import Store, Tenant
from coadapt.tune.tables import ExperimentRow, TrialRow


class ExperimentState(str, Enum):
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"  # target reached, or the trial/time budget spent with a result
    FAILED = "FAILED"  # the budget was spent without a single result
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self is not ExperimentState.RUNNING


class TrialState(str, Enum):
    PENDING = "PENDING"  # recorded (Optuna number known), job not yet submitted
    RUNNING = "RUNNING"  # its job is submitted (the scheduler may still queue it)
    SUCCEEDED = "SUCCEEDED"
    PRUNED = "PRUNED"
    FAILED = "FAILED"  # retries exhausted
    CANCELLED = "CANCELLED"  # the experiment ended while it ran

    @property
    def is_active(self) -> bool:
        return self in (TrialState.PENDING, TrialState.RUNNING)


@dataclass(frozen=True)
class Experiment:
    id: str
    tenant_id: str
    name: str
    spec: dict[str, Any]
    state: ExperimentState
    study_name: str
    created_at: float
    updated_at: float
    finished_at: float | None
    best_value: float | None
    best_trial: int | None
    target_reached_at: float | None
    reason: str | None
    policy_state: dict[str, Any]
    best_history: list[list[float]]


@dataclass(frozen=True)
class Trial:
    id: int
    experiment_id: str
    number: int
    params: dict[str, Any]
    state: TrialState
    job_id: str | None
    attempts: int
    priority: int
    value: float | None
    curve: list[list[float]]
    gpu_seconds: float
    created_at: float
    started_at: float | None
    ended_at: float | None
    last_progress_at: float | None
    reason: str | None


_EXP_FIELDS = frozenset(f.name for f in fields(Experiment)) - {"id", "tenant_id", "spec"}
_TRIAL_FIELDS = frozenset(f.name for f in fields(Trial)) - {"id", "experiment_id", "number"}


def _experiment(row: ExperimentRow) -> Experiment:
    return Experiment(
        id=row.id,
        tenant_id=row.tenant_id,
        name=row.name,
        spec=dict(row.spec),
        state=ExperimentState(row.state),
        study_name=row.study_name,
        created_at=row.created_at,
        updated_at=row.updated_at,
        finished_at=row.finished_at,
        best_value=row.best_value,
        best_trial=row.best_trial,
        target_reached_at=row.target_reached_at,
        reason=row.reason,
        policy_state=dict(row.policy_state or {}),
        best_history=[list(p) for p in (row.best_history or [])],
    )


def _trial(row: TrialRow) -> Trial:
    return Trial(
        id=row.id,
        experiment_id=row.experiment_id,
        number=row.number,
        params=dict(row.params),
        state=TrialState(row.state),
        job_id=row.job_id,
        attempts=row.attempts,
        priority=row.priority,
        value=row.value,
        curve=[list(p) for p in (row.curve or [])],
        gpu_seconds=row.gpu_seconds,
        created_at=row.created_at,
        started_at=row.started_at,
        ended_at=row.ended_at,
        last_progress_at=row.last_progress_at,
        reason=row.reason,
    )


def _plain(value: Any) -> Any:
    """Enum members to their values, so they can be written to a column."""
    return value.value if isinstance(value, Enum) else value


class TuneStore:
    """Experiments and trials, next to the controller's jobs (same engine, same rules)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.engine = store.engine
        # The controller store's sessions: same engine, same SQLite locking discipline.
        self._tx = store.transaction
        self._read = store.reading

    def tenant(self, tenant_id: str) -> Tenant:
        for t in self.store.tenants():
            if t.id == tenant_id:
                return t
        raise NotFoundError(f"no tenant {tenant_id!r}")

    # -- experiments ----------------------------------------------------------------------
    def create_experiment(
        self, tenant: Tenant, name: str, spec: dict[str, Any], now: float
    ) -> Experiment:
        exp_id = f"exp-{name[:16].lower()}-{secrets.token_hex(4)}"
        row = ExperimentRow(
            id=exp_id,
            tenant_id=tenant.id,
            name=name,
            spec=spec,
            state=ExperimentState.RUNNING.value,
            study_name=f"coadapt-{exp_id}",
            created_at=now,
            updated_at=now,
            policy_state={},
            best_history=[],
        )
        with self._tx() as s:
            s.add(row)
        return _experiment(row)

    @staticmethod
    def _visible(row: ExperimentRow | None, tenant: Tenant | None, exp_id: str) -> ExperimentRow:
        if row is None or (
            tenant is not None and not tenant.is_admin and row.tenant_id != tenant.id
        ):
            raise NotFoundError(f"no experiment {exp_id!r}")
        return row

    def get_experiment(self, exp_id: str, tenant: Tenant | None = None) -> Experiment:
        """The experiment, if ``tenant`` (None = the controller itself) may see it."""
        with self._read() as s:
            return _experiment(self._visible(s.get(ExperimentRow, exp_id), tenant, exp_id))

    def list_experiments(
        self, tenant: Tenant | None = None, states: Iterable[ExperimentState] | None = None
    ) -> list[Experiment]:
        """Experiments in submission order, optionally only ``tenant``'s and in ``states``."""
        q = select(ExperimentRow).order_by(ExperimentRow.created_at, ExperimentRow.id)
        if tenant is not None and not tenant.is_admin:
            q = q.where(ExperimentRow.tenant_id == tenant.id)
        if states is not None:
            q = q.where(ExperimentRow.state.in_([st.value for st in states]))
        with self._read() as s:
            return [_experiment(r) for r in s.scalars(q)]

    def update_experiment(
        self,
        exp_id: str,
        now: float,
        expect: ExperimentState | None = None,
        **changes: Any,
    ) -> Experiment:
        """Change an experiment atomically; ``expect`` makes it a compare-and-set on state."""
        unknown = set(changes) - _EXP_FIELDS
        if unknown:
            raise ValueError(f"not experiment fields: {sorted(unknown)}")
        with self._tx() as s:
            row = s.get(ExperimentRow, exp_id, with_for_update=True)
            if row is None:
                raise NotFoundError(f"no experiment {exp_id!r}")
            if expect is not None and row.state != expect.value:
                raise InvalidTransitionError(
                    f"experiment {exp_id} is {row.state}, expected {expect.value}"
                )
            new_state = changes.get("state")
            if new_state is not None and ExperimentState(new_state).is_terminal:
                row.finished_at = now
            for key, value in changes.items():
                setattr(row, key, _plain(value))
            row.updated_at = now
            s.flush()
            return _experiment(row)

    def cancel_experiment(self, exp_id: str, tenant: Tenant | None, now: float) -> Experiment:
        """Mark the experiment CANCELLED (409 if it already ended); the tuning loop then
        cancels its running trials' jobs."""
        exp = self.get_experiment(exp_id, tenant)
        if exp.state.is_terminal:
            raise InvalidTransitionError(
                f"experiment {exp_id} is {exp.state.value}; cannot be cancelled"
            )
        who = tenant.name if tenant is not None else "the controller"
        return self.update_experiment(
            exp_id,
            now,
            expect=ExperimentState.RUNNING,
            state=ExperimentState.CANCELLED,
            reason=f"cancelled by {who}",
        )

    # -- trials ---------------------------------------------------------------------------
    def add_trial(
        self, exp_id: str, number: int, params: dict[str, Any], now: float, priority: int = 0
    ) -> Trial:
        """Record trial ``number`` (PENDING) before its job exists; idempotent on
        ``(experiment, number)``, so re-recording after a crash returns the existing row."""
        row = TrialRow(
            experiment_id=exp_id,
            number=number,
            params=params,
            state=TrialState.PENDING.value,
            attempts=0,
            priority=priority,
            gpu_seconds=0.0,
            created_at=now,
            curve=[],
        )
        try:
            with self._tx() as s:
                s.add(row)
                s.flush()
                return _trial(row)
        except IntegrityError:
            existing = self.trial(exp_id, number)
            if existing is None:
                raise
            return existing

    def trial(self, exp_id: str, number: int) -> Trial | None:
        q = select(TrialRow).where(TrialRow.experiment_id == exp_id, TrialRow.number == number)
        with self._read() as s:
            row = s.scalar(q)
            return _trial(row) if row is not None else None

    def trials(self, exp_id: str, states: Iterable[TrialState] | None = None) -> list[Trial]:
        q = select(TrialRow).where(TrialRow.experiment_id == exp_id).order_by(TrialRow.number)
        if states is not None:
            q = q.where(TrialRow.state.in_([st.value for st in states]))
        with self._read() as s:
            return [_trial(r) for r in s.scalars(q)]

    def trials_of(self, exp_ids: Iterable[str]) -> dict[str, list[Trial]]:
        """Every trial of several experiments in one read (the loop's per-tick view)."""
        ids = list(exp_ids)
        out: dict[str, list[Trial]] = {i: [] for i in ids}
        if not ids:
            return out
        q = (
            select(TrialRow)
            .where(TrialRow.experiment_id.in_(ids))
            .order_by(TrialRow.experiment_id, TrialRow.number)
        )
        with self._read() as s:
            for r in s.scalars(q):
                out[r.experiment_id].append(_trial(r))
        return out

    def trial_counts(self, exp_ids: Iterable[str]) -> dict[str, dict[str, int]]:
        """Trials per state of each experiment (one grouped read, for listings)."""
        ids = list(exp_ids)
        out: dict[str, dict[str, int]] = {i: {} for i in ids}
        if not ids:
            return out
        q = (
            select(TrialRow.experiment_id, TrialRow.state, func.count())
            .where(TrialRow.experiment_id.in_(ids))
            .group_by(TrialRow.experiment_id, TrialRow.state)
        )
        with self._read() as s:
            for exp_id, state, n in s.execute(q):
                out[exp_id][state] = int(n)
        return out

    def ended_with_active_trials(self) -> list[str]:
        """Ended experiments that still have PENDING/RUNNING trials (to wind down)."""
        q = (
            select(TrialRow.experiment_id)
            .join(ExperimentRow, ExperimentRow.id == TrialRow.experiment_id)
            .where(
                ExperimentRow.state != ExperimentState.RUNNING.value,
                TrialRow.state.in_([TrialState.PENDING.value, TrialState.RUNNING.value]),
            )
            .distinct()
        )
        with self._read() as s:
            return sorted(s.scalars(q))

    def update_trial(
        self, trial_id: int, expect: TrialState | Iterable[TrialState] | None = None, **changes: Any
    ) -> Trial:
        """Change a trial atomically; ``expect`` makes it a compare-and-set on state."""
        unknown = set(changes) - _TRIAL_FIELDS
        if unknown:
            raise ValueError(f"not trial fields: {sorted(unknown)}")
        with self._tx() as s:
            row = s.get(TrialRow, trial_id, with_for_update=True)
            if row is None:
                raise NotFoundError(f"no trial {trial_id}")
            if expect is not None:
                allowed = {expect} if isinstance(expect, TrialState) else set(expect)
                if TrialState(row.state) not in allowed:
                    raise InvalidTransitionError(
                        f"trial {row.experiment_id}#{row.number} is {row.state}"
                    )
            for key, value in changes.items():
                setattr(row, key, _plain(value))
            s.flush()
            return _trial(row)


def optuna_db(url: str) -> Any:
    """Optuna's RDBStorage on the controller's database ``url``.

    Optuna keeps its own schema revision in ``alembic_version``; ours is in
    :data:`coadapt.controller.db.VERSION_TABLE`, so the two never mix and Optuna's own schema
    check runs (an Optuna upgrade that needs ``optuna storage upgrade`` says so). On SQLite
    the engine gets the controller's pragmas and ``BEGIN IMMEDIATE`` (a deferred read that
    upgrades to a write would otherwise fail at once while the job loop writes).
    """
    import optuna

    url = normalise_url(url)
    if make_url(url).get_backend_name() != "sqlite":
        return optuna.storages.RDBStorage(
            url,
            engine_kwargs={"pool_pre_ping": True, "pool_size": 5, "max_overflow": 5},
        )
    storage = optuna.storages.RDBStorage(
        url,
        engine_kwargs={"connect_args": {"timeout": 30, "check_same_thread": False}},
    )
    engine = storage.engine

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections opened before the listeners lack the pragmas
    return storage

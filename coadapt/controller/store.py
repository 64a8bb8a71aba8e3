"""The controller's storage contract, on any SQLAlchemy database (SQLite, PostgreSQL).

Contract (checked by ``tests/controller/test_store.py`` on every backend):

* every method is one transaction: it either happens completely or not at all;
* methods are thread-safe (each opens its own session); records returned are immutable
  snapshots, never live ORM objects;
* job state changes go through :meth:`Store.update_job`, which re-reads the row under a lock,
  enforces the state machine (:mod:`coadapt.controller.states`) and an optional expected
  state (compare-and-set), and writes the event in the same transaction;
* a tenant only ever reads its own jobs: a stranger's job raises :class:`NotFoundError`,
  exactly like a job that does not exist.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from coadapt.controller.db import READ_OPTION, make_engine, migrate
from coadapt.controller.errors import (
    AuthError,
    ConflictError,
    InvalidTransitionError,
    NotFoundError,
    StorageError,
)
from coadapt.controller.models import (
    EventRow,
    JobRow,
    MetaRow,
    MetricRow,
    ReplicaRow,
    TenantRow,
    TokenRow,
)
from coadapt.controller.spec import JobSpec
from coadapt.controller.states import JobState, check_transition
from coadapt.protocol import CancelCause


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Tenant:
    id: str
    name: str
    is_admin: bool


@dataclass(frozen=True)
class Job:
    """A job row as plain data."""

    id: str
    tenant_id: str
    name: str
    spec: dict[str, Any]
    state: JobState
    priority: int
    submit_time: float
    updated_at: float
    started_at: float | None
    finished_at: float | None
    attempt: int
    replicas: int
    desired_replicas: int
    num_restarts: int
    failures: int
    not_before: float
    attained_service: float
    service_at: float | None
    max_gpus_held: int
    stop_requested_at: float | None
    reason: str | None
    report: dict[str, Any] | None
    # node -> replicas: what the current attempt holds / what the policy chose last (None on
    # rows written by a single-node controller: see :meth:`held` and :meth:`wanted`)
    allocation: dict[str, int] | None = None
    desired_allocation: dict[str, int] | None = None
    # what an out-of-memory failure taught: {"max_local_bsz", "oom_local_bsz", "ooms"}
    memory_limit: dict[str, int] | None = None
    # why a CANCELLED job was cancelled (None: not cancelled, or by an older controller)
    cancel_cause: CancelCause | None = None

    @property
    def max_local_bsz(self) -> int | None:
        """The per-replica batch cap learned from out-of-memory failures (None: none yet)."""
        cap = (self.memory_limit or {}).get("max_local_bsz")
        return int(cap) if isinstance(cap, int) and cap >= 1 else None

    @property
    def job_spec(self) -> JobSpec:
        return JobSpec.model_validate(self.spec)

    @property
    def held(self) -> dict[str, int]:
        """Replicas per node of the current attempt (old rows: all on node ``local``)."""
        if self.allocation is not None:
            return {n: k for n, k in self.allocation.items() if k > 0}
        return {"local": self.replicas} if self.replicas > 0 else {}

    @property
    def wanted(self) -> dict[str, int]:
        """Replicas per node the policy chose last (old rows: all on node ``local``)."""
        if self.desired_allocation is not None:
            return {n: k for n, k in self.desired_allocation.items() if k > 0}
        return {"local": self.desired_replicas} if self.desired_replicas > 0 else {}


@dataclass(frozen=True)
class Replica:
    id: int
    job_id: str
    attempt: int
    rank: int
    slot: int
    # "starting" (row written, process maybe not), "live", "exited", or "lost" (evicted: its
    # node left or its placement never came; not the job's fault)
    status: str
    pid: int | None
    start_ticks: int | None
    run_dir: str
    log_path: str
    exit_code: int | None
    reason: str | None
    started_at: float
    ended_at: float | None
    node: str = "local"
    oom: bool = False  # ended for lack of memory (OOM killer or the library's OOM exit)


@dataclass(frozen=True)
class Event:
    id: int
    job_id: str | None
    time: float
    kind: str
    message: str
    data: dict[str, Any] | None


@dataclass(frozen=True)
class Metric:
    time: float
    name: str
    value: float | None
    step: int | None


_JOB_FIELDS = frozenset(f.name for f in fields(Job)) - {"id", "tenant_id", "spec", "state"}
_REPLICA_FIELDS = frozenset(
    {"status", "pid", "start_ticks", "exit_code", "reason", "ended_at", "oom"}
)


def _job(row: JobRow) -> Job:
    return Job(
        id=row.id,
        tenant_id=row.tenant_id,
        name=row.name,
        spec=dict(row.spec),
        state=JobState(row.state),
        priority=row.priority,
        submit_time=row.submit_time,
        updated_at=row.updated_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        attempt=row.attempt,
        replicas=row.replicas,
        desired_replicas=row.desired_replicas,
        num_restarts=row.num_restarts,
        failures=row.failures,
        not_before=row.not_before,
        attained_service=row.attained_service,
        service_at=row.service_at,
        max_gpus_held=row.max_gpus_held,
        stop_requested_at=row.stop_requested_at,
        reason=row.reason,
        report=dict(row.report) if row.report is not None else None,
        allocation=dict(row.allocation) if row.allocation is not None else None,
        desired_allocation=(
            dict(row.desired_allocation) if row.desired_allocation is not None else None
        ),
        memory_limit=dict(row.memory_limit) if row.memory_limit is not None else None,
        cancel_cause=_cause(row.cancel_cause),
    )


def _cause(raw: str | None) -> CancelCause | None:
    """The stored cause; one a newer controller wrote that this one does not know: None."""
    try:
        return CancelCause(raw) if raw is not None else None
    except ValueError:
        return None


def _replica(row: ReplicaRow) -> Replica:
    return Replica(
        id=row.id,
        job_id=row.job_id,
        attempt=row.attempt,
        rank=row.rank,
        slot=row.slot,
        status=row.status,
        pid=row.pid,
        start_ticks=row.start_ticks,
        run_dir=row.run_dir,
        log_path=row.log_path,
        exit_code=row.exit_code,
        reason=row.reason,
        started_at=row.started_at,
        ended_at=row.ended_at,
        node=row.node,
        oom=bool(row.oom),
    )


def _event(row: EventRow) -> Event:
    return Event(
        row.id,
        row.job_id,
        row.time,
        row.kind,
        row.message,
        dict(row.data) if row.data is not None else None,
    )


class Store:
    """All persistent state of the controller."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._readers = sessionmaker(
            engine.execution_options(**{READ_OPTION: True}), expire_on_commit=False
        )

    @classmethod
    def open(cls, url: str, run_migrations: bool = True) -> Store:
        """Connect to ``url`` and bring its schema up to date."""
        engine = make_engine(url)
        if run_migrations:
            migrate(engine)
        return cls(engine)

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One read-write transaction (committed on exit); database errors as StorageError."""
        try:
            with self._sessions.begin() as session:
                yield session
        except OperationalError as exc:
            raise StorageError(f"database error: {exc.orig}") from exc

    @contextmanager
    def reading(self) -> Iterator[Session]:
        """A read-only transaction (never takes SQLite's write lock)."""
        try:
            with self._readers.begin() as session:
                yield session
        except OperationalError as exc:
            raise StorageError(f"database error: {exc.orig}") from exc

    # -- meta -----------------------------------------------------------------------------
    def meta_get(self, key: str) -> str | None:
        with self.reading() as s:
            row = s.get(MetaRow, key)
            return row.value if row is not None else None

    def meta_setdefault(self, key: str, value: str) -> str:
        """Store ``value`` under ``key`` unless already set; return the stored value."""
        with self.transaction() as s:
            row = s.get(MetaRow, key)
            if row is not None:
                return row.value
            s.add(MetaRow(key=key, value=value))
            return value

    def meta_set_many(self, values: dict[str, str]) -> None:
        """Set several meta keys in one transaction (a policy round's counter and state must
        not be torn apart by a crash between two writes)."""
        with self.transaction() as s:
            for key, value in values.items():
                row = s.get(MetaRow, key)
                if row is None:
                    s.add(MetaRow(key=key, value=value))
                else:
                    row.value = value

    def meta_set(self, key: str, value: str) -> None:
        with self.transaction() as s:
            row = s.get(MetaRow, key)
            if row is None:
                s.add(MetaRow(key=key, value=value))
            else:
                row.value = value

    def job_secret(self) -> bytes:
        """Secret behind the per-job metrics tokens (survives restarts, lives in the DB)."""
        return self.meta_setdefault("job_secret", secrets.token_hex(32)).encode()

    def job_token(self, job_id: str) -> str:
        return hmac.new(self.job_secret(), job_id.encode(), hashlib.sha256).hexdigest()[:32]

    def check_job_token(self, job_id: str, token: str) -> bool:
        return hmac.compare_digest(self.job_token(job_id), token)

    # -- tenants --------------------------------------------------------------------------
    def create_tenant(self, name: str, now: float, is_admin: bool = False) -> tuple[Tenant, str]:
        """A new tenant and its first API token (shown once; only its hash is stored)."""
        tenant_id = "t-" + secrets.token_hex(6)
        token = secrets.token_urlsafe(24)
        try:
            with self.transaction() as s:
                if s.scalar(select(TenantRow).where(TenantRow.name == name)) is not None:
                    raise ConflictError(f"tenant {name!r} already exists")
                s.add(TenantRow(id=tenant_id, name=name, is_admin=is_admin, created_at=now))
                s.flush()
                s.add(TokenRow(token_hash=hash_token(token), tenant_id=tenant_id, created_at=now))
        except IntegrityError:
            raise ConflictError(f"tenant {name!r} already exists") from None
        return Tenant(tenant_id, name, is_admin), token

    def add_token(self, tenant_id: str, token: str, now: float) -> None:
        with self.transaction() as s:
            if s.get(TokenRow, hash_token(token)) is None:
                s.add(TokenRow(token_hash=hash_token(token), tenant_id=tenant_id, created_at=now))

    def tenant_by_name(self, name: str) -> Tenant | None:
        with self.reading() as s:
            row = s.scalar(select(TenantRow).where(TenantRow.name == name))
            return Tenant(row.id, row.name, row.is_admin) if row is not None else None

    def tenants(self) -> list[Tenant]:
        with self.reading() as s:
            rows = s.scalars(select(TenantRow).order_by(TenantRow.created_at))
            return [Tenant(r.id, r.name, r.is_admin) for r in rows]

    def authenticate(self, token: str | None) -> Tenant:
        if not token:
            raise AuthError("missing API token (Authorization: Bearer TOKEN)")
        with self.reading() as s:
            tok = s.get(TokenRow, hash_token(token))
            if tok is None:
                raise AuthError("unknown API token")
            row = s.get(TenantRow, tok.tenant_id)
            if row is None:
                raise AuthError("unknown API token")
            return Tenant(row.id, row.name, row.is_admin)

    # -- jobs -----------------------------------------------------------------------------
    def create_job(self, tenant: Tenant, spec: JobSpec, now: float) -> Job:
        job_id = f"{spec.name[:20].lower()}-{secrets.token_hex(4)}"
        row = JobRow(
            id=job_id,
            tenant_id=tenant.id,
            name=spec.name,
            spec=spec.model_dump(mode="json"),
            state=JobState.PENDING.value,
            priority=spec.priority,
            submit_time=now,
            updated_at=now,
            attempt=0,
            replicas=0,
            desired_replicas=0,
            num_restarts=0,
            failures=0,
            not_before=0.0,
            attained_service=0.0,
            max_gpus_held=0,
        )
        with self.transaction() as s:
            s.add(row)
            s.add(
                EventRow(
                    job_id=job_id,
                    time=now,
                    kind="submitted",
                    message=f"submitted by {tenant.name}",
                    data=None,
                )
            )
        return _job(row)

    @staticmethod
    def _visible(row: JobRow | None, tenant: Tenant | None, job_id: str) -> JobRow:
        if row is None or (
            tenant is not None and not tenant.is_admin and row.tenant_id != tenant.id
        ):
            raise NotFoundError(f"no job {job_id!r}")
        return row

    def get_job(self, job_id: str, tenant: Tenant | None = None) -> Job:
        """The job, if ``tenant`` (None = the controller itself) may see it."""
        with self.reading() as s:
            return _job(self._visible(s.get(JobRow, job_id), tenant, job_id))

    def list_jobs(
        self, tenant: Tenant | None = None, states: Iterable[JobState] | None = None
    ) -> list[Job]:
        """Jobs in submission order, optionally only ``tenant``'s and in ``states``."""
        q = select(JobRow).order_by(JobRow.submit_time, JobRow.id)
        if tenant is not None and not tenant.is_admin:
            q = q.where(JobRow.tenant_id == tenant.id)
        if states is not None:
            q = q.where(JobRow.state.in_([st.value for st in states]))
        with self.reading() as s:
            return [_job(r) for r in s.scalars(q)]

    def update_job(
        self,
        job_id: str,
        now: float,
        state: JobState | None = None,
        expect: JobState | Iterable[JobState] | None = None,
        event: tuple[str, str] | None = None,
        event_data: dict[str, Any] | None = None,
        **changes: Any,
    ) -> Job:
        """Change a job atomically: optional state transition, fields, and an event.

        ``expect`` makes it a compare-and-set: if the job is no longer in that state (another
        thread cancelled it, say) :class:`InvalidTransitionError` is raised and nothing changes.
        """
        unknown = set(changes) - _JOB_FIELDS
        if unknown:
            raise ValueError(f"not job fields: {sorted(unknown)}")
        with self.transaction() as s:
            row = s.get(JobRow, job_id, with_for_update=True)
            if row is None:
                raise NotFoundError(f"no job {job_id!r}")
            old = JobState(row.state)
            if expect is not None:
                allowed = {expect} if isinstance(expect, JobState) else set(expect)
                if old not in allowed:
                    raise InvalidTransitionError(
                        f"job {job_id} is {old.value}, expected "
                        f"{'/'.join(sorted(a.value for a in allowed))}"
                    )
            if state is not None and state is not old:
                check_transition(job_id, old, state)
                row.state = state.value
                if state.is_terminal:
                    row.finished_at = now
            for key, value in changes.items():
                setattr(row, key, value)
            row.updated_at = now
            if event is not None:
                s.add(
                    EventRow(
                        job_id=job_id, time=now, kind=event[0], message=event[1], data=event_data
                    )
                )
            s.flush()
            return _job(row)

    def set_desired(
        self,
        desired: dict[str, tuple[int, str, dict[str, Any]]],
        now: float,
        allocations: dict[str, dict[str, int]] | None = None,
    ) -> None:
        """Record a policy round's decisions (job -> (replicas, message, data), and the
        per-node ``allocations``) in one transaction, with a ``desired`` event each; jobs gone
        terminal meanwhile are skipped."""
        if not desired:
            return
        with self.transaction() as s:
            rows = s.scalars(select(JobRow).where(JobRow.id.in_(list(desired))).with_for_update())
            for row in rows:
                if JobState(row.state).is_terminal:
                    continue
                k, message, data = desired[row.id]
                row.desired_replicas = k
                if allocations is not None and row.id in allocations:
                    row.desired_allocation = dict(allocations[row.id])
                row.updated_at = now
                s.add(EventRow(job_id=row.id, time=now, kind="desired", message=message, data=data))

    def merge_report(self, job_id: str, patch: dict[str, Any]) -> None:
        """Merge the latest figures a job reported into its ``report`` column."""
        with self.transaction() as s:
            row = s.get(JobRow, job_id, with_for_update=True)
            if row is None:
                raise NotFoundError(f"no job {job_id!r}")
            row.report = {**(row.report or {}), **patch}

    # -- replicas -------------------------------------------------------------------------
    def add_replica(
        self,
        job_id: str,
        attempt: int,
        rank: int,
        slot: int,
        run_dir: str,
        log_path: str,
        now: float,
        node: str = "local",
    ) -> Replica:
        """Record a replica *before* it starts (status "starting"), so a crash mid-launch
        leaves a row that recovery can match with the process (no replica runs unrecorded)."""
        row = ReplicaRow(
            job_id=job_id,
            attempt=attempt,
            rank=rank,
            slot=slot,
            node=node,
            status="starting",
            run_dir=run_dir,
            log_path=log_path,
            started_at=now,
        )
        with self.transaction() as s:
            s.add(row)
            s.flush()
            return _replica(row)

    def update_replica(self, replica_id: int, **changes: Any) -> Replica:
        unknown = set(changes) - _REPLICA_FIELDS
        if unknown:
            raise ValueError(f"not replica fields: {sorted(unknown)}")
        with self.transaction() as s:
            row = s.get(ReplicaRow, replica_id, with_for_update=True)
            if row is None:
                raise NotFoundError(f"no replica {replica_id}")
            for key, value in changes.items():
                setattr(row, key, value)
            s.flush()
            return _replica(row)

    def replicas(
        self,
        job_id: str | None = None,
        attempt: int | None = None,
        statuses: Iterable[str] | None = None,
    ) -> list[Replica]:
        q = select(ReplicaRow).order_by(ReplicaRow.id)
        if job_id is not None:
            q = q.where(ReplicaRow.job_id == job_id)
        if attempt is not None:
            q = q.where(ReplicaRow.attempt == attempt)
        if statuses is not None:
            q = q.where(ReplicaRow.status.in_(list(statuses)))
        with self.reading() as s:
            return [_replica(r) for r in s.scalars(q)]

    # -- events and metrics ---------------------------------------------------------------
    def add_event(
        self,
        job_id: str | None,
        kind: str,
        message: str,
        now: float,
        data: dict[str, Any] | None = None,
    ) -> None:
        with self.transaction() as s:
            s.add(EventRow(job_id=job_id, time=now, kind=kind, message=message, data=data))

    def events(
        self, job_id: str | None = None, kinds: Iterable[str] | None = None, after_id: int = 0
    ) -> list[Event]:
        q = select(EventRow).where(EventRow.id > after_id).order_by(EventRow.id)
        if job_id is not None:
            q = q.where(EventRow.job_id == job_id)
        if kinds is not None:
            q = q.where(EventRow.kind.in_(list(kinds)))
        with self.reading() as s:
            return [_event(r) for r in s.scalars(q)]

    def add_metric(
        self, job_id: str, name: str, value: float | None, step: int | None, now: float
    ) -> None:
        self.add_metrics(job_id, {name: value}, step, now)

    def add_metrics(
        self, job_id: str, values: Mapping[str, float | None], step: int | None, now: float
    ) -> None:
        """Several named values of one step in one transaction (a record's figures land
        together or not at all)."""
        with self.transaction() as s:
            s.add_all(
                MetricRow(job_id=job_id, time=now, name=name[:64], value=value, step=step)
                for name, value in values.items()
            )

    def metrics(self, job_id: str) -> list[Metric]:
        q = select(MetricRow).where(MetricRow.job_id == job_id).order_by(MetricRow.id)
        with self.reading() as s:
            return [Metric(r.time, r.name, r.value, r.step) for r in s.scalars(q)]

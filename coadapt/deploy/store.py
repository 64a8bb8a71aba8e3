"""Persistence of deployments and their serving replicas, on the controller's database.

:class:`DeploymentStore` takes the controller :class:`~coadapt.controller.store.Store` and opens
its sessions from the same engine, so the same rules hold as for jobs and models: every method
is one transaction, records returned are frozen snapshots, and a tenant only ever sees its own
deployments (a stranger's is a :class:`NotFoundError`, like a missing one; the admin sees all).

Both life cycles are explicit state machines, checked under a row lock::

    deployment:  active ──> deleting ──> deleted
    replica:     starting ──> ready ──> draining ──> stopping ──> exited
                     └──────────┴──────────┴─────────────┴──────────^  (it died, or was stopped)

A draining replica may go back to ``ready`` (the scale-down was called off before its SIGTERM).
"""

from __future__ import annotations

import builtins
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from coadapt.controller.errors import ConflictError, InvalidTransitionError, NotFoundError
from coadapt.controller.store import Store, Tenant
from coadapt.deploy.spec import DeploymentSpec
from coadapt.deploy.tables import DeploymentRow, ServingReplicaRow


class DeploymentState(str, Enum):
    ACTIVE = "active"  # scheduled: replicas follow its demand
    DELETING = "deleting"  # `coadapt deploy rm`: the plane stops its processes
    DELETED = "deleted"  # nothing of it runs; the row stays as history


class ServingReplicaStatus(str, Enum):
    STARTING = "starting"  # row written, process launching or loading the model
    READY = "ready"  # answers /readyz; in the gateway's route table
    DRAINING = "draining"  # out of the route table; in-flight requests finish
    STOPPING = "stopping"  # SIGTERM sent
    EXITED = "exited"  # the process is gone (exit_code, reason)

    @property
    def alive(self) -> bool:
        """Whether the replica's process may still hold its slot."""
        return self is not ServingReplicaStatus.EXITED


_S = ServingReplicaStatus
_REPLICA_MOVES: dict[ServingReplicaStatus, frozenset[ServingReplicaStatus]] = {
    _S.STARTING: frozenset({_S.READY, _S.DRAINING, _S.STOPPING, _S.EXITED}),
    _S.READY: frozenset({_S.DRAINING, _S.STOPPING, _S.EXITED}),
    _S.DRAINING: frozenset({_S.READY, _S.STOPPING, _S.EXITED}),
    _S.STOPPING: frozenset({_S.EXITED}),
    _S.EXITED: frozenset(),
}
_REPLICA_CHANGES = frozenset(
    {"pid", "start_ticks", "status", "ready_at", "ended_at", "exit_code", "reason"}
)


@dataclass(frozen=True)
class DeploymentRecord:
    id: int
    tenant_id: str
    name: str
    spec: DeploymentSpec
    state: DeploymentState
    model_root: str  # the registered model's version root, resolved at create
    gateway_port: int  # chosen at create (free_port), stable for the deployment's life
    gateway_pid: int | None
    gateway_start_ticks: int | None
    gateway_run_dir: str | None
    created_at: float
    updated_at: float
    deleted_at: float | None


@dataclass(frozen=True)
class ServingReplicaRecord:
    id: int
    deployment_id: int
    node: str
    slot: int
    port: int
    pid: int | None
    start_ticks: int | None
    run_dir: str
    log_path: str
    status: ServingReplicaStatus
    started_at: float
    ready_at: float | None
    ended_at: float | None
    exit_code: int | None
    reason: str | None


def _deployment(row: DeploymentRow) -> DeploymentRecord:
    return DeploymentRecord(
        id=row.id,
        tenant_id=row.tenant_id,
        name=row.name,
        spec=DeploymentSpec.model_validate(row.spec),
        state=DeploymentState(row.state),
        model_root=row.model_root,
        gateway_port=row.gateway_port,
        gateway_pid=row.gateway_pid,
        gateway_start_ticks=row.gateway_start_ticks,
        gateway_run_dir=row.gateway_run_dir,
        created_at=row.created_at,
        updated_at=row.updated_at,
        deleted_at=row.deleted_at,
    )


def _replica(row: ServingReplicaRow) -> ServingReplicaRecord:
    return ServingReplicaRecord(
        id=row.id,
        deployment_id=row.deployment_id,
        node=row.node,
        slot=row.slot,
        port=row.port,
        pid=row.pid,
        start_ticks=row.start_ticks,
        run_dir=row.run_dir,
        log_path=row.log_path,
        status=ServingReplicaStatus(row.status),
        started_at=row.started_at,
        ready_at=row.ready_at,
        ended_at=row.ended_at,
        exit_code=row.exit_code,
        reason=row.reason,
    )


_VISIBLE = (DeploymentState.ACTIVE, DeploymentState.DELETING)


class DeploymentStore:
    """Deployments and serving replicas, next to the controller's jobs (same engine, rules)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._tx = store.transaction
        self._read = store.reading

    # -- deployments ------------------------------------------------------------------------
    def create(
        self,
        tenant: Tenant,
        spec: DeploymentSpec,
        model_root: str,
        gateway_port: int,
        now: float,
    ) -> DeploymentRecord:
        """Record a new deployment of ``spec`` (409 if the tenant has one of that name that
        is not deleted yet)."""
        row = DeploymentRow(
            tenant_id=tenant.id,
            name=spec.name,
            active_name=spec.name,
            spec=spec.to_json(),
            state=DeploymentState.ACTIVE.value,
            model_root=model_root,
            gateway_port=gateway_port,
            created_at=now,
            updated_at=now,
        )
        try:
            with self._tx() as s:
                s.add(row)
                s.flush()
                return _deployment(row)
        except IntegrityError:
            raise ConflictError(
                f"a deployment named {spec.name!r} exists already: pick another name, or "
                f"`coadapt deploy rm {spec.name}` and wait until it is deleted"
            ) from None

    def get(self, tenant: Tenant, name: str) -> DeploymentRecord:
        """``tenant``'s deployment ``name`` that is not deleted (the admin reaches any
        tenant's, its own first); a stranger's is a 404 like a missing one."""
        q = (
            select(DeploymentRow)
            .where(DeploymentRow.active_name == name)
            .order_by(DeploymentRow.id)
        )
        with self._read() as s:
            rows = list(s.scalars(q))
            own = [r for r in rows if r.tenant_id == tenant.id]
            rows = own or (rows if tenant.is_admin else [])
            if not rows:
                raise NotFoundError(f"no deployment {name!r} (see `coadapt deploy ls`)")
            if len(rows) > 1:
                raise ConflictError(
                    f"several tenants have a deployment named {name!r}: use a tenant's token"
                )
            return _deployment(rows[0])

    def by_id(self, deployment_id: int) -> DeploymentRecord:
        with self._read() as s:
            row = s.get(DeploymentRow, deployment_id)
            if row is None:
                raise NotFoundError(f"no deployment #{deployment_id}")
            return _deployment(row)

    def list(
        self, tenant: Tenant | None = None, states: Collection[DeploymentState] = _VISIBLE
    ) -> list[DeploymentRecord]:
        """The deployments ``tenant`` may see (None or the admin: all) in ``states``, by name."""
        q = (
            select(DeploymentRow)
            .where(DeploymentRow.state.in_([st.value for st in states]))
            .order_by(DeploymentRow.name, DeploymentRow.id)
        )
        if tenant is not None and not tenant.is_admin:
            q = q.where(DeploymentRow.tenant_id == tenant.id)
        with self._read() as s:
            return [_deployment(r) for r in s.scalars(q)]

    def _locked(self, s: Session, deployment_id: int) -> DeploymentRow:
        row = s.scalar(
            select(DeploymentRow).where(DeploymentRow.id == deployment_id).with_for_update()
        )
        if row is None:
            raise NotFoundError(f"no deployment #{deployment_id}")
        return row

    def request_delete(self, tenant: Tenant, name: str, now: float) -> DeploymentRecord:
        """ACTIVE -> DELETING: the plane stops its processes, then :meth:`mark_deleted`.
        Asking again while it is being deleted answers the same record (idempotent)."""
        target = self.get(tenant, name)
        with self._tx() as s:
            row = self._locked(s, target.id)
            if row.state == DeploymentState.ACTIVE.value:
                row.state = DeploymentState.DELETING.value
                row.updated_at = now
            elif row.state != DeploymentState.DELETING.value:
                raise NotFoundError(f"no deployment {name!r} (see `coadapt deploy ls`)")
            s.flush()
            return _deployment(row)

    def mark_deleted(self, deployment_id: int, now: float) -> None:
        """DELETING -> DELETED, once nothing of the deployment runs; the name is free again."""
        with self._tx() as s:
            row = self._locked(s, deployment_id)
            if row.state == DeploymentState.DELETED.value:
                return
            if row.state != DeploymentState.DELETING.value:
                raise InvalidTransitionError(
                    f"deployment {row.name!r} is {row.state}; only a deployment being deleted "
                    "can become deleted"
                )
            row.state = DeploymentState.DELETED.value
            row.active_name = None
            row.deleted_at = now
            row.updated_at = now

    def set_gateway(
        self,
        deployment_id: int,
        pid: int | None,
        start_ticks: int | None,
        run_dir: str | None,
        now: float,
    ) -> None:
        """Where the deployment's gateway process is (None: not running), for re-adoption."""
        with self._tx() as s:
            row = self._locked(s, deployment_id)
            row.gateway_pid = pid
            row.gateway_start_ticks = start_ticks
            row.gateway_run_dir = run_dir
            row.updated_at = now

    # -- replicas ---------------------------------------------------------------------------
    def add_replica(
        self,
        deployment_id: int,
        node: str,
        slot: int,
        port: int,
        run_dir: str,
        log_path: str,
        now: float,
    ) -> ServingReplicaRecord:
        """The row of a replica about to start (STARTING, no pid yet): written before the
        process exists, so a controller crash in between leaves a row to reconcile, never an
        unknown process."""
        with self._tx() as s:
            dep = self._locked(s, deployment_id)
            if dep.state != DeploymentState.ACTIVE.value:
                raise InvalidTransitionError(
                    f"deployment {dep.name!r} is {dep.state}: it gets no new replicas"
                )
            row = ServingReplicaRow(
                deployment_id=deployment_id,
                node=node,
                slot=slot,
                port=port,
                run_dir=run_dir,
                log_path=log_path,
                status=ServingReplicaStatus.STARTING.value,
                started_at=now,
            )
            s.add(row)
            s.flush()
            return _replica(row)

    def update_replica(self, replica_id: int, **changes: Any) -> ServingReplicaRecord:
        """Set ``changes`` (pid, start_ticks, status, ready_at, ended_at, exit_code, reason) in
        one transaction; a status change must be one the replica state machine allows."""
        unknown = set(changes) - _REPLICA_CHANGES
        if unknown:
            raise ValueError(f"not changeable replica fields: {sorted(unknown)}")
        with self._tx() as s:
            row = s.scalar(
                select(ServingReplicaRow)
                .where(ServingReplicaRow.id == replica_id)
                .with_for_update()
            )
            if row is None:
                raise NotFoundError(f"no serving replica #{replica_id}")
            if "status" in changes:
                new = ServingReplicaStatus(changes["status"])
                old = ServingReplicaStatus(row.status)
                if new is not old and new not in _REPLICA_MOVES[old]:
                    raise InvalidTransitionError(
                        f"serving replica #{replica_id} is {old.value}; it cannot become "
                        f"{new.value}"
                    )
                changes["status"] = new.value
            for key, value in changes.items():
                setattr(row, key, value)
            s.flush()
            return _replica(row)

    def replicas(
        self,
        deployment_id: int | None = None,
        statuses: Collection[ServingReplicaStatus] | None = None,
    ) -> builtins.list[ServingReplicaRecord]:
        """Replicas of one deployment (None: all), oldest first, optionally by status."""
        q = select(ServingReplicaRow).order_by(ServingReplicaRow.id)
        if deployment_id is not None:
            q = q.where(ServingReplicaRow.deployment_id == deployment_id)
        if statuses is not None:
            q = q.where(ServingReplicaRow.status.in_([st.value for st in statuses]))
        with self._read() as s:
            return [_replica(r) for r in s.scalars(q)]


def scheduling_names(
    records: Iterable[DeploymentRecord], tenant_names: Mapping[str, str]
) -> dict[int, str]:
    """Deployment id -> the name the scheduler knows it by (reservations are keyed by it): its
    own name, or ``tenant/name`` when two tenants' deployments share a name."""
    records = builtins.list(records)
    counts: dict[str, int] = {}
    for rec in records:
        counts[rec.name] = counts.get(rec.name, 0) + 1
    return {
        rec.id: rec.name
        if counts[rec.name] == 1
        else f"{tenant_names.get(rec.tenant_id, rec.tenant_id)}/{rec.name}"
        for rec in records
    }

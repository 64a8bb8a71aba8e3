"""Persistence of registered models, their versions and promotions, on the controller's
database.

:class:`RegistryStore` takes the controller :class:`~coadapt.controller.store.Store` and opens
its sessions from the same engine, so the same rules hold: every method is one transaction,
records returned are frozen snapshots, and a tenant only ever sees its own models (a
stranger's model is a :class:`NotFoundError`, like a missing one; the admin sees all).
Version state changes go through :func:`coadapt.registry.states.check_transition`, under a
row lock, so two API calls cannot both promote.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from coadapt.controller.errors import ConflictError, InvalidTransitionError, NotFoundError
from coadapt.controller.store import Store, Tenant
from coadapt.registry.config import GateConfig, ModelSpec, Retention
from coadapt.registry.states import VersionState, check_transition
from coadapt.registry.tables import ModelRow, PromotionRow, VersionRow


@dataclass(frozen=True)
class Model:
    id: int
    tenant_id: str
    name: str
    root: str
    gates: GateConfig
    retention: Retention
    created_at: float
    synced_at: float | None


@dataclass(frozen=True)
class Version:
    model_id: int
    version: str
    kind: str
    parent: str | None
    manifest_sha256: str
    size_bytes: int
    job_id: str | None
    step: int | None
    data_offset: int | None
    created_at: float
    registered_at: float
    state: VersionState
    reason: str | None
    checks: list[dict[str, Any]]
    validated_at: float | None


@dataclass(frozen=True)
class NewVersion:
    """What the scan learnt about a version from its manifest (see :mod:`.scan`)."""

    version: str
    kind: str
    parent: str | None
    manifest_sha256: str
    size_bytes: int
    job_id: str | None
    step: int | None
    data_offset: int | None
    created_at: float


@dataclass(frozen=True)
class Promotion:
    action: str  # promote | rollback | auto | adopt
    from_version: str | None
    to_version: str
    who: str
    at: float


def _model(row: ModelRow) -> Model:
    return Model(
        id=row.id,
        tenant_id=row.tenant_id,
        name=row.name,
        root=row.root,
        gates=GateConfig.model_validate(row.gates or {}),
        retention=Retention.model_validate(row.retention or {}),
        created_at=row.created_at,
        synced_at=row.synced_at,
    )


def _version(row: VersionRow) -> Version:
    return Version(
        model_id=row.model_id,
        version=row.version,
        kind=row.kind,
        parent=row.parent,
        manifest_sha256=row.manifest_sha256,
        size_bytes=row.size_bytes,
        job_id=row.job_id,
        step=row.step,
        data_offset=row.data_offset,
        created_at=row.created_at,
        registered_at=row.registered_at,
        state=VersionState(row.state),
        reason=row.reason,
        checks=[dict(c) for c in (row.checks or [])],
        validated_at=row.validated_at,
    )


def _promotion(row: PromotionRow) -> Promotion:
    return Promotion(row.action, row.from_version, row.to_version, row.who, row.at)


_VERSION_CHANGES = frozenset({"reason", "checks", "validated_at"})


class RegistryStore:
    """Models, versions and promotions, next to the controller's jobs (same engine, rules)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._tx = store.transaction
        self._read = store.reading

    # -- models -----------------------------------------------------------------------------
    def create_model(self, tenant: Tenant, spec: ModelSpec, now: float) -> Model:
        """Register ``spec`` for ``tenant`` (409 if the tenant has a model of that name)."""
        row = ModelRow(
            tenant_id=tenant.id,
            name=spec.name,
            root=spec.root,
            gates=spec.gates.model_dump(mode="json"),
            retention=spec.retention.model_dump(mode="json"),
            created_at=now,
        )
        try:
            with self._tx() as s:
                s.add(row)
                s.flush()
                return _model(row)
        except IntegrityError:
            raise ConflictError(
                f"a model named {spec.name!r} exists already: pick another name, or "
                f"`coadapt model rm {spec.name}` first"
            ) from None

    def model(self, model_id: int) -> Model:
        with self._read() as s:
            row = s.get(ModelRow, model_id)
            if row is None:
                raise NotFoundError(f"no model #{model_id}")
            return _model(row)

    def find_model(self, ref: str, tenant: Tenant) -> Model:
        """The model ``ref`` names for ``tenant``: its own model of that name. The admin also
        reaches any tenant's model, as ``TENANT/NAME`` or by a name only one model has."""
        owner, sep, name = ref.rpartition("/")
        q = select(ModelRow).where(ModelRow.name == (name if sep else ref))
        with self._read() as s:
            rows = list(s.scalars(q.order_by(ModelRow.id)))
            if sep:
                owners = {t.id: t.name for t in self.store.tenants()}
                rows = [r for r in rows if owners.get(r.tenant_id) == owner]
            if not tenant.is_admin:
                rows = [r for r in rows if r.tenant_id == tenant.id]
            else:
                own = [r for r in rows if r.tenant_id == tenant.id]
                rows = own or rows
            if not rows:
                raise NotFoundError(f"no model {ref!r} (see `coadapt model ls`)")
            if len(rows) > 1:
                raise ConflictError(
                    f"several tenants have a model named {ref!r}: name the owner "
                    "(coadapt model ... --owner TENANT, or ?owner=TENANT)"
                )
            return _model(rows[0])

    def list_models(self, tenant: Tenant | None = None) -> list[Model]:
        """Every model ``tenant`` may see (None: the controller itself, all), by name."""
        q = select(ModelRow).order_by(ModelRow.name, ModelRow.id)
        if tenant is not None and not tenant.is_admin:
            q = q.where(ModelRow.tenant_id == tenant.id)
        with self._read() as s:
            return [_model(r) for r in s.scalars(q)]

    def set_synced(self, model_id: int, now: float) -> None:
        with self._tx() as s:
            row = s.get(ModelRow, model_id)
            if row is not None:
                row.synced_at = now

    def delete_model(self, model_id: int) -> None:
        """Forget a model (its rows; its files stay where they are)."""
        with self._tx() as s:
            for table in (PromotionRow, VersionRow):
                for r in s.scalars(select(table).where(table.model_id == model_id)):
                    s.delete(r)
            row = s.get(ModelRow, model_id)
            if row is not None:
                s.delete(row)

    # -- versions ---------------------------------------------------------------------------
    def add_version(self, model_id: int, v: NewVersion, now: float) -> Version:
        """Record a version found complete on disk (``registered``); idempotent."""
        row = VersionRow(
            model_id=model_id,
            version=v.version,
            kind=v.kind,
            parent=v.parent,
            manifest_sha256=v.manifest_sha256,
            size_bytes=v.size_bytes,
            job_id=v.job_id,
            step=v.step,
            data_offset=v.data_offset,
            created_at=v.created_at,
            registered_at=now,
            state=VersionState.REGISTERED.value,
            checks=[],
        )
        try:
            with self._tx() as s:
                s.add(row)
                s.flush()
                return _version(row)
        except IntegrityError:
            existing = self.version(model_id, v.version)
            if existing is None:
                raise
            return existing

    def version(self, model_id: int, version: str) -> Version | None:
        with self._read() as s:
            row = s.scalar(self._version_q(model_id, version))
            return _version(row) if row is not None else None

    def versions(
        self, model_id: int, states: Iterable[VersionState] | None = None
    ) -> list[Version]:
        """A model's versions, oldest first (sequence numbers sort as strings)."""
        q = select(VersionRow).where(VersionRow.model_id == model_id).order_by(VersionRow.version)
        if states is not None:
            q = q.where(VersionRow.state.in_([st.value for st in states]))
        with self._read() as s:
            return [_version(r) for r in s.scalars(q)]

    @staticmethod
    def _version_q(model_id: int, version: str) -> Any:
        return select(VersionRow).where(
            VersionRow.model_id == model_id, VersionRow.version == version
        )

    def _locked(self, s: Session, model_id: int, version: str) -> VersionRow:
        row = s.scalar(self._version_q(model_id, version).with_for_update())
        if row is None:
            raise NotFoundError(f"no version {version!r} (see `coadapt model show NAME`)")
        return row

    def set_state(self, model_id: int, version: str, new: VersionState, **changes: Any) -> Version:
        """Move a version to ``new`` (the state machine must allow it) and set ``changes``
        (``reason``, ``checks``, ``validated_at``) in the same transaction."""
        unknown = set(changes) - _VERSION_CHANGES
        if unknown:
            raise ValueError(f"not changeable version fields: {sorted(unknown)}")
        with self._tx() as s:
            row = self._locked(s, model_id, version)
            check_transition(VersionState(row.state), new, f"version {version}")
            row.state = new.value
            for key, value in changes.items():
                setattr(row, key, value)
            s.flush()
            return _version(row)

    def go_live(self, model_id: int, version: str, action: str, who: str, now: float) -> Promotion:
        """Make ``version`` the live one (the previous live one retires) and record who did
        it, in one transaction. Refused (409) unless the version passed its gates."""
        with self._tx() as s:
            row = self._locked(s, model_id, version)
            state = VersionState(row.state)
            if state is VersionState.LIVE:
                raise InvalidTransitionError(f"version {version} is live already")
            if not state.promotable:
                why = f": {row.reason}" if row.reason else ""
                raise InvalidTransitionError(
                    f"version {version} is {state.value}{why}; only a version that passed "
                    "its gates can go live"
                )
            current = s.scalar(
                select(VersionRow)
                .where(VersionRow.model_id == model_id, VersionRow.state == VersionState.LIVE.value)
                .with_for_update()
            )
            if current is not None:
                current.state = VersionState.RETIRED.value
            row.state = VersionState.LIVE.value
            prom = PromotionRow(
                model_id=model_id,
                action=action,
                from_version=current.version if current is not None else None,
                to_version=version,
                who=who,
                at=now,
            )
            s.add(prom)
            s.flush()
            return _promotion(prom)

    def promotions(self, model_id: int) -> list[Promotion]:
        """The model's live-version changes, oldest first."""
        q = (
            select(PromotionRow)
            .where(PromotionRow.model_id == model_id)
            .order_by(PromotionRow.at, PromotionRow.id)
        )
        with self._read() as s:
            return [_promotion(r) for r in s.scalars(q)]

    def delete_version(self, model_id: int, version: str) -> None:
        """Forget a version's row (refused for the live one); the caller deletes its files."""
        with self._tx() as s:
            row = self._locked(s, model_id, version)
            if row.state == VersionState.LIVE.value:
                raise InvalidTransitionError(
                    f"version {version} is live: promote or roll back to another one first"
                )
            s.delete(row)

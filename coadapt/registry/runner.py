"""The registry's mechanism: registering roots, finding and validating new versions, moving
the LIVE pointer, retention, and the loop that does it all in the background.

Every change of a model happens under that model's lock (the background loop and the API
threads take turns), database first where a record must exist before the files change
(deleting) and files first where the files are what servers act on (promotion: the pointer
moves, then the row says so; a failed row write puts the pointer back).

The LIVE pointer is kept honest on every round: registering a root pins what its servers serve
(or holds them empty, when there is no version yet), so a version published later serves only
once promoted; a pointer that names a version that did not pass its gates (someone ran
``coadapt serve activate``) is put back to the registry's live version.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from coadapt.controller.errors import (
    ConflictError,
    ControllerError,
    InvalidTransitionError,
    NotFoundError,
    SpecError,
)
from coadapt.controller.store import Store, Tenant
from coadapt.registry import retention, scan
from coadapt.registry.config import ModelSpec
from coadapt.registry.states import VersionState
from coadapt.registry.store import Model, Promotion, RegistryStore, Version
from coadapt.registry.validate import Confine, run_gates

log = logging.getLogger("coadapt.registry")

PROMOTE, ROLLBACK, AUTO, ADOPT = "promote", retention.ROLLBACK, "auto", "adopt"


@dataclass(frozen=True)
class SyncReport:
    """What one round did to a model."""

    registered: tuple[str, ...] = ()
    validated: tuple[str, ...] = ()
    promoted: str | None = None
    deleted: tuple[str, ...] = ()


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


class RegistryRunner:
    """Registered models on the controller's database; see the module docstring."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], float],
        *,
        state_dir: Path | None = None,
        jobs_dir: Path | None = None,
        confine: Confine | None = None,
        python: str = sys.executable,
        environ: Mapping[str, str] | None = None,
        run_as_uid: Callable[[str], int | None] | None = None,
    ) -> None:
        self.store = store
        self.registry = RegistryStore(store)
        self.clock = clock
        self.state_dir = state_dir.resolve() if state_dir is not None else None
        self.jobs_dir = jobs_dir.resolve() if jobs_dir is not None else None
        self.confine = confine
        self.python = python
        self.environ = environ
        # Tenant name -> the uid its jobs run as (None: the controller's own, no run-as).
        self.run_as_uid = run_as_uid
        self._locks: dict[tuple[int, bool], threading.Lock] = {}
        self._guard = threading.Lock()
        self._wake = threading.Event()

    def _lock(self, model_id: int, gates: bool = False) -> threading.Lock:
        """The model's lock (its rows, files and pointer), or its gate runner's."""
        with self._guard:
            return self._locks.setdefault((model_id, gates), threading.Lock())

    # -- registering --------------------------------------------------------------------------
    def create(self, tenant: Tenant, spec: ModelSpec) -> Model:
        """Register a model root for ``tenant`` and pin what its servers serve."""
        if importlib.util.find_spec("torch") is None:
            raise SpecError(
                "this controller cannot check model versions: it lacks torch; install "
                "pip install 'coadapt[train]' where the controller runs"
            )
        self._check_root(tenant, spec.root)
        model = self.registry.create_model(tenant, spec, self.clock())
        with self._lock(model.id):
            if not scan.pointer_present(model.root):
                versions = scan.complete_versions(model.root)
                if versions:  # what servers serve now: stays until something is promoted
                    scan.set_live(model.root, versions[-1])
                else:
                    scan.hold(model.root)
        self.poke()
        return model

    def _check_root(self, tenant: Tenant, root: str) -> None:
        path = Path(root)
        if not path.is_dir():
            raise SpecError(
                f"root {root!r} is not a directory: create it (or publish a first version) "
                "and register it again",
                [{"field": "root", "message": "not a directory"}],
            )
        if not scan.is_model_root(root):
            raise SpecError(
                f"root {root!r} holds other things than model versions: give the directory "
                "coadapt.serve.publish writes versions into (or a new, empty one)",
                [{"field": "root", "message": "not a model's version root"}],
            )
        real = path.resolve()
        for other in self.registry.list_models(None):
            theirs = Path(other.root).resolve()
            if _within(real, theirs) or _within(theirs, real):
                raise ConflictError(
                    f"root {root!r} overlaps the root of a registered model"
                    + (f" ({other.name})" if other.tenant_id == tenant.id else "")
                    + ": give each model a directory of its own"
                )
        if tenant.is_admin or self.state_dir is None:
            return
        if _within(self.state_dir, real):
            raise SpecError(
                f"root {root!r} holds the controller's state directory",
                [{"field": "root", "message": "not allowed"}],
            )
        if _within(real, self.state_dir):
            job = self._own_job_of(tenant, real)
            if job is None:
                raise SpecError(
                    f"root {root!r} lies in the controller's state directory outside your "
                    "jobs' directories: publish into your job's directory or a shared one",
                    [{"field": "root", "message": "not allowed"}],
                )
            return
        # Outside the state dir the controller writes LIVE and deletes versions as its own
        # user: only in a directory the tenant's jobs could change themselves, i.e. one its
        # run-as user owns, reached without symbolic links (which could be re-pointed later).
        if real != path:
            raise SpecError(
                f"root {root!r} goes through a symbolic link (it is {str(real)!r}): register "
                "the real path",
                [{"field": "root", "message": "symbolic link"}],
            )
        reason = self._foreign_root(tenant.name, real)
        if reason is not None:
            raise SpecError(reason, [{"field": "root", "message": "not yours"}])

    def _foreign_root(self, tenant: str, real: Path) -> str | None:
        """Why ``real`` is not a root the tenant may hand the controller (None: it may)."""
        uid = self.run_as_uid(tenant) if self.run_as_uid is not None else None
        if uid is None:
            return None  # jobs run as the controller's user: nothing to escalate to
        owner = real.stat().st_uid
        if owner != uid:
            return (
                f"root {str(real)!r} belongs to uid {owner}, not to uid {uid} that tenant "
                f"{tenant}'s jobs run as: give the model a directory your jobs' user owns"
            )
        return None

    def _check_still_owned(self, model: Model) -> None:
        """Refuse a round on a root that changed hands (or became a link) since it was
        registered: the controller must not write or delete there any more."""
        tenant = self._tenant_name(model.tenant_id)
        if self._is_admin(model.tenant_id):
            return
        path = Path(model.root)
        if self.state_dir is not None and _within(path.resolve(), self.state_dir):
            return
        if path.resolve() != path:
            raise ConflictError(f"root {model.root} became a symbolic link: re-register it")
        reason = self._foreign_root(tenant, path)
        if reason is not None:
            raise ConflictError(reason)

    def _is_admin(self, tenant_id: str) -> bool:
        return any(t.is_admin for t in self.store.tenants() if t.id == tenant_id)

    def _own_job_of(self, tenant: Tenant, real: Path) -> str | None:
        if self.jobs_dir is None or not _within(real, self.jobs_dir) or real == self.jobs_dir:
            return None
        job_id = real.relative_to(self.jobs_dir).parts[0]
        try:
            return self.store.get_job(job_id, tenant).id
        except NotFoundError:
            return None

    def forget(self, model: Model) -> None:
        """Unregister a model (rows only; its files and LIVE pointer stay)."""
        with self._lock(model.id):
            self.registry.delete_model(model.id)

    # -- the round ------------------------------------------------------------------------------
    def sync(self, model: Model) -> SyncReport:
        """Find new versions, run their gates, keep the pointer honest, auto-promote and apply
        retention: one model's whole round. Gates run without the model's lock held (they
        take seconds to minutes), so promote, rollback and the API's sync never wait for
        them; one gate runner per model at a time."""
        with self._lock(model.id):
            self._check_still_owned(model)
            registered = self._discover(model)
        with self._lock(model.id, gates=True):
            validated = self._validate_pending(model)
        with self._lock(model.id):
            self._check_still_owned(model)  # again: the gates took a while
            self._reconcile_pointer(model)
            promoted = self._auto_promote(model) if model.gates.auto_promote else None
            deleted = self._apply_retention(model)
            self.registry.set_synced(model.id, self.clock())
        return SyncReport(registered, validated, promoted, deleted)

    def discover(self, model: Model) -> tuple[str, ...]:
        """Only register new complete versions (the API's ``sync``; gates follow in the loop)."""
        with self._lock(model.id):
            return self._discover(model)

    def _discover(self, model: Model) -> tuple[str, ...]:
        known = {v.version: v for v in self.registry.versions(model.id)}
        new = []
        for name in scan.complete_versions(model.root):
            old = known.get(name)
            if old is not None:
                self._check_unchanged(model, old)
                continue
            row, why = scan.describe(model.root, name)
            self.registry.add_version(model.id, row, self.clock())
            if why is not None:
                check = {"name": "manifest", "status": "failed", "value": None, "bound": None,
                         "reason": why}  # fmt: skip
                self.registry.set_state(
                    model.id, name, VersionState.FAILED, reason=why, checks=[check],
                    validated_at=self.clock(),
                )  # fmt: skip
            new.append(name)
        return tuple(new)

    def _check_unchanged(self, model: Model, v: Version) -> None:
        """A manifest that changed after registration voids the gates (another version)."""
        if v.state is VersionState.FAILED:
            return
        digest = scan.manifest_digest(model.root, v.version)
        if digest is None or digest == v.manifest_sha256:
            return
        why = "its manifest changed after it was registered; publish a new version instead"
        if v.state is VersionState.LIVE:
            log.warning("model %s: live version %s: %s", model.name, v.version, why)
            return
        self.registry.set_state(model.id, v.version, VersionState.FAILED, reason=why)

    def _validate_pending(self, model: Model) -> tuple[str, ...]:
        done = []
        pending = (VersionState.REGISTERED, VersionState.VALIDATING)
        for v in self.registry.versions(model.id, pending):
            with self._lock(model.id):
                now = self.registry.version(model.id, v.version)
                if now is None or now.state not in pending:
                    continue  # removed (or decided) meanwhile
                if now.state is VersionState.REGISTERED:
                    self.registry.set_state(model.id, v.version, VersionState.VALIDATING)
                live = self._serving(model)
            outcome = run_gates(
                model.root,
                v.version,
                live,
                model.gates,
                self._tenant_name(model.tenant_id),
                python=self.python,
                confine=self.confine,
                environ=self.environ,
            )
            state = VersionState.PASSED if outcome.passed else VersionState.FAILED
            with self._lock(model.id):
                try:
                    self.registry.set_state(
                        model.id, v.version, state, reason=outcome.reason,
                        checks=outcome.checks, validated_at=self.clock(),
                    )  # fmt: skip
                except NotFoundError:  # `rm` took it while its gates ran
                    continue
            log.info("model %s version %s: gates %s", model.name, v.version, state.value)
            done.append(v.version)
        return tuple(done)

    def _tenant_name(self, tenant_id: str) -> str:
        return next((t.name for t in self.store.tenants() if t.id == tenant_id), tenant_id)

    def _serving(self, model: Model) -> str | None:
        """The version servers serve now (what drift is measured against)."""
        return scan.pointer(model.root)

    def _reconcile_pointer(self, model: Model) -> None:
        """Servers serve the registry's live version (or nothing): adopt a passed version
        someone pointed them at by hand, put back anything else, re-pin a deleted pointer."""
        versions = {v.version: v for v in self.registry.versions(model.id)}
        live = next((v.version for v in versions.values() if v.state is VersionState.LIVE), None)
        named = scan.pointer(model.root)
        if named == live and scan.pointer_present(model.root):
            return
        if named is not None:
            target = versions.get(named)
            if target is not None and target.state.promotable:
                self.registry.go_live(model.id, named, ADOPT, "registry", self.clock())
                return
            if target is None and live is None:
                return  # not registered yet: the next round validates it
            log.warning(
                "model %s: LIVE named %s, which did not pass its gates; put back to %s",
                model.name, named, live or "nothing",
            )  # fmt: skip
        if live is not None:
            scan.set_live(model.root, live)
        else:
            scan.hold(model.root)

    def _auto_promote(self, model: Model) -> str | None:
        versions = self.registry.versions(model.id)
        live = next((v.version for v in versions if v.state is VersionState.LIVE), "")
        fresh = [v.version for v in versions if v.state is VersionState.PASSED]
        if not fresh or fresh[-1] <= live:
            return None
        self._go_live(model, fresh[-1], AUTO, "auto_promote")
        return fresh[-1]

    def _apply_retention(self, model: Model) -> tuple[str, ...]:
        gone = retention.to_delete(
            self.registry.versions(model.id), self.registry.promotions(model.id), model.retention
        )
        for name in gone:
            self.registry.delete_version(model.id, name)
            scan.remove_files(model.root, name)
        if gone:
            log.info("model %s: retention removed %s", model.name, ", ".join(gone))
        return tuple(gone)

    # -- the operator's actions ------------------------------------------------------------------
    def promote(self, model: Model, version: str, who: str) -> Promotion:
        """Make ``version`` live (refused unless it passed its gates); servers hot-swap."""
        with self._lock(model.id):
            return self._go_live(model, version, PROMOTE, who)

    def rollback(self, model: Model, who: str) -> Promotion:
        """Back to the version that was live before the live one."""
        with self._lock(model.id):
            target = retention.rollback_target(
                self.registry.promotions(model.id), self.registry.versions(model.id)
            )
            if target is None:
                raise InvalidTransitionError(
                    f"model {model.name} has no previous live version to roll back to (it was "
                    "removed, or only one version was ever live): promote one instead"
                )
            return self._go_live(model, target, ROLLBACK, who)

    def _go_live(self, model: Model, version: str, action: str, who: str) -> Promotion:
        self._check_still_owned(model)
        v = self.registry.version(model.id, version)
        if v is None:
            raise NotFoundError(f"model {model.name} has no version {version!r}")
        if not v.state.promotable:
            why = f" ({v.reason})" if v.reason else ""
            raise InvalidTransitionError(
                f"version {version} is {v.state.value}{why}: only a version that passed its "
                "gates can go live"
            )
        before = scan.pointer(model.root)
        from coadapt.serve.artifacts import ArtifactError

        try:
            scan.set_live(model.root, version)
        except ArtifactError as exc:
            raise ConflictError(f"cannot point servers at version {version}: {exc}") from exc
        try:
            return self.registry.go_live(model.id, version, action, who, self.clock())
        except BaseException:
            if before is not None:
                scan.set_live(model.root, before)
            else:
                scan.hold(model.root)
            raise

    def remove(self, model: Model, version: str) -> None:
        """Delete a version: refused for the live one and for the base of a kept delta; the
        row goes first, then the files."""
        with self._lock(model.id):
            self._check_still_owned(model)
            versions = self.registry.versions(model.id)
            kids = retention.dependants(version, versions)
            if kids:
                raise ConflictError(
                    f"version {version} is the base of delta(s) {', '.join(kids)}: remove "
                    "those first"
                )
            self.registry.delete_version(model.id, version)
            scan.remove_files(model.root, version)

    # -- the loop -------------------------------------------------------------------------------
    def poke(self) -> None:
        """Run a round now (a model was registered or synced through the API)."""
        self._wake.set()

    def sync_all(self) -> None:
        for model in self.registry.list_models(None):
            try:
                self.sync(model)
            except (ControllerError, OSError, ValueError, ImportError) as exc:
                log.warning("model %s: sync failed: %s", model.name, exc)
            except Exception:  # e.g. the model was unregistered mid-round: the loop goes on
                log.exception("model %s: sync failed", model.name)

    def run(self, stop: threading.Event, tick: float) -> None:
        """Sync every model every ``tick`` seconds (or when poked) until ``stop`` is set."""
        while not stop.is_set():
            self.sync_all()
            self._wake.wait(tick)
            self._wake.clear()

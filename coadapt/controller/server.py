"""The controller process's parts: options, admin token, replica isolation, shutdown report.

:mod:`coadapt.service` assembles them with the store, the executor, the loops and the API
into ``coadapt server``; nothing here imports above the controller.

State lives in the database (SQLite file ``STATE_DIR/coadapt.db`` by default); job logs and
checkpoints under ``STATE_DIR/jobs/``. Stopping or killing the controller does not stop the
jobs: their replicas run in their own sessions, and the next controller re-adopts them.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from coadapt.controller.errors import SpecError
from coadapt.controller.paths import (
    ADMIN_TOKEN_FILE,
    DEFAULT_PORT,
    default_state_dir,
)
from coadapt.controller.store import Store
from coadapt.executors import (
    Executor,
    detect_gpus,
    memlimit,
    sandbox,
)
from coadapt.executors.sandbox import Isolation, SandboxError

log = logging.getLogger("coadapt.controller")


def ensure_admin_token(store: Store, state_dir: Path, now: float) -> str:
    """The admin token: created (mode 0600) on first start, re-registered if the DB is new."""
    path = state_dir / ADMIN_TOKEN_FILE
    if path.exists():
        token = path.read_text(encoding="utf-8").strip()
    else:
        token = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(token + "\n")
    admin = store.tenant_by_name("admin")
    if admin is None:
        admin, _ = store.create_tenant("admin", now, is_admin=True)
    store.add_token(admin.id, token, now)
    return token


@dataclass
class ServerOptions:
    state_dir: Path = field(default_factory=default_state_dir)
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    db: str | None = None
    slots: int | dict[str, int] | None = None  # a count, or slots per GPU type (a100:4)
    policy: str = "pollux"
    interval: float = 60.0
    tick: float = 0.5
    stop_grace: float = 30.0
    restart_delay: float = 30.0
    backoff: float = 2.0
    seed: int = 0
    log_level: str = "warning"
    tune_policy: str = "ei-per-gpu"  # cross-tenant tuning policy (coadapt.tune.policies)
    tune_tick: float = 1.0
    executor: str = "local"  # or "ray" (coadapt.executors.ray_executor)
    ray_address: str | None = None  # None with --executor ray: start a local Ray cluster
    ray_slot_resource: str | None = None  # None: GPU if the cluster has GPUs, else CPU
    ray_namespace: str = "coadapt"
    placement_timeout: float = 60.0  # give up a placement group not placed by then
    shared_dir: Path | None = None  # job dirs (checkpoints, logs) where every node sees them
    # Replica confinement (coadapt.executors.sandbox, docs/security.md).
    isolation: str = "auto"  # auto | namespace | user | none
    run_as: str | None = None  # USER[:GROUP]; default nobody (root controller only)
    run_as_tenant: dict[str, str] = field(default_factory=dict)  # tenant -> USER[:GROUP]
    memory_per_slot: str | None = None  # e.g. "16G": per-replica limit (cgroup or RLIMIT_AS)
    # GPU sharing: measured co-location figures (--colocation FILE, coadapt.controller.colocation)
    colocation: Mapping[tuple[str, str], tuple[float, float]] = field(default_factory=dict)


def private_file(path: Path) -> None:
    """Create ``path`` (if missing) or narrow it to mode 0600."""
    if not path.exists():
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    path.chmod(0o600)


def resolve_isolation(
    options: ServerOptions, state_dir: Path, jobs_root: Path, executor: Executor | None
) -> Isolation:
    """What confines replicas: the local executor's sandbox, or nothing (Ray, tests' fakes)."""
    if executor is not None:
        found = getattr(executor, "isolation", None)
        return found if isinstance(found, Isolation) else Isolation(note="executor not confined")
    if options.executor != "local":
        if options.isolation not in ("auto", "none") or options.memory_per_slot:
            raise SpecError(
                "--isolation/--memory-per-slot confine --executor local replicas only; Ray "
                "replicas run as the Ray workers' user (docs/security.md)"
            )
        return Isolation(note=f"--executor {options.executor}: replicas are not confined")
    try:
        memory = None
        if options.memory_per_slot:
            gpus = not isinstance(options.slots, int) and detect_gpus() > 0
            memory = memlimit.detect(memlimit.parse_size(options.memory_per_slot), gpus=gpus)
        hide = tuple(dict.fromkeys((str(state_dir), str(jobs_root))))
        return sandbox.resolve(
            options.isolation,
            run_as=options.run_as,
            tenant_run_as=options.run_as_tenant,
            hide=hide,
            jobs_root=str(jobs_root),
            memory=memory,
        )
    except (SandboxError, memlimit.MemoryLimitError) as exc:
        raise SpecError(str(exc)) from exc


def describe_isolation(isolation: Isolation | None) -> str:
    """One line for the start-up banner."""
    if isolation is None:
        return "none (this executor does not confine replicas)"
    d = isolation.describe()
    parts = [str(d["mode"])]
    if d["run_as"]:
        parts.append(f"run as {d['run_as']}")
    if d["tenant_run_as"]:
        parts.append("per tenant " + ", ".join(f"{t}={u}" for t, u in d["tenant_run_as"].items()))
    if isolation.memory is not None:
        parts.append(f"memory {isolation.memory.describe()}")
    if d["note"]:
        parts.append(str(d["note"]))
    return "; ".join(parts)


def isolation_guard(options: ServerOptions, isolation: Isolation) -> Callable[[], None]:
    """Raises (SpecError) when tenants other than the admin would share unconfined replicas,
    unless ``--isolation none`` accepted that risk explicitly (single-tenant use is fine)."""

    def check() -> None:
        if isolation.mode != "none" or options.isolation == "none":
            return
        why = f" ({isolation.note})" if isolation.note else ""
        raise SpecError(
            "multi-tenant mode needs isolated replicas, and none is available here"
            f"{why}: any job could read the admin token and the database. Fix the cause, "
            "or pass --isolation none to accept the risk explicitly (docs/security.md)"
        )

    return check


def shutdown_report(store: Store, received: list[int]) -> None:
    """Log what stopping did, checkpoint the SQLite WAL and close the database."""
    why = signal.Signals(received[0]).name if received else "server stopped"
    loop_alive = any(
        t.name in ("coadapt-loop", "coadapt-tune") and t.is_alive() for t in threading.enumerate()
    )
    log.info(
        "shutdown (%s): %s",
        why,
        "the scheduling loop did not stop within 10 s (abandoned)"
        if loop_alive
        else "stopped the scheduling and tuning loops",
    )
    try:
        live = store.replicas(statuses=("starting", "live"))
        jobs = {r.job_id for r in live}
        log.info(
            "shutdown: left %d replica(s) of %d job(s) running for the next controller to adopt",
            len(live),
            len(jobs),
        )
    except Exception as exc:  # the report must not stop the clean-up
        log.warning("shutdown: cannot count the running replicas: %s", exc)
    if store.engine.dialect.name == "sqlite":
        try:
            raw = store.engine.raw_connection()
            try:
                cur = raw.cursor()
                cur.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                busy, _frames, done = cur.fetchone() or (1, -1, -1)
                cur.close()
            finally:
                raw.close()
            if busy:
                log.warning("shutdown: WAL checkpoint incomplete (database busy)")
            else:
                log.info("shutdown: checkpointed the SQLite WAL (%d frame(s))", done)
        except Exception as exc:
            log.warning("shutdown: WAL checkpoint failed: %s", exc)
    store.close()
    log.info("shutdown: closed the database; bye")

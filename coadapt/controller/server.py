"""``coadapt server``: the controller process (API + scheduling loop + local executor).

State lives in the database (SQLite file ``STATE_DIR/coadapt.db`` by default); job logs and
checkpoints under ``STATE_DIR/jobs/``. Stopping or killing the controller does not stop the
jobs: their replicas run in their own sessions, and the next controller re-adopts them.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from coadapt.controller.api import ApiContext, create_app
from coadapt.controller.db import sqlite_url
from coadapt.controller.errors import SpecError
from coadapt.controller.paths import (
    ADMIN_TOKEN_FILE,
    DEFAULT_PORT,
    SERVER_FILE,
    default_state_dir,
)
from coadapt.controller.reconciler import Controller, ControllerConfig
from coadapt.controller.store import Store
from coadapt.executors import Executor, ExecutorError, create_executor
from coadapt.policies import POLICY_NAMES, make_policy

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
    slots: int | None = None
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


def build(
    options: ServerOptions, executor: Executor | None = None, clock: Callable[[], float] = time.time
) -> tuple[FastAPI, Controller, Store]:
    """Open the database (migrating it), create the admin token and wire API + loop."""
    if options.policy not in POLICY_NAMES:
        raise SpecError(
            f"--policy: unknown policy {options.policy!r}; accepted: {', '.join(POLICY_NAMES)}"
        )
    if options.interval <= 0:
        raise SpecError(f"--interval: {options.interval} is invalid; accepted: seconds > 0")
    from coadapt.tune.policies import POLICY_NAMES as TUNE_POLICIES
    from coadapt.tune.runner import TuneRunner

    if options.tune_policy not in TUNE_POLICIES:
        raise SpecError(
            f"--tune-policy: unknown policy {options.tune_policy!r}; "
            f"accepted: {', '.join(TUNE_POLICIES)}"
        )
    if executor is None:
        try:
            executor = create_executor(
                options.executor,
                slots=options.slots,
                ray_address=options.ray_address,
                ray_slot_resource=options.ray_slot_resource,
                ray_namespace=options.ray_namespace,
                placement_timeout=options.placement_timeout,
            )
        except ExecutorError as exc:
            raise SpecError(str(exc)) from exc
    state_dir = options.state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    store = Store.open(options.db or sqlite_url(state_dir / "coadapt.db"))
    ensure_admin_token(store, state_dir, clock())
    shared_dir = options.shared_dir.resolve() if options.shared_dir is not None else None
    host = "127.0.0.1" if options.host in ("0.0.0.0", "::", "") else options.host
    config = ControllerConfig(
        state_dir=state_dir,
        interval=options.interval,
        stop_grace=options.stop_grace,
        backoff_base=options.backoff,
        restart_delay=options.restart_delay,
        seed=options.seed,
        metrics_base_url=f"http://{host}:{options.port}",
        shared_dir=shared_dir,
    )
    controller = Controller(store, executor, make_policy(options.policy), config, clock)
    tuner = TuneRunner(
        store, lambda: controller.slots, options.tune_policy, clock, on_change=controller.poke
    )
    stop = threading.Event()

    def round_info() -> dict[str, Any]:
        return {
            "count": controller.rounds,
            "at": controller.last_round_at,
            "seconds": controller.last_round_seconds,
            "interval": options.interval,
        }

    ctx = ApiContext(
        store=store,
        state_dir=state_dir,
        slots=controller.slots,
        policy=options.policy,
        clock=clock,
        on_change=controller.poke,
        round_info=round_info,
        jobs_dir=controller.job_dir("_").parent,
        inventory=lambda: [(n.name, n.gpus) for n in controller.nodes],
    )
    app = create_app(ctx)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        thread = threading.Thread(
            target=controller.run, args=(stop, options.tick), name="coadapt-loop", daemon=True
        )
        thread.start()
        tune_thread = threading.Thread(
            target=tuner.run, args=(stop, options.tune_tick), name="coadapt-tune", daemon=True
        )
        tune_thread.start()
        try:
            yield
        finally:
            stop.set()
            controller.poke()
            thread.join(timeout=10)
            tune_thread.join(timeout=10)
            tuner.close()

    app.router.lifespan_context = lifespan
    return app, controller, store


def serve(options: ServerOptions) -> int:
    """Run the controller until SIGINT/SIGTERM (jobs keep running; a restart re-adopts)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app, controller, store = build(options)
    state_dir = options.state_dir.resolve()
    url = (
        f"http://{'127.0.0.1' if options.host in ('0.0.0.0', '::') else options.host}:"
        f"{options.port}"
    )
    (state_dir / SERVER_FILE).write_text(json.dumps({"url": url, "pid": os.getpid()}))
    print(
        f"coadapt controller on {url} (docs {url}/docs), policy {options.policy}, "
        f"{controller.slots} {'GPU' if controller.executor.uses_gpus() else 'CPU'} slots, "
        f"state {state_dir}, admin token in {state_dir / ADMIN_TOKEN_FILE}",
        flush=True,
    )
    server = uvicorn.Server(
        uvicorn.Config(
            app, host=options.host, port=options.port, log_level=options.log_level, access_log=False
        )
    )
    try:
        server.run()
    finally:
        store.close()
    return 0

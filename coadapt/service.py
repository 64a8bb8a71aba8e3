"""The composition root: the one place that assembles the controller service.

``coadapt server`` is built here and nowhere else: the store (database, migrations), the
executor, the scheduling policy and loop (:mod:`coadapt.controller.reconciler`), the tuning
loop (:mod:`coadapt.tune.runner`), the API routers (jobs, tenants, cluster and metrics
ingestion from :mod:`coadapt.controller.api`, the dashboard, tuning) and the threads that run
the loops. Everything it imports sits below it; nothing below imports it (the import arrows
are drawn in ``docs/architecture.md`` and enforced by ``tests/test_architecture.py``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI

from coadapt.controller import api
from coadapt.controller.api import ApiContext, TenantIn
from coadapt.controller.dashboard.routes import mount_dashboard
from coadapt.controller.db import sqlite_url
from coadapt.controller.errors import SpecError
from coadapt.controller.openapi import install_docs, install_openapi
from coadapt.controller.paths import ADMIN_TOKEN_FILE, SERVER_FILE
from coadapt.controller.reconciler import Controller, ControllerConfig
from coadapt.controller.server import (
    ServerOptions,
    describe_isolation,
    ensure_admin_token,
    isolation_guard,
    private_file,
    resolve_isolation,
    shutdown_report,
)
from coadapt.controller.spec import JobSpec
from coadapt.controller.store import Store
from coadapt.deploy.api import deploy_router
from coadapt.deploy.metrics import DeploymentCollector
from coadapt.deploy.plane import DeploymentPlane
from coadapt.deploy.spec import DeploymentSpec
from coadapt.deploy.store import DeploymentStore
from coadapt.executors import Executor, ExecutorError, create_executor
from coadapt.policies import POLICY_NAMES, make_policy
from coadapt.registry.api import PromoteIn, registry_router
from coadapt.registry.config import ModelSpec
from coadapt.registry.runner import RegistryRunner
from coadapt.registry.validate import gate_confinement
from coadapt.tune.api import tune_router
from coadapt.tune.policies import POLICY_NAMES as TUNE_POLICIES
from coadapt.tune.runner import TuneRunner
from coadapt.tune.spec import ExperimentSpec
from coadapt.tune.store import TuneStore

log = logging.getLogger("coadapt.controller")
#: How often the registry looks for new versions under the registered roots (and runs gates).
REGISTRY_TICK_S = 2.0

__all__ = ["ServerOptions", "build", "create_app", "serve"]


def create_app(ctx: ApiContext, registry: RegistryRunner | None = None) -> FastAPI:
    """The whole HTTP service: the controller's routes, tuning, the dashboard and the docs.

    Order matters only for the dashboard, mounted last: its static files are served under
    its own prefix and must not shadow an API route."""
    app = api.create_app(ctx)
    auth = api.authenticator(ctx.store)
    app.include_router(tune_router(TuneStore(ctx.store), ctx.clock, auth, ctx.on_change))
    if registry is None:  # routes without the background round (tests of other routers)
        registry = RegistryRunner(
            ctx.store, ctx.clock, state_dir=ctx.state_dir, jobs_dir=ctx.jobs_dir
        )
    app.include_router(registry_router(registry, auth))
    deploys = DeploymentStore(ctx.store)
    app.include_router(deploy_router(deploys, registry.registry, ctx.clock, auth, ctx.on_change))
    app.state.metrics_registry.register(DeploymentCollector(deploys))
    mount_dashboard(app, ctx, auth)
    install_docs(app)
    install_openapi(app, [JobSpec, ExperimentSpec, TenantIn, ModelSpec, PromoteIn, DeploymentSpec])
    return app


def build(
    options: ServerOptions, executor: Executor | None = None, clock: Callable[[], float] = time.time
) -> tuple[FastAPI, Controller, Store]:
    """Open the database (migrating it), create the admin token, and wire the scheduling
    loop, the tuning loop and the API; the loops' threads start and stop with the app."""
    if options.policy not in POLICY_NAMES:
        raise SpecError(
            f"--policy: unknown policy {options.policy!r}; accepted: {', '.join(POLICY_NAMES)}"
        )
    if options.interval <= 0:
        raise SpecError(f"--interval: {options.interval} is invalid; accepted: seconds > 0")
    if options.tune_policy not in TUNE_POLICIES:
        raise SpecError(
            f"--tune-policy: unknown policy {options.tune_policy!r}; "
            f"accepted: {', '.join(TUNE_POLICIES)}"
        )
    state_dir = options.state_dir.resolve()
    shared_dir = options.shared_dir.resolve() if options.shared_dir is not None else None
    jobs_root = (shared_dir or state_dir) / "jobs"
    isolation = resolve_isolation(options, state_dir, jobs_root, executor)
    if executor is None:
        try:
            executor = create_executor(
                options.executor,
                slots=options.slots,
                ray_address=options.ray_address,
                ray_slot_resource=options.ray_slot_resource,
                ray_namespace=options.ray_namespace,
                placement_timeout=options.placement_timeout,
                isolation=isolation if isolation.active else None,
            )
        except ExecutorError as exc:
            raise SpecError(str(exc)) from exc
    # Only the controller enters the state dir; ``user`` mode (no namespaces) must let the
    # run-as user traverse (not list) it to reach its own job dir.
    traverse = 0o711 if isolation.mode == "user" else 0o700
    state_dir.mkdir(parents=True, exist_ok=True)
    state_dir.chmod(traverse)
    jobs_root.mkdir(parents=True, exist_ok=True)
    jobs_root.chmod(traverse)
    if options.db is None:
        for suffix in ("", "-wal", "-shm"):  # SQLite gives -wal/-shm the database's mode
            if suffix == "" or (state_dir / f"coadapt.db{suffix}").exists():
                private_file(state_dir / f"coadapt.db{suffix}")
    store = Store.open(options.db or sqlite_url(state_dir / "coadapt.db"))
    ensure_admin_token(store, state_dir, clock())
    (state_dir / ADMIN_TOKEN_FILE).chmod(0o600)
    guard = isolation_guard(options, isolation)
    if any(not t.is_admin for t in store.tenants()):
        guard()
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
        colocation=dict(options.colocation),
    )
    if options.colocation and not executor.shares_slots:
        log.warning(
            "--colocation: executor %s cannot share a slot between two jobs; the co-location "
            "table is ignored and no job is packed",
            executor.name,
        )
    # Deployments (issue 17): their gateways and replicas, scheduled beside training.
    plane = DeploymentPlane(
        DeploymentStore(store), executor, state_dir, options.stop_grace, jobs_dir=jobs_root
    )
    controller = Controller(
        store, executor, make_policy(options.policy), config, clock, serving=plane
    )
    tuner = TuneRunner(
        store, lambda: controller.slots, options.tune_policy, clock, on_change=controller.poke
    )
    registry = RegistryRunner(
        store,
        clock,
        state_dir=state_dir,
        jobs_dir=jobs_root,
        confine=gate_confinement(isolation),
        run_as_uid=lambda tenant: who.uid if (who := isolation.identity(tenant)) else None,
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
        gpu_types=lambda: {n.name: n.gpu_type for n in controller.nodes},
        isolation=isolation.describe(),
        admit_tenant=guard,
        serving_slots=plane.occupied,
        packing_keys=frozenset(k for pair in options.colocation for k in pair),
        shares_slots=executor.shares_slots,
    )
    app = create_app(ctx, registry)

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
        registry_thread = threading.Thread(
            target=registry.run, args=(stop, REGISTRY_TICK_S), name="coadapt-registry", daemon=True
        )
        registry_thread.start()
        try:
            yield
        finally:
            stop.set()
            controller.poke()
            thread.join(timeout=10)
            tune_thread.join(timeout=10)
            registry.poke()
            registry_thread.join(timeout=10)
            tuner.close()

    app.router.lifespan_context = lifespan
    return app, controller, store


def serve(options: ServerOptions) -> int:
    """Run the controller until SIGINT/SIGTERM (jobs keep running; a restart re-adopts).

    On the signal uvicorn stops serving and the lifespan stops the scheduling loop; then this
    logs what the shutdown did, checkpoints SQLite's WAL into the database file (so the state
    dir is one self-contained file while no controller runs) and closes the database.
    uvicorn re-raises the captured signal after it shut down; the handlers installed here
    turn that into a plain return, so the clean-up below runs and the exit status is 0.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app, controller, store = build(options)
    state_dir = options.state_dir.resolve()
    url = (
        f"http://{'127.0.0.1' if options.host in ('0.0.0.0', '::') else options.host}:"
        f"{options.port}"
    )
    private_file(state_dir / SERVER_FILE)
    (state_dir / SERVER_FILE).write_text(json.dumps({"url": url, "pid": os.getpid()}))
    iso = getattr(controller.executor, "isolation", None)
    print(f"coadapt replica isolation: {describe_isolation(iso)}", flush=True)
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
    received: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda signum, _frame: received.append(signum))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutdown_report(store, received)
    return 0

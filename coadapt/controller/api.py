"""The REST API (FastAPI; OpenAPI schema at ``/docs`` and ``/openapi.json``).

Authentication: ``Authorization: Bearer TOKEN`` with a tenant's API token. The admin token
(``STATE_DIR/admin-token``) sees every job and may create tenants; a tenant sees, reads logs
of and cancels only its own jobs (a stranger's job is a 404, like a missing one).

Metrics ingestion (``POST /api/v1/jobs/{id}/metrics?token=JOBTOKEN``) is authenticated with a
per-job token the controller derives (HMAC of the job id with a secret kept in the database)
and hands each replica in ``ReplicaEnv.metrics_url``; the training library posts to that URL as is.
A metric is stored with the record's own ``time`` (when the trial reported it) if that lies
within :data:`MAX_RECORD_AGE_S` before its arrival, else with the arrival time.

All errors are JSON ``{"error", "message", "details"?}``; :class:`ControllerError` subclasses
are mapped to their status here and nowhere else. Bodies are capped at
:data:`~coadapt.controller.http_input.MAX_BODY_BYTES` (413), integer parameters at what the
database and a file offset hold, and the OpenAPI schema (:mod:`~coadapt.controller.openapi`)
declares the bodies, the bearer scheme and every error status.
"""

# No ``from __future__ import annotations`` here: FastAPI reads the endpoint annotations at
# definition time, and the ``Auth`` dependency alias is local to :func:`create_app`.
import json
import math
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from coadapt import __version__
from coadapt.controller.colocation import packing_note
from coadapt.controller.dashboard.series import is_series, record_series
from coadapt.controller.errors import (
    ControllerError,
    ForbiddenError,
    NotFoundError,
    SpecError,
)
from coadapt.controller.http_input import (
    BIGINT_MAX,
    INT32_MAX,
    MAX_BODY_BYTES,
    BodySizeLimit,
    json_body,
    tokens_equal,
    too_large,
)
from coadapt.controller.openapi import error_responses
from coadapt.controller.openapi import json_body as body_schema
from coadapt.controller.prom import metrics_registry
from coadapt.controller.snapshot import ATTEMPT_GPU_TYPE, PERF_GPU_TYPE, speedup
from coadapt.controller.spec import JobSpec, check_cluster_types, parse_spec
from coadapt.controller.states import ACTIVE, JobState, check_transition
from coadapt.controller.store import Job, Store, Tenant
from coadapt.policies import DEFAULT_GPU_TYPE
from coadapt.protocol import (
    BatchRecord,
    CancelCause,
    EventKind,
    GoodputRecord,
    MetricRecord,
    MetricReport,
    ProgressRecord,
    RecordError,
    StoppedRecord,
    parse_record,
)

MAX_METRICS_BYTES = MAX_BODY_BYTES
MAX_LOG_CHUNK = 1 << 20
#: HTTP error statuses Starlette raises itself (unknown route, wrong method), as our codes.
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


@dataclass
class ApiContext:
    """What the API needs from the server: storage, the clock, and a way to wake the loop."""

    store: Store
    state_dir: Path
    slots: int
    policy: str
    clock: Callable[[], float]
    on_change: Callable[[], None] = lambda: None
    round_info: Callable[[], dict[str, Any]] = dict
    jobs_dir: Path | None = None  # job logs and checkpoints (default: STATE_DIR/jobs)
    # The nodes the loop saw last, as (name, slots): nodes join and leave on Ray clusters.
    # None means one node "local" with ``slots`` slots (tests, single machine).
    inventory: Callable[[], Sequence[tuple[str, int]]] | None = None
    # Replica confinement in force (shown in the cluster view), and the check that refuses
    # a new tenant when replicas cannot be isolated (coadapt.controller.server).
    isolation: dict[str, Any] | None = None
    admit_tenant: Callable[[], None] = lambda: None
    # Node name -> GPU type as the loop saw it last; None (or a node missing): the default.
    gpu_types: Callable[[], Mapping[str, str]] | None = None
    # GPU sharing: the keys of the co-location table, and whether the executor can share a
    # slot (a job whose packing_key cannot pack gets an event at submit saying why).
    # Slots serving replicas hold now, (node, slot) (issue 17; the deployment plane's).
    serving_slots: Callable[[], Collection[tuple[str, int]]] = frozenset
    packing_keys: frozenset[str] = frozenset()
    shares_slots: bool = True

    def node_types(self) -> list[tuple[str, int, str]]:
        """The current inventory as (name, slots, GPU type)."""
        types = self.gpu_types() if self.gpu_types is not None else {}
        return [(name, n, types.get(name, DEFAULT_GPU_TYPE)) for name, n in self.nodes()]

    def nodes(self) -> list[tuple[str, int]]:
        """The current inventory; never calls the executor (that is the loop's job)."""
        if self.inventory is None:
            return [("local", self.slots)]
        return [(str(name), int(n)) for name, n in self.inventory()]

    def total_slots(self) -> int:
        return sum(n for _, n in self.nodes())


class TenantIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _tenant_in(data: Any) -> TenantIn:
    """The body of ``POST /api/v1/tenants``, or a 422 naming what is wrong."""
    accepted = "1-64 characters: letters, digits, '.', '_', '-' (starting with a letter or digit)"
    if not isinstance(data, dict):
        raise SpecError(
            'the body must be a JSON object {"name": ...}',
            [{"field": "body", "message": f"got {type(data).__name__}", "accepted": accepted}],
        )
    try:
        return TenantIn.model_validate(data)
    except ValidationError as exc:
        details = [
            {
                "field": ".".join(str(p) for p in e["loc"]) or "body",
                "message": str(e["msg"]),
                "accepted": accepted,
            }
            for e in exc.errors(include_url=False)
        ]
        raise SpecError(
            "invalid tenant: " + ", ".join(d["field"] for d in details), details
        ) from None


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def job_view(job: Job, tenants: dict[str, str] | None = None) -> dict[str, Any]:
    """A job as the API shows it (spec, state, allocation and the job's latest report)."""
    report = job.report or {}
    progress = report.get("progress") or {}
    good = report.get("goodput") or {}
    view: dict[str, Any] = {
        "id": job.id,
        "name": job.name,
        "state": job.state.value,
        "tenant": (tenants or {}).get(job.tenant_id, job.tenant_id),
        "submit_time": job.submit_time,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "attempt": job.attempt,
        "replicas": job.replicas,
        "desired_replicas": job.desired_replicas,
        "restarts": job.num_restarts,
        "failures": job.failures,
        "attained_service": job.attained_service,
        "reason": job.reason,
        "batch_size": report.get("batch_size", job.spec.get("batch_size")),
        "local_bsz": report.get("local_bsz"),
        "accum_steps": report.get("accum_steps"),
        "step": progress.get("step"),
        "epoch": progress.get("epoch"),
        "loss": _num(progress.get("loss")),
        "pgns": _num(progress.get("pgns")),
        "goodput": _num(good.get("current_goodput")),
        "speedup": speedup(job, job.replicas) if job.replicas > 0 else None,
        "metrics": report.get("metrics", {}),
        "spec": job.spec,
        "memory_limit": memory_limit_view(job),
    }
    return view


def memory_limit_view(job: Job) -> dict[str, Any] | None:
    """What an out-of-memory failure taught the job (None until one did), with the line the
    job page shows."""
    limit = job.memory_limit or {}
    cap, failed = job.max_local_bsz, limit.get("oom_local_bsz")
    if cap is None:
        return None
    return {
        "max_local_bsz": cap,
        "oom_local_bsz": failed,
        "ooms": limit.get("ooms", 1),
        "text": f"memory limit: per-replica batch ≤ {cap} (learned after OOM at {failed})",
    }


def authenticator(store: Store) -> Callable[..., Tenant]:
    """The FastAPI dependency that turns the bearer token into its :class:`Tenant`.

    The controller's routes and the routers mounted beside them (dashboard, tuning; see
    :mod:`coadapt.service`) each call this, so every route authenticates the same way."""
    # auto_error=False: a missing token is our JSON 401, not FastAPI's; the scheme still
    # appears in the OpenAPI schema (securitySchemes.HTTPBearer) on every route using it.
    bearer = HTTPBearer(auto_error=False, description="a tenant's API token, or the admin token")

    def tenant(
        creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> Tenant:
        return store.authenticate(creds.credentials.strip() if creds else None)

    return tenant


def create_app(ctx: ApiContext) -> FastAPI:
    """The controller's own routes (jobs, tenants, cluster, metrics ingestion, Prometheus).

    The whole service (dashboard, tuning, OpenAPI docs) is assembled on top of this by
    :func:`coadapt.service.create_app`; this module imports nothing above the controller."""
    app = FastAPI(
        title="coadapt controller",
        version=__version__,
        description="Goodput-optimising cluster scheduler (Pollux-style). Authenticate with "
        "`Authorization: Bearer TOKEN` (a tenant's token, or the admin token).",
        docs_url=None,
        redoc_url=None,
    )
    app.add_middleware(BodySizeLimit, limit=MAX_BODY_BYTES)
    store = ctx.store

    @app.exception_handler(ControllerError)
    async def _controller_error(request: Request, exc: ControllerError) -> JSONResponse:
        return JSONResponse(exc.to_json(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        body = {"error": code, "message": f"{request.method} {request.url.path}: {exc.detail}"}
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        details = [
            {
                "field": ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body",
                "message": str(err.get("msg", "")),
            }
            for err in exc.errors()
        ]
        err = SpecError("invalid request: " + ", ".join(d["field"] for d in details), details)
        return JSONResponse(err.to_json(), status_code=err.status)

    tenant = authenticator(store)
    Auth = Annotated[Tenant, Depends(tenant)]

    def names() -> dict[str, str]:
        return {t.id: t.name for t in store.tenants()}

    @app.get("/healthz", tags=["meta"])
    def healthz() -> dict[str, Any]:
        return {"ok": True, "version": __version__}

    @app.get("/api/v1/whoami", tags=["tenants"])
    def whoami(me: Auth) -> dict[str, Any]:
        return {"id": me.id, "name": me.name, "admin": me.is_admin}

    @app.post(
        "/api/v1/tenants",
        status_code=201,
        tags=["tenants"],
        responses=error_responses(403, 409, 413),
        openapi_extra=body_schema(TenantIn, "the new tenant's name"),
    )
    def create_tenant(me: Auth, data: Annotated[Any, Depends(json_body)]) -> dict[str, Any]:
        """Create a tenant and return its API token (admin only; the token is shown once)."""
        if not me.is_admin:
            raise ForbiddenError("only the admin token can create tenants")
        body = _tenant_in(data)
        ctx.admit_tenant()
        t, token = store.create_tenant(body.name, ctx.clock())
        return {"id": t.id, "name": t.name, "token": token}

    @app.post(
        "/api/v1/jobs",
        status_code=201,
        tags=["jobs"],
        responses=error_responses(413),
        openapi_extra=body_schema(JobSpec, "the job spec (the fields of `coadapt submit` files)"),
    )
    def submit(me: Auth, spec: Annotated[Any, Depends(json_body)]) -> dict[str, Any]:
        """Submit a job spec (JSON); 422 names every invalid field and what it accepts."""
        parsed = parse_spec(spec)
        check_cluster_types(parsed, [t for _, _, t in ctx.node_types()])
        job = store.create_job(me, parsed, ctx.clock())
        if note := packing_note(parsed.packing_key, ctx.packing_keys, ctx.shares_slots):
            store.add_event(job.id, EventKind.SUBMITTED, note, ctx.clock())
        ctx.on_change()
        return job_view(job, {me.id: me.name})

    @app.get("/api/v1/jobs", tags=["jobs"])
    def list_jobs(
        me: Auth, state: Annotated[list[JobState] | None, Query()] = None
    ) -> list[dict[str, Any]]:
        tn = names()
        return [job_view(j, tn) for j in store.list_jobs(me, states=state)]

    @app.get("/api/v1/jobs/{job_id}", tags=["jobs"])
    def get_job(job_id: str, me: Auth) -> dict[str, Any]:
        return job_view(store.get_job(job_id, me), names())

    @app.post("/api/v1/jobs/{job_id}/cancel", tags=["jobs"], responses=error_responses(409))
    def cancel(job_id: str, me: Auth) -> dict[str, Any]:
        """Cancel a job (409 if it already finished); its replicas get SIGTERM, then SIGKILL."""
        if store.get_job(job_id, me).state.is_terminal:
            check_transition(job_id, store.get_job(job_id).state, JobState.CANCELLED)
        job = store.update_job(
            job_id,
            ctx.clock(),
            state=JobState.CANCELLED,
            expect=ACTIVE,
            reason=f"cancelled by {me.name}",
            desired_replicas=0,
            cancel_cause=CancelCause.USER,
            event=(EventKind.CANCELLED, f"cancelled by {me.name}"),
        )
        ctx.on_change()
        return job_view(job, names())

    @app.get("/api/v1/jobs/{job_id}/events", tags=["jobs"])
    def events(
        job_id: str, me: Auth, after: Annotated[int, Query(ge=0, le=BIGINT_MAX)] = 0
    ) -> list[dict[str, Any]]:
        store.get_job(job_id, me)
        return [
            {"id": e.id, "time": e.time, "kind": e.kind, "message": e.message, "data": e.data}
            for e in store.events(job_id, after_id=after)
        ]

    @app.get("/api/v1/jobs/{job_id}/metrics", tags=["jobs"])
    def metrics(job_id: str, me: Auth) -> list[dict[str, Any]]:
        store.get_job(job_id, me)
        return [
            {"time": m.time, "name": m.name, "value": m.value, "step": m.step}
            for m in store.metrics(job_id)
            if not is_series(m.name)  # the dashboard's series (see dashboard/series.py)
        ]

    @app.get("/api/v1/jobs/{job_id}/logs", tags=["jobs"])
    def logs(
        job_id: str,
        me: Auth,
        attempt: Annotated[int | None, Query(ge=1, le=INT32_MAX)] = None,
        rank: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
        offset: Annotated[int, Query(ge=0, le=BIGINT_MAX)] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_LOG_CHUNK)] = 65536,
    ) -> dict[str, Any]:
        """A chunk of one replica's log from byte ``offset`` (poll ``next_offset`` to follow);
        an offset at or past the end is an empty chunk."""
        job = store.get_job(job_id, me)
        att = attempt if attempt is not None else max(job.attempt, 1)
        jobs_dir = ctx.jobs_dir or ctx.state_dir / "jobs"
        path = jobs_dir / job.id / "logs" / f"attempt-{att}.rank-{rank}.log"
        data = b""
        if path.is_file():
            with open(path, "rb") as fh:
                # Never seek/read past the end: the OS refuses offsets near 2^63 (EINVAL).
                if offset < os.fstat(fh.fileno()).st_size:
                    fh.seek(offset)
                    data = fh.read(limit)
        elif attempt is not None and att > job.attempt:
            raise NotFoundError(f"job {job.id} has no attempt {att} (latest: {job.attempt})")
        return {
            "attempt": att,
            "rank": rank,
            "offset": offset,
            "next_offset": offset + len(data),
            "text": data.decode("utf-8", errors="replace"),
            "latest_attempt": job.attempt,
            "state": job.state.value,
        }

    @app.post(
        "/api/v1/jobs/{job_id}/metrics",
        status_code=204,
        tags=["ingestion"],
        responses=error_responses(413),
        openapi_extra={
            "requestBody": {
                "required": True,
                "description": "one coadapt.train metrics record (a JSON object with `kind`)",
                "content": {"application/json": {"schema": {"type": "object"}}},
            }
        },
    )
    async def ingest(job_id: str, request: Request, token: str = "") -> None:
        """Metrics from a job's replicas (the coadapt.train payload), per-job token auth."""
        body = await request.body()
        if len(body) > MAX_METRICS_BYTES:
            raise too_large(len(body), MAX_METRICS_BYTES)
        # The token check and the write read and write the database: in the thread pool, as
        # the plain ``def`` endpoints are, or they would hold the event loop (every other
        # request) while the scheduling and tuning threads hold the database.
        await run_in_threadpool(_ingest_body, job_id, token, body)

    def _ingest_body(job_id: str, token: str, body: bytes) -> None:
        if not tokens_equal(store.job_token(job_id), token):
            raise NotFoundError(f"no job {job_id!r}")  # no oracle for job ids
        try:
            # NaN/Infinity (a diverged loss) become null: stored JSON must stay strict JSON.
            record = json.loads(
                body.decode("utf-8"), parse_constant=lambda _: None, parse_float=_finite_or_none
            )
        except (ValueError, RecursionError):
            raise SpecError("metrics record is not UTF-8 JSON (or nests too deeply)") from None
        if not isinstance(record, dict):
            raise SpecError("metrics record must be a JSON object")
        ingest_record(store, job_id, _storable(record), ctx.clock())

    @app.get("/api/v1/cluster", tags=["cluster"])
    def cluster(me: Auth) -> dict[str, Any]:
        """Nodes, slots, allocations and per-job goodput, speedup and batch size."""
        live = store.replicas(statuses=("starting", "live"))
        slots_of: dict[str, list[int]] = {}
        # Distinct slots: two packed jobs share one; serving replicas hold theirs too.
        serving = set(ctx.serving_slots())
        taken = {(rep.node, rep.slot) for rep in live} | serving
        for rep in live:
            slots_of.setdefault(rep.job_id, []).append(rep.slot)
        used_on: dict[str, int] = {}
        for node, _ in taken:
            used_on[node] = used_on.get(node, 0) + 1
        used = len(taken)
        nodes = ctx.node_types()
        tn = names()
        active = store.list_jobs(me, states=ACTIVE)
        jobs = []
        for job in active:
            view = job_view(job, tn)
            view.pop("spec")
            view["slots"] = sorted(slots_of.get(job.id, []))
            jobs.append(view)
        return {
            "policy": ctx.policy,
            "slots": sum(n for _, n, _ in nodes),
            "used": used,
            "serving": len(serving),
            "nodes": [
                {"name": name, "slots": n, "used": used_on.get(name, 0), "gpu_type": t}
                for name, n, t in nodes
            ],
            "gpu_types": sorted({t for _, _, t in nodes}),
            "round": ctx.round_info(),
            "jobs": jobs,
            "isolation": ctx.isolation,
        }

    registry = metrics_registry(store, ctx.total_slots, ctx.node_types)
    app.state.metrics_registry = registry  # packages above add their collectors

    @app.get("/metrics", tags=["meta"], response_class=Response, responses=error_responses(403))
    def prometheus_metrics(me: Auth) -> Response:
        """Prometheus text exposition of the cluster and its active jobs (admin token only).

        Authenticated like the rest of the API: the series span every tenant's jobs (the
        admin's cluster view), so a scraper sends ``Authorization: Bearer ADMIN_TOKEN``; no or
        an unknown token is a 401, a tenant's token a 403 (as for creating tenants).
        """
        if not me.is_admin:
            raise ForbiddenError("only the admin token can scrape /metrics")
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _storable(x: Any) -> Any:
    """``x`` with every string made storable on any backend: NUL (PostgreSQL's JSON and text
    refuse it) and lone surrogates (no UTF-8 form) become U+FFFD."""
    if isinstance(x, str):
        return x.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
    if isinstance(x, dict):
        return {_storable(k): _storable(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_storable(v) for v in x]
    return x


def _finite_or_none(text: str) -> float | None:
    x = float(text)
    return x if math.isfinite(x) else None


#: How far before its arrival a record's own timestamp is believed (a sender's queue can hold
#: records that long while the controller is unreachable); older or later ones get the arrival.
MAX_RECORD_AGE_S = 300.0


def record_time(record: MetricRecord, now: float) -> float:
    """When the record was made: its own ``time`` (the sender's clock, taken when the value
    was reported) if it is within ``MAX_RECORD_AGE_S`` before ``now``, else ``now``. A metric
    then carries when it was measured, not when a busy controller got to it, which is what
    times to target and curves are read from."""
    t = record.time
    return t if t is not None and now - MAX_RECORD_AGE_S <= t <= now else now


def ingest_record(store: Store, job_id: str, obj: dict[str, Any], now: float) -> None:
    """Fold one coadapt.train metrics record (a decoded JSON object) into the job's report
    (and metrics table); :func:`coadapt.protocol.parse_record` types it."""
    try:
        record = parse_record(obj)
    except RecordError as exc:
        raise SpecError(f"metrics record: {exc}") from None
    patch: dict[str, Any] = {"last_report_at": now}
    if isinstance(record, GoodputRecord):
        for key in ("perf", "grad", "profile"):
            if key in obj:
                patch[key] = getattr(record, key)
        if "perf" in obj or "profile" in obj:  # measured on the type the attempt runs on
            measured_on = (store.get_job(job_id).report or {}).get(ATTEMPT_GPU_TYPE)
            if isinstance(measured_on, str):
                patch[PERF_GPU_TYPE] = measured_on
        patch["goodput"] = {
            "current": record.current,
            "current_goodput": record.current_goodput,
            "best": record.best,
            "best_goodput": record.best_goodput,
            "pgns": record.pgns,
        }
    elif isinstance(record, ProgressRecord):
        patch["progress"] = {
            "step": record.step,
            "epoch": record.epoch,
            "position": record.position,
            "replicas": record.replicas,
            "lr_scale": record.lr_scale,
            "pgns": record.pgns,
            "loss": record.loss,
            "fraction": record.fraction,
        }
        _patch_batch(patch, obj, record)
    elif isinstance(record, BatchRecord):
        _patch_batch(patch, obj, record)
        store.add_event(
            job_id,
            EventKind.BATCH,
            f"batch size -> {record.batch_size} (m={record.local_bsz}, s={record.accum_steps})",
            now,
            {"batch_size": record.batch_size},
        )
    elif isinstance(record, MetricReport):
        step = record.step
        ok_step = step is not None and abs(step) <= INT32_MAX
        store.add_metric(
            job_id, record.name, record.value, step if ok_step else None, record_time(record, now)
        )
        job = store.get_job(job_id)
        metrics = dict((job.report or {}).get("metrics", {}))
        metrics[record.name[:64]] = record.value
        patch["metrics"] = metrics
    elif isinstance(record, StoppedRecord):
        store.add_event(
            job_id,
            EventKind.CHECKPOINTED,
            "replica checkpointed and stopped",
            now,
            {"checkpoint": record.checkpoint},
        )
    store.merge_report(job_id, patch)
    if record is not None:
        record_series(store, job_id, record, now)


def _patch_batch(
    patch: dict[str, Any], obj: dict[str, Any], record: ProgressRecord | BatchRecord
) -> None:
    """The batch figures the record carries (a sender that omits one keeps the last)."""
    for key in ("batch_size", "local_bsz", "accum_steps"):
        if key in obj:
            patch[key] = getattr(record, key)

"""Read endpoints for the dashboard (``/api/v1/ui/...``) and the single-page app itself.

Same bearer tokens and the same visibility rule as the rest of the API (``create_app`` hands
its auth dependency in): a tenant reads only its own jobs, a stranger's job is a 404. The
cluster view is the one place other tenants' jobs show up, and there only anonymised: a
slot they hold is ``{"other": true}`` with no job id, name, tenant or rank, and their share
of the utilisation history is one lumped "other tenants" series.

The app is static files (no build step): ``GET /`` is ``index.html``; scripts, styles and the
icon are under ``/ui/``. Nothing is mounted at ``/``, so later routers are never shadowed.
"""

# No ``from __future__ import annotations``: FastAPI reads endpoint annotations at definition
# time, and the ``Auth`` alias is local to :func:`mount_dashboard` (as in ``api.py``).
import itertools
import json
import math
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from fastapi import Depends, FastAPI, Query
from fastapi.responses import FileResponse, Response
from fastapi.routing import APIRouter
from fastapi.staticfiles import StaticFiles

from coadapt.controller.api import ApiContext, job_view
from coadapt.controller.dashboard.data import Rep, replica_rows, series_rows
from coadapt.controller.dashboard.series import PREFIX
from coadapt.controller.dashboard.tta import tta_view
from coadapt.controller.errors import NotFoundError
from coadapt.controller.models import MetricRow
from coadapt.controller.states import ACTIVE, JobState
from coadapt.controller.store import Event, Job, Tenant
from coadapt.goodput import PerfParams, iter_time
from coadapt.goodput.fit import fit_profile
from coadapt.protocol import ENV_DASHBOARD_SIM_DIR

STATIC = Path(__file__).resolve().parent / "static"
SIM_DIR_ENV = ENV_DASHBOARD_SIM_DIR
MAX_POINTS = 600  # per series: plots never need more, and the browser polls every 2 s
ETA_WINDOW_S = 120.0  # progress rate is measured over this much recent history
TOTAL_FLAGS = {
    "--steps": "steps",
    "--max-steps": "steps",
    "--total-steps": "steps",
    "--epochs": "epochs",
    "--num-epochs": "epochs",
}
# A strict CSP keeps the page from reaching anything but its own controller.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'"
)
NO_CACHE = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
}


def thin(points: list[list[Any]], limit: int = MAX_POINTS) -> list[list[Any]]:
    """At most ``limit`` points, evenly picked, always keeping the last one."""
    if len(points) <= limit:
        return points
    idx = np.unique(np.linspace(0, len(points) - 1, limit).round().astype(int))
    return [points[i] for i in idx]


def utilisation(reps: list[Rep], visible: set[str], start: float, end: float) -> dict[str, Any]:
    """Slots held over [start, end] as step functions: in total and per visible job, with
    every other tenant's replicas lumped into one anonymous series."""
    deltas: dict[str | None, list[tuple[float, int]]] = {}
    total: list[tuple[float, int]] = []
    for r in reps:
        key = r.job_id if r.job_id in visible else None
        t0 = max(r.started_at, start)
        t1 = min(r.ended_at if r.ended_at is not None else end, end)
        if t1 < t0:
            continue
        for d in (deltas.setdefault(key, []), total):
            d.append((t0, 1))
            if r.ended_at is not None and r.ended_at <= end:
                d.append((t1, -1))

    def steps(d: list[tuple[float, int]]) -> list[list[float]]:
        out: list[list[float]] = [[start, 0.0]]
        level = 0
        for t, dv in sorted(d, key=lambda x: (x[0], x[1])):
            level += dv
            if out and out[-1][0] == t:
                out[-1][1] = float(level)
            else:
                out.append([t, float(level)])
        out.append([end, float(level)])
        return thin(out)

    series = [
        {"job_id": key, "other": key is None, "points": steps(d)}
        for key, d in sorted(deltas.items(), key=lambda kv: (kv[0] is None, kv[0] or ""))
    ]
    return {"start": start, "end": end, "total": steps(total), "jobs": series}


def total_work(job: Job) -> tuple[str, float] | None:
    """("steps"|"epochs", N) read from the job's ``--steps N``/``--epochs N`` arguments."""
    args = [str(a) for a in (job.spec.get("command") or []) + (job.spec.get("args") or [])]
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in TOTAL_FLAGS:
            text = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            if re.fullmatch(r"\d+", text) and int(text) > 0:
                return TOTAL_FLAGS[flag], float(text)
    return None


def progress_eta(
    job: Job, samples: list[tuple[float, float]], now: float
) -> tuple[float | None, float | None]:
    """Fraction done and seconds left, from the (time, step-or-epoch) samples of the job."""
    if job.state is JobState.SUCCEEDED:
        return 1.0, 0.0
    work = total_work(job)
    if work is None:
        return None, None
    unit, total = work
    report = (job.report or {}).get("progress") or {}
    done = report.get(unit[:-1] if unit == "epochs" else "step")
    if not isinstance(done, (int, float)) or isinstance(done, bool):
        return 0.0, None
    frac = min(max(float(done) / total, 0.0), 1.0)
    if job.state.is_terminal or job.state is JobState.PENDING:
        return frac, None
    recent = [s for s in samples if s[0] >= now - ETA_WINDOW_S]
    if len(recent) < 2 or recent[-1][0] <= recent[0][0] or recent[-1][1] <= recent[0][1]:
        return frac, None
    rate = (recent[-1][1] - recent[0][1]) / (recent[-1][0] - recent[0][0])
    return frac, max(total - float(done), 0.0) / rate


def _finite(values: dict[str, Any], keys: Iterable[str]) -> list[float] | None:
    out = []
    for key in keys:
        v = values.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return None
        out.append(float(v))
    return out


PROFILE_KEYS = ("nodes", "replicas", "local_bsz", "accum_steps", "iter_time")


def perf_params(report: dict[str, Any]) -> tuple[PerfParams | None, str | None]:
    """θ_sys the job reported, else fitted here from its profile (with where it came from)."""
    perf = report.get("perf")
    if isinstance(perf, dict):
        vals = _finite(perf, PerfParams.__dataclass_fields__)
        if vals is not None:
            return PerfParams(*vals), "reported"
    fitted = fit_profile(report.get("profile"))  # cached: fitted once per profile version
    return (fitted, "fitted from profile") if fitted is not None else (None, None)


def model_view(job: Job, configs: Iterable[tuple[int, int, int, int]]) -> dict[str, Any]:
    """The throughput model (T_iter per config) beside the step times the job profiled."""
    report = job.report or {}
    perf, source = perf_params(report)
    profile = []
    for r in report.get("profile") or []:
        if not isinstance(r, dict) or _finite(r, PROFILE_KEYS) is None:
            continue
        row: dict[str, Any] = {k: float(r[k]) for k in PROFILE_KEYS}
        row["count"] = r.get("count")
        row["predicted"] = (
            float(
                iter_time(perf, row["nodes"], row["replicas"], row["local_bsz"], row["accum_steps"])
            )
            if perf is not None
            else None
        )
        profile.append(row)
    curves = []
    configs = list(configs)
    keys = {(int(p["nodes"]), int(p["replicas"]), int(p["accum_steps"])) for p in profile}
    keys |= {(n, k, s) for n, k, _, s in configs}
    keys = keys or {(1, max(job.replicas, 1), 0)}
    top = max(
        [p["local_bsz"] for p in profile]
        + [float(c[2]) for c in configs]
        + [float(job.spec.get("batch_size") or 32)]
    )
    if perf is not None:
        grid = np.unique(np.geomspace(1, max(top * 1.5, 2), 40).round())
        for n, k, s in sorted(keys):
            t = iter_time(perf, n, k, grid, s)
            curves.append(
                {
                    "nodes": n,
                    "replicas": k,
                    "accum_steps": s,
                    "points": [[float(m), float(v)] for m, v in zip(grid, t, strict=True)],
                }
            )
    grad = report.get("grad") if isinstance(report.get("grad"), dict) else None
    return {
        "perf": perf.__dict__ if perf is not None else None,
        "source": source,
        "grad": grad,
        "profile": profile,
        "curves": curves,
    }


def _alloc_points(events: list[Event]) -> tuple[list[list[float]], list[list[float]]]:
    alloc: list[list[float]] = []
    desired: list[list[float]] = []
    for e in events:
        data = e.data or {}
        if e.kind == "alloc" and isinstance(data.get("replicas"), int):
            alloc.append([e.time, float(data["replicas"])])
        elif e.kind == "desired" and isinstance(data.get("desired"), int):
            desired.append([e.time, float(data["desired"])])
    return alloc, desired


def step_times(
    rows: list[MetricRow],
    alloc_times: list[float],
    perf: PerfParams | None,
    nodes_at: Callable[[float], int],
) -> tuple[list[list[float | None]], set[tuple[int, int, int, int]]]:
    """Observed seconds per step between consecutive progress records of one allocation,
    with the model's T_iter for the same configuration: [time, observed, predicted, K]."""
    samples: dict[tuple[float, int], dict[str, float]] = {}
    for r in rows:
        if r.step is not None and r.value is not None and r.name.startswith(PREFIX):
            samples.setdefault((r.time, r.step), {})[r.name[len(PREFIX) :]] = r.value
    ordered = sorted((t, step, v) for (t, step), v in samples.items() if "replicas" in v)
    out: list[list[float | None]] = []
    configs: set[tuple[int, int, int, int]] = set()
    for (t0, s0, v0), (t1, s1, v1) in itertools.pairwise(ordered):
        k = int(v1["replicas"])
        if s1 <= s0 or t1 <= t0 or int(v0["replicas"]) != k:
            continue
        if any(t0 < a <= t1 for a in alloc_times):
            continue  # a restart happened in between: that gap is not a step time
        m, s = int(v1.get("local_bsz", 0)), int(v1.get("accum_steps", 0))
        n = nodes_at(t1)
        pred = float(iter_time(perf, n, k, m, s)) if perf is not None and m > 0 else None
        if m > 0:
            configs.add((n, k, m, s))
        out.append([t1, (t1 - t0) / (s1 - s0), pred, float(k)])
    return out, configs


def _features(app: FastAPI) -> dict[str, Any]:
    # The OpenAPI paths list every route, included routers too (whatever order they came in).
    paths = app.openapi().get("paths", {})
    sim_dir = os.environ.get(SIM_DIR_ENV)
    return {
        "experiments": "/api/v1/experiments" in paths,
        "simulations_dir": bool(sim_dir and Path(sim_dir).is_dir()),
    }


def mount_dashboard(app: FastAPI, ctx: ApiContext, auth: Callable[..., Tenant]) -> None:
    """Add the dashboard's endpoints and static files to ``app`` (called by ``create_app``)."""
    store = ctx.store
    Auth = Annotated[Tenant, Depends(auth)]
    router = APIRouter(prefix="/api/v1/ui", tags=["dashboard"])

    def names() -> dict[str, str]:
        return {t.id: t.name for t in store.tenants()}

    @router.get("/features")
    def features(me: Auth) -> dict[str, Any]:
        """What the pages may fetch (so an absent service is never a failed request)."""
        return {**_features(app), "tenant": me.name, "admin": me.is_admin}

    @router.get("/cluster")
    def cluster(
        me: Auth, window: Annotated[float, Query(gt=0, le=7 * 86400)] = 1800.0
    ) -> dict[str, Any]:
        """Who holds each slot now, and slots held over the last ``window`` seconds."""
        now = ctx.clock()
        tn = names()
        visible = {j.id: j for j in store.list_jobs(me)}
        reps = replica_rows(store, since=now - window)
        slots = []
        for r in reps:
            if r.status not in ("starting", "live"):
                continue
            job = visible.get(r.job_id)
            if job is None:
                slots.append({"node": r.node, "slot": r.slot, "status": r.status, "other": True})
            else:
                slots.append(
                    {
                        "node": r.node,
                        "slot": r.slot,
                        "status": r.status,
                        "other": False,
                        "job_id": job.id,
                        "name": job.name,
                        "rank": r.rank,
                        "tenant": tn.get(job.tenant_id, job.tenant_id),
                    }
                )
        # Start where the history does (within the window), so a young cluster fills the plot.
        first = min((r.started_at for r in reps), default=now - window)
        start = max(now - window, min(first - 0.05 * (now - first), now - 60.0))
        util = utilisation(reps, set(visible), start, now)
        for s in util["jobs"]:
            job = visible.get(s["job_id"]) if s["job_id"] else None
            s["name"] = job.name if job is not None else "other tenants"
        return {"now": now, "slots": ctx.total_slots(), "replicas": slots, "utilisation": util}

    @router.get("/jobs")
    def jobs(me: Auth) -> dict[str, Any]:
        """Every visible job with progress, ETA and LR scale (the public view's fields)."""
        now = ctx.clock()
        tn = names()
        mine = store.list_jobs(me)
        running = [j.id for j in mine if j.state in ACTIVE]
        samples: dict[str, dict[str, list[tuple[float, float]]]] = {}
        for r in series_rows(
            store, running, [PREFIX + "step", PREFIX + "epoch"], since=now - ETA_WINDOW_S
        ):
            if r.value is not None:
                samples.setdefault(r.job_id, {}).setdefault(r.name[len(PREFIX) :], []).append(
                    (r.time, r.value)
                )
        out = []
        for job in mine:
            view = job_view(job, tn)
            spec = view.pop("spec")
            work = total_work(job)
            unit = work[0][:-1] if work else "step"
            frac, eta = progress_eta(job, samples.get(job.id, {}).get(unit, []), now)
            progress = (job.report or {}).get("progress") or {}
            lr_scale = progress.get("lr_scale")
            view.update(
                {
                    "progress": frac,
                    "eta_s": eta,
                    "total": {"unit": work[0], "value": work[1]} if work else None,
                    "lr_scale": lr_scale if isinstance(lr_scale, (int, float)) else None,
                    "lr": spec.get("lr"),
                    "min_replicas": spec.get("min_replicas"),
                    "max_replicas": spec.get("max_replicas"),
                    "allocation": _allocation(job),
                }
            )
            out.append(view)
        return {"now": now, "jobs": out}

    @router.get("/jobs/{job_id}")
    def job_detail(job_id: str, me: Auth) -> dict[str, Any]:
        """A job's timelines (allocation, batch size, LR, goodput, φ, loss, user metrics),
        observed step times against the model, its throughput model and its events."""
        job = store.get_job(job_id, me)
        events = store.events(job.id)
        alloc, desired = _alloc_points(events)
        if job.state.is_terminal and job.finished_at is not None:
            alloc.append([job.finished_at, 0.0])
        rows = series_rows(store, [job.id])
        series: dict[str, list[list[Any]]] = {}
        user: dict[str, list[list[Any]]] = {}
        for r in rows:
            if r.value is None:
                continue
            if r.name.startswith(PREFIX):
                series.setdefault(r.name[len(PREFIX) :], []).append([r.time, r.value, r.step])
            else:
                user.setdefault(r.name, []).append([r.time, r.value, r.step])
        for e in events:  # a batch change the job announced between two progress records
            batch = (e.data or {}).get("batch_size")
            if e.kind == "batch" and isinstance(batch, int):
                series.setdefault("batch_size", []).append([e.time, float(batch), None])
        series["batch_size"] = sorted(series.get("batch_size", []), key=lambda p: p[0])
        perf, _ = perf_params(job.report or {})
        reps = [r for r in replica_rows(store, since=0.0) if r.job_id == job.id]

        def nodes_at(t: float) -> int:
            held = {
                r.node
                for r in reps
                if r.started_at <= t and (r.ended_at is None or r.ended_at >= t)
            }
            return max(len(held), 1)

        steps, configs = step_times(rows, [a[0] for a in alloc], perf, nodes_at)
        view = job_view(job, names())
        view["allocation"] = _allocation(job)
        return {
            "now": ctx.clock(),
            "job": view,
            "alloc": alloc,
            "desired": desired,
            "series": {k: thin(v) for k, v in series.items()},
            "user_metrics": {k: thin(v) for k, v in user.items()},
            "step_times": thin(steps),
            "model": model_view(job, configs),
            # time so far vs the user's initial batch, fixed (issue 19): did adapting pay?
            "tta": tta_view(rows, [a[0] for a in alloc], perf, _init_batch(job), nodes_at, PREFIX),
            "replicas": [
                {
                    "node": r.node,
                    "slot": r.slot,
                    "rank": r.rank,
                    "attempt": r.attempt,
                    "status": r.status,
                    "started_at": r.started_at,
                    "ended_at": r.ended_at,
                }
                for r in reps[-64:]
            ],
            "events": [
                {"id": e.id, "time": e.time, "kind": e.kind, "message": e.message}
                for e in events[-300:]
            ],
        }

    @router.get("/simulations")
    def simulations(me: Auth) -> dict[str, Any]:
        """``coadapt simulate --json`` results in the directory the environment names."""
        folder = os.environ.get(SIM_DIR_ENV)
        if not folder or not Path(folder).is_dir():
            return {"configured": False, "files": []}
        files = sorted(p.name for p in Path(folder).glob("*.json") if p.is_file())
        return {"configured": True, "files": files}

    @router.get("/simulations/{name}")
    def simulation(name: str, me: Auth) -> Any:
        folder = os.environ.get(SIM_DIR_ENV)
        if not folder or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*\.json", name):
            raise NotFoundError(f"no simulation result {name!r}")
        path = Path(folder) / name
        if not path.is_file():
            raise NotFoundError(f"no simulation result {name!r}")
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            raise NotFoundError(f"{name} is not a JSON file") from None

    app.include_router(router)

    @app.get("/", include_in_schema=False)
    def index() -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html", headers=NO_CACHE)

    app.mount("/ui", StaticFiles(directory=STATIC), name="dashboard-static")


def _allocation(job: Job) -> dict[str, int] | None:
    """Node -> replicas the job holds (the multi-node column when present, else replicas)."""
    alloc = getattr(job, "allocation", None)
    if isinstance(alloc, dict) and alloc:
        return {str(k): int(v) for k, v in alloc.items() if isinstance(v, int)}
    return {"local": job.replicas} if job.replicas else None


def _init_batch(job: Job) -> int | None:
    """M0, the batch size the job was submitted with (None when the spec has none)."""
    value = job.spec.get("batch_size")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

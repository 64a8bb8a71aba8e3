"""REST routes of tuning experiments (``/api/v1/experiments``), included by ``create_app``.

Same authentication as the job routes (the bearer-token dependency of
:func:`coadapt.controller.api.create_app` is handed in): a tenant sees and cancels only its
own experiments, a stranger's is a 404 like a missing one; the admin token sees all. A bad
spec is a 422 whose ``details`` name each field (``space.lr.low``, ``trial.script``) and what
it accepts. The contract (also used by the dashboard)::

    POST /api/v1/experiments                 body: the experiment spec -> {"experiment": {...}}
    GET  /api/v1/experiments                 -> {"experiments": [{id, name, tenant, state,
                                                 objective, best_value, target, n_trials, ...}]}
    GET  /api/v1/experiments/{id}            -> {"experiment", "trials": [{number, state,
                                                 params, value, job_id, curve}], "best_history"}
    POST /api/v1/experiments/{id}/cancel     -> {"experiment": {...}}  (409 once it ended)
"""

# No ``from __future__ import annotations``: FastAPI reads the annotations at definition time.
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends

from coadapt.controller.http_input import json_body
from coadapt.controller.openapi import error_responses
from coadapt.controller.openapi import json_body as body_schema
from coadapt.controller.store import Tenant
from coadapt.tune.store import Experiment, ExperimentState, Trial, TuneStore


def experiment_view(
    exp: Experiment, tenants: dict[str, str], counts: dict[str, int] | None = None
) -> dict[str, Any]:
    """An experiment as the API lists it."""
    spec = exp.spec
    objective = spec.get("objective") or {}
    counts = counts or {}
    policy = exp.policy_state or {}
    return {
        "id": exp.id,
        "name": exp.name,
        "tenant": tenants.get(exp.tenant_id, exp.tenant_id),
        "state": exp.state.value,
        "objective": {
            "metric": objective.get("metric"),
            "direction": objective.get("direction", "maximize"),
        },
        "best_value": exp.best_value,
        "best_trial": exp.best_trial,
        "target": spec.get("target"),
        "sampler": spec.get("sampler"),
        "parallelism": spec.get("parallelism"),
        "max_trials": spec.get("max_trials"),
        "n_trials": sum(counts.values()),
        "n_running": counts.get("RUNNING", 0) + counts.get("PENDING", 0),
        "trial_states": counts,
        "created_at": exp.created_at,
        "finished_at": exp.finished_at,
        "target_reached_at": exp.target_reached_at,
        "reason": exp.reason,
        "priority": policy.get("priority"),
        "grant": policy.get("grant"),
        "policy_note": policy.get("why"),
    }


def trial_view(t: Trial) -> dict[str, Any]:
    return {
        "number": t.number,
        "state": t.state.value,
        "params": t.params,
        "value": t.value,
        "job_id": t.job_id,
        "attempts": t.attempts,
        "curve": [[p[0], p[1]] for p in t.curve],
        "gpu_seconds": t.gpu_seconds,
        "created_at": t.created_at,
        "started_at": t.started_at,
        "ended_at": t.ended_at,
        "reason": t.reason,
    }


def tune_router(
    tune: TuneStore,
    clock: Callable[[], float],
    auth: Callable[..., Tenant],
    on_change: Callable[[], None] = lambda: None,
) -> APIRouter:
    """The experiment routes; ``auth`` is the app's bearer-token dependency."""
    from coadapt.tune.samplers import require_sampler
    from coadapt.tune.spec import ExperimentSpec, parse_experiment

    router = APIRouter(prefix="/api/v1/experiments", tags=["experiments"])
    Auth = Annotated[Tenant, Depends(auth)]

    def names() -> dict[str, str]:
        return {t.id: t.name for t in tune.store.tenants()}

    def view(exp: Experiment) -> dict[str, Any]:
        return experiment_view(exp, names(), tune.trial_counts([exp.id])[exp.id])

    @router.post(
        "",
        status_code=201,
        responses=error_responses(413),
        openapi_extra=body_schema(ExperimentSpec, "the experiment spec (see docs/tune.md)"),
    )
    def submit(me: Auth, spec: Annotated[Any, Depends(json_body)]) -> dict[str, Any]:
        """Submit an experiment spec (JSON); 422 names every invalid field."""
        parsed = parse_experiment(spec)
        require_sampler(parsed.sampler)  # this controller can run it (installed extras)
        exp = tune.create_experiment(me, parsed.name, parsed.model_dump(mode="json"), clock())
        on_change()
        return {"experiment": view(exp)}

    @router.get("")
    def list_experiments(me: Auth) -> dict[str, Any]:
        exps = tune.list_experiments(me)
        counts = tune.trial_counts([e.id for e in exps])
        tn = names()
        return {"experiments": [experiment_view(e, tn, counts[e.id]) for e in exps]}

    @router.get("/{exp_id}")
    def get_experiment(exp_id: str, me: Auth) -> dict[str, Any]:
        exp = tune.get_experiment(exp_id, me)
        trials = tune.trials(exp.id)
        out = view(exp)
        out["spec"] = exp.spec
        return {
            "experiment": out,
            "trials": [trial_view(t) for t in trials],
            "best_history": [[h[0], h[1]] for h in exp.best_history],
        }

    @router.post("/{exp_id}/cancel", responses=error_responses(409))
    def cancel(exp_id: str, me: Auth) -> dict[str, Any]:
        """Cancel an experiment (409 if it already ended); its running trials are cancelled."""
        exp = tune.cancel_experiment(exp_id, me, clock())
        on_change()
        return {"experiment": view(exp)}

    return router


__all__ = ["ExperimentState", "experiment_view", "trial_view", "tune_router"]

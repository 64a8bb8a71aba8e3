"""REST routes of the model registry (``/api/v1/models``), included by ``create_app``.

Same authentication as the job routes: a tenant sees and changes only its own models (a
stranger's is a 404 like a missing one); the admin token sees all and names another tenant's
model with ``?owner=TENANT`` when two tenants use the same name. The contract (also used by the
dashboard's Models view and ``coadapt model``)::

    POST   /api/v1/models                          body: model spec -> 201 {"model"}
    GET    /api/v1/models                          -> {"models": [{name, tenant, root, live,
                                                       states: {state: n}, ...}]}
    GET    /api/v1/models/{name}                   -> {"model", "versions": [...],
                                                       "promotions": [...], "rollback_to"}
    GET    /api/v1/models/{name}/versions/{v}      -> {"version": {..., "checks": [...]}}
    POST   /api/v1/models/{name}/sync              -> {"registered": [...]} (gates follow)
    POST   /api/v1/models/{name}/promote           body {"version"} -> {"promotion"}
    POST   /api/v1/models/{name}/rollback          -> {"promotion"}
    DELETE /api/v1/models/{name}/versions/{v}      -> {"deleted"}  (409 for the live one)
    DELETE /api/v1/models/{name}                   -> {"forgotten"} (rows only; files stay)
"""

# No ``from __future__ import annotations``: FastAPI reads the annotations at definition time.
from collections.abc import Callable
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel

from coadapt.controller.errors import NotFoundError, SpecError
from coadapt.controller.http_input import json_body
from coadapt.controller.openapi import error_responses
from coadapt.controller.openapi import json_body as body_schema
from coadapt.controller.store import Tenant
from coadapt.registry import retention
from coadapt.registry.config import ModelSpec, parse_model_spec
from coadapt.registry.runner import RegistryRunner
from coadapt.registry.states import VersionState
from coadapt.registry.store import Model, Version


class PromoteIn(BaseModel):
    """The body of ``POST /api/v1/models/{name}/promote``."""

    version: str


def version_view(v: Version) -> dict[str, Any]:
    out = asdict(v)
    out.pop("model_id")
    out["state"] = v.state.value
    out["lineage"] = {"job_id": v.job_id, "step": v.step, "data_offset": v.data_offset}
    return out


def model_view(m: Model, tenants: dict[str, str], versions: list[Version]) -> dict[str, Any]:
    states: dict[str, int] = {}
    for v in versions:
        states[v.state.value] = states.get(v.state.value, 0) + 1
    live = next((v.version for v in versions if v.state is VersionState.LIVE), None)
    newest = versions[-1].version if versions else None
    return {
        "name": m.name,
        "tenant": tenants.get(m.tenant_id, m.tenant_id),
        "root": m.root,
        "gates": m.gates.model_dump(mode="json"),
        "retention": m.retention.model_dump(mode="json"),
        "created_at": m.created_at,
        "synced_at": m.synced_at,
        "live": live,
        "newest": newest,
        "n_versions": len(versions),
        "states": states,
    }


def registry_router(runner: RegistryRunner, auth: Callable[..., Tenant]) -> APIRouter:
    """The model routes; ``auth`` is the app's bearer-token dependency."""
    router = APIRouter(prefix="/api/v1/models", tags=["models"])
    Auth = Annotated[Tenant, Depends(auth)]
    reg = runner.registry

    def names() -> dict[str, str]:
        return {t.id: t.name for t in runner.store.tenants()}

    def find(name: str, me: Tenant, owner: str | None) -> Model:
        return reg.find_model(f"{owner}/{name}" if owner else name, me)

    @router.post(
        "",
        status_code=201,
        responses=error_responses(409, 413),
        openapi_extra=body_schema(ModelSpec, "the model spec (see docs/serve.md)"),
    )
    def create(me: Auth, spec: Annotated[Any, Depends(json_body)]) -> dict[str, Any]:
        """Register a model root; its versions are found and validated in the background."""
        model = runner.create(me, parse_model_spec(spec))
        return {"model": model_view(model, names(), [])}

    @router.get("")
    def list_models(me: Auth) -> dict[str, Any]:
        tn = names()
        return {"models": [model_view(m, tn, reg.versions(m.id)) for m in reg.list_models(me)]}

    @router.get("/{name}", responses=error_responses(404))
    def show(name: str, me: Auth, owner: str | None = None) -> dict[str, Any]:
        m = find(name, me, owner)
        versions = reg.versions(m.id)
        promotions = reg.promotions(m.id)
        return {
            "model": model_view(m, names(), versions),
            "versions": [version_view(v) for v in versions],
            "promotions": [asdict(p) for p in promotions],
            "rollback_to": retention.rollback_target(promotions, versions),
        }

    @router.get("/{name}/versions/{version}", responses=error_responses(404))
    def show_version(name: str, version: str, me: Auth, owner: str | None = None) -> dict[str, Any]:
        m = find(name, me, owner)
        v = reg.version(m.id, version)
        if v is None:
            raise NotFoundError(f"model {m.name} has no version {version!r}")
        return {"version": version_view(v)}

    @router.post("/{name}/sync", responses=error_responses(404))
    def sync(name: str, me: Auth, owner: str | None = None) -> dict[str, Any]:
        """Look for new versions now; their gates run in the background right after."""
        m = find(name, me, owner)
        registered = runner.discover(m)
        runner.poke()
        return {"registered": list(registered)}

    @router.post(
        "/{name}/promote",
        responses=error_responses(404, 409),
        openapi_extra=body_schema(PromoteIn, "the version to make live"),
    )
    def promote(
        name: str, me: Auth, body: Annotated[Any, Depends(json_body)], owner: str | None = None
    ) -> dict[str, Any]:
        """Make a version that passed its gates live (servers hot-swap to it)."""
        version = body.get("version") if isinstance(body, dict) else None
        if not isinstance(version, str) or not version:
            raise SpecError(
                'give the version to promote: {"version": "00000003"}',
                [{"field": "version", "message": "required string"}],
            )
        m = find(name, me, owner)
        return {"promotion": asdict(runner.promote(m, version, me.name))}

    @router.post("/{name}/rollback", responses=error_responses(404, 409))
    def rollback(name: str, me: Auth, owner: str | None = None) -> dict[str, Any]:
        """Go back to the version that was live before the live one."""
        m = find(name, me, owner)
        return {"promotion": asdict(runner.rollback(m, me.name))}

    @router.delete("/{name}/versions/{version}", responses=error_responses(404, 409))
    def remove(name: str, version: str, me: Auth, owner: str | None = None) -> dict[str, Any]:
        """Delete a version (not the live one): its row, then its files."""
        m = find(name, me, owner)
        runner.remove(m, version)
        return {"deleted": version}

    @router.delete("/{name}", responses=error_responses(404))
    def forget(name: str, me: Auth, owner: str | None = None) -> dict[str, Any]:
        """Unregister a model: its rows go, its files and LIVE pointer stay."""
        m = find(name, me, owner)
        runner.forget(m)
        return {"forgotten": m.name}

    return router


__all__ = ["PromoteIn", "model_view", "registry_router", "version_view"]

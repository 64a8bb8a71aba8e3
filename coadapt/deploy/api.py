"""REST routes of deployments (``/api/v1/deployments``), included by ``create_app``.

Same authentication as the model routes: a tenant sees and changes only its own deployments (a
stranger's is a 404 like a missing one); the admin token sees all. The contract (also used by
the dashboard's Deployments panel and ``coadapt deploy``)::

    POST   /api/v1/deployments          body: deployment spec -> 201 {"deployment"}
    GET    /api/v1/deployments          -> {"deployments": [{name, tenant, model, state, url,
                                            replicas: {desired, ready, ...}, live, ...}]}
    GET    /api/v1/deployments/{name}   -> {"deployment", "replicas": [...]}
    DELETE /api/v1/deployments/{name}   -> {"deployment"} (state "deleting"; the plane stops
                                            its processes, then it is "deleted")

``live`` is the gateway's figures (:mod:`coadapt.deploy.live`) when it answers within 0.5 s,
else null. ``replicas.desired``/``granted`` are the last co-scheduling round's reservation
(null before the first).
"""

# No ``from __future__ import annotations``: FastAPI reads the annotations at definition time.
import json
from collections.abc import Callable, Iterable
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Depends

from coadapt.controller.errors import ConflictError, NotFoundError, StorageError
from coadapt.controller.http_input import json_body
from coadapt.controller.openapi import error_responses
from coadapt.controller.openapi import json_body as body_schema
from coadapt.controller.serving import SERVING_STATE_KEY
from coadapt.controller.store import Store, Tenant
from coadapt.deploy.live import LiveFigures, live_figures
from coadapt.deploy.spec import DeploymentSpec, parse_deployment_spec
from coadapt.deploy.store import (
    DeploymentRecord,
    DeploymentState,
    DeploymentStore,
    ServingReplicaRecord,
    ServingReplicaStatus,
    scheduling_names,
)
from coadapt.policies.base import PolicyError
from coadapt.policies.coschedule import Reservation, reservations_of
from coadapt.ports import free_port
from coadapt.protocol import EventKind
from coadapt.registry.store import RegistryStore

BASE = "/api/v1/deployments"
GATEWAY_HOST = "127.0.0.1"  # where gateways listen (the controller's machine)
PORT_TRIES = 32  # free ports tried before giving up (each must not be another gateway's)


def reservations(store: Store) -> dict[str, Reservation]:
    """What the last co-scheduling round reserved per scheduling name ({} before one)."""
    raw = store.meta_get(SERVING_STATE_KEY)
    if not raw:
        return {}
    try:
        state = json.loads(raw)
        return reservations_of(state) if isinstance(state, dict) else {}
    except (json.JSONDecodeError, PolicyError, KeyError, TypeError, ValueError):
        return {}  # the loop logs a bad state; the views show no reservation


def replica_counts(rows: Iterable[ServingReplicaRecord]) -> dict[str, int]:
    """Replicas of a deployment per status, every live status present (zeros included)."""
    counts = {st.value: 0 for st in ServingReplicaStatus if st.alive}
    for r in rows:
        if r.status.alive:
            counts[r.status.value] += 1
    return counts


def deployment_view(
    rec: DeploymentRecord,
    tenant: str,
    sched_name: str,
    rows: list[ServingReplicaRecord],
    reservation: Reservation | None,
    live: LiveFigures | None,
) -> dict[str, Any]:
    """One deployment as the API, the dashboard and the CLI show it."""
    return {
        "id": rec.id,
        "name": rec.name,
        "tenant": tenant,
        "scheduling_name": sched_name,
        "model": rec.spec.model,
        "version": rec.spec.version,
        "state": rec.state.value,
        "url": f"http://{GATEWAY_HOST}:{rec.gateway_port}",
        "gateway_port": rec.gateway_port,
        "gateway_pid": rec.gateway_pid,
        "model_root": rec.model_root,
        "spec": rec.spec.to_json(),
        "slo_s": rec.spec.slo_ms / 1000.0,
        "replicas": {
            **replica_counts(rows),
            "desired": reservation.desired if reservation is not None else None,
            "granted": reservation.slots if reservation is not None else None,
            "admit_rps": reservation.admit_rps if reservation is not None else None,
        },
        "placement": sorted([r.node, r.slot, r.status.value] for r in rows if r.status.alive),
        "live": live.to_json() if live is not None else None,
        "created_at": rec.created_at,
        "updated_at": rec.updated_at,
        "deleted_at": rec.deleted_at,
    }


def replica_view(r: ServingReplicaRecord) -> dict[str, Any]:
    out = asdict(r)
    out["status"] = r.status.value
    return out


class DeploymentViews:
    """Builds deployment views with their replicas, reservations and gateway figures (the
    routes here and the dashboard share it)."""

    def __init__(self, deploys: DeploymentStore) -> None:
        self.deploys = deploys
        self.store = deploys.store

    def views(
        self, records: list[DeploymentRecord], with_live: bool = True
    ) -> list[dict[str, Any]]:
        tenants = {t.id: t.name for t in self.store.tenants()}
        names = scheduling_names(self.deploys.list(), tenants)
        reserved = reservations(self.store)
        rows: dict[int, list[ServingReplicaRecord]] = {}
        for r in self.deploys.replicas():
            rows.setdefault(r.deployment_id, []).append(r)
        ports = {rec.id: rec.gateway_port for rec in records if rec.state is DeploymentState.ACTIVE}
        live = live_figures(ports) if with_live else {}
        out = []
        for rec in records:
            sched = names.get(rec.id, rec.name)
            out.append(
                deployment_view(
                    rec,
                    tenants.get(rec.tenant_id, rec.tenant_id),
                    sched,
                    rows.get(rec.id, []),
                    reserved.get(sched),
                    live.get(rec.id),
                )
            )
        return out


def _gateway_port(taken: set[int]) -> int:
    """A free port no other deployment's gateway was given (a gateway binds it later)."""
    for _ in range(PORT_TRIES):
        port = free_port(GATEWAY_HOST)
        if port not in taken:
            return port
    raise StorageError("no free TCP port for the deployment's gateway: try again")


def deploy_router(
    deploys: DeploymentStore,
    registry: RegistryStore,
    clock: Callable[[], float],
    auth: Callable[..., Tenant],
    on_change: Callable[[], None] = lambda: None,
) -> APIRouter:
    """The deployment routes; ``auth`` is the app's bearer-token dependency, ``on_change``
    wakes the control loop (a new or deleted deployment is acted on at once)."""
    router = APIRouter(tags=["deployments"])
    Auth = Annotated[Tenant, Depends(auth)]
    views = DeploymentViews(deploys)
    store = deploys.store

    def event(rec: DeploymentRecord, message: str, **data: Any) -> None:
        store.add_event(
            None,
            EventKind.DEPLOY,
            f"deployment {rec.name}: {message}",
            clock(),
            {"deployment": rec.name, "deployment_id": rec.id, **data},
        )

    def resolve(me: Tenant, spec: DeploymentSpec) -> tuple[DeploymentSpec, str]:
        """The spec with its version as the registry spells it (``3`` is ``00000003``), and
        the model's version root; an explicit version must have passed its gates."""
        model = registry.find_model(spec.model, me)
        if model.tenant_id != me.id and not me.is_admin:  # find_model already refuses this
            raise NotFoundError(f"no model {spec.model!r} (see `coadapt model ls`)")
        if spec.follows_live:
            return spec, model.root
        v = registry.version(model.id, spec.version)
        if v is None and spec.version.isdigit():
            same = [
                x for x in registry.versions(model.id)
                if x.version.isdigit() and int(x.version) == int(spec.version)
            ]  # fmt: skip
            v = same[0] if len(same) == 1 else None
        if v is None:
            raise ConflictError(
                f"model {model.name} has no version {spec.version!r}: give one from "
                f"`coadapt model show {model.name}`, or version: live"
            )
        if not v.state.passed_gates:
            why = f" ({v.reason})" if v.reason else ""
            raise ConflictError(
                f"version {v.version} of model {model.name} is {v.state.value}{why}: "
                "only a version that passed its gates can be deployed"
            )
        return spec.model_copy(update={"version": v.version}), model.root

    def one(rec: DeploymentRecord, with_live: bool = True) -> dict[str, Any]:
        return views.views([rec], with_live)[0]

    @router.post(
        BASE,
        status_code=201,
        responses=error_responses(404, 409, 413),
        openapi_extra=body_schema(DeploymentSpec, "the deployment spec (see docs/coschedule.md)"),
    )
    def create(me: Auth, body: Annotated[Any, Depends(json_body)]) -> dict[str, Any]:
        """Deploy a registered model behind a gateway; replicas follow its demand."""
        spec, root = resolve(me, parse_deployment_spec(body))
        taken = {d.gateway_port for d in deploys.list()}
        rec = deploys.create(me, spec, root, _gateway_port(taken), clock())
        event(rec, f"created for model {spec.model} (version {spec.version})")
        on_change()
        return {"deployment": one(rec, with_live=False)}

    @router.get(BASE)
    def list_deployments(me: Auth, live: bool = True) -> dict[str, Any]:
        """Your deployments (the admin: all) being served or deleted; ``live=false`` skips
        asking the gateways for their figures."""
        return {"deployments": views.views(deploys.list(me), with_live=live)}

    @router.get(BASE + "/{name}", responses=error_responses(404))
    def show(name: str, me: Auth) -> dict[str, Any]:
        rec = deploys.get(me, name)
        return {
            "deployment": one(rec),
            "replicas": [replica_view(r) for r in deploys.replicas(rec.id)],
        }

    @router.delete(BASE + "/{name}", responses=error_responses(404))
    def remove(name: str, me: Auth) -> dict[str, Any]:
        """Stop serving: the deployment becomes ``deleting``; its gateway and replicas stop,
        then it is ``deleted`` and its name free again."""
        rec = deploys.request_delete(me, name, clock())
        event(rec, f"deletion requested by {me.name}")
        on_change()
        return {"deployment": one(rec, with_live=False)}

    @router.get("/api/v1/ui/serving", tags=["dashboard"])
    def serving_slots(me: Auth) -> dict[str, Any]:
        """The dashboard's serving half: your deployments (as ``GET /api/v1/deployments``) and
        every slot a serving replica holds; another tenant's is anonymised (``other``)."""
        mine = deploys.list(me)
        own = {rec.id: rec.name for rec in mine}
        slots = []
        for r in deploys.replicas(statuses=[st for st in ServingReplicaStatus if st.alive]):
            if r.deployment_id in own:
                slots.append({"node": r.node, "slot": r.slot, "status": r.status.value,
                              "deployment": own[r.deployment_id], "other": False})  # fmt: skip
            else:
                slots.append({"node": r.node, "slot": r.slot, "status": r.status.value,
                              "other": True})  # fmt: skip
        return {"deployments": views.views(mine), "replicas": slots}

    return router


__all__ = ["DeploymentViews", "deploy_router", "deployment_view", "replica_view", "reservations"]

"""The deployment store on SQLite and PostgreSQL: records, tenant isolation, the two state
machines, and its own migration branch upgrading an existing database in place."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from coadapt.controller.db import current_heads, head_revisions, make_engine, migrate
from coadapt.controller.errors import ConflictError, InvalidTransitionError, NotFoundError
from coadapt.controller.store import Store
from coadapt.deploy.store import (
    DeploymentState,
    DeploymentStore,
    ServingReplicaStatus,
)
from tests.deploy.conftest import deploy_spec, tenants

S = ServingReplicaStatus


def test_create_get_list_and_tenant_isolation(store: Store) -> None:
    t = tenants(store)
    ds = DeploymentStore(store)
    rec = ds.create(t["alice"], deploy_spec(slo_ms=80), "/models/mlp", 41001, now=10.0)
    assert (rec.name, rec.tenant_id, rec.state) == ("web", t["alice"].id, DeploymentState.ACTIVE)
    assert (rec.model_root, rec.gateway_port, rec.gateway_pid) == ("/models/mlp", 41001, None)
    assert rec.spec == deploy_spec(slo_ms=80) and rec.created_at == rec.updated_at == 10.0
    assert ds.get(t["alice"], "web") == rec == ds.by_id(rec.id)
    # a stranger's deployment is a 404, like a missing one; bob may use the same name
    with pytest.raises(NotFoundError, match="no deployment 'web'"):
        ds.get(t["bob"], "web")
    bobs = ds.create(t["bob"], deploy_spec(), "/models/b", 41002, now=11.0)
    assert ds.get(t["bob"], "web") == bobs
    assert [d.id for d in ds.list(t["alice"])] == [rec.id]
    assert {d.id for d in ds.list(t["root"])} == {rec.id, bobs.id} == {d.id for d in ds.list()}
    # the admin reaches a tenant's deployment when only one has that name
    ds.create(t["alice"], deploy_spec(name="api"), "/models/mlp", 41003, now=12.0)
    assert ds.get(t["root"], "api").tenant_id == t["alice"].id
    with pytest.raises(ConflictError, match="several tenants"):
        ds.get(t["root"], "web")
    with pytest.raises(NotFoundError):
        ds.by_id(999)


def test_a_name_is_taken_until_its_deployment_is_deleted(store: Store) -> None:
    t = tenants(store)
    ds = DeploymentStore(store)
    first = ds.create(t["alice"], deploy_spec(), "/m", 41001, now=1.0)
    with pytest.raises(ConflictError, match="exists already"):
        ds.create(t["alice"], deploy_spec(), "/m", 41002, now=2.0)
    deleting = ds.request_delete(t["alice"], "web", now=3.0)
    assert deleting.state is DeploymentState.DELETING and deleting.updated_at == 3.0
    assert ds.request_delete(t["alice"], "web", now=4.0).state is DeploymentState.DELETING
    assert [d.state for d in ds.list(t["alice"])] == [DeploymentState.DELETING]
    with pytest.raises(ConflictError):
        ds.create(t["alice"], deploy_spec(), "/m", 41002, now=5.0)  # still being deleted
    ds.mark_deleted(first.id, now=6.0)
    ds.mark_deleted(first.id, now=7.0)  # idempotent
    gone = ds.by_id(first.id)
    assert (gone.state, gone.deleted_at) == (DeploymentState.DELETED, 6.0)
    assert ds.list(t["alice"]) == []
    assert ds.list(t["alice"], states=[DeploymentState.DELETED]) == [gone]
    with pytest.raises(NotFoundError):
        ds.get(t["alice"], "web")
    with pytest.raises(NotFoundError):
        ds.request_delete(t["alice"], "web", now=8.0)
    again = ds.create(t["alice"], deploy_spec(), "/m", 41003, now=9.0)
    assert again.id != first.id and ds.get(t["alice"], "web") == again
    with pytest.raises(InvalidTransitionError, match="being deleted"):
        ds.mark_deleted(again.id, now=10.0)  # active: rm first
    with pytest.raises(NotFoundError):
        ds.request_delete(t["bob"], "web", now=10.0)  # not bob's


def test_gateway_and_replica_records(store: Store) -> None:
    t = tenants(store)
    ds = DeploymentStore(store)
    dep = ds.create(t["alice"], deploy_spec(), "/m", 41001, now=1.0)
    ds.set_gateway(dep.id, 4242, 987654321012, "/state/deployments/1/gateway", now=2.0)
    got = ds.by_id(dep.id)
    assert (got.gateway_pid, got.gateway_start_ticks, got.gateway_run_dir) == (
        4242,
        987654321012,
        "/state/deployments/1/gateway",
    )
    a = ds.add_replica(dep.id, "local", 0, 42001, "/r/a", "/r/a/log", now=3.0)
    b = ds.add_replica(dep.id, "local", 1, 42002, "/r/b", "/r/b/log", now=3.0)
    assert (a.status, a.pid, a.started_at, a.slot, a.port) == (S.STARTING, None, 3.0, 0, 42001)
    a = ds.update_replica(a.id, pid=100, start_ticks=5, status=S.READY, ready_at=4.0)
    assert (a.pid, a.start_ticks, a.status, a.ready_at) == (100, 5, S.READY, 4.0)
    assert ds.replicas(dep.id, statuses=[S.READY]) == [a]
    assert [r.id for r in ds.replicas()] == [a.id, b.id] == [r.id for r in ds.replicas(dep.id)]
    # drain, called off, drained again, stopped, exited; then nothing moves it
    for status in (S.DRAINING, S.READY, S.DRAINING, S.STOPPING):
        a = ds.update_replica(a.id, status=status)
    a = ds.update_replica(a.id, status="exited", ended_at=9.0, exit_code=0, reason="scaled down")
    assert (a.status, a.exit_code, a.reason, a.status.alive) == (S.EXITED, 0, "scaled down", False)
    with pytest.raises(InvalidTransitionError, match="exited; it cannot become ready"):
        ds.update_replica(a.id, status=S.READY)
    with pytest.raises(InvalidTransitionError, match="stopping; it cannot become ready"):
        ds.update_replica(ds.update_replica(b.id, status=S.STOPPING).id, status=S.READY)
    with pytest.raises(ValueError, match="not changeable"):
        ds.update_replica(b.id, node="elsewhere")
    with pytest.raises(NotFoundError):
        ds.update_replica(999, status=S.READY)
    # a deployment being deleted gets no new replicas
    ds.request_delete(t["alice"], "web", now=10.0)
    with pytest.raises(InvalidTransitionError, match="no new replicas"):
        ds.add_replica(dep.id, "local", 2, 42003, "/r/c", "/r/c/log", now=11.0)


def tables(engine: sa.Engine) -> set[str]:
    return set(sa.inspect(engine).get_table_names())


def test_deploy_is_a_branch_that_needs_only_the_tenants_revision(db_url: str) -> None:
    assert "deploy_0001" in head_revisions()
    engine = make_engine(db_url)
    try:
        migrate(engine, "deploy@head")
        assert current_heads(engine) == {"deploy_0001"}
        assert {"tenants", "deploy_deployments", "deploy_replicas"} <= tables(engine)
        assert not {t for t in tables(engine) if t.startswith(("tune_", "registry_"))}
    finally:
        engine.dispose()


def test_an_existing_database_upgrades_in_place(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        for branch in ("controller", "tune", "registry"):
            migrate(engine, f"{branch}@head")
        before = current_heads(engine)
        assert "deploy_0001" not in before and len(before) == 3
        assert "deploy_deployments" not in tables(engine)
    finally:
        engine.dispose()
    store = Store.open(db_url)  # what a new controller does on start
    try:
        tenant, _ = store.create_tenant("alice", 1.0)
        assert current_heads(store.engine) == head_revisions()
        assert {"deploy_deployments", "deploy_replicas"} <= tables(store.engine)
        assert store.tenant_by_name("alice") == tenant
        assert DeploymentStore(store).create(tenant, deploy_spec(), "/m", 1, 1.0).id > 0
    finally:
        store.close()

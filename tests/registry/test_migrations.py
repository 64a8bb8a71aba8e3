"""The registry's own migration branch: it needs only the controller's ``tenants`` revision,
and a database already at the controller's and tuning's heads upgrades to it in place, rows
kept (on SQLite and PostgreSQL)."""

from __future__ import annotations

import sqlalchemy as sa

from coadapt.controller.db import current_heads, head_revisions, make_engine, migrate
from coadapt.controller.store import Store


def tables(engine: sa.Engine) -> set[str]:
    return set(sa.inspect(engine).get_table_names())


def test_registry_is_a_branch_of_its_own() -> None:
    assert "registry_0001" in head_revisions()


def test_the_branch_needs_only_the_tenants_revision(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        migrate(engine, "registry@head")
        assert current_heads(engine) == {"registry_0001"}  # 0001 is implied by depends_on
        assert {"tenants", "registry_models", "registry_versions"} <= tables(engine)
        assert not {t for t in tables(engine) if t.startswith("tune_")}
    finally:
        engine.dispose()


def test_an_existing_database_upgrades_in_place(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        migrate(engine, "controller@head")
        migrate(engine, "tune@head")
        before = current_heads(engine)
        assert "registry_0001" not in before and len(before) == 2
        assert "registry_models" not in tables(engine)
    finally:
        engine.dispose()
    store = Store.open(db_url)  # what a new controller does on start
    try:
        tenant, _ = store.create_tenant("alice", 1.0)
        assert current_heads(store.engine) == head_revisions()
        assert {"registry_models", "registry_versions", "registry_promotions"} <= tables(
            store.engine
        )
        assert store.tenant_by_name("alice") == tenant
    finally:
        store.close()

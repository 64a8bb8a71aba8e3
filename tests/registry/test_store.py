"""The registry's storage on SQLite and PostgreSQL: tenant scoping, the version state
machine, promotion as one transaction with its history, deletion rules."""

from __future__ import annotations

import pytest

from coadapt.controller.errors import ConflictError, InvalidTransitionError, NotFoundError
from coadapt.controller.store import Store, Tenant
from coadapt.registry.config import ModelSpec, parse_model_spec
from coadapt.registry.states import VersionState
from coadapt.registry.store import NewVersion, RegistryStore

Setup = tuple[RegistryStore, dict[str, Tenant]]


def new(version: str, kind: str = "full", parent: str | None = None) -> NewVersion:
    return NewVersion(version, kind, parent, "ab" * 32, 1 << 33, "job-1", 7, 1 << 40, 5.0)


@pytest.fixture
def setup(store: Store) -> Setup:
    tenants = {
        n: store.create_tenant(n, 1.0, is_admin=(n == "root"))[0] for n in ("root", "alice", "bob")
    }
    return RegistryStore(store), tenants


def spec(name: str, root: str = "/models/x") -> ModelSpec:
    return parse_model_spec({"name": name, "root": root, "retention": {"keep_passed": 2}})


def test_models_are_tenant_scoped(setup: Setup) -> None:
    reg, t = setup
    a = reg.create_model(t["alice"], spec("ctr", "/m/a"), 10.0)
    b = reg.create_model(t["bob"], spec("ctr", "/m/b"), 11.0)
    assert a.retention.keep_passed == 2 and a.gates.replay is None
    assert reg.find_model("ctr", t["alice"]).id == a.id
    assert reg.find_model("ctr", t["bob"]).id == b.id
    with pytest.raises(NotFoundError):
        reg.find_model("bob/ctr", t["alice"])
    assert [m.id for m in reg.list_models(t["alice"])] == [a.id]
    assert {m.id for m in reg.list_models(t["root"])} == {a.id, b.id}
    with pytest.raises(ConflictError, match="name the owner"):
        reg.find_model("ctr", t["root"])
    assert reg.find_model("bob/ctr", t["root"]).id == b.id
    with pytest.raises(ConflictError, match="exists already"):
        reg.create_model(t["alice"], spec("ctr", "/m/c"), 12.0)


def test_versions_state_machine_and_promotions(setup: Setup) -> None:
    reg, t = setup
    m = reg.create_model(t["alice"], spec("ctr"), 10.0)
    v1 = reg.add_version(m.id, new("00000001"), 20.0)
    assert v1.state is VersionState.REGISTERED and v1.size_bytes == 1 << 33
    assert v1.data_offset == 1 << 40  # BIGINT on both backends
    assert reg.add_version(m.id, new("00000001"), 21.0).registered_at == 20.0  # idempotent
    reg.add_version(m.id, new("00000002", "delta", "00000001"), 22.0)
    with pytest.raises(InvalidTransitionError, match="registered; it cannot become live"):
        reg.set_state(m.id, "00000001", VersionState.LIVE)
    checks = [{"name": "integrity", "status": "passed"}]
    for v in ("00000001", "00000002"):
        reg.set_state(m.id, v, VersionState.VALIDATING)
    reg.set_state(m.id, "00000001", VersionState.PASSED, checks=checks, validated_at=30.0)
    bad = reg.set_state(m.id, "00000002", VersionState.FAILED, reason="auc 0.5 < 0.7")
    assert bad.reason == "auc 0.5 < 0.7"
    with pytest.raises(InvalidTransitionError, match="only a version that passed"):
        reg.go_live(m.id, "00000002", "promote", "alice", 40.0)
    p1 = reg.go_live(m.id, "00000001", "promote", "alice", 40.0)
    assert (p1.from_version, p1.to_version) == (None, "00000001")
    with pytest.raises(InvalidTransitionError, match="live already"):
        reg.go_live(m.id, "00000001", "promote", "alice", 41.0)
    reg.add_version(m.id, new("00000003"), 42.0)
    reg.set_state(m.id, "00000003", VersionState.VALIDATING)
    reg.set_state(m.id, "00000003", VersionState.PASSED, checks=checks)
    p2 = reg.go_live(m.id, "00000003", "promote", "bob", 50.0)
    assert p2.from_version == "00000001"
    states = {v.version: v.state for v in reg.versions(m.id)}
    assert states == {
        "00000001": VersionState.RETIRED,
        "00000002": VersionState.FAILED,
        "00000003": VersionState.LIVE,
    }
    assert [v.version for v in reg.versions(m.id, [VersionState.LIVE])] == ["00000003"]
    assert [(p.action, p.to_version) for p in reg.promotions(m.id)] == [
        ("promote", "00000001"),
        ("promote", "00000003"),
    ]
    one = reg.version(m.id, "00000001")
    assert one is not None and one.checks == checks
    with pytest.raises(InvalidTransitionError, match="is live"):
        reg.delete_version(m.id, "00000003")
    reg.delete_version(m.id, "00000002")
    assert reg.version(m.id, "00000002") is None
    with pytest.raises(NotFoundError):
        reg.delete_version(m.id, "00000002")
    reg.delete_model(m.id)
    assert reg.list_models(None) == []

"""The registry's round on real version directories and real gate processes: discovery
(a half-written version is invisible), the LIVE pointer pinned and kept honest, failing
gates blocking promotion with their reason, auto-promotion, retention, rollback to the exact
predictions, deletion rules and where a tenant may register a root."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from coadapt.controller.errors import ConflictError, InvalidTransitionError, SpecError
from coadapt.controller.spec import parse_spec
from coadapt.serve import artifacts
from coadapt.serve.models import make_mlp
from tests.controller.conftest import make_spec
from tests.registry.conftest import KW, Reg, make_reg, predict, publish

X = np.random.default_rng(1).normal(size=(32, KW["in_features"])).astype(np.float32)


def test_auto_promotion_retention_and_rollback_to_exact_predictions(
    reg: Reg, tmp_path: Path
) -> None:
    root = tmp_path / "mlp"
    publish(root, seed=1)
    model = reg.create("alice", "mlp", root, gates={"auto_promote": True},
                       retention={"keep_passed": 1})  # fmt: skip
    assert artifacts.live_version(root) == "00000001"  # pinned: what servers served
    (root / "00000002").mkdir()  # a publisher still writing: no manifest yet
    (root / "00000002" / artifacts.DENSE_FILE).write_bytes(b"\0" * 64)
    first = reg.runner.sync(model)
    assert first.registered == ("00000001",) and first.validated == ("00000001",)
    assert reg.states(model) == {"00000001": "live"}  # adopted once it passed
    promos = reg.runner.registry.promotions(model.id)
    assert [(p.action, p.to_version) for p in promos] == [("adopt", "00000001")]
    v1 = reg.runner.registry.version(model.id, "00000001")
    assert v1 is not None and (v1.job_id, v1.step, v1.data_offset) == ("job-1", 10, 1000)

    publish(root, seed=2)  # 00000003 (the crashed publisher's 00000002 stays invisible)
    second = reg.runner.sync(model)
    assert second.promoted == "00000003" and artifacts.live_version(root) == "00000003"
    assert second.deleted == ()  # 00000001 is the previous live: kept for a rollback
    before = predict(root, "00000003", X)
    publish(root, seed=3)  # 00000004
    third = reg.runner.sync(model)
    assert third.promoted == "00000004" and third.deleted == ("00000001",)
    assert not (root / "00000001").exists()
    assert reg.states(model) == {"00000003": "retired", "00000004": "live"}

    back = reg.runner.rollback(model, "alice")
    assert (back.from_version, back.to_version) == ("00000004", "00000003")
    assert artifacts.live_version(root) == "00000003"
    after = predict(root, artifacts.live_version(root) or "", X)
    assert after.tobytes() == before.tobytes()  # exactly, bit for bit
    with pytest.raises(InvalidTransitionError, match="no previous live version"):
        reg.runner.rollback(model, "alice")  # 00000001 was live before 3: deleted
    reg.runner.sync(model)  # auto_promote does not undo an operator's rollback
    assert artifacts.live_version(root) == "00000003"


def test_failed_gates_block_promotion_and_the_live_version_keeps_serving(
    reg: Reg, tmp_path: Path, replay: Path
) -> None:
    root = tmp_path / "mlp"
    root.mkdir()
    gates = {"replay": str(replay), "logits": True, "metrics": [{"metric": "accuracy", "min": 0.9}]}
    model = reg.create("alice", "mlp", root, gates=gates, retention={"keep_failed": 2})
    assert (root / artifacts.LIVE_FILE).read_text() == "\n"  # held: nothing serves yet
    assert artifacts.live_version(root) is None
    publish(root, seed=1)
    publish(root, seed=1)  # 00000002: same weights, its file corrupted below
    publish(root, seed=2)  # 00000003: loads fine, fails the accuracy gate
    data = root / "00000002" / artifacts.DENSE_FILE
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0x01
    data.write_bytes(bytes(raw))
    reg.runner.sync(model)
    assert reg.states(model) == {"00000001": "passed", "00000002": "failed", "00000003": "failed"}
    assert artifacts.live_version(root) is None  # passing is not promotion
    reg.runner.promote(model, "00000001", "alice")
    assert artifacts.live_version(root) == "00000001"
    with pytest.raises(InvalidTransitionError, match=r"failed \(integrity: .*sha256"):
        reg.runner.promote(model, "00000002", "alice")
    with pytest.raises(InvalidTransitionError, match=r"accuracy = 0\.\d+, needs >= 0\.9"):
        reg.runner.promote(model, "00000003", "alice")
    assert artifacts.live_version(root) == "00000001"
    # someone points servers at the failed version by hand: the next round puts it back
    (root / artifacts.LIVE_FILE).write_text("00000003\n")
    reg.runner.sync(model)
    assert artifacts.live_version(root) == "00000001"
    assert reg.states(model)["00000001"] == "live"
    (root / artifacts.LIVE_FILE).unlink()  # without it servers would serve the newest (3)
    reg.runner.sync(model)
    assert (root / artifacts.LIVE_FILE).read_text() == "00000001\n"


def test_remove_refuses_the_live_version_and_a_delta_base(reg: Reg, tmp_path: Path) -> None:
    root = tmp_path / "mlp"
    publish(root, seed=1)
    publish(root, seed=2, incremental=True)  # 00000002: a delta on 00000001
    model = reg.create("alice", "mlp", root)
    assert reg.runner.discover(model) == ("00000001", "00000002")
    v2 = reg.runner.registry.version(model.id, "00000002")
    assert v2 is not None and (v2.kind, v2.parent) == ("delta", "00000001")
    with pytest.raises(ConflictError, match="base of delta"):
        reg.runner.remove(model, "00000001")
    reg.runner.remove(model, "00000002")
    assert not (root / "00000002").exists()
    assert reg.runner.discover(model) == ()  # gone for good
    assert [v.version for v in reg.runner.registry.versions(model.id)] == ["00000001"]


def test_where_a_tenant_may_register_a_root(sqlite_store: object, tmp_path: Path) -> None:
    state = tmp_path / "state"
    jobs = state / "jobs"
    jobs.mkdir(parents=True)
    reg = make_reg(sqlite_store, state_dir=state, jobs_dir=jobs)  # type: ignore[arg-type]
    job = reg.store.create_job(reg.tenants["alice"], parse_spec(make_spec()), 1.0)
    (jobs / job.id / "models").mkdir(parents=True)
    (tmp_path / "shared" / "a").mkdir(parents=True)
    with pytest.raises(SpecError, match="not a directory"):
        reg.create("alice", "m", tmp_path / "missing")
    with pytest.raises(SpecError, match="other things than model versions"):
        reg.create("root", "m", state)  # it would plant a LIVE pointer among the state files
    (state / "models").mkdir()
    with pytest.raises(SpecError, match="outside your jobs"):
        reg.create("alice", "m", state / "models")
    with pytest.raises(SpecError, match="outside your jobs"):
        reg.create("bob", "m", jobs / job.id / "models")  # alice's job
    reg.create("alice", "m", jobs / job.id / "models")
    reg.create("bob", "m", tmp_path / "shared" / "a")
    (tmp_path / "shared" / "a" / "inner").mkdir()
    with pytest.raises(ConflictError, match=r"registered model: give"):
        reg.create("alice", "other", tmp_path / "shared" / "a" / "inner")  # bob's: no name
    with pytest.raises(ConflictError, match=r"\(m\)"):
        reg.create("bob", "again", tmp_path / "shared" / "a" / "inner")
    (state / "admin-models").mkdir()
    reg.create("root", "anything", state / "admin-models")  # the admin may


def test_a_running_gate_does_not_block_the_model(reg: Reg, tmp_path: Path) -> None:
    root = tmp_path / "slow"
    artifacts.publish(
        make_mlp(1, **KW).state_dict(), root, factory="tests.registry.spy:hang",
        input_shape=(KW["in_features"],),
    )  # fmt: skip
    model = reg.create("alice", "slow", root, gates={"timeout_s": 3})
    round_ = threading.Thread(target=reg.runner.sync, args=(model,))
    round_.start()
    try:
        deadline = time.monotonic() + 30
        while reg.states(model).get("00000001") != "validating":
            assert time.monotonic() < deadline, reg.states(model)
            time.sleep(0.05)
        publish(root, seed=2)
        started = time.monotonic()
        assert reg.runner.discover(model) == ("00000002",)  # while version 1's gates run
        assert time.monotonic() - started < 2.0
    finally:
        round_.join(timeout=60)
    one = reg.runner.registry.version(model.id, "00000001")
    assert one is not None and one.reason == "the gates ran longer than timeout_s = 3 s"
    assert artifacts.live_version(root) is None  # the pinned version failed: servers hold


def test_a_tenant_root_must_be_owned_by_its_jobs_user_and_stay_so(
    sqlite_store: object, tmp_path: Path
) -> None:
    """Outside the state dir the controller writes and deletes as itself: only in a directory
    the tenant's run-as user owns, reached without a symbolic link, and only while it stays so."""
    import os

    me = os.getuid()
    uids = {"alice": me, "bob": me + 4242}  # bob's jobs run as a user who owns nothing here
    reg = make_reg(sqlite_store, state_dir=tmp_path / "state", run_as_uid=uids.get)  # type: ignore[arg-type]
    (tmp_path / "state").mkdir()
    mine = tmp_path / "alice-models"
    mine.mkdir()
    with pytest.raises(SpecError, match=f"not to uid {me + 4242}"):
        reg.create("bob", "m", mine)
    link = tmp_path / "link"
    link.symlink_to(mine)
    with pytest.raises(SpecError, match="symbolic link"):
        reg.create("alice", "m", link)
    model = reg.create("alice", "m", mine)
    publish(mine, seed=1)
    reg.runner.sync(model)
    assert [v.version for v in reg.runner.registry.versions(model.id)] == ["00000001"]
    # The directory is swapped for a link elsewhere: the controller stops touching it.
    elsewhere = tmp_path / "elsewhere"
    mine.rename(elsewhere)
    mine.symlink_to(elsewhere)
    with pytest.raises(ConflictError, match="symbolic link"):
        reg.runner.sync(model)
    with pytest.raises(ConflictError, match="symbolic link"):
        reg.runner.remove(model, "00000001")
    assert (elsewhere / "00000001" / artifacts.MANIFEST).exists()

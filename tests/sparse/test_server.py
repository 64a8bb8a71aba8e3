from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from coadapt.sparse.client import PSClient
from coadapt.sparse.server import (
    CallerMemo,
    ShardState,
    TableSpec,
    checkpoint_path,
    launch_servers,
    running_servers,
    shard_of,
)

SPECS = [TableSpec("a", 4, "adagrad", {"lr": 0.1}), TableSpec("b", 2, "sgd", {"lr": 0.5})]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_shard_rule_is_stable_balanced_and_in_range() -> None:
    ids = np.random.default_rng(0).integers(0, 2**63, 40_000, dtype=np.uint64)
    sh = shard_of(ids, 4)
    assert sh.min() >= 0 and sh.max() <= 3
    counts = np.bincount(sh, minlength=4)
    assert counts.min() > 0.9 * ids.size / 4
    np.testing.assert_array_equal(sh, shard_of(ids.view(np.int64), 4))  # int64 = same bits
    # Pinned: clients and servers of different versions must agree on the rule.
    assert shard_of(np.array([0, 1, 2**64 - 1], np.uint64), 7).tolist() == PINNED
    assert shard_of(ids, 1).max() == 0
    with pytest.raises(ValueError, match="num_shards"):
        shard_of(ids, 0)


PINNED = [5, 3, 0]  # mix64(id ^ SHARD_SALT) % 7, recorded when the rule was defined


def test_shard_state_pull_push_and_checkpoint_roundtrip(tmp_path: Path) -> None:
    st = ShardState(SPECS, seed=3)
    ids = np.array([5, 9, 2**64 - 1], np.uint64)
    w0 = st.pull(0, ids)
    g = np.ones((3, 4), np.float32)
    st.push(0, ids, g)
    w1 = st.pull(0, ids)
    # AdaGrad first step: w -= lr * g / (|g| + eps) = w - 0.1
    np.testing.assert_allclose(w1, w0 - 0.1, atol=1e-6)
    st.push(1, np.array([77], np.uint64), np.ones((1, 2), np.float32))  # no row: dropped
    assert st.dropped_grad_rows == 1
    path = st.save(tmp_path / "s.ckpt", {"offset": 42})
    back = ShardState.load(path)
    np.testing.assert_array_equal(back.pull(0, ids), w1)
    assert back.meta == {"offset": 42} and back.steps == st.steps
    # The init rng resumes too: a new ID gets the same row in both.
    new = np.array([123456], np.uint64)
    np.testing.assert_array_equal(back.pull(0, new), st.pull(0, new))
    with pytest.raises(ValueError, match="gradients must be"):
        st.push(0, ids, np.ones((3, 5), np.float32))


def test_not_admitted_ids_pull_zero_rows() -> None:
    st = ShardState([TableSpec("a", 3, "sgd", {"lr": 0.1, "init_scale": 0.5}, admit_after=2)])
    ids = np.array([1, 2], np.uint64)
    assert not st.pull(0, ids).any()  # first sighting: not admitted
    assert st.pull(0, ids).any()  # second: rows exist, randomly initialised


def test_server_process_started_and_stopped_by_pid(tmp_path: Path) -> None:
    procs = launch_servers(SPECS, 2, tmp_path)
    try:
        for p in procs:
            assert p.host == "127.0.0.1" and p.port > 0 and _alive(p.pid)
        with PSClient([p.address for p in procs]) as c:
            stats = c.stats()
            assert [s["pid"] for s in stats] == [p.pid for p in procs]
            with pytest.raises(RuntimeError, match="no checkpoint directory"):
                c.save()
    finally:
        codes = [p.stop() for p in procs]
    assert codes == [0, 0]
    assert not any(_alive(p.pid) for p in procs)


def test_client_rejects_servers_listed_out_of_order(tmp_path: Path) -> None:
    with (
        running_servers(SPECS, 2, tmp_path) as procs,
        pytest.raises(ValueError, match="shard order"),
    ):
        PSClient([procs[1].address, procs[0].address])


def test_kill9_then_restart_serves_checkpointed_rows(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ids = np.arange(1, 200, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    procs = launch_servers(SPECS, 2, tmp_path / "w1", ckpt_dir=ckpt)
    try:
        c = PSClient([p.address for p in procs])
        c.pull({"a": ids})
        c.push({"a": (ids, np.full((ids.size, 4), 0.5, np.float32))})
        saved = c.pull({"a": ids})["a"]
        info = c.save({"stream_offset": 1234})
        assert [Path(i["path"]) for i in info] == [checkpoint_path(ckpt, s, 2) for s in range(2)]
        c.push({"a": (ids, np.ones((ids.size, 4), np.float32))})  # after the checkpoint: lost
        assert not np.array_equal(c.pull({"a": ids})["a"], saved)
        c.close()
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
            p.proc.wait(10)
            assert p.proc.returncode == -signal.SIGKILL
    finally:
        for p in procs:
            p.stop()
    t0 = time.monotonic()
    with (
        running_servers(SPECS, 2, tmp_path / "w2", ckpt_dir=ckpt) as procs2,
        PSClient([p.address for p in procs2]) as c2,
    ):
        np.testing.assert_array_equal(c2.pull({"a": ids})["a"], saved)
        assert all(s["tables"]["a"]["rows"] > 0 for s in c2.stats())
    assert time.monotonic() - t0 < 60


def test_push_reuses_the_pull_indices_only_while_they_are_valid() -> None:
    """A caller's push of exactly the IDs it pulled skips the lookup; any insert in between
    (here another caller's pull of new IDs) bumps the generation and forces a fresh lookup.
    Either way the result equals the memo-less path bit for bit."""
    specs = [TableSpec("a", 4, "rowwise_adagrad", {"lr": 0.1})]
    fast, ref = ShardState(specs, seed=1), ShardState(specs, seed=1)
    memo = CallerMemo()
    lookups = 0
    real_lookup = fast.tables[0].lookup

    def counting_lookup(*a: object, **kw: object) -> np.ndarray:
        nonlocal lookups
        lookups += 1
        return real_lookup(*a, **kw)  # type: ignore[arg-type]

    fast.tables[0].lookup = counting_lookup  # type: ignore[method-assign]
    rng = np.random.default_rng(0)
    ids = np.arange(100, dtype=np.uint64)
    for step in range(4):
        np.testing.assert_array_equal(fast.pull(0, ids, memo=memo), ref.pull(0, ids))
        if step == 2:  # someone else inserts rows between this caller's pull and push
            fresh = np.arange(1000, 1300, dtype=np.uint64)
            fast.pull(0, fresh)
            ref.pull(0, fresh)
        g = rng.standard_normal((ids.size, 4)).astype(np.float32)
        fast.push(0, ids, g, memo=memo)
        ref.push(0, ids, g)
        assert lookups == (1 if step >= 2 else 0)
    fast.push(0, ids[::-1].copy(), g, memo=memo)  # other IDs than pulled: looked up
    ref.push(0, ids[::-1].copy(), g)
    assert lookups == 2
    idx = ref.tables[0].lookup(ids)
    np.testing.assert_array_equal(
        fast.tables[0].rows(fast.tables[0].lookup(ids)), ref.tables[0].rows(idx)
    )

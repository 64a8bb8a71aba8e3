"""The compiled probe (``coadapt.sparse._probe``) answers exactly as the numpy path does."""

from __future__ import annotations

import numpy as np
import pytest

from coadapt.sparse import _probe
from coadapt.sparse import table as table_mod
from coadapt.sparse.table import EmbeddingTable

pytestmark = pytest.mark.skipif(
    _probe.probe_keys is None, reason="numba absent or COADAPT_NO_JIT set: no kernels to compare"
)

EXTREMES = np.array([0, 1, 2**63, 2**64 - 1, 2**64 - 2], dtype=np.uint64)


def _numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``table.py`` take its numpy path from now on (as with COADAPT_NO_JIT=1)."""
    monkeypatch.setattr(table_mod, "probe_keys", None)
    monkeypatch.setattr(table_mod, "probe_stored", None)
    monkeypatch.setattr(table_mod, "_take_found", None)


def _keys(rng: np.random.Generator, n: int) -> np.ndarray:
    k = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    return np.unique(np.concatenate([EXTREMES, k]))


def _grown_table(
    rng: np.random.Generator, width: int = 3, **kw: object
) -> tuple[EmbeddingTable, np.ndarray]:
    """A table filled in many small batches, so every segment grew (rehashed) several times."""
    t = EmbeddingTable(2, width, segments=4, max_rows=50_000, seed=3, **kw)  # type: ignore[arg-type]
    keys = _keys(rng, 20_000)
    rng.shuffle(keys)
    for a in range(0, keys.size, 700):
        k = keys[a : a + 700]
        t.assign(k, rng.standard_normal((k.size, width)).astype(np.float32))
    return t, keys


def _queries(rng: np.random.Generator, keys: np.ndarray) -> np.ndarray:
    """Present keys (with repeats), absent random keys and the extremes, shuffled."""
    q = np.concatenate([keys[rng.integers(0, keys.size, 6000)], _keys(rng, 3000), EXTREMES])
    rng.shuffle(q)
    return q


def _both(
    t: EmbeddingTable, q: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> tuple[np.ndarray, np.ndarray]:
    fast = t.lookup(q)
    st, sg = t._prepare(q)
    fast_stored = t._find(st, sg)
    with monkeypatch.context() as m:
        _numpy(m)
        slow = t.lookup(q)
        assert np.array_equal(t._find(st, sg), slow)
    assert np.array_equal(fast_stored, fast)
    return fast, slow


def test_lookup_matches_numpy_after_growth(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    t, keys = _grown_table(rng)
    assert t._level.min() > 0  # every segment grew at least once
    q = _queries(rng, keys)
    fast, slow = _both(t, q, monkeypatch)
    assert np.array_equal(fast, slow)
    assert 0 < np.count_nonzero(fast < 0) < q.size  # hits and misses both exercised
    assert np.array_equal(t.lookup(EXTREMES) >= 0, np.ones(EXTREMES.size, bool))


def test_tiny_segments_and_the_same_bucket_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """One- and two-bucket segments (b1 == b2 happens for half the keys) at every size."""
    rng = np.random.default_rng(1)
    t = EmbeddingTable(1, segments=2, max_rows=4000, seed=5)
    keys = _keys(rng, 400)
    for a in range(0, keys.size, 7):
        t.assign(keys[a : a + 7], np.ones((keys[a : a + 7].size, 1), np.float32))
        q = np.concatenate([keys[: a + 14], EXTREMES])
        fast, slow = _both(t, q, monkeypatch)
        assert np.array_equal(fast, slow)


def test_after_deletes_and_expiry(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(2)
    t = EmbeddingTable(2, 2, ttl=10, segments=8, max_rows=50_000)
    keys = _keys(rng, 10_000)
    t.lookup_or_insert(keys[:5000], now=0)
    t.lookup_or_insert(keys[5000:], now=8)
    assert t.delete(keys[::3]) > 0
    assert t.expire(12) > 0  # the rows touched at 0 are gone
    q = _queries(rng, keys)
    fast, slow = _both(t, q, monkeypatch)
    assert np.array_equal(fast, slow)
    assert np.all(fast[np.isin(q, keys[::3])] < 0)


@pytest.mark.parametrize("with_at", [False, True])
def test_take_found_matches_numpy(monkeypatch: pytest.MonkeyPatch, with_at: bool) -> None:
    rng = np.random.default_rng(3)
    t, keys = _grown_table(rng, width=5)  # optimizer state beyond dim: only dim columns copied
    q = _queries(rng, keys)
    n, off = q.size, 7
    at = rng.permutation(n + off)[:n] if with_at else None
    out = []
    for numpy_path in (False, True):
        buf = np.full((n + off, t.dim), -9.0, np.float32)
        pos = np.full(n + off, -5, np.int64)
        with monkeypatch.context() as m:
            if numpy_path:
                _numpy(m)
            end, miss = t.take_found(q, buf, pos, off, at)
        out.append((end, miss, buf, pos))
    (e1, m1, b1, p1), (e2, m2, b2, p2) = out
    assert e1 == e2 and np.array_equal(m1, m2)
    assert np.array_equal(b1, b2) and np.array_equal(p1, p2)
    idx = t.lookup(q)
    assert np.array_equal(m1, np.flatnonzero(idx < 0))
    hit = np.flatnonzero(idx >= 0)
    where = hit if at is None else at[hit]
    assert np.array_equal(b1[p1[where]], t._rows[idx[hit], : t.dim])


def test_take_found_rejects_a_wrong_buffer() -> None:
    t = EmbeddingTable(4)
    keys, buf = np.arange(3, dtype=np.uint64), np.empty((3, 4), np.float32)
    with pytest.raises(ValueError, match="pos must be 1-D with at least 3"):
        t.take_found(keys, buf, np.empty(2, np.int64))
    with pytest.raises(IndexError, match="outside pos"):
        t.take_found(keys, buf, np.empty(3, np.int64), at=np.array([0, 1, 3]))
    with pytest.raises(ValueError, match="buf has 2 rows"):
        t.take_found(
            np.arange(3, dtype=np.uint64), np.empty((2, 4), np.float32), np.empty(3, np.int64)
        )
    with pytest.raises(ValueError, match=r"buf must be float32 \(rows, 4\)"):
        t.take_found(
            np.arange(3, dtype=np.uint64), np.empty((3, 2), np.float32), np.empty(3, np.int64)
        )


def test_warm_compiles_once() -> None:
    assert _probe.warm() is True
    assert _probe.warm() is True  # cached: nothing to do the second time


@pytest.mark.parametrize("nsh", [2, 3, 7])
def test_split_shards_matches_shard_of(nsh: int) -> None:
    from coadapt.sparse.server import SHARD_SALT, shard_of

    assert _probe.split_shards is not None
    rng = np.random.default_rng(nsh)
    keys = np.concatenate([_keys(rng, 5000), EXTREMES, EXTREMES])  # repeats too
    order = np.empty(keys.size, np.int64)
    starts = np.zeros(nsh + 1, np.int64)
    _probe.split_shards(keys, SHARD_SALT, nsh, order, starts)
    sh = shard_of(keys, nsh)
    for s in range(nsh):
        assert np.array_equal(order[starts[s] : starts[s + 1]], np.flatnonzero(sh == s))
    assert starts[-1] == keys.size

"""The serving look-up kernels (``coadapt.sparse._serve_lookup``, through
``ShardedTable.pool_sum`` and ``ServingEmbedding``): bag sums bit for bit equal to
``embedding_bag(mode="sum")`` over the rows ``ShardedTable.take`` finds, at several widths and
shard counts, with unknown, extreme and repeated IDs, rows added by deltas, a delta still in its
overlays, shared IDs; the overlays' key filter; and the case that must keep ``take``'s path (no
kernels)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from coadapt.serve import sparse_model  # noqa: E402
from coadapt.serve.sparse_model import (  # noqa: E402
    PendingMerge,
    ServingEmbedding,
    ShardedTable,
    SparseView,
    prepare_delta,
)
from coadapt.sparse import _serve_lookup  # noqa: E402
from coadapt.sparse.export import DeltaTable  # noqa: E402
from coadapt.sparse.server import shard_of  # noqa: E402
from coadapt.sparse.table import EmbeddingTable  # noqa: E402

pytestmark = pytest.mark.skipif(
    _serve_lookup.probe_rows is None, reason="numba absent or COADAPT_NO_JIT set: no kernels"
)
EXTREMES = np.array([0, 1, 2**63, 2**63 - 1, 2**64 - 1], np.uint64)
NO_BACK = np.empty(0, np.int64)


def _table(keys: np.ndarray, dim: int, shards: int, packed: bool, seed: int = 0) -> ShardedTable:
    """A served table holding ``keys`` split by ``shard_of``; rows of mixed magnitudes and
    some -0.0 entries (a sum must not turn them into anything but embedding_bag's answer)."""
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((keys.size, dim)).astype(np.float32)
    rows *= rng.choice(np.array([1e-4, 1.0, 1e4], np.float32), (keys.size, 1))
    rows[rng.random(rows.shape) < 0.05] = -0.0
    sh = shard_of(keys, shards)
    bases = []
    for s in range(shards):
        t = EmbeddingTable(dim, dim, max_rows=keys.size + 4096, segments=8)
        t.assign(keys[sh == s], rows[sh == s])
        bases.append(t.packed() if packed else t)
    return ShardedTable("t", dim, bases)


def _want(t: ShardedTable, keys: np.ndarray, back: np.ndarray, bag: int) -> np.ndarray:
    """embedding_bag(sum) over the rows ``take`` finds: what the serving path computed."""
    buf, pos = t.take(keys)
    at = pos if back.size == 0 else pos[back]
    return torch.nn.functional.embedding_bag(
        torch.from_numpy(at).view(-1, bag), torch.from_numpy(buf), mode="sum"
    ).numpy()


def _same(a: np.ndarray | None, b: np.ndarray) -> bool:
    """Bit for bit (0.0 and -0.0 differ)."""
    return (
        a is not None
        and a.shape == b.shape
        and np.array_equal(a.view(np.uint32), b.view(np.uint32))
    )


def _queries(keys: np.ndarray, n: int, seed: int) -> np.ndarray:
    """``n`` IDs: present ones (repeated), 10 % unknown, the extremes."""
    rng = np.random.default_rng(seed)
    q = keys[rng.integers(0, keys.size, n)]
    unknown = rng.random(n) < 0.1
    q[unknown] = rng.integers(0, 2**64 - 1, int(unknown.sum()), dtype=np.uint64)
    q[: EXTREMES.size] = EXTREMES
    return q


@pytest.mark.parametrize("dim", [1, 3, 8, 16, 33])
@pytest.mark.parametrize("shards", [1, 2, 3, 4])
def test_pool_sum_equals_embedding_bag_over_take_bit_for_bit(dim: int, shards: int) -> None:
    keys = np.unique(np.random.default_rng(dim).integers(1, 2**64 - 1, 6000, dtype=np.uint64))
    t = _table(keys, dim, shards, packed=shards % 2 == 0, seed=shards)
    for bag in (1, 7, 50):
        q = _queries(keys, bag * 40, seed=bag)
        assert _same(t.pool_sum(q, NO_BACK, bag), _want(t, q, NO_BACK, bag))
    nothing = np.arange(3, 13, dtype=np.uint64)  # no row at all: every bag zero
    got = t.pool_sum(nothing, NO_BACK, 5)
    assert _same(got, np.zeros((2, dim), np.float32))


def test_pool_sum_reads_positions_through_back() -> None:
    keys = np.arange(1, 4001, dtype=np.uint64) * np.uint64(7919)
    t = _table(keys, 8, 2, packed=True)
    q = _queries(keys, 300, seed=5)
    back = np.random.default_rng(6).integers(0, q.size, 20 * 30).astype(np.int64)
    assert _same(t.pool_sum(q, back, 30), _want(t, q, back, 30))


def test_pool_sum_declines_what_it_cannot_do() -> None:
    keys = np.arange(1, 101, dtype=np.uint64)
    t = _table(keys, 4, 2, packed=False)
    assert t.pool_sum(keys, NO_BACK, 0) is None  # no bag length
    assert t.pool_sum(keys, NO_BACK, 7) is None  # 100 positions are no whole number of bags
    assert t.pool_sum(keys[:0], NO_BACK, 5) is None


def _delta(view: SparseView, upd: np.ndarray, new: np.ndarray, gone: np.ndarray) -> PendingMerge:
    """A delta (updated, added and deleted rows) taken live, not merged yet."""
    cur = view.tables["t"]
    nsh, dim = len(cur.bases), cur.dim
    k_all = np.concatenate([upd, new])
    parts = []
    for s in range(nsh):
        k = k_all[shard_of(k_all, nsh) == s]
        g = gone[shard_of(gone, nsh) == s]
        after = cur.rows(s) + k.size - cur.present(s, k) - cur.present(s, g)
        rows = np.full((k.size, dim), 2.5, np.float32)
        parts.append(DeltaTable("t", dim, after, k, rows, g))
    return prepare_delta(view, {"t": parts}, "v")


def test_a_delta_in_its_overlay_is_summed_by_the_kernels_bit_for_bit() -> None:
    keys = np.arange(1, 2001, dtype=np.uint64) * np.uint64(104729)
    view = SparseView({"t": _table(keys, 8, 2, packed=True)})
    new = np.arange(10**9, 10**9 + 300, dtype=np.uint64)
    pending = _delta(view, keys[:100], new, keys[1900:1950])
    q = np.concatenate([keys, new, np.array([5, 6], np.uint64)])
    q = q[np.random.default_rng(7).permutation(q.size)][: 40 * 50]
    t = pending.view.tables["t"]
    during = t.pool_sum(q, NO_BACK, 50)  # the overlays answer first, in the kernels
    assert _same(during, _want(t, q, NO_BACK, 50))  # take's path through the overlays
    for step in pending.steps():
        step()
    assert pending.finish() == []
    assert all(e is not None and len(e) for e in t.extras)  # new rows live in the extras
    got = t.pool_sum(q, NO_BACK, 50)
    assert _same(got, _want(t, q, NO_BACK, 50))
    assert np.count_nonzero(np.isin(q, new))  # some positions read rows of the extras
    assert during is not None and _same(got, during)  # merged or in the overlay: the same

    # a second delta over the first: rows of the extras updated and deleted, base rows
    # deleted, more rows added; read through back (shared positions) and signed IDs
    added = np.arange(2 * 10**9, 2 * 10**9 + 64, dtype=np.uint64) * np.uint64(64)
    gone = np.concatenate([new[250:270], keys[300:330]])
    second = _delta(pending.view, np.concatenate([new[:40], keys[200:260]]), added, gone)
    t2 = second.view.tables["t"]
    q2 = np.concatenate([q, added])
    back = np.random.default_rng(8).integers(0, q2.size, 60 * 40)
    want = _want(t2, q2, back, 40)
    assert _same(t2.pool_sum(q2.view(np.int64), back, 40), want)
    for step in second.steps():
        step()
    assert second.finish() == []
    assert _same(t2.pool_sum(q2, back, 40), want)
    deleted = t2.pool_sum(gone, NO_BACK, 1)
    assert deleted is not None and not deleted.any()  # deleted: the zero embedding


@pytest.mark.parametrize(
    "held",
    [
        np.arange(1, 5001, dtype=np.uint64),  # small consecutive IDs
        np.arange(1, 3001, dtype=np.uint64) << np.uint64(20),  # low bits all zero
        np.concatenate([EXTREMES, np.arange(7, 70000, 7, dtype=np.uint64)]),
        np.array([42], np.uint64),
    ],
)
def test_an_overlays_filter_never_hides_a_key_it_holds(held: np.ndarray) -> None:
    rows = np.zeros((held.size, 4), np.float32)
    rows[::3, 3] = 1.0  # every third row is a deletion
    rows[1::3, 0] = 7.0
    ov = sparse_model.Overlay(held[::-1].copy(), rows[::-1].copy())  # sorted by the overlay
    rng = np.random.default_rng(3)
    absent = np.setdiff1d(rng.integers(0, 2**64 - 1, 20000, dtype=np.uint64), held)
    ask = np.concatenate([held, absent, held[:10] + np.uint64(1)])
    ask = ask[rng.permutation(ask.size)]
    idx = ov.lookup(ask)
    mine = np.isin(ask, held)
    assert (idx[mine] >= 0).all() and (idx[~mine] == -1).all()
    assert np.array_equal(ov.keys[idx[mine]], ask[mine])
    refs = np.full(ask.size, -5, np.int64)  # untouched where the overlay holds nothing
    ov.point(ask, refs)
    assert (refs[~mine] == -5).all()
    deleted = mine.copy()
    deleted[mine] = ov.rows(idx[mine])[:, 3] != 0.0
    assert (refs[deleted] == 0).all()
    live = mine & ~deleted
    rows_at = ov._rows.ctypes.data + idx[live] * ov._rows.strides[0]  # into the overlay itself
    assert np.array_equal(refs[live], rows_at)
    if absent.size > 1000:  # the filter lets few absent keys through to the search
        word, need = ov._hash(absent)
        assert np.count_nonzero(ov.words[word] & need == need) < 0.05 * absent.size


def test_serving_embedding_sums_without_take(monkeypatch: pytest.MonkeyPatch) -> None:
    keys = np.arange(1, 3001, dtype=np.uint64) * np.uint64(104729)
    t = _table(keys, 8, 2, packed=True)
    ids = _queries(keys, 60 * 25, seed=8).reshape(60, 25)
    ids[:, :10] = ids[0, :10]  # shared by every item: looked up once, positions through back
    x = torch.from_numpy(ids.view(np.int64))
    with torch.inference_mode():
        want = ServingEmbedding(t, "mean")(x) * 25  # take's path (mode mean), for the shape
        exact = _want(t, ids.reshape(-1), NO_BACK, 25)

        def no_take(*a: object, **k: object) -> None:
            raise AssertionError("the sum went through take")

        monkeypatch.setattr(ShardedTable, "take", no_take)
        got = ServingEmbedding(t, "sum")(x)
        flat = ServingEmbedding(t, "sum")(x[:, :12].contiguous())  # nothing shared found
    assert got.shape == want.shape
    assert _same(got.numpy(), exact)
    assert flat.shape == (60, 8)


def test_without_kernels_the_serving_embedding_keeps_takes_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = np.arange(1, 3001, dtype=np.uint64) * np.uint64(104729)
    t = _table(keys, 8, 3, packed=False)
    ids = _queries(keys, 40 * 25, seed=9).reshape(40, 25)
    x = torch.from_numpy(ids.view(np.int64))
    with torch.inference_mode():
        fast = ServingEmbedding(t, "sum")(x)
        monkeypatch.setattr(sparse_model._serve_lookup, "probe_rows", None)
        assert t.pool_sum(ids.reshape(-1), NO_BACK, 25) is None
        slow = ServingEmbedding(t, "sum")(x)
    assert _same(fast.numpy(), slow.numpy())


def test_pool_sum_reads_signed_ids_bit_for_bit() -> None:
    keys = np.array([1, 2**63, 2**64 - 1, 2**64 - 2, 77], np.uint64)
    t = _table(keys, 4, 2, packed=False)
    want = t.pool_sum(keys, NO_BACK, 5)
    assert want is not None and want.any()
    assert _same(t.pool_sum(keys.view(np.int64), NO_BACK, 5), want)  # as torch hands them out

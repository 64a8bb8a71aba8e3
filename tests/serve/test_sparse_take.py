"""The serving look-up path (``ShardedTable.take``): rows found per shard, copied once into a
buffer, addressed by position. Every case is checked key by key against a plain dict of what the
served version holds (base rows, rows added by deltas, a delta still in its overlay, deletions,
unknown and repeated IDs), and the serving embedding's scores against ``embedding_bag`` over the
rows in request order, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from coadapt.serve.sparse_model import (  # noqa: E402
    ServingEmbedding,
    ShardedTable,
    SparseView,
    _item_blocks,
    prepare_delta,
)
from coadapt.sparse.export import DeltaTable  # noqa: E402
from coadapt.sparse.server import shard_of  # noqa: E402
from coadapt.sparse.table import EmbeddingTable  # noqa: E402

DIM = 3


def _sharded(keys: np.ndarray, shards: int) -> tuple[ShardedTable, dict[int, np.ndarray]]:
    """A served table holding ``keys`` split as the trainer splits them, and the truth."""
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((keys.size, DIM)).astype(np.float32)
    sh = shard_of(keys, shards)
    bases = []
    for s in range(shards):
        t = EmbeddingTable(DIM, DIM, max_rows=1 << 16)
        t.assign(keys[sh == s], rows[sh == s])
        bases.append(t)
    return ShardedTable("t", DIM, bases), {int(k): r for k, r in zip(keys, rows, strict=True)}


def _expected(truth: dict[int, np.ndarray], keys: np.ndarray) -> np.ndarray:
    zero = np.zeros(DIM, np.float32)
    return np.array([truth.get(int(k), zero) for k in keys], np.float32).reshape(-1, DIM)


def _check(t: ShardedTable, truth: dict[int, np.ndarray], keys: np.ndarray) -> None:
    buf, pos = t.take(keys)
    assert buf.shape == (keys.size + 1, DIM) and pos.shape == (keys.size,)
    assert not buf[-1].any()  # the zero row keys without a row point at
    want = _expected(truth, keys)
    assert np.array_equal(buf[pos], want)
    assert np.array_equal(t.gather(keys), want)
    for s in range(len(t.bases)):  # a table-shard process's look-up: one shard's keys
        mine = keys[shard_of(keys, len(t.bases)) == s]
        assert np.array_equal(t.shard_rows(s, mine), _expected(truth, mine))


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_take_finds_every_row_and_zero_for_unknown_and_repeated_ids(shards: int) -> None:
    keys = np.arange(1, 2001, dtype=np.uint64) * np.uint64(7919)
    t, truth = _sharded(keys, shards)
    rng = np.random.default_rng(1)
    ask = np.concatenate(
        [keys[rng.integers(0, keys.size, 500)], np.array([0, 2**64 - 1, 5], np.uint64)]
    )
    _check(t, truth, ask)
    _check(t, truth, keys[:1])
    _check(t, truth, np.array([3, 4], np.uint64))  # nothing found: every position the zero row
    _check(t, truth, np.zeros(0, np.uint64))


def test_take_reads_the_overlay_then_the_base_then_the_extras() -> None:
    keys = np.arange(1, 1001, dtype=np.uint64)
    t, truth = _sharded(keys, 2)
    view = SparseView({"t": t})

    def delta(upd: np.ndarray, new: np.ndarray, gone: np.ndarray, value: float) -> None:
        nonlocal view
        cur = view.tables["t"]
        parts = []
        sh_u = shard_of(np.concatenate([upd, new]), 2)
        sh_g = shard_of(gone, 2)
        for s in range(2):
            k = np.concatenate([upd, new])[sh_u == s]
            g = gone[sh_g == s]
            after = cur.rows(s) + k.size - cur.present(s, k) - cur.present(s, g)
            rows = np.full((k.size, DIM), value, np.float32)
            parts.append(DeltaTable("t", DIM, after, k, rows, g))
        pending = prepare_delta(view, {"t": parts}, "v")
        for k in np.concatenate([upd, new]):
            truth[int(k)] = np.full(DIM, value, np.float32)
        for k in gone:
            truth.pop(int(k), None)
        ask = np.concatenate([keys, upd, new, gone, np.array([10**12], np.uint64)])
        _check(pending.view.tables["t"], truth, ask)  # through the overlay
        for step in pending.steps():
            step()
        assert pending.finish() == []
        _check(pending.view.tables["t"], truth, ask)  # merged: base rows and extras
        view = pending.view

    delta(keys[:50], np.arange(5000, 5100, dtype=np.uint64), keys[900:920], 2.0)
    # a second delta: rows in the extras updated, some deleted, others added
    delta(
        np.arange(5000, 5010, dtype=np.uint64),
        np.arange(6000, 6005, dtype=np.uint64),
        np.arange(5050, 5060, dtype=np.uint64),
        3.0,
    )


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_serving_embedding_scores_equal_embedding_bag_over_rows_in_request_order(
    mode: str,
) -> None:
    keys = np.arange(1, 3001, dtype=np.uint64) * np.uint64(104729)
    t, truth = _sharded(keys, 2)
    rng = np.random.default_rng(2)
    ids = keys[rng.integers(0, keys.size, (40, 25))]
    ids[rng.random(ids.shape) < 0.1] = 17  # unknown: the zero embedding
    emb = ServingEmbedding(t, mode)
    x = torch.from_numpy(ids.view(np.int64))
    rows = torch.from_numpy(_expected(truth, ids.reshape(-1)))
    want = torch.nn.functional.embedding_bag(
        torch.arange(ids.size).view(ids.shape), rows, mode=mode
    )
    with torch.inference_mode():
        assert torch.equal(emb(x), want)
        flat = x.reshape(-1)
        assert torch.equal(emb(flat), rows)
        offsets = torch.arange(0, ids.size, 25)
        assert torch.equal(emb(flat, offsets), want)


def _ranking_ids(keys: np.ndarray, items: int, shared: int, seed: int) -> np.ndarray:
    """``items`` x 60 IDs, the first ``shared`` of each item the same in every item (the user's
    features), seen as a CtrRanker embedding sees them: (items * 3 groups, 20)."""
    rng = np.random.default_rng(seed)
    ids = keys[rng.integers(0, keys.size, (items, 60))]
    ids[rng.random(ids.shape) < 0.05] = 17  # unknown IDs too
    ids[:, :shared] = ids[0, :shared]
    return ids.reshape(items * 3, 20)


@pytest.mark.parametrize("shared", [0, 1, 6, 30, 60])
def test_ids_repeated_by_every_item_are_looked_up_once_and_score_the_same(shared: int) -> None:
    keys = np.arange(1, 3001, dtype=np.uint64) * np.uint64(104729)
    t, truth = _sharded(keys, 2)
    ids = _ranking_ids(keys, 50, shared, seed=shared)
    found = _item_blocks(ids)
    if shared >= 6:  # at least MIN_SHARED of an item's 60 IDs
        assert found is not None
        k, back = found
        assert k.size <= ids.size - (50 - 1) * shared
        assert np.array_equal(k[back], ids.reshape(-1))
    elif shared == 0:
        assert found is None
    rows = torch.from_numpy(_expected(truth, ids.reshape(-1)))
    want = torch.nn.functional.embedding_bag(torch.arange(ids.size).view(ids.shape), rows)
    with torch.inference_mode():
        assert torch.equal(ServingEmbedding(t, "mean")(torch.from_numpy(ids.view(np.int64))), want)


def test_two_batched_requests_with_different_users_still_score_exactly() -> None:
    keys = np.arange(1, 3001, dtype=np.uint64) * np.uint64(104729)
    t, truth = _sharded(keys, 2)
    ids = np.concatenate([_ranking_ids(keys, 20, 30, 1), _ranking_ids(keys, 20, 30, 2)])
    found = _item_blocks(ids)
    if found is not None:
        assert np.array_equal(found[0][found[1]], ids.reshape(-1))
    rows = torch.from_numpy(_expected(truth, ids.reshape(-1)))
    want = torch.nn.functional.embedding_bag(torch.arange(ids.size).view(ids.shape), rows)
    with torch.inference_mode():
        assert torch.equal(ServingEmbedding(t, "mean")(torch.from_numpy(ids.view(np.int64))), want)


class _DictRows:
    """A row source that is not a local table (as the table-shard client is): rows in order."""

    def __init__(self, truth: dict[int, np.ndarray]) -> None:
        self.truth = truth
        self.dim = DIM
        self.asked = 0

    def gather(self, keys: np.ndarray) -> np.ndarray:
        self.asked += keys.size
        return _expected(self.truth, keys)


def test_a_remote_row_source_gets_each_shared_id_once_and_scores_the_same() -> None:
    keys = np.arange(1, 3001, dtype=np.uint64) * np.uint64(104729)
    _, truth = _sharded(keys, 1)
    src = _DictRows(truth)
    ids = _ranking_ids(keys, 50, 30, seed=3)
    rows = torch.from_numpy(_expected(truth, ids.reshape(-1)))
    want = torch.nn.functional.embedding_bag(torch.arange(ids.size).view(ids.shape), rows)
    with torch.inference_mode():
        got = ServingEmbedding(src, "mean")(torch.from_numpy(ids.view(np.int64)))
    assert torch.equal(got, want)
    assert src.asked <= ids.size - 49 * 30  # the shared IDs crossed the wire once

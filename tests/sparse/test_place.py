"""The compiled cuckoo placement (``coadapt.sparse._place``) against a dict and the numpy path:
every row, counter and age survives the eviction walks and the segment growth they end in."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from coadapt.sparse import EmbeddingTable, _place
from coadapt.sparse import table as table_mod
from coadapt.sparse._hashing import mix64

pytestmark = pytest.mark.skipif(
    _place.place_items is None, reason="numba absent or COADAPT_NO_JIT set: no kernel to test"
)


def _fill_and_check(t: EmbeddingTable, rng: np.random.Generator) -> None:
    """Insert 6000 keys in uneven batches at two times, count clicks, expire the old ones."""
    model: dict[int, np.ndarray] = {}
    keys = mix64(np.arange(1, 6001, dtype=np.uint64))
    old = set(keys[:3000].tolist())
    a = 0
    for now, stop in ((0.0, 3000), (5.0, 6000)):
        while a < stop:
            b = min(stop, a + int(rng.integers(1, 700)))
            vals = rng.standard_normal((b - a, 3)).astype(np.float32)
            t.assign(keys[a:b], vals, now=now)
            t.count(keys[a:b], clicks=np.ones(b - a))
            model.update(zip(keys[a:b].tolist(), vals, strict=True))
            a = b
    assert len(t) == len(model) == 6000
    assert t.load_factor > 0.85  # full buckets: the inserts walked and grew segments
    ks = np.array(list(model), dtype=np.uint64)
    idx = t.lookup(ks)
    assert (idx >= 0).all() and np.unique(idx).size == idx.size
    np.testing.assert_array_equal(t.rows(idx), np.stack(list(model.values())))
    np.testing.assert_array_equal(t.counters(idx), np.ones((ks.size, 2), np.uint32))
    assert t.expire(9.0) == 3000  # ages travelled with their rows: only the first 3000 expire
    gone = t.lookup(ks) < 0
    assert {k for k, g in zip(ks.tolist(), gone.tolist(), strict=True) if g} == old


@pytest.mark.parametrize("compiled", [True, False])
def test_every_row_counter_and_age_survives_growth(
    monkeypatch: pytest.MonkeyPatch, compiled: bool
) -> None:
    if not compiled:  # the numpy rounds, as with COADAPT_NO_JIT=1
        monkeypatch.setattr(table_mod, "place_items", None)
    # two tiny segments: constant displacement and growth
    t = EmbeddingTable(3, ttl=8, counters=True, segments=2, max_rows=20000, seed=3)
    _fill_and_check(t, np.random.default_rng(0))


def _full_pair(width: int = 2) -> tuple[np.ndarray, ...]:
    """One segment of two buckets (16 slots), every slot taken by a distinct stored value."""
    keys = np.arange(1, 17, dtype=np.uint64) | np.uint64(1 << 63)
    rows = np.arange(16 * width, dtype=np.float32).reshape(16, width)
    return keys, rows


def _walk(max_kicks: int) -> tuple[Any, ...]:
    keys, rows = _full_pair()
    size = np.array([16], np.int64)
    new_key = np.array([99 | (1 << 63)], np.uint64)
    new_row = np.array([[-1.0, -2.0]], np.float32)
    none_age = np.empty(0, np.uint8)
    none_cnt = np.empty((0, 2), np.uint32)
    left = (np.empty(1, np.uint64), np.empty(1, np.int64), np.empty((1, 2), np.float32))
    assert _place.place_items is not None
    n = _place.place_items(
        new_key, np.zeros(1, np.int64), new_row, none_age, none_cnt,
        keys, rows, none_age, none_cnt, size,
        np.array([2], np.int64), 2, 31, np.uint64(7), max_kicks,
        *left, none_age, none_cnt,
    )  # fmt: skip
    return n, keys, rows, size, *left


@pytest.mark.parametrize("max_kicks", [0, 5])
def test_a_walk_that_does_not_end_hands_one_item_back(max_kicks: int) -> None:
    n, keys, rows, size, left_key, left_seg, left_row = _walk(max_kicks)
    assert n == 1 and size[0] == 16 and left_seg[0] == 0  # nothing added, nothing lost
    before_keys, before_rows = _full_pair()
    everything = {**dict(zip(before_keys.tolist(), before_rows.tolist(), strict=True))}
    everything[99 | (1 << 63)] = [-1.0, -2.0]
    now = dict(zip(keys.tolist(), rows.tolist(), strict=True))
    now[int(left_key[0])] = left_row[0].tolist()
    assert now == everything  # every key kept its own row through the evictions
    if max_kicks == 0:
        assert int(left_key[0]) == 99 | (1 << 63)  # no walk: the new item itself comes back
        np.testing.assert_array_equal(keys, before_keys)

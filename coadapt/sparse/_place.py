"""Compiled cuckoo placement of new rows into the embedding table (``EmbeddingTable._place``).

Why: a table that grows re-places whole segments. With 64 segments growing 6.25 % at a time (the
price of holding <= 1.2x the raw bytes), inserting a batch of new IDs regrows most segments, so
every new row costs 8-16 re-placements of rows already there; the numpy path places by rounds of
~15 batch-wide passes (bucket fill counts, ranks within buckets, cumulative sums, scattered
writes), about 0.5 us a placement. Filling 50M rows through a parameter server then took
minutes, and 1M new rows cost 1.4 s at 2M rows but 8.7 s at 16M (docs/serve.md). One loop per
item does the same placement in registers and touches only the item's two buckets and the one
row it writes.

The placement rule is the numpy path's, item by item instead of round by round: an item goes to
the first free slot of whichever of its two buckets has more free slots (the first on a tie);
when both are full it takes a random one of their 16 slots and the item it evicts is placed
next, by the same rule (a cuckoo walk), at most ``max_kicks`` times. An item whose walk does
not end is handed back (``left_*``) for ``EmbeddingTable`` to grow its segment, as the numpy
path does after ``_EVICT_ROUNDS`` rounds. Every item of a walk lives in one segment (both
buckets of a stored value are in its segment), so a walk that ends adds one item to that
segment's count and one that is handed back adds none. The slots chosen can differ from the
numpy path's (rounds place a batch's items in another order); what is found, and its row, does
not: ``tests/sparse/test_place.py`` checks both paths against a dictionary.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from coadapt._jit import kernel
from coadapt.sparse._probe import _buckets, _helper, _splitmix

__all__ = ["MAX_KICKS", "place_items"]

_BUCKET = 8
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_WAYS = np.uint64(2 * _BUCKET)
#: Evictions one item's walk may make before it is handed back for its segment to grow: at the
#: table's MAX_LOAD (96 % of 8-slot buckets, two choices) walks are short; a long one means the
#: segment is too full for this item.
MAX_KICKS = 500


@_helper
def _free_slots(keys: Any, g: Any) -> tuple[Any, Any]:  # pragma: no cover - compiled
    """How many slots of the bucket starting at ``g`` are empty, and the first of them (-1)."""
    free, first = 0, -1
    for j in range(_BUCKET):
        if keys[g + j] == 0:
            if first < 0:
                first = g + j
            free += 1
    return free, first


@kernel()
def place_items(  # pragma: no cover - compiled; tests/sparse/test_place.py exercises it
    stored: Any, seg: Any, prow: Any, page: Any, pcnt: Any,
    keys: Any, rows: Any, age: Any, cnt: Any, size: Any,
    nb: Any, seg_buckets: int, b2_bits: int, seed: Any, max_kicks: int,
    left_stored: Any, left_seg: Any, left_row: Any, left_age: Any, left_cnt: Any,
) -> int:  # fmt: skip
    """Place items ``(stored[i], seg[i])`` with payload ``prow[i]`` (and ``page[i]``,
    ``pcnt[i]`` when ``age``/``cnt`` are non-empty) into ``keys``/``rows``/``age``/``cnt``,
    counting each placed item in ``size[seg]``. Items that found no slot within ``max_kicks``
    evictions (the new one or an evicted one) go to ``left_*``; returns how many."""
    width = rows.shape[1]
    has_age = age.size > 0
    has_cnt = cnt.size > 0
    carry = np.empty(width, np.float32)
    state = seed
    n_left = 0
    for i in range(stored.size):
        k = stored[i]
        s = seg[i]
        for c in range(width):
            carry[c] = prow[i, c]
        a = page[i] if has_age else 0
        c0 = pcnt[i, 0] if has_cnt else 0
        c1 = pcnt[i, 1] if has_cnt else 0
        kicks = 0
        while True:
            g1, g2 = _buckets(k, s, nb, seg_buckets, b2_bits)
            free1, first1 = _free_slots(keys, g1)
            free2, first2 = _free_slots(keys, g2)
            if free1 + free2 > 0:
                slot = first2 if free2 > free1 else first1
                keys[slot] = k
                for c in range(width):
                    rows[slot, c] = carry[c]
                if has_age:
                    age[slot] = a
                if has_cnt:
                    cnt[slot, 0] = c0
                    cnt[slot, 1] = c1
                size[s] += 1
                break
            if kicks >= max_kicks:
                left_stored[n_left] = k
                left_seg[n_left] = s
                for c in range(width):
                    left_row[n_left, c] = carry[c]
                if has_age:
                    left_age[n_left] = a
                if has_cnt:
                    left_cnt[n_left, 0] = c0
                    left_cnt[n_left, 1] = c1
                n_left += 1
                break
            state += _GOLDEN
            r = np.int64(_splitmix(state) % _WAYS)
            slot = (g1 if r < _BUCKET else g2) + r % _BUCKET
            # swap the carried item with the slot's: it takes the slot, the evicted one walks
            k, keys[slot] = keys[slot], k
            for c in range(width):
                v = rows[slot, c]
                rows[slot, c] = carry[c]
                carry[c] = v
            if has_age:
                a, age[slot] = age[slot], a
            if has_cnt:
                c0, cnt[slot, 0] = cnt[slot, 0], c0
                c1, cnt[slot, 1] = cnt[slot, 1], c1
            kicks += 1
    return n_left

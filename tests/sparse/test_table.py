"""EmbeddingTable: exact keys under insert/lookup/delete/expire/grow, admission, counters, files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from coadapt.sparse import EmbeddingTable, TableFullError
from coadapt.sparse import table as table_mod
from coadapt.sparse._hashing import mix64, unmix64

EXTREMES = [0, 1, 2**63, 2**64 - 1, 2**64 - 2]
key_st = st.one_of(st.sampled_from(EXTREMES), st.integers(0, 40), st.integers(0, 2**64 - 1))


class TableMachine(RuleBasedStateMachine):
    """The table must behave exactly like a dict {key: (row, last_touch)} under any sequence."""

    @initialize()
    def setup(self) -> None:
        # tiny segments so that cuckoo displacement and segment growth happen constantly
        self.t = EmbeddingTable(2, 3, ttl=8, segments=2, max_rows=5000, seed=1)
        self.model: dict[int, tuple[np.ndarray, int]] = {}
        self.now = 0
        self.counter = 0.0
        self.next_key = 0

    def _values(self, n: int) -> np.ndarray:
        vals = self.counter + np.arange(n * 3, dtype=np.float32).reshape(n, 3)
        self.counter += n * 3
        return vals

    @rule(keys=st.lists(key_st, min_size=1, max_size=40))
    def insert(self, keys: list[int]) -> None:
        arr = np.array(keys, dtype=np.uint64)
        idx, new = self.t.lookup_or_insert(arr, now=self.now)
        assert (idx >= 0).all()
        for k, isnew in zip(keys, new.tolist(), strict=True):
            assert isnew == (k not in self.model)
        uk = np.unique(arr)
        uidx = self.t.lookup(uk)
        vals = self._values(uk.size)
        self.t.write_rows(uidx, vals)
        for k, v in zip(uk.tolist(), vals, strict=True):
            self.model[k] = (v, self.now)

    @rule(n=st.integers(50, 400))
    def grow(self, n: int) -> None:
        keys = mix64(np.arange(self.next_key, self.next_key + n, dtype=np.uint64))
        self.next_key += n
        vals = self._values(n)
        self.t.assign(keys, vals, now=self.now)
        for k, v in zip(keys.tolist(), vals, strict=True):
            self.model[k] = (v, self.now)

    @rule(keys=st.lists(key_st, max_size=20))
    def delete(self, keys: list[int]) -> None:
        gone = self.t.delete(np.array(keys, dtype=np.uint64))
        assert gone == len({k for k in keys if k in self.model})
        for k in keys:
            self.model.pop(k, None)

    @rule(keys=st.lists(key_st, max_size=20))
    def lookup_touch(self, keys: list[int]) -> None:
        idx = self.t.lookup(np.array(keys, dtype=np.uint64), now=self.now)
        for k, i in zip(keys, idx.tolist(), strict=True):
            assert (i >= 0) == (k in self.model)
            if k in self.model:
                self.model[k] = (self.model[k][0], self.now)

    @rule(dt=st.integers(0, 6))
    def tick_and_expire(self, dt: int) -> None:
        self.now += dt
        dropped = self.t.expire(self.now)
        dead = [k for k, (_, t) in self.model.items() if self.now - t >= 8]
        assert dropped == len(dead)
        for k in dead:
            del self.model[k]

    @invariant()
    def matches_model(self) -> None:
        assert len(self.t) == len(self.model)
        if not self.model:
            return
        keys = np.array(list(self.model), dtype=np.uint64)
        idx = self.t.lookup(keys)
        assert (idx >= 0).all()
        assert np.unique(idx).size == idx.size
        expect = np.stack([self.model[k][0] for k in self.model])
        np.testing.assert_array_equal(self.t.rows(idx), expect)
        listed = np.concatenate([k for k, _ in self.t.iter_chunks(chunk_rows=7)])
        assert sorted(listed.tolist()) == sorted(self.model)


TableMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=30, deadline=None)
TestTableMachine = TableMachine.TestCase


class NumpyPlacementMachine(TableMachine):
    """The same model check with rows placed by the numpy rounds (a bare install, or
    COADAPT_NO_JIT=1) instead of the compiled kernel (``coadapt.sparse._place``)."""

    @initialize()
    def setup(self) -> None:
        self._saved_place = table_mod.place_items
        table_mod.place_items = None
        super().setup()

    def teardown(self) -> None:
        table_mod.place_items = self._saved_place


NumpyPlacementMachine.TestCase.settings = TableMachine.TestCase.settings
TestNumpyPlacementMachine = NumpyPlacementMachine.TestCase


def test_mix_is_a_bijection_with_exact_inverse() -> None:
    x = np.array([0, 1, 2**64 - 1, 12345, 2**63], dtype=np.uint64)
    x = np.concatenate([x, np.random.default_rng(0).integers(0, 2**64 - 1, 1000, dtype=np.uint64)])
    np.testing.assert_array_equal(unmix64(mix64(x)), x)


def test_signed_ids_are_the_same_feature_as_their_bit_pattern() -> None:
    t = EmbeddingTable(4)
    idx, _ = t.lookup_or_insert(np.array([-1, 5], dtype=np.int64))
    np.testing.assert_array_equal(t.lookup(np.array([2**64 - 1, 5], dtype=np.uint64)), idx)


def test_bad_input_is_rejected_with_a_clear_message() -> None:
    t = EmbeddingTable(2)
    with pytest.raises(TypeError, match="integer feature IDs"):
        t.lookup(np.array([1.5, 2.0]))
    with pytest.raises(ValueError, match="1-D"):
        t.lookup(np.zeros((2, 2), dtype=np.uint64))
    with pytest.raises(ValueError, match="width"):
        EmbeddingTable(4, 2)
    with pytest.raises(ValueError, match="shape"):
        t.write_rows(np.array([0]), np.zeros((1, 3), np.float32))
    with pytest.raises(IndexError, match="not a live row"):
        t.write_rows(np.array([-1]), np.zeros((1, 2), np.float32))
    with pytest.raises(RuntimeError, match="ttl"):
        t.expire(3)


def test_admission_after_k_sightings_and_default_for_unadmitted() -> None:
    t = EmbeddingTable(4, admit_after=3)
    keys = np.array([10, 20], dtype=np.uint64)
    for _ in range(2):
        idx, new = t.lookup_or_insert(keys)
        assert (idx == -1).all() and not new.any()
    assert len(t) == 0
    # duplicates in one batch count as separate sightings
    idx, new = t.lookup_or_insert(np.array([10, 30, 30, 30], dtype=np.uint64))
    assert (idx >= 0).all() and new.all()
    assert t.lookup(np.array([20], dtype=np.uint64))[0] == -1
    assert t.sketch is not None and t.nbytes() > t.sketch.nbytes() > 0


def test_init_callback_fills_new_rows_only() -> None:
    t = EmbeddingTable(2, 3)
    t.lookup_or_insert(np.array([1], dtype=np.uint64), init=lambda r: r.fill(7.0))
    idx, new = t.lookup_or_insert(np.array([1, 2, 2], dtype=np.uint64), init=lambda r: r.fill(3.0))
    assert new.tolist() == [False, True, True]
    assert t.rows(idx).tolist() == [[7.0] * 3, [3.0] * 3, [3.0] * 3]
    assert t.weights(idx).shape == (3, 2) and t.state(idx).shape == (3, 1)


@pytest.mark.parametrize("admit_after", [1, 2])
def test_a_batch_larger_than_a_slice_inserts_each_key_once_and_flags_every_copy(
    admit_after: int,
) -> None:
    """Inserts run in slices of 8 192 positions: a key repeated in several slices becomes one
    row, every position of a new key is flagged new, and init sees each new row once."""
    rng = np.random.default_rng(5)
    old = rng.integers(0, 2**64 - 1, 3000, dtype=np.uint64)
    t = EmbeddingTable(2, 3, admit_after=admit_after)
    for _ in range(admit_after):
        t.lookup_or_insert(old, init=lambda r: r.fill(1.0))
    fresh = rng.integers(0, 2**64 - 1, 9000, dtype=np.uint64)
    batch = np.concatenate([fresh, old, fresh, fresh[:500]])  # fresh keys in 3 of 3 slices
    rng.shuffle(batch)
    seen: list[int] = []

    def init(r: np.ndarray) -> None:
        seen.append(r.shape[0])
        r.fill(2.0)

    idx, new = t.lookup_or_insert(batch, init=init)
    is_fresh = np.isin(batch, fresh)
    if admit_after == 1:
        assert len(t) == 12000 and sum(seen) == 9000
        assert (idx >= 0).all() and np.array_equal(new, is_fresh)
        assert (t.rows(idx)[:, 0] == np.where(is_fresh, 2.0, 1.0)).all()
    else:  # fresh keys seen 2-3 times in this batch: admitted at their 2nd sighting
        assert len(t) == 12000 and sum(seen) == 9000
        assert np.array_equal(new, is_fresh & (idx >= 0))
    assert np.array_equal(t.lookup(batch), idx)
    assert t.lookup(fresh).min() >= 0


def test_expiry_with_quantised_float_clock_is_never_early_and_at_most_two_quanta_late() -> None:
    t = EmbeddingTable(1, ttl=3600.0)  # 3600 > 64 steps: quantum = 3600 / 64 s
    q = 3600.0 / 64
    rng = np.random.default_rng(0)
    born = rng.uniform(0, 10_000, 2000)
    keys = np.arange(2000, dtype=np.uint64)
    for k, b in zip(keys, born, strict=True):
        t.lookup_or_insert(np.array([k]), now=float(b))
    now = 12_000.0
    t.expire(now)
    alive = t.contains(keys)
    age = now - born
    assert alive[age < 3600].all()
    assert not alive[age >= 3600 + 2 * q].any()


def test_expired_slots_are_reused() -> None:
    t = EmbeddingTable(1, ttl=5, segments=2)
    t.lookup_or_insert(np.arange(5000, dtype=np.uint64), now=0)
    before = t.nbytes()
    assert t.expire(5) == 5000 and len(t) == 0
    t.lookup_or_insert(np.arange(5000, 10000, dtype=np.uint64), now=6)
    assert len(t) == 5000 and t.nbytes() == before


def test_counters_count_exposures_and_clicks_of_present_rows() -> None:
    t = EmbeddingTable(1, counters=True)
    idx, _ = t.lookup_or_insert(np.array([1, 2], dtype=np.uint64))
    t.count(np.array([1, 1, 2, 99], dtype=np.uint64), clicks=np.array([1, 0, 1, 1]))
    t.count(np.array([2], dtype=np.uint64))
    assert t.counters(idx).tolist() == [[2, 1], [2, 1]]
    assert t.raw_bytes_per_row() == 8 + 4 + 8
    with pytest.raises(RuntimeError, match="counters=True"):
        EmbeddingTable(1).count(np.array([1], dtype=np.uint64))


def test_save_load_round_trip_keeps_rows_ages_counters_and_sketch(tmp_path: Path) -> None:
    t = EmbeddingTable(3, 5, ttl=10, counters=True, admit_after=2, segments=4)
    keys = np.random.default_rng(1).integers(0, 2**64 - 1, 3000, dtype=np.uint64)
    keys = np.unique(np.concatenate([keys, np.array([0, 2**64 - 1], dtype=np.uint64)]))
    t.lookup_or_insert(keys, now=1)
    idx, _ = t.lookup_or_insert(keys, now=4, init=lambda r: r.fill(0.5))
    t.write_rows(idx, np.random.default_rng(2).random((keys.size, 5), dtype=np.float32))
    t.count(keys[:100], clicks=np.ones(100, np.int64))
    t.lookup_or_insert(np.array([777], dtype=np.uint64))  # one sighting in the sketch only
    path = tmp_path / "shard0.tbl"
    t.save(path, chunk_rows=256)
    assert [p.name for p in tmp_path.iterdir()] == ["shard0.tbl"]  # no temp file left behind
    u = EmbeddingTable.load(path)
    assert len(u) == len(t)
    np.testing.assert_array_equal(u.rows(u.lookup(keys)), t.rows(t.lookup(keys)))
    np.testing.assert_array_equal(u.counters(u.lookup(keys)), t.counters(t.lookup(keys)))
    assert u.expire(13) == 0 and u.expire(14) == len(keys)  # ages survived the round trip
    assert u.lookup_or_insert(np.array([777], dtype=np.uint64))[0][0] >= 0  # second sighting
    got = {
        k: r.tolist() for ks, rs in t.iter_chunks() for k, r in zip(ks.tolist(), rs, strict=True)
    }
    assert set(got) == set(keys.tolist())


def test_load_rejects_a_truncated_file(tmp_path: Path) -> None:
    t = EmbeddingTable(2)
    t.lookup_or_insert(np.arange(100, dtype=np.uint64))
    path = tmp_path / "t.tbl"
    t.save(path)
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(ValueError, match=r"truncated|corrupt"):
        EmbeddingTable.load(path)
    path.write_bytes(b"nope")
    with pytest.raises(ValueError, match="not an embedding-table file"):
        EmbeddingTable.load(path)


def test_memory_stays_within_budget_while_growing() -> None:
    t = EmbeddingTable(16, 17, ttl=100, segments=8)
    rng = np.random.default_rng(0)
    ratios = []
    for _ in range(25):
        t.lookup_or_insert(rng.integers(0, 2**64 - 1, 8000, dtype=np.uint64), now=0)
        ratios.append(t.memory_report()["ratio"])
    assert len(t) == 200_000
    assert max(ratios[5:]) <= 1.2, ratios


def test_table_full_error_names_the_fix() -> None:
    t = EmbeddingTable(1, max_rows=100, segments=2)
    with pytest.raises(TableFullError, match="larger max_rows"):
        t.lookup_or_insert(np.arange(20_000, dtype=np.uint64))


def _advised_ranges(lo: int, hi: int) -> list[tuple[int, int]]:
    """Address ranges in ``[lo, hi)`` that this process has advised ``MADV_HUGEPAGE`` (the
    ``hg`` flag of ``/proc/self/smaps``): what the kernel was asked, whatever it allocated."""
    out: list[tuple[int, int]] = []
    start = end = 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(" ", 1)[0]
        if "-" in head and ":" not in head:
            a, b = head.split("-")
            start, end = int(a, 16), int(b, 16)
        elif line.startswith("VmFlags:") and "hg" in line.split()[1:] and start < hi and end > lo:
            out.append((max(start, lo), min(end, hi)))
    return out


@pytest.fixture(scope="module")
def huge_page_tables() -> dict[str, EmbeddingTable]:
    """The same inserts into a table per huge-page mode: 2 segments of ~6 MB of rows once
    grown, so the committed ranges hold whole huge pages; each growth advises again."""
    out = {}
    for mode in ("off", "inside", "whole"):
        t = EmbeddingTable(8, 32, segments=2, max_rows=200_000, huge_pages=mode, seed=3)
        rng = np.random.default_rng(5)
        for _ in range(5):
            keys = rng.integers(0, 2**64 - 1, 20_000, dtype=np.uint64)
            idx, _ = t.lookup_or_insert(keys)
            t.write_rows(idx, rng.standard_normal((keys.size, 32)).astype(np.float32))
        out[mode] = t
    return out


def test_huge_page_tables_give_identical_answers(
    huge_page_tables: dict[str, EmbeddingTable],
) -> None:
    tables = huge_page_tables
    q = np.concatenate(
        [
            np.concatenate([k for k, _ in tables["off"].iter_chunks()])[::7],
            np.random.default_rng(9).integers(0, 2**64 - 1, 500, dtype=np.uint64),  # unknown
        ]
    )
    ref = tables["off"]
    ref_idx = ref.lookup(q)
    assert (ref_idx >= 0).sum() > 10_000
    buf0 = np.empty((q.size, 8), np.float32)
    pos0 = np.empty(q.size, np.int64)
    end0, miss0 = ref.take_found(q, buf0, pos0)
    packed = ref.packed()  # segments end to end, "whole" huge pages
    assert packed._seg_buckets < ref._seg_buckets and packed.huge_pages == "whole"
    for mode, t in [("inside", tables["inside"]), ("whole", tables["whole"]), ("whole", packed)]:
        assert t.huge_pages == mode
        idx = t.lookup(q)
        hit = idx >= 0
        np.testing.assert_array_equal(hit, ref_idx >= 0)
        if t is not packed:  # same seed, same slots; packed: same slot within its segment
            np.testing.assert_array_equal(idx, ref_idx)
        np.testing.assert_array_equal(t.rows(idx[idx >= 0]), ref.rows(ref_idx[ref_idx >= 0]))
        buf = np.empty_like(buf0)
        pos = np.empty_like(pos0)
        end, miss = t.take_found(q, buf, pos)
        assert end == end0
        np.testing.assert_array_equal(miss, miss0)
        np.testing.assert_array_equal(buf[:end], buf0[:end0])
        if mode == "inside":  # no byte more held
            assert t.memory_report() == ref.memory_report()
        else:  # counted in whole huge pages
            assert t.nbytes() > ref.nbytes()
    np.testing.assert_array_equal(
        np.concatenate([k for k, _ in packed.iter_chunks()]),
        np.concatenate([k for k, _ in ref.iter_chunks()]),
    )
    # packed and in huge pages throughout: the slack is the gaps between segments only
    assert 1.0 < packed.nbytes() / ref.nbytes() < 1.35


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc/self/smaps")
def _union(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping or touching [lo, hi) ranges merged."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def test_huge_pages_are_advised_only_inside_committed_ranges(
    huge_page_tables: dict[str, EmbeddingTable],
) -> None:
    """``inside`` advises whole huge pages within each segment's committed range (no slack);
    ``whole`` covers the committed range; ``off`` advises nothing."""
    import mmap

    if not hasattr(mmap, "MADV_HUGEPAGE"):
        pytest.skip("no MADV_HUGEPAGE on this platform")
    from coadapt.sparse.table import _HUGE, BUCKET

    for mode in ("off", "inside", "whole"):
        t = huge_page_tables[mode]
        for addr, item, m in zip(t._addrs, t._slot_arrays(), t._maps, strict=True):
            got = _advised_ranges(addr, addr + len(m))
            committed = [
                (addr + s * t._seg_slots * item,
                 addr + (s * t._seg_slots + int(t._touched[s]) * BUCKET) * item)
                for s in range(t.segments)
            ]  # fmt: skip
            rounded = [(lo // _HUGE * _HUGE, -(-hi // _HUGE) * _HUGE) for lo, hi in committed]
            if mode == "off":
                assert got == []
                continue
            if item == 4 * t.width:  # the row arena: ~6 MB a segment, huge pages inside
                assert got, mode
            for a, b in got:  # each advised range within one segment's (rounded) range
                if mode == "inside":
                    assert a % _HUGE == 0 and b % _HUGE == 0, (hex(a), hex(b))
                    assert any(lo <= a and b <= hi for lo, hi in _union(committed)), (
                        hex(a),
                        hex(b),
                    )
                else:  # rounded ranges of neighbouring segments may touch: the kernel
                    # then merges their advice into one mapping, so test against the union
                    assert any(lo <= a and b <= hi for lo, hi in _union(rounded)), (
                        hex(a),
                        hex(b),
                    )
            for lo, hi in committed:
                inner = (-(-lo // _HUGE) * _HUGE, hi // _HUGE * _HUGE)
                if inner[1] > inner[0] or mode == "whole":
                    want = inner if mode == "inside" else (lo, hi)
                    covered = sum(min(b, want[1]) - max(a, want[0]) for a, b in got
                                  if a < want[1] and b > want[0])  # fmt: skip
                    assert covered == want[1] - want[0], (mode, item, hex(lo), hex(hi))


def test_huge_pages_option_is_checked() -> None:
    for bad in (True, "on", None, 1):
        with pytest.raises(ValueError, match="huge_pages must be one of 'off', 'inside', 'whole'"):
            EmbeddingTable(4, huge_pages=bad)  # type: ignore[arg-type]


def test_commit_geometry_checks_the_bucket_counts() -> None:
    t = EmbeddingTable(4, segments=4, max_rows=10_000)
    with pytest.raises(ValueError, match="nb must be 4 bucket counts"):
        t.commit_geometry([1, 2, 3])
    with pytest.raises(ValueError, match="nb must be 4 bucket counts"):
        t.commit_geometry([1, 0, 1, 1])
    t.commit_geometry([5, 5, 5, 5])
    assert t._touched.tolist() == [5, 5, 5, 5]


def test_a_packed_table_refuses_to_outgrow_its_stride() -> None:
    t = EmbeddingTable(2, segments=2, max_rows=100_000)
    t.assign(np.arange(5000, dtype=np.uint64), np.ones((5000, 2), np.float32))
    p = t.packed(huge_pages="off")
    np.testing.assert_array_equal(p.rows(p.lookup(np.arange(5000))), np.ones((5000, 2)))
    p.write_rows(p.lookup([7]), np.full((1, 2), 3.0, np.float32))  # in place: fine
    assert p.rows(p.lookup([7])).tolist() == [[3.0, 3.0]]
    with pytest.raises(TableFullError, match="larger max_rows"):
        p.assign(np.arange(5000, 60_000, dtype=np.uint64), np.ones((55_000, 2), np.float32))
    with pytest.raises(ValueError, match="stride_buckets must be a positive multiple of 512"):
        EmbeddingTable(2, stride_buckets=100)

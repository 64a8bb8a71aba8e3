from __future__ import annotations

import gzip
import logging
import math
from pathlib import Path

import numpy as np
import pytest

from coadapt.sparse.formats import (
    CRITEO_CATEGORICAL,
    FormatError,
    ParseStats,
    hash64,
    missing_id,
    parse_criteo,
    read_criteo,
    read_libsvm,
)

_MASK = (1 << 64) - 1


def _fmix(h: int) -> int:
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & _MASK
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & _MASK
    return h ^ (h >> 33)


def _reference_hash(s: bytes, field: int) -> int:
    """The documented hash64 spec with plain Python integers."""
    seed = _fmix(((field + 1) * 0x9E3779B97F4A7C15) & _MASK)
    h = _fmix(seed ^ ((len(s) * 0x9E3779B97F4A7C15) & _MASK))
    padded = s + b"\0" * (-len(s) % 8)
    for k in range(max(1, len(padded) // 8)):
        h = _fmix(h ^ int.from_bytes(padded[8 * k : 8 * k + 8].ljust(8, b"\0"), "little"))
    return h


def _criteo_line(label: int, dense: list[int | None], cats: list[str | None]) -> str:
    fields = [str(label)]
    fields += ["" if d is None else str(d) for d in dense]
    fields += ["" if c is None else c for c in cats]
    return "\t".join(fields)


def _sample(i: int) -> tuple[int, list[int | None], list[str | None]]:
    rng = np.random.default_rng(i)
    dense: list[int | None] = [
        None if rng.random() < 0.2 else int(rng.integers(-3, 10**6)) for _ in range(13)
    ]
    cats: list[str | None] = [
        None if rng.random() < 0.1 else f"{int(rng.integers(0, 2**32)):08x}"
        for _ in range(CRITEO_CATEGORICAL)
    ]
    return int(rng.integers(0, 2)), dense, cats


def test_hash64_is_stable_salted_and_matches_its_spec() -> None:
    values: list[bytes | str] = [b"", b"a", b"68fd1e64", b"exactly8", b"nine char", "ünïcode"]
    values.append(b"x" * 40)
    for field in (0, 1, 25):
        got = hash64(values, field)
        want = [_reference_hash(v.encode() if isinstance(v, str) else v, field) for v in values]
        assert got.tolist() == want
    # Known values pin the function across releases (ids in saved models depend on them).
    assert hash64([b"68fd1e64"], 0).tolist() == [_reference_hash(b"68fd1e64", 0)]
    assert len(set(hash64(values, 0).tolist())) == len(values)
    assert hash64([b"abc"], 2)[0] != hash64([b"abc"], 3)[0]
    assert missing_id(4) == _reference_hash(b"", 4)
    with pytest.raises(ValueError, match="NUL"):
        hash64([b"a\0b"])


def test_criteo_parses_values_missing_and_per_field_ids(tmp_path: Path) -> None:
    samples = [_sample(i) for i in range(300)]
    # Same hex in two fields must give two ids.
    samples[0][2][0] = samples[0][2][1] = "deadbeef"
    path = tmp_path / "day_0.tsv"
    path.write_text("\n".join(_criteo_line(*s) for s in samples) + "\n")
    batches = list(read_criteo(path, batch_size=128, chunk_bytes=5000, log_dense=False))
    assert [len(b) for b in batches] == [128, 128, 44]
    labels = np.concatenate([b.labels for b in batches])
    dense = np.concatenate([b.dense for b in batches])
    cats = np.concatenate([b.cats for b in batches])
    assert labels.dtype == np.float32 and dense.dtype == np.float32 and cats.dtype == np.uint64
    assert dense.shape == (300, 13) and cats.shape == (300, 26)
    for i, (label, d, c) in enumerate(samples):
        assert labels[i] == label
        assert dense[i].tolist() == [0.0 if v is None else float(np.float32(v)) for v in d]
        for j, v in enumerate(c):
            want = missing_id(j) if v is None else _reference_hash(v.encode(), j)
            assert int(cats[i, j]) == want
    assert cats[0, 0] != cats[0, 1]
    # The log transform: log(1 + max(x, 0)).
    logged = np.concatenate([b.dense for b in read_criteo(path)])
    np.testing.assert_allclose(logged, np.log1p(np.maximum(dense, 0)), rtol=1e-6)


def test_criteo_long_and_short_fields_hash_like_hash64() -> None:
    cats: list[str | None] = ["x" * 20, "a", None, "0123456789abcdef", "ff" * 9, *["1"] * 21]
    dense: list[int | None] = [123456789012345, -7, None, *[0] * 10]
    batch = parse_criteo(_criteo_line(1, dense, cats).encode(), log_dense=False)
    assert batch.dense[0, :3].tolist() == [float(np.float32(123456789012345)), -7.0, 0.0]
    for j, c in enumerate(cats):
        assert int(batch.cats[0, j]) == _reference_hash(b"" if c is None else c.encode(), j)
    assert len(parse_criteo(b"")) == 0 and len(parse_criteo(b"\n\n")) == 0


def test_criteo_handles_gzip_crlf_and_a_missing_final_newline(tmp_path: Path) -> None:
    lines = [_criteo_line(*_sample(i)) for i in range(20)]
    plain = tmp_path / "a.tsv"
    plain.write_text("\n".join(lines) + "\n")
    gz = tmp_path / "b.tsv.gz"
    with gzip.open(gz, "wb") as fh:
        fh.write(("\r\n".join(lines)).encode())
    a = np.concatenate([b.cats for b in read_criteo(plain)])
    b = np.concatenate([b.cats for b in read_criteo(gz)])
    assert a.shape == (20, 26) and (a == b).all()


def test_malformed_lines_are_counted_logged_and_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = [_criteo_line(*_sample(i)) for i in range(10)]
    lines = [
        *good[:4],
        "1\t2\t3",  # too few fields (line 5)
        good[4],
        "1" + "\t7" * 12 + "\tabc" + "\t" * 26,  # non-integer I13 (line 7)
        "",  # empty lines are not samples and not errors
        good[5],
        "\t".join(["0"] + ["1"] * 13 + ["a"] * 27),  # 41 fields (line 10)
        *good[7:],
    ]
    path = tmp_path / "m.tsv"
    path.write_text("\n".join(lines) + "\n")
    stats = ParseStats()
    with caplog.at_level(logging.WARNING, logger="coadapt.sparse"):
        out = list(read_criteo(path, stats=stats))
    assert sum(len(b) for b in out) == 9 and stats.malformed == 3 and stats.lines == 13
    assert [n for n, _ in stats.first_malformed] == [5, 7, 10]
    assert "line 5" in caplog.text and "found 3" in caplog.text
    assert "line 7" in caplog.text and "I13" in caplog.text and "found 41" in caplog.text


def test_wrong_format_stops_with_a_clear_error(tmp_path: Path) -> None:
    csv = tmp_path / "x.csv"
    csv.write_text("\n".join(",".join(["1"] * 40) for _ in range(5)) + "\n")
    with pytest.raises(
        FormatError, match=r"expected 40 tab-separated.*line 1, the first data line, has 1 .*CSV"
    ):
        next(read_criteo(csv))
    svm = tmp_path / "x.svm"
    svm.write_text("1 3:0.5 7:1\n0 2:1\n")
    with pytest.raises(FormatError, match="libsvm"):
        next(read_criteo(svm))
    tsv = tmp_path / "x.tsv"
    tsv.write_text(_criteo_line(*_sample(0)) + "\n")
    with pytest.raises(FormatError, match=r"not a libsvm file.*Criteo"):
        next(read_libsvm(tsv))


def test_parse_criteo_on_stream_records() -> None:
    recs = [_criteo_line(*_sample(i)).encode() for i in range(5)]
    batch = parse_criteo(b"\n".join(recs))
    assert len(batch) == 5
    ref = next(iter([parse_criteo(b"\n".join(recs) + b"\n")]))
    assert (batch.cats == ref.cats).all()


def test_libsvm_reader(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "a.svm"
    path.write_text(
        "1 3:0.5 10:1 # a comment\n"
        "0\n"
        "-1 2:-2.5e-1   7:3\n"
        "1 4:x\n"  # malformed: value
        "1 5\n"  # malformed: no colon
        "0 1:1 18446744073709551615:2\n"
    )
    stats = ParseStats()
    with caplog.at_level(logging.WARNING, logger="coadapt.sparse"):
        batches = list(read_libsvm(path, batch_size=2, stats=stats))
    assert [len(b) for b in batches] == [2, 2]
    labels = np.concatenate([b.labels for b in batches])
    assert labels.tolist() == [1, 0, -1, 0]
    b0, b1 = batches
    assert b0.offsets.tolist() == [0, 2, 2] and b0.ids.tolist() == [3, 10]
    assert b1.offsets.tolist() == [0, 2, 4]
    assert b1.ids.tolist() == [2, 7, 1, 2**64 - 1]
    assert b1.values.tolist() == [-0.25, 3.0, 1.0, 2.0]
    assert stats.malformed == 2 and [n for n, _ in stats.first_malformed] == [4, 5]
    assert "line 4" in caplog.text


def test_criteo_parse_rate_is_reported(tmp_path: Path) -> None:
    """Not a benchmark gate (shared CI cores), just a sanity floor against a 10x regression."""
    import time

    distinct = [_criteo_line(*_sample(i)) for i in range(50)]
    lines = distinct * 400
    path = tmp_path / "speed.tsv"
    path.write_text("\n".join(lines) + "\n")
    t = time.process_time()
    n = sum(len(b) for b in read_criteo(path, batch_size=2048))
    rate = n / max(time.process_time() - t, 1e-9)
    assert n == 20_000
    assert rate > 20_000 and math.isfinite(rate)


def test_a_file_with_the_wrong_field_count_stops_naming_line_and_count(tmp_path: Path) -> None:
    """Criteo's unlabelled test file has 39 fields: every line is short, so it is not skipped
    line by line but refused at once with what was expected and what was found."""
    no_label = [_criteo_line(*_sample(i)).split("\t", 1)[1] for i in range(12)]
    path = tmp_path / "test.txt"
    path.write_text("\n".join(no_label) + "\n")
    with pytest.raises(
        FormatError, match=r"line 1, the first data line, has 39 tab-separated.*no label"
    ):
        next(read_criteo(path))


def test_the_first_data_line_decides(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A wrong field count on the first data line stops the file (even if later lines are
    fine); the same line anywhere after a good first line is counted and skipped."""
    good = [_criteo_line(*_sample(i)) for i in range(6)]
    short = good[0].split("\t", 1)[1]  # 39 fields
    first_bad = tmp_path / "first_bad.tsv"
    first_bad.write_text("\n\n" + "\n".join([short, *good]) + "\n")  # blank lines do not count
    with pytest.raises(FormatError, match=r"line 3, the first data line, has 39"):
        next(read_criteo(first_bad))
    later_bad = tmp_path / "later_bad.tsv"
    later_bad.write_text("\n".join([good[0], short, *good[1:], short]) + "\n")
    stats = ParseStats()
    with caplog.at_level(logging.WARNING, logger="coadapt.sparse"):
        assert sum(len(b) for b in read_criteo(later_bad, stats=stats, chunk_bytes=300)) == 6
    assert stats.malformed == 2 and [n for n, _ in stats.first_malformed] == [2, 8]
    assert "skipping malformed line 2: expected 40 tab-separated fields, found 39" in caplog.text
    # The decision is made once per file, not once per chunk: a later chunk that starts with
    # a short line is a malformed line, not a wrong file (chunk_bytes=300 < one line here).
    assert "line 8" in caplog.text
    # The first line has the right field count but a bad label (a header row): skipped.
    header = "\t".join(
        ["label", *[f"I{j}" for j in range(1, 14)], *[f"C{j}" for j in range(1, 27)]]
    )
    with_header = tmp_path / "header.tsv"
    with_header.write_text("\n".join([header, *good]) + "\n")
    stats = ParseStats()
    assert sum(len(b) for b in read_criteo(with_header, stats=stats)) == 6
    assert (
        stats.first_malformed[0][0] == 1
        and "label is not an integer" in stats.first_malformed[0][1]
    )


def test_libsvm_first_data_line_decides(tmp_path: Path) -> None:
    bad_first = tmp_path / "a.svm"
    bad_first.write_text("# comment only\n\n1,3,0.5\n1 3:0.5\n")
    with pytest.raises(FormatError, match=r"line 3, the first data line"):
        next(read_libsvm(bad_first))
    bad_later = tmp_path / "b.svm"
    bad_later.write_text("1 3:0.5\n1 3:x\n0 4:1\n")
    stats = ParseStats()
    assert sum(len(b) for b in read_libsvm(bad_later, stats=stats)) == 2
    assert [n for n, _ in stats.first_malformed] == [2]

"""Batch file formats for sparse CTR training: Criteo TSV and libsvm, parsed in chunks.

Criteo TSV: one sample per line, 40 tab-separated fields — the label, 13 integer ("dense")
features, 26 categorical features as hex strings; an empty field is a missing value. The
parser works on whole byte chunks with numpy (separator scan, vectorised digit parsing and
hashing) instead of splitting each line in Python, so parsing keeps up with training.

Feature ids are 64-bit hashes of the raw bytes (:func:`hash64`), salted per field: the same
string in two fields gives two ids, and a missing value gets its field's own "missing" id (the
hash of the empty string in that field), distinct from every real value's id.

libsvm: ``label idx:val idx:val ...``; indices are used as feature ids as they are.

The first data line decides the format: if it has the wrong field count (a CSV, Criteo's
unlabelled 39-field test file, libsvm passed as Criteo) the reader stops with
:class:`FormatError` saying what was expected and what was found, before yielding anything. A
malformed line anywhere after it (wrong field count, a non-integer label or dense feature, a bad
libsvm token) is counted in :class:`ParseStats`, logged with its line number (logger
``coadapt.sparse``) and skipped: one bad line must not stop a long job, a wrong file must.
"""

from __future__ import annotations

import gzip
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, cast

import numpy as np

__all__ = [
    "CRITEO_CATEGORICAL",
    "CRITEO_DENSE",
    "CriteoBatch",
    "FormatError",
    "LibsvmBatch",
    "ParseStats",
    "hash64",
    "missing_id",
    "parse_criteo",
    "parse_libsvm",
    "read_criteo",
    "read_libsvm",
]

log = logging.getLogger("coadapt.sparse")

CRITEO_DENSE = 13
CRITEO_CATEGORICAL = 26
_CRITEO_FIELDS = 1 + CRITEO_DENSE + CRITEO_CATEGORICAL
_MAX_LOGGED = 50
_CHUNK_BYTES = 4 << 20


class FormatError(ValueError):
    """The file is not in the format it was read as."""


# --------------------------------------------------------------------------- hashing

_U64 = np.uint64
_M1 = _U64(0xFF51AFD7ED558CCD)
_M2 = _U64(0xC4CEB9FE1A85EC53)
_GOLDEN = _U64(0x9E3779B97F4A7C15)
_S33 = _U64(33)


def _fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser (a bijection with full avalanche), in place."""
    h ^= h >> _S33
    h *= _M1
    h ^= h >> _S33
    h *= _M2
    h ^= h >> _S33
    return h


def _field_seed(field_index: int) -> np.ndarray:
    return _fmix64(np.array([field_index + 1], dtype=np.uint64) * _GOLDEN)


def _hash_words(words: np.ndarray, lengths: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """Hash rows of little-endian 64-bit words (zero-padded bytes) of the given byte lengths.

    ``h = fmix(seed ^ len * GOLDEN); for each of the max(1, ceil(len / 8)) words w:
    h = fmix(h ^ w)`` — the spec of :func:`hash64`; the tests mirror it with plain Python ints.
    """
    h = _fmix64(seed ^ (lengths.astype(np.uint64) * _GOLDEN))
    n_words = np.maximum(1, (lengths + 7) // 8)  # a field's own length decides, not the batch's
    for k in range(words.shape[1]):
        if k == 0 or bool((n_words > k).all()):
            h ^= words[:, k]
            _fmix64(h)
        else:
            sel = np.flatnonzero(n_words > k)
            h[sel] = _fmix64(h[sel] ^ words[sel, k])
    return h


def hash64(values: Sequence[bytes | str] | np.ndarray, field: int = 0) -> np.ndarray:
    """Stable 64-bit ids of raw feature strings, salted by ``field`` (vectorised).

    Deterministic across runs, processes and machines (no Python ``hash`` randomisation);
    strings are UTF-8 encoded. Returns ``uint64 (len(values),)``.
    """
    raw = [v.encode() if isinstance(v, str) else bytes(v) for v in values]
    if not raw:
        return np.empty(0, dtype=np.uint64)
    if any(b"\0" in v for v in raw):
        raise ValueError("feature strings must not contain NUL bytes")
    lengths = np.fromiter((len(v) for v in raw), dtype=np.int64, count=len(raw))
    width = max(8, -(-int(lengths.max()) // 8) * 8)
    arr = np.array(raw, dtype=f"S{width}")
    words = arr.view("<u8").reshape(len(raw), width // 8).astype(np.uint64)
    return _hash_words(words, lengths, _field_seed(field))


def missing_id(field: int) -> int:
    """The id a missing (empty) value of ``field`` gets."""
    return int(hash64([b""], field)[0])


# --------------------------------------------------------------------------- byte helpers


_BYTE_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=np.uint64)


class _Buffer:
    """A parse block, zero-padded, with the 8 bytes at any offset one fancy-index away
    (instead of gathering an (m, width) index matrix of single bytes)."""

    def __init__(self, data: bytes) -> None:
        size = len(data) + 16
        self.u8 = np.zeros(size + 8, dtype=np.uint8)
        self.u8[: len(data)] = np.frombuffer(data, dtype=np.uint8)
        # Row a holds the words starting at offsets a, a + 8, a + 16, ...: an aligned copy per
        # alignment makes "the 8 bytes at offset s" the plain lookup table[s % 8, s // 8].
        count = size // 8
        self.table = np.empty((8, count), dtype=np.uint64)
        for a in range(8):
            self.table[a] = np.frombuffer(self.u8, dtype="<u8", count=count, offset=a)

    def fields(self, starts: np.ndarray, lens: np.ndarray, n_words: int) -> np.ndarray:
        """(m, n_words) little-endian words of the fields, zero past each field's length."""
        out = np.empty((starts.size, n_words), dtype=np.uint64)
        lo, hi = starts & 7, starts >> 3
        for k in range(n_words):
            w = self.table[lo, hi + k]
            w &= _BYTE_MASKS[np.clip(lens - 8 * k, 0, 8)]
            out[:, k] = w
        return out


def _parse_ints(
    buf: _Buffer, starts: np.ndarray, lens: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Decimal integers (optional leading '-') → (int64 values, ok mask). Empty → 0, ok."""
    m = starts.size
    ok = lens <= 18
    if m == 0 or int(lens.max()) == 0:
        return np.zeros(m, np.int64), ok
    lens = np.minimum(lens, 24)
    n_words = -(-int(lens.max()) // 8)
    width = 8 * n_words
    b = buf.fields(starts, lens, n_words).view(np.uint8).reshape(m, width)
    d = b.astype(np.int16)
    neg = d[:, 0] == 45  # '-'
    d[neg, 0] = 48  # parse the sign slot as a leading zero
    d -= 48
    cols = np.arange(width)[None, :]
    inside = cols < lens[:, None]
    ok &= ~(inside & ((d < 0) | (d > 9))).any(axis=1)
    ok &= ~(neg & (lens == 1))
    d[~inside] = 0
    # Right-align: the digit at position j of a length-L field has weight 10^(L-1-j).
    power = (lens[:, None] - 1 - cols).clip(0, 18)
    vals = (d.astype(np.int64) * _POW10[power]).sum(axis=1)
    vals[neg] = -vals[neg]
    return vals, ok


_POW10 = np.array([10**k for k in range(19)], dtype=np.int64)


def _hash_fields(
    buf: _Buffer, starts: np.ndarray, lens: np.ndarray, seeds: np.ndarray
) -> np.ndarray:
    """Hash byte fields of a buffer with one seed per field (same spec as :func:`hash64`)."""
    if starts.size == 0:
        return np.empty(0, dtype=np.uint64)
    n_words = max(1, -(-int(lens.max()) // 8))
    return _hash_words(buf.fields(starts, lens, n_words), lens, seeds)


def _open(path: str | os.PathLike[str]) -> IO[bytes]:
    p = os.fspath(path)
    if p.endswith(".gz"):
        return cast(IO[bytes], gzip.open(p, "rb"))
    return open(p, "rb")


def _chunks(fh: IO[bytes], chunk_bytes: int) -> Iterator[bytes]:
    """Blocks of whole lines (the last one newline-terminated even if the file is not)."""
    rest = b""
    while True:
        block = fh.read(chunk_bytes)
        if not block:
            if rest:
                yield rest + b"\n"
            return
        block = rest + block
        cut = block.rfind(b"\n")
        if cut < 0:
            rest = block
            continue
        rest = block[cut + 1 :]
        yield block[: cut + 1]


# --------------------------------------------------------------------------- Criteo


@dataclass
class ParseStats:
    """Counts for one reader: lines seen, samples returned, malformed lines skipped."""

    lines: int = 0
    samples: int = 0
    malformed: int = 0
    first_malformed: list[tuple[int, str]] = field(default_factory=list)

    def _bad(self, line_no: int, why: str) -> None:
        self.malformed += 1
        if len(self.first_malformed) < _MAX_LOGGED:
            self.first_malformed.append((line_no, why))
            log.warning("skipping malformed line %d: %s", line_no, why)
        elif len(self.first_malformed) == _MAX_LOGGED and self.malformed == _MAX_LOGGED + 1:
            log.warning("more malformed lines: logging stops here, ParseStats.malformed counts")


@dataclass
class CriteoBatch:
    """Parsed samples: labels float32 (n,), dense float32 (n, 13), cats uint64 (n, 26)."""

    labels: np.ndarray
    dense: np.ndarray
    cats: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def slice(self, a: int, b: int) -> CriteoBatch:
        return CriteoBatch(self.labels[a:b], self.dense[a:b], self.cats[a:b])


_CAT_SEEDS = np.concatenate([_field_seed(j) for j in range(CRITEO_CATEGORICAL)])


def _describe(line: bytes) -> str:
    tabs = line.count(b"\t") + 1
    hint = ""
    if tabs == _CRITEO_FIELDS - 1:
        hint = " (no label column: Criteo's unlabelled test file? prepend a label)"
    elif tabs == 1 and line.count(b",") >= 5:
        hint = f" ({line.count(b',') + 1} comma-separated: a CSV file?)"
    elif b":" in line and tabs <= 2:
        hint = " (idx:val tokens: a libsvm file? read it with read_libsvm)"
    return f"{tabs} tab-separated field(s){hint}"


def parse_criteo(
    data: bytes,
    *,
    log_dense: bool = True,
    first_line: int = 1,
    stats: ParseStats | None = None,
    sniff: bool = False,
) -> CriteoBatch:
    """Parse a block of whole Criteo lines (e.g. records from a stream joined by newlines)."""
    stats = stats if stats is not None else ParseStats()
    if data and not data.endswith(b"\n"):
        data += b"\n"
    buf = _Buffer(data)
    u8 = buf.u8[: len(data)]
    nl = np.flatnonzero(u8 == 10)
    line_start = np.concatenate([[0], nl[:-1] + 1]).astype(np.int64)[: nl.size]
    line_end = nl.astype(np.int64)
    # A CR before the newline belongs to the line break.
    cr = (line_end > line_start) & (u8[np.maximum(line_end - 1, 0)] == 13)
    line_end = line_end - cr
    n_lines = nl.size
    stats.lines += n_lines
    tabs = np.flatnonzero(u8 == 9)
    ntabs = np.searchsorted(tabs, line_end) - np.searchsorted(tabs, line_start)
    empty = line_end == line_start
    good = (ntabs == _CRITEO_FIELDS - 1) & ~empty

    if sniff and n_lines:  # the first data line decides: a wrong field count is a wrong file
        head = np.flatnonzero(~empty)[:1]
        if head.size and not good[head[0]]:
            i = int(head[0])
            raise FormatError(
                f"not a Criteo TSV file: expected {_CRITEO_FIELDS} tab-separated fields per line "
                f"(label, {CRITEO_DENSE} integer, {CRITEO_CATEGORICAL} categorical), but line "
                f"{first_line + i}, the first data line, has "
                f"{_describe(bytes(data[line_start[i] : line_end[i]]))}"
            )

    malformed = [
        (
            first_line + bad,
            f"expected {_CRITEO_FIELDS} tab-separated fields, found {int(ntabs[bad]) + 1}",
        )
        for bad in np.flatnonzero(~good & ~empty).tolist()
    ]
    rows = np.flatnonzero(good)
    n = rows.size
    # Field boundaries of the good lines: tabs inside them, in order, 39 per line.
    first_tab = np.searchsorted(tabs, line_start[rows])
    tab_idx = first_tab[:, None] + np.arange(_CRITEO_FIELDS - 1)[None, :]
    tpos = tabs[tab_idx] if n else np.empty((0, _CRITEO_FIELDS - 1), np.int64)
    starts = np.empty((n, _CRITEO_FIELDS), dtype=np.int64)
    ends = np.empty((n, _CRITEO_FIELDS), dtype=np.int64)
    starts[:, 0] = line_start[rows]
    starts[:, 1:] = tpos + 1
    ends[:, :-1] = tpos
    ends[:, -1] = line_end[rows]
    lens = ends - starts

    num_starts = starts[:, : 1 + CRITEO_DENSE].reshape(-1)
    num_lens = lens[:, : 1 + CRITEO_DENSE].reshape(-1)
    vals, ok = _parse_ints(buf, num_starts, num_lens)
    vals = vals.reshape(n, 1 + CRITEO_DENSE)
    ok = ok.reshape(n, 1 + CRITEO_DENSE)
    ok[:, 0] &= lens[:, 0] > 0  # the label must be present
    line_ok = ok.all(axis=1)
    for r in np.flatnonzero(~line_ok).tolist():
        j = int(np.flatnonzero(~ok[r])[0])
        what = "label" if j == 0 else f"integer feature I{j}"
        raw = bytes(data[starts[r, j] : ends[r, j]])[:40]
        malformed.append((first_line + int(rows[r]), f"{what} is not an integer: {raw!r}"))
    for line_no, why in sorted(malformed):  # logged in file order
        stats._bad(line_no, why)
    if not line_ok.all():
        keep = np.flatnonzero(line_ok)
        vals, starts, lens = vals[keep], starts[keep], lens[keep]
        n = keep.size

    labels = vals[:, 0].astype(np.float32)
    dense = vals[:, 1:].astype(np.float32)
    if log_dense:
        np.maximum(dense, 0, out=dense)
        np.log1p(dense, out=dense)
    cat_starts = starts[:, 1 + CRITEO_DENSE :].reshape(-1)
    cat_lens = lens[:, 1 + CRITEO_DENSE :].reshape(-1)
    seeds = np.tile(_CAT_SEEDS, n)
    cats = _hash_fields(buf, cat_starts, cat_lens, seeds).reshape(n, CRITEO_CATEGORICAL)
    stats.samples += n
    return CriteoBatch(labels, dense, cats)


def _rebatch(parts: Iterator[Any], batch_size: int | None, concat: Any) -> Iterator[Any]:
    if batch_size is None:
        for p in parts:
            if len(p):
                yield p
        return
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    pending: list[Any] = []
    have = 0
    for p in parts:
        if not len(p):
            continue
        pending.append(p)
        have += len(p)
        while have >= batch_size:
            whole = concat(pending)
            yield whole.slice(0, batch_size)
            rest = whole.slice(batch_size, len(whole))
            pending, have = ([rest], len(rest)) if len(rest) else ([], 0)
    if have:
        yield concat(pending)


def _criteo_concat(parts: list[CriteoBatch]) -> CriteoBatch:
    if len(parts) == 1:
        return parts[0]
    return CriteoBatch(
        np.concatenate([p.labels for p in parts]),
        np.concatenate([p.dense for p in parts]),
        np.concatenate([p.cats for p in parts]),
    )


def read_criteo(
    path: str | os.PathLike[str],
    *,
    batch_size: int | None = None,
    log_dense: bool = True,
    chunk_bytes: int = _CHUNK_BYTES,
    stats: ParseStats | None = None,
) -> Iterator[CriteoBatch]:
    """Stream a Criteo TSV file (``.gz`` too) as batches of ``batch_size`` samples.

    ``batch_size=None`` yields whatever one chunk of ``chunk_bytes`` holds. Pass a
    :class:`ParseStats` to learn how many lines were malformed.
    """
    stats = stats if stats is not None else ParseStats()
    line = 1

    def parts() -> Iterator[CriteoBatch]:
        nonlocal line
        decided = False  # has the first data line been checked yet?
        with _open(path) as fh:
            for block in _chunks(fh, chunk_bytes):
                yield parse_criteo(
                    block, log_dense=log_dense, first_line=line, stats=stats, sniff=not decided
                )
                decided = decided or bool(block.strip())
                line += block.count(b"\n")

    yield from _rebatch(parts(), batch_size, _criteo_concat)


# --------------------------------------------------------------------------- libsvm


@dataclass
class LibsvmBatch:
    """CSR samples: labels float32 (n,), row offsets int64 (n+1,), ids uint64, values float32."""

    labels: np.ndarray
    offsets: np.ndarray
    ids: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def slice(self, a: int, b: int) -> LibsvmBatch:
        lo, hi = int(self.offsets[a]), int(self.offsets[b])
        return LibsvmBatch(
            self.labels[a:b], self.offsets[a : b + 1] - lo, self.ids[lo:hi], self.values[lo:hi]
        )


def _libsvm_concat(parts: list[LibsvmBatch]) -> LibsvmBatch:
    if len(parts) == 1:
        return parts[0]
    offs = [parts[0].offsets]
    base = int(parts[0].offsets[-1])
    for p in parts[1:]:
        offs.append(p.offsets[1:] + base)
        base += int(p.offsets[-1])
    return LibsvmBatch(
        np.concatenate([p.labels for p in parts]),
        np.concatenate(offs),
        np.concatenate([p.ids for p in parts]),
        np.concatenate([p.values for p in parts]),
    )


def _libsvm_line(line: bytes) -> tuple[float, list[int], list[float]]:
    toks = line.split()
    label = float(toks[0])
    idx: list[int] = []
    val: list[float] = []
    for t in toks[1:]:
        k, sep, v = t.partition(b":")
        if not sep or not k or not v:
            raise ValueError(f"token {t[:30]!r} is not idx:val")
        i = int(k)
        if i < 0:
            raise ValueError(f"negative feature index {i}")
        idx.append(i)
        val.append(float(v))
    return label, idx, val


def parse_libsvm(
    data: bytes, *, first_line: int = 1, stats: ParseStats | None = None, sniff: bool = False
) -> LibsvmBatch:
    """Parse a block of whole libsvm lines (``label idx:val ...``; ``#`` starts a comment)."""
    stats = stats if stats is not None else ParseStats()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    stats.lines += len(lines)
    labels: list[float] = []
    counts: list[int] = []
    line_nos: list[int] = []
    malformed: list[tuple[int, str]] = []
    feature_text: list[bytes] = []
    checked = False
    for i, raw in enumerate(lines):
        line = raw.split(b"#", 1)[0].strip()
        if not line:
            continue
        head = line.split(None, 1)
        rest = head[1] if len(head) > 1 else b""
        n_feat = rest.count(b":")
        # Fast path: structure checks are C-level byte operations on the whole line.
        flat = rest.replace(b":", b" ")
        ok = (
            len(flat.split()) == 2 * n_feat
            and b": " not in rest
            and b" :" not in rest
            and not rest.startswith(b"-")
            and b" -" not in rest
            and b"\t-" not in rest
        )
        if ok:
            try:
                label = float(head[0])
            except ValueError:
                ok = False
        if sniff and not checked:  # the first data line decides, as for Criteo
            checked = True
            if not ok:
                raise FormatError(
                    "not a libsvm file: expected 'label idx:val idx:val ...' per line, but line "
                    f"{first_line + i}, the first data line, is {raw[:60]!r}"
                    + (" (tab-separated: a Criteo TSV file?)" if b"\t" in raw else "")
                )
        if not ok:
            try:
                _libsvm_line(line)
                why = "could not parse"
            except (ValueError, IndexError) as exc:
                why = str(exc)
            malformed.append((first_line + i, why))
            continue
        labels.append(label)
        counts.append(n_feat)
        line_nos.append(first_line + i)
        feature_text.append(flat)
    tokens = b" ".join(feature_text).split()
    ids, values, bad_tok = _convert_tokens(tokens[0::2], tokens[1::2])
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    batch = LibsvmBatch(np.asarray(labels, dtype=np.float32), offsets, ids, values)
    if bad_tok.any():  # rare: a token that looked right but is not a number
        bad_rows = np.unique(np.searchsorted(offsets, np.flatnonzero(bad_tok), side="right") - 1)
        for r in bad_rows:
            malformed.append((line_nos[int(r)], "an idx:val token is not a number"))
        keep = np.setdiff1d(np.arange(len(counts)), bad_rows)
        batch = _libsvm_concat(
            [batch.slice(0, 0)] + [batch.slice(int(r), int(r) + 1) for r in keep]
        )
    for line_no, why in sorted(malformed):  # logged in file order
        stats._bad(line_no, why)
    stats.samples += len(batch)
    return batch


def _convert_tokens(
    idx: list[bytes], val: list[bytes]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not idx:
        return np.zeros(0, np.uint64), np.zeros(0, np.float32), np.zeros(0, bool)
    try:  # int()/float() on bytes are C calls: faster than numpy's string casts here
        ids = np.array(list(map(int, idx)), dtype=np.uint64)
        values = np.array(list(map(float, val)), dtype=np.float32)
        return ids, values, np.zeros(len(idx), bool)
    except (ValueError, OverflowError):
        pass
    ids = np.zeros(len(idx), np.uint64)
    values = np.zeros(len(idx), np.float32)
    bad = np.zeros(len(idx), bool)
    for k, (a, b) in enumerate(zip(idx, val, strict=True)):
        try:
            ids[k] = int(a)
            values[k] = float(b)
        except (ValueError, OverflowError):
            bad[k] = True
    return ids, values, bad


def read_libsvm(
    path: str | os.PathLike[str],
    *,
    batch_size: int | None = None,
    chunk_bytes: int = _CHUNK_BYTES,
    stats: ParseStats | None = None,
) -> Iterator[LibsvmBatch]:
    """Stream a libsvm file (``.gz`` too) as CSR batches of ``batch_size`` samples."""
    stats = stats if stats is not None else ParseStats()
    line = 1

    def parts() -> Iterator[LibsvmBatch]:
        nonlocal line
        decided = False  # has the first data line been checked yet?
        with _open(path) as fh:
            for block in _chunks(fh, chunk_bytes):
                seen = stats.samples + stats.malformed
                yield parse_libsvm(block, first_line=line, stats=stats, sniff=not decided)
                decided = decided or stats.samples + stats.malformed > seen
                line += block.count(b"\n")

    yield from _rebatch(parts(), batch_size, _libsvm_concat)

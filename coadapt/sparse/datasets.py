"""Criteo-format click data from a planted logistic model, so every trainer has a known ceiling.

Each row: ``label \\t I1..I13 \\t C1..C26`` (13 integer counts, 26 8-hex-digit categoricals,
empty field = missing). The click probability is ``sigmoid(bias + sum of planted weights)``:
one weight per (field, categorical value), derived from a seeded hash of the value so that the
model needs no table, plus one weight per dense field on its standardised ``log1p`` count.
Categorical values are Zipf-distributed ranks over ``vocab`` (>= 10**8 by default) values per
field, mapped through a seeded bijective hash so IDs are not small integers. With drift, every
planted weight rotates on a circle of constant radius (full turn every ``drift_period`` rows), so
weight magnitudes — and hence the ceiling — stay stable while their signs move: an online
learner must keep up. The AUC of the planted probabilities on the generated labels is the
ceiling no model can beat on this data; it is computed while streaming (fine logit histogram).

CLI: ``python -m coadapt.sparse.datasets --rows N --out FILE [--drift ROWS] [--seed S]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from coadapt.atomicfile import atomic_writer
from coadapt.sparse._hashing import mix64

__all__ = [
    "N_CAT",
    "N_DENSE",
    "GenerationResult",
    "PlantedChunk",
    "PlantedConfig",
    "format_criteo",
    "generate",
    "iter_planted",
    "main",
]

N_DENSE = 13
N_CAT = 26
_DENSE_DIGITS = 10
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_AUC_BINS = 1 << 20
_LOGIT_RANGE = 20.0


@dataclass(frozen=True)
class PlantedConfig:
    """Everything that determines the generated data (same config + seed = same bytes)."""

    rows: int
    seed: int = 0
    vocab: int = 10**8
    zipf_min: float = 1.05
    zipf_max: float = 1.6
    cat_scale: float = 0.3
    dense_scale: float = 0.3
    bias: float = -1.5
    missing_cat: float = 0.04
    missing_dense: float = 0.08
    drift_period: int = 0
    chunk_rows: int = 1 << 16
    zipf_exponents: tuple[float, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        checks = [
            (self.rows >= 1, f"rows must be >= 1, got {self.rows}"),
            (2 <= self.vocab <= 1 << 32, f"vocab must be in [2, 2**32], got {self.vocab}"),
            (
                0 < self.zipf_min <= self.zipf_max,
                f"need 0 < zipf_min <= zipf_max, got {self.zipf_min}, {self.zipf_max}",
            ),
            (0 <= self.missing_cat < 1, f"missing_cat must be in [0, 1), got {self.missing_cat}"),
            (
                0 <= self.missing_dense < 1,
                f"missing_dense must be in [0, 1), got {self.missing_dense}",
            ),
            (self.drift_period >= 0, f"drift_period must be >= 0 rows, got {self.drift_period}"),
            (self.chunk_rows >= 1, f"chunk_rows must be >= 1, got {self.chunk_rows}"),
            (self.cat_scale >= 0 and self.dense_scale >= 0, "weight scales must be >= 0"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)
        if not self.zipf_exponents:
            object.__setattr__(
                self,
                "zipf_exponents",
                tuple(np.linspace(self.zipf_min, self.zipf_max, N_CAT).round(4).tolist()),
            )
        if len(self.zipf_exponents) != N_CAT:
            raise ValueError(f"zipf_exponents needs {N_CAT} values, got {len(self.zipf_exponents)}")


@dataclass
class PlantedChunk:
    """One chunk of generated rows, plus the planted probability of each row."""

    start: int
    labels: npt.NDArray[np.int8]
    dense: npt.NDArray[np.int64]  # (n, 13), -1 = missing
    cats: npt.NDArray[np.uint32]  # (n, 26) 32-bit IDs
    cat_missing: npt.NDArray[np.bool_]  # (n, 26)
    prob: npt.NDArray[np.float64]
    logit: npt.NDArray[np.float64]


@dataclass
class GenerationResult:
    path: str
    meta_path: str
    rows: int
    positives: int
    ceiling_auc: float
    ceiling_logloss: float
    seconds: float


def _u01(h: npt.NDArray[np.uint64]) -> npt.NDArray[np.float64]:
    """Uniform in (0, 1) from the high 53 bits of a hash."""
    return ((h >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


def _field_salt(seed: int, f: int) -> np.uint64:
    return mix64(np.array([(seed * 1_000_003 + f * 7919 + 17) & ((1 << 64) - 1)], np.uint64))[0]


class _Planted:
    """The planted model's parameters (all derived from the seed; nothing stored per ID)."""

    def __init__(self, cfg: PlantedConfig) -> None:
        self.cfg = cfg
        self.id_salt = [_field_salt(cfg.seed, f) for f in range(N_CAT)]
        self.w_salt = [_field_salt(cfg.seed + 1, f) for f in range(N_CAT)]
        rng = np.random.default_rng([cfg.seed, 0xD15E])
        self.dense_mu = rng.uniform(0.0, 4.0, N_DENSE)
        self.dense_sigma = rng.uniform(0.5, 1.5, N_DENSE)
        self.dense_w = rng.normal(0.0, cfg.dense_scale, N_DENSE)
        self.dense_phase = rng.uniform(0, 2 * math.pi, N_DENSE)
        self.cat_field_scale = cfg.cat_scale * rng.uniform(0.5, 1.5, N_CAT)

    def angle(self, t: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        if self.cfg.drift_period == 0:
            return np.zeros(t.shape, np.float64)
        return 2 * math.pi * t.astype(np.float64) / self.cfg.drift_period

    def cat_weight(
        self, f: int, ids: npt.NDArray[np.uint32], theta: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        """Box-Muller normal whose phase rotates with the drift angle: w = r cos(phi - theta)."""
        h = mix64(ids.astype(np.uint64) ^ self.w_salt[f])
        u1 = _u01(h)
        u2 = _u01(mix64(h))
        r = np.sqrt(-2.0 * np.log(u1))
        return self.cat_field_scale[f] * r * np.cos(2 * math.pi * u2 - theta)

    def dense_weight(self, theta: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """(n, 13) dense weights at each row's drift angle."""
        if self.cfg.drift_period == 0:
            return np.broadcast_to(
                self.dense_w * np.cos(self.dense_phase) * math.sqrt(2), (theta.size, N_DENSE)
            )
        return self.dense_w * math.sqrt(2) * np.cos(self.dense_phase[None, :] - theta[:, None])


def _zipf_ranks(rng: np.random.Generator, a: float, vocab: int, n: int) -> npt.NDArray[np.uint64]:
    """Ranks in [1, vocab] with P(rank) ~ rank**-a (inverse CDF of the continuous power law)."""
    u = rng.random(n)
    if abs(a - 1.0) < 1e-9:
        x = np.power(float(vocab) + 1.0, u)
    else:
        e = 1.0 - a
        x = np.power((np.power(float(vocab) + 1.0, e) - 1.0) * u + 1.0, 1.0 / e)
    return np.clip(np.floor(x), 1, vocab).astype(np.uint64)


def iter_planted(cfg: PlantedConfig) -> Iterator[PlantedChunk]:
    """Generate the rows chunk by chunk (chunk c is seeded by (seed, c))."""
    model = _Planted(cfg)
    for c, start in enumerate(range(0, cfg.rows, cfg.chunk_rows)):
        n = min(cfg.chunk_rows, cfg.rows - start)
        rng = np.random.default_rng([cfg.seed, c])
        t = np.arange(start, start + n, dtype=np.int64)
        theta = model.angle(t)
        cats = np.empty((n, N_CAT), dtype=np.uint32)
        logit = np.full(n, cfg.bias, dtype=np.float64)
        miss_rate = cfg.missing_cat * (np.arange(N_CAT) % 4) / 1.5
        cat_missing = rng.random((n, N_CAT)) < miss_rate[None, :]
        for f in range(N_CAT):
            ranks = _zipf_ranks(rng, cfg.zipf_exponents[f], cfg.vocab, n)
            ids = (mix64(ranks ^ model.id_salt[f]) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
            cats[:, f] = ids
            w = model.cat_weight(f, ids, theta)
            logit += np.where(cat_missing[:, f], 0.0, w)
        z = rng.normal(size=(n, N_DENSE))
        counts = np.floor(np.expm1(model.dense_mu + model.dense_sigma * z).clip(0, 9.0e9))
        dense_missing = rng.random((n, N_DENSE)) < cfg.missing_dense
        dense = np.where(dense_missing, -1, counts).astype(np.int64)
        std = (np.log1p(counts) - model.dense_mu) / model.dense_sigma
        dense_part = np.where(dense_missing, 0.0, std * model.dense_weight(theta))
        logit += dense_part.sum(axis=1)
        prob = 1.0 / (1.0 + np.exp(-logit))
        labels = (rng.random(n) < prob).astype(np.int8)
        yield PlantedChunk(start, labels, dense, cats, cat_missing, prob, logit)


def format_criteo(
    labels: npt.NDArray[np.int8],
    dense: npt.NDArray[np.int64],
    cats: npt.NDArray[np.uint32],
    cat_missing: npt.NDArray[np.bool_],
) -> bytes:
    """Vectorised TSV formatting: build a fixed-width byte matrix, then drop the padding."""
    n = labels.size
    width = 2 + N_DENSE * (_DENSE_DIGITS + 1) + N_CAT * 9
    mat = np.full((n, width), ord("\t"), dtype=np.uint8)
    keep = np.ones((n, width), dtype=bool)
    mat[:, 0] = labels.astype(np.uint8) + ord("0")
    d = np.maximum(dense, 0)
    if np.any(d >= 10**_DENSE_DIGITS):
        raise ValueError(f"dense values must be < 10**{_DENSE_DIGITS}")
    pow10 = 10 ** np.arange(_DENSE_DIGITS - 1, -1, -1, dtype=np.int64)
    digits = (d[:, :, None] // pow10[None, None, :]) % 10
    ndig = 1 + (d[:, :, None] >= pow10[None, None, :-1]).sum(axis=2)  # exact, no float log10
    pos = np.arange(_DENSE_DIGITS)[None, None, :]
    dkeep = (pos >= _DENSE_DIGITS - ndig[:, :, None]) & (dense[:, :, None] >= 0)
    block = mat[:, 2 : 2 + N_DENSE * (_DENSE_DIGITS + 1)].reshape(n, N_DENSE, _DENSE_DIGITS + 1)
    block[:, :, :_DENSE_DIGITS] = digits.astype(np.uint8) + ord("0")
    kblock = keep[:, 2 : 2 + N_DENSE * (_DENSE_DIGITS + 1)].reshape(n, N_DENSE, _DENSE_DIGITS + 1)
    kblock[:, :, :_DENSE_DIGITS] = dkeep
    off = 2 + N_DENSE * (_DENSE_DIGITS + 1)
    shifts = np.arange(28, -1, -4, dtype=np.uint32)
    nib = (cats[:, :, None] >> shifts[None, None, :]) & np.uint32(0xF)
    cblock = mat[:, off:].reshape(n, N_CAT, 9)
    cblock[:, :, :8] = _HEX[nib]
    ckeep = keep[:, off:].reshape(n, N_CAT, 9)
    ckeep[:, :, :8] = ~cat_missing[:, :, None]
    mat[:, -1] = ord("\n")
    return bytes(mat[keep].tobytes())


class _AucHistogram:
    """Streaming AUC of scores (logits) against labels via a fine histogram (ties count 1/2)."""

    def __init__(self) -> None:
        self.pos = np.zeros(_AUC_BINS, np.int64)
        self.neg = np.zeros(_AUC_BINS, np.int64)
        self.logloss_sum = 0.0

    def add(self, logit: npt.NDArray[np.float64], labels: npt.NDArray[np.int8]) -> None:
        scaled = (logit + _LOGIT_RANGE) / (2 * _LOGIT_RANGE) * _AUC_BINS
        b = np.clip(scaled.astype(np.int64), 0, _AUC_BINS - 1)
        y = labels.astype(bool)
        self.pos += np.bincount(b[y], minlength=_AUC_BINS)
        self.neg += np.bincount(b[~y], minlength=_AUC_BINS)
        # log loss of the planted probabilities: softplus(-z) for y=1, softplus(z) for y=0
        z = np.where(y, -logit, logit)
        self.logloss_sum += float(np.logaddexp(0.0, z).sum())

    def auc(self) -> float:
        p, n = int(self.pos.sum()), int(self.neg.sum())
        if p == 0 or n == 0:
            return float("nan")
        neg_below = np.cumsum(self.neg) - self.neg
        return float((self.pos * (neg_below + 0.5 * self.neg)).sum() / (p * n))

    def logloss(self) -> float:
        total = int(self.pos.sum() + self.neg.sum())
        return self.logloss_sum / total if total else float("nan")


def generate(
    cfg: PlantedConfig,
    out: str | os.PathLike[str],
    progress: Callable[[int, int, float], None] | None = None,
) -> GenerationResult:
    """Stream ``cfg.rows`` rows to ``out`` (atomically) and write ``out + '.planted.json'``."""
    dest = Path(out)
    hist = _AucHistogram()
    t0 = time.perf_counter()
    done = 0
    with atomic_writer(dest) as f:
        for ch in iter_planted(cfg):
            f.write(format_criteo(ch.labels, ch.dense, ch.cats, ch.cat_missing))
            hist.add(ch.logit, ch.labels)
            done += ch.labels.size
            if progress is not None:
                progress(done, cfg.rows, time.perf_counter() - t0)
    result = GenerationResult(
        path=str(dest),
        meta_path=str(dest) + ".planted.json",
        rows=done,
        positives=int(hist.pos.sum()),
        ceiling_auc=hist.auc(),
        ceiling_logloss=hist.logloss(),
        seconds=time.perf_counter() - t0,
    )
    meta = {"config": asdict(cfg), "result": asdict(result)}
    Path(result.meta_path).write_text(json.dumps(meta, indent=2) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m coadapt.sparse.datasets",
        description="Write Criteo-format TSV from a planted logistic model (ceiling AUC included).",
    )
    ap.add_argument("--rows", type=int, required=True, help="number of rows to write")
    ap.add_argument("--out", required=True, help="output TSV path (+ OUT.planted.json)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--drift",
        type=int,
        default=0,
        metavar="ROWS",
        help="rows per full rotation of the planted weights (0 = stationary)",
    )
    ap.add_argument("--vocab", type=int, default=10**8, help="possible values per field")
    ap.add_argument("--zipf-min", type=float, default=1.05, help="smallest Zipf exponent")
    ap.add_argument("--zipf-max", type=float, default=1.6, help="largest Zipf exponent")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = ap.parse_args(argv)
    try:
        cfg = PlantedConfig(
            rows=args.rows,
            seed=args.seed,
            vocab=args.vocab,
            drift_period=args.drift,
            zipf_min=args.zipf_min,
            zipf_max=args.zipf_max,
        )
    except ValueError as exc:
        ap.error(str(exc))

    def show(done: int, total: int, secs: float) -> None:
        rate = done / secs if secs > 0 else 0.0
        print(f"\r{done:>12,}/{total:,} rows  {rate:,.0f} rows/s", end="", file=sys.stderr)

    res = generate(cfg, args.out, None if args.quiet else show)
    if not args.quiet:
        print(file=sys.stderr)
    print(json.dumps(asdict(res)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

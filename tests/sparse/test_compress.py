from __future__ import annotations

import numpy as np
import pytest

from coadapt.sparse.compress import (
    CompressionConfig,
    GradientCompressor,
    ResidualTable,
    decode,
    is_empty,
    raw_nbytes,
)


def _zipf_push(
    rng: np.random.Generator, n: int, dim: int, space: int = 10**8
) -> tuple[np.ndarray, np.ndarray]:
    """Unique ids drawn Zipf-like from a huge space; summed gradients grow with frequency."""
    draws = rng.zipf(1.2, size=4 * n) % space
    ids, counts = np.unique(draws.astype(np.uint64) * np.uint64(2654435761), return_counts=True)
    ids, counts = ids[:n], counts[:n]
    grads = rng.standard_normal((ids.size, dim)).astype(np.float32)
    grads *= (0.01 * np.sqrt(counts)).astype(np.float32)[:, None]
    return ids, grads


def _no_ef(**kw: object) -> CompressionConfig:
    return CompressionConfig(error_feedback=False, **kw)  # type: ignore[arg-type]


def test_int8_roundtrip_error_is_within_half_a_step() -> None:
    rng = np.random.default_rng(0)
    ids = np.arange(500, dtype=np.uint64) * np.uint64(977)
    x = (rng.standard_normal((500, 32)) * rng.uniform(0.001, 10, size=(500, 1))).astype(np.float32)
    comp = GradientCompressor(32, _no_ef(values="int8"))
    out_ids, y = decode(comp.encode(ids, x))
    assert (out_ids == ids).all()
    step = np.abs(x).max(axis=1, keepdims=True) / 127
    assert (np.abs(y - x) <= step / 2 * (1 + 1e-5)).all()
    assert comp.ratio == pytest.approx((500 * (8 + 4 + 32) + 24) / raw_nbytes(500, 32))


def test_fp32_roundtrip_is_exact_and_zero_rows_survive() -> None:
    x = np.zeros((3, 5), dtype=np.float32)
    x[1] = [1.5, -2.0, 0.0, 3.25, 1e-30]
    ids = np.array([7, 2**64 - 1, 0], dtype=np.uint64)
    for codec in ("fp32", "int8", "ternary"):
        out_ids, y = decode(GradientCompressor(5, _no_ef(values=codec)).encode(ids, x))
        assert (out_ids == ids).all()
        assert (y[[0, 2]] == 0).all()
        if codec == "fp32":
            assert (y == x).all()


def test_ternary_deterministic_and_stochastic_bounds() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((200, 17)).astype(np.float32)
    ids = np.arange(200, dtype=np.uint64)
    _, y = decode(GradientCompressor(17, _no_ef(values="ternary")).encode(ids, x))
    scale = np.abs(x).max(axis=1, keepdims=True)
    assert (np.abs(y - x) <= scale / 2 * (1 + 1e-6)).all()
    assert set(np.unique(np.round(y / scale, 6))) <= {-1.0, 0.0, 1.0}
    # Stochastic rounding: |error| < scale and unbiased on average over many seeds.
    total = np.zeros_like(x, dtype=np.float64)
    reps = 400
    for seed in range(reps):
        cfg = _no_ef(values="ternary", stochastic=True, seed=seed)
        _, ys = decode(GradientCompressor(17, cfg).encode(ids, x))
        assert (np.abs(ys - x) < scale * (1 + 1e-6)).all()
        total += ys
    bias = np.abs(total / reps - x) / scale
    assert bias.mean() < 0.03
    # Seeded: the same seed gives the same bytes.
    a = GradientCompressor(17, _no_ef(values="ternary", stochastic=True, seed=5)).encode(ids, x)
    b = GradientCompressor(17, _no_ef(values="ternary", stochastic=True, seed=5)).encode(ids, x)
    assert a == b


def test_topk_sends_the_largest_rows_and_threshold_the_large_elements() -> None:
    x = np.zeros((100, 8), dtype=np.float32)
    x[:, 0] = np.arange(100, dtype=np.float32)
    ids = np.arange(100, dtype=np.uint64) + np.uint64(1000)
    out_ids, y = decode(
        GradientCompressor(8, _no_ef(values="fp32", sparsify="topk", density=0.05)).encode(ids, x)
    )
    assert list(out_ids) == list(range(1095, 1100))
    assert (y == x[95:]).all()
    cfg = _no_ef(values="int8", sparsify="threshold", threshold=97.5)
    out_ids, y = decode(GradientCompressor(8, cfg).encode(ids, x))
    assert list(out_ids) == [1098, 1099]
    np.testing.assert_allclose(y[:, 0], [98, 99], rtol=1e-2)


@pytest.mark.parametrize(
    "cfg",
    [
        CompressionConfig(values="int8", sparsify="topk", density=0.01),
        CompressionConfig(values="ternary", stochastic=True, sparsify="topk", density=0.1),
        CompressionConfig(values="ternary"),
        CompressionConfig(values="int8", sparsify="threshold", threshold=0.02),
        CompressionConfig(values="int8", sparsify="topk", density=0.05, residual_capacity=300),
    ],
    ids=["topk-int8", "topk-ternary-stoch", "ternary", "threshold", "topk-evicting"],
)
def test_error_feedback_never_loses_gradient_mass(cfg: CompressionConfig) -> None:
    dim = 8
    rng = np.random.default_rng(2)
    comp = GradientCompressor(dim, cfg)
    raw_sum = np.zeros(dim)
    applied = np.zeros(dim)
    # Ids repeat across pushes (a small space), so residuals are picked up again.
    for _ in range(60):
        ids = np.unique(rng.integers(0, 2000, size=400)).astype(np.uint64)
        g = rng.standard_normal((ids.size, dim)).astype(np.float32) * np.float32(0.05)
        raw_sum += g.sum(axis=0, dtype=np.float64)
        _, rows = decode(comp.encode(ids, g))
        applied += rows.sum(axis=0, dtype=np.float64)
    pending = comp.residuals.total()
    np.testing.assert_allclose(applied + pending, raw_sum, atol=1e-3)
    assert np.abs(pending).sum() > 0 or cfg.sparsify == "none"
    assert len(comp.residuals) <= cfg.residual_capacity
    if cfg.residual_capacity == 300:
        assert comp.flushed_rows > 0
    # flush() delivers everything still pending, exactly.
    _, rest = decode(comp.flush())
    np.testing.assert_allclose(applied + rest.sum(axis=0, dtype=np.float64), raw_sum, atol=1e-3)
    assert len(comp.residuals) == 0


def test_drop_policy_counts_what_it_discards() -> None:
    dim = 4
    cfg = CompressionConfig(
        values="fp32", sparsify="topk", density=0.1, residual_capacity=50, on_evict="drop"
    )
    comp = GradientCompressor(dim, cfg)
    rng = np.random.default_rng(3)
    raw = applied = 0.0
    for step in range(20):
        ids = np.arange(step * 100, step * 100 + 100, dtype=np.uint64)  # never repeat
        g = np.abs(rng.standard_normal((100, dim))).astype(np.float32)
        raw += float(g.sum(dtype=np.float64))
        applied += float(decode(comp.encode(ids, g))[1].sum(dtype=np.float64))
    pending = float(comp.residuals.total().sum())
    assert comp.dropped_l1 > 0
    assert applied + pending + comp.dropped_l1 == pytest.approx(raw, rel=1e-6)


def test_topk_one_percent_int8_saves_99_percent_of_bytes_on_zipf_gradients() -> None:
    dim = 64
    rng = np.random.default_rng(4)
    comp = GradientCompressor(dim, CompressionConfig(values="int8", sparsify="topk", density=0.01))
    for _ in range(10):
        ids, g = _zipf_push(rng, 20_000, dim)
        decode(comp.encode(ids, g))
    assert comp.bytes_raw > 10 * raw_nbytes(15_000, dim)
    assert comp.ratio <= 0.01, comp.ratio
    assert comp.flushed_rows == 0


def test_residual_table_lookup_insert_evict() -> None:
    t = ResidualTable(2, capacity=10)
    t.insert(np.array([5, 1, 9], dtype=np.uint64), np.arange(6, dtype=np.float32).reshape(3, 2), 1)
    t.insert(np.array([3], dtype=np.uint64), np.full((1, 2), 7, dtype=np.float32), 2)
    at, rows = t.pop(np.array([9, 4, 5], dtype=np.uint64))
    assert list(at) == [0, 2]
    assert rows.tolist() == [[4, 5], [0, 1]]
    ids, rows = t.evict_oldest(1)
    assert list(ids) == [1] and rows.tolist() == [[2, 3]]
    assert len(t) == 1 and t.total().tolist() == [7, 7]


def test_bad_input_is_rejected_clearly() -> None:
    comp = GradientCompressor(4)
    with pytest.raises(ValueError, match="unique"):
        comp.encode(np.array([1, 1], dtype=np.uint64), np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match=r"float32 \(2, 4\)"):
        comp.encode(np.array([1, 2], dtype=np.uint64), np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="density"):
        CompressionConfig(density=0.0)
    with pytest.raises(ValueError, match="values must be one of"):
        CompressionConfig(values="int4")  # type: ignore[arg-type]
    good = comp.encode(np.array([1, 2], dtype=np.uint64), np.ones((2, 4), np.float32))
    with pytest.raises(ValueError, match="truncated"):
        decode(good[:-3])
    with pytest.raises(ValueError, match="magic"):
        decode(b"XXXX" + good[4:])


def test_stochastic_k_sends_density_rows_on_average_and_keeps_the_rest() -> None:
    """k = floor(density * n + u): small pushes often send nothing; no mass is lost."""
    cfg = CompressionConfig("fp32", "topk", density=0.01, k_rounding="stochastic", seed=3)
    comp = GradientCompressor(4, cfg)
    rng = np.random.default_rng(0)
    ids = np.arange(40, dtype=np.uint64)
    sent_rows, empty, delivered = 0, 0, np.zeros(4, np.float32)
    total = np.zeros(4, np.float64)
    for _ in range(400):
        g = rng.standard_normal((40, 4)).astype(np.float32)
        total += g.sum(axis=0)
        payload = comp.encode(ids, g)
        got_ids, got = decode(payload)
        sent_rows += got_ids.size
        empty += is_empty(payload)
        delivered += got.sum(axis=0)
    assert 0.3 * 400 < sent_rows < 0.5 * 400  # E = 0.4 rows per push
    assert empty > 200  # most pushes carry nothing and need not be sent
    np.testing.assert_allclose(delivered + comp.residuals.total(), total, rtol=1e-4, atol=1e-3)
    assert not is_empty(comp.flush()) and is_empty(
        comp.encode(ids[:0], np.zeros((0, 4), np.float32))
    )


def test_k_rounding_is_validated() -> None:
    with pytest.raises(ValueError, match="k_rounding"):
        CompressionConfig(k_rounding="floor")  # type: ignore[arg-type]

"""One push payload per shard (ShardCompressor): round trip, cross-table top-k, error
feedback, byte accounting and corrupt payloads."""

from __future__ import annotations

import numpy as np
import pytest

from coadapt.sparse.compress import CompressionConfig, ShardCompressor, decode_shard, raw_nbytes

DIMS = [1, 8, 1, 8]


def _push(
    rng: np.random.Generator, n: int = 40, space: int = 400
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for t, d in enumerate(DIMS):
        ids = np.unique(rng.integers(0, space, n)).astype(np.uint64) * np.uint64(0x9E3779B1)
        out[t] = (ids, (rng.standard_normal((ids.size, d)) * 0.05).astype(np.float32))
    return out


def _applied(payload: bytes) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    return {t: (i, g) for t, i, g in decode_shard(payload, DIMS)} if payload else {}


def test_fp32_round_trip_is_exact_for_every_table() -> None:
    rng = np.random.default_rng(0)
    push = _push(rng)
    comp = ShardCompressor(DIMS, CompressionConfig(values="fp32", error_feedback=False))
    got = _applied(comp.encode(push))
    assert sorted(got) == [0, 1, 2, 3]
    for t, (ids, g) in push.items():
        assert (got[t][0] == ids).all() and (got[t][1] == g).all()


@pytest.mark.parametrize("codec", ["int8", "ternary"])
def test_quantised_rows_decode_within_one_step_of_the_bf16_scale(codec: str) -> None:
    rng = np.random.default_rng(1)
    push = _push(rng)
    cfg = CompressionConfig(values=codec, error_feedback=False)  # type: ignore[arg-type]
    got = _applied(ShardCompressor(DIMS, cfg).encode(push))
    for t, (ids, g) in push.items():
        amax = np.abs(g).max(axis=1, keepdims=True)
        step = amax / (127 if codec == "int8" else 1)
        assert (got[t][0] == ids).all()
        assert (np.abs(got[t][1] - g) <= step * 0.51 + amax * 2**-8).all()


def test_topk_budget_is_shared_across_tables_and_picks_the_largest_rows() -> None:
    ids = np.arange(100, dtype=np.uint64)
    small = np.full((100, 1), 0.01, np.float32)
    big = np.full((100, 8), 0.01, np.float32)
    big[[3, 50, 97]] = 5.0  # the three largest rows of all 400 live in table 1
    push = {0: (ids, small), 1: (ids, big), 2: (ids, small.copy()), 3: (ids, big.copy() * 0)}
    cfg = CompressionConfig(values="fp32", sparsify="topk", density=3 / 400)
    got = _applied(ShardCompressor(DIMS, cfg).encode(push))
    assert sorted(got) == [1]  # tables without a chosen row (nor a flush) take no bytes
    assert got[1][0].tolist() == [3, 50, 97]


@pytest.mark.parametrize(
    "cfg",
    [
        CompressionConfig(values="ternary", sparsify="topk", density=0.01),
        CompressionConfig(values="int8", sparsify="topk", density=0.05, k_rounding="stochastic"),
        CompressionConfig(values="int8", sparsify="threshold", threshold=0.05),
        CompressionConfig(values="ternary", sparsify="topk", density=0.05, residual_capacity=60),
    ],
    ids=["topk-ternary", "topk-stochastic", "threshold", "topk-evicting"],
)
def test_error_feedback_never_loses_gradient_mass_in_any_table(cfg: CompressionConfig) -> None:
    rng = np.random.default_rng(2)
    comp = ShardCompressor(DIMS, cfg)
    raw = [np.zeros(d) for d in DIMS]
    applied = [np.zeros(d) for d in DIMS]
    for _ in range(50):
        push = _push(rng)
        for t, (_, g) in push.items():
            raw[t] += g.sum(axis=0, dtype=np.float64)
        for t, (_, g) in _applied(comp.encode(push)).items():
            applied[t] += g.sum(axis=0, dtype=np.float64)
    assert comp.residual_rows > 0
    if cfg.residual_capacity == 60:
        assert comp.flushed_rows > 0
    for t in range(len(DIMS)):
        np.testing.assert_allclose(applied[t] + comp.residual_total(t), raw[t], atol=1e-4)
    for t, (_, g) in _applied(comp.flush()).items():  # flush delivers the rest, exactly
        applied[t] += g.sum(axis=0, dtype=np.float64)
    for t in range(len(DIMS)):
        np.testing.assert_allclose(applied[t], raw[t], atol=1e-4)
    assert comp.residual_rows == 0 and comp.flush() == b""


def test_payload_bytes_are_rows_plus_a_few_bytes_per_table() -> None:
    rng = np.random.default_rng(3)
    push = _push(rng)
    cfg = CompressionConfig(values="int8", error_feedback=False)
    comp = ShardCompressor(DIMS, cfg)
    payload = comp.encode(push)
    rows = sum(ids.size for ids, _ in push.values())
    values = sum(ids.size * d for (ids, _), d in zip(push.values(), DIMS, strict=True))
    # 3-byte header, 1-byte table bitmap, 2 one-byte varints per table; 8-byte id and 2-byte
    # bf16 scale per row; 1 byte per int8 value.
    assert len(payload) == 3 + 1 + 2 * 4 + rows * (8 + 2) + values
    assert comp.bytes_sent == len(payload)
    pairs = zip(push.values(), DIMS, strict=True)
    assert comp.bytes_raw == sum(raw_nbytes(i.size, d) for (i, _), d in pairs)


def test_an_all_residual_push_sends_nothing() -> None:
    comp = ShardCompressor(
        DIMS, CompressionConfig(sparsify="topk", density=0.001, k_rounding="stochastic", seed=1)
    )
    push = {0: (np.arange(5, dtype=np.uint64), np.ones((5, 1), np.float32))}
    payloads = [comp.encode(push) for _ in range(20)]
    assert b"" in payloads  # E[k] = 0.005 rows: most pushes select nothing and send nothing


def test_bad_input_and_corrupt_payloads_are_clear_errors() -> None:
    comp = ShardCompressor(DIMS, CompressionConfig(values="int8"))
    ids = np.arange(3, dtype=np.uint64)
    with pytest.raises(ValueError, match=r"table 1: grads must be float32 \(3, 8\)"):
        comp.encode({1: (ids, np.zeros((3, 1), np.float32))})
    with pytest.raises(ValueError, match="table index 9 out of range"):
        comp.encode({9: (ids, np.zeros((3, 1), np.float32))})
    with pytest.raises(ValueError, match="ids must be unique"):
        comp.encode({0: (np.zeros(2, np.uint64), np.zeros((2, 1), np.float32))})
    payload = comp.encode({1: (ids, np.ones((3, 8), np.float32))})
    with pytest.raises(ValueError, match="truncated"):
        decode_shard(payload[:-3], DIMS)
    with pytest.raises(ValueError, match="trailing"):
        decode_shard(payload + b"\0", DIMS)
    with pytest.raises(ValueError, match="magic"):
        decode_shard(b"\0" + payload[1:], DIMS)
    with pytest.raises(ValueError, match="scope must be 'shard' or 'table'"):
        CompressionConfig(scope="row")  # type: ignore[arg-type]

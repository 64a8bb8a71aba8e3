"""SPEEDUP (eq. 16) relative to a reference allocation."""

from __future__ import annotations

import numpy as np
import pytest

from coadapt.goodput import BatchLimits, GoodputModel, GradParams, PerfParams, SpeedupFunction

MODEL = GoodputModel(PerfParams(0.05, 0.001, 0.05, 0.005, 0.2, 0.02, 1.5), GradParams(1, 30), 32)
LIMITS = BatchLimits(32, 4096, 8, 256)


def test_speedup_is_one_at_the_reference() -> None:
    fn = SpeedupFunction(MODEL, LIMITS, ref_nodes=1, ref_replicas=4)
    assert float(fn(1, 4)) == pytest.approx(1.0)
    expected = MODEL.optimize(2, 8, LIMITS).goodput / MODEL.optimize(1, 4, LIMITS).goodput
    assert float(fn(2, 8)) == pytest.approx(float(expected))


def test_no_model_means_perfect_scaling() -> None:
    fn = SpeedupFunction(None, LIMITS, ref_nodes=1, ref_replicas=4)
    np.testing.assert_allclose(fn([1, 1, 2], [2, 4, 8]), [0.5, 1.0, 2.0])
    assert fn.scalar(1, 0) == 0.0


def test_zero_replicas_zero_speedup_and_memo_consistency() -> None:
    fn = SpeedupFunction(MODEL, LIMITS, prefetch=(np.array([1, 1]), np.array([2, 4])))
    first = fn([0, 1, 1], [0, 2, 4])
    assert first[0] == 0.0
    assert fn.scalar(1, 4) == pytest.approx(float(first[2]))


def test_bad_reference_rejected() -> None:
    with pytest.raises(ValueError, match="reference"):
        SpeedupFunction(MODEL, LIMITS, ref_nodes=2, ref_replicas=1)


def test_every_multi_node_spread_is_priced_once_and_exactly() -> None:
    """The model reads nodes only as one or several (eq. 11), so (3, 8) and (2, 8) share a
    memo entry and a prefetch of K GPUs on n and n + 1 nodes asks each shape once; every value
    equals the model's own price of that exact allocation."""
    k = np.arange(1, 33)
    n = -(-k // 4)
    prefetch = (np.concatenate([n, n + 1]), np.concatenate([k, k]))
    built = SpeedupFunction.build_many([MODEL], [LIMITS], 1, 4, [prefetch])[0]
    single = SpeedupFunction(MODEL, LIMITS, ref_nodes=1, ref_replicas=4, prefetch=prefetch)
    nodes, gpus = prefetch
    shapes = {(min(a, 2), b) for a, b in zip(nodes.tolist(), gpus.tolist(), strict=True)}
    assert len(built._memo) == len(shapes)
    ref = MODEL.optimize(1, 4, LIMITS).goodput
    for a, b in zip(nodes.tolist(), gpus.tolist(), strict=True):
        exact = float(MODEL.optimize(a, b, LIMITS).goodput / ref)
        assert built.scalar(a, b) == pytest.approx(exact, rel=1e-12)
        assert single.scalar(a, b) == built.scalar(a, b)
    np.testing.assert_array_equal(built(nodes, gpus), single(nodes, gpus))
    assert built.scalar(7, 24) == built.scalar(2, 24)


def _jobs(
    seed: int,
) -> tuple[
    list[GoodputModel | None], list[BatchLimits], list[tuple[np.ndarray, np.ndarray] | None]
]:
    """Twelve jobs: some without a model or a prefetch, some whose reference no batch split
    can run (the one-GPU fallback)."""
    from tests.policies.builders import random_model

    rng = np.random.default_rng(seed)
    models: list[GoodputModel | None] = []
    limits: list[BatchLimits] = []
    prefetch: list[tuple[np.ndarray, np.ndarray] | None] = []
    for i in range(12):
        model, lim = random_model(rng)
        if i % 5 == 4:
            lim = BatchLimits(lim.init_batch_size, lim.init_batch_size, 64, 64)  # ref infeasible
        models.append(None if i % 7 == 3 else model)
        limits.append(lim)
        cap = int(rng.integers(1, 40))
        k = np.arange(1, cap + 1)
        n = -(-k // 4)
        prefetch.append(None if i % 6 == 5 else (np.concatenate([n, n + 1]), np.tile(k, 2)))
    return models, limits, prefetch


@pytest.mark.parametrize("seed", range(4))
def test_build_many_equals_each_jobs_own_constructor_bit_for_bit(seed: int) -> None:
    """The bulk build (one batch-choice call, whole-array bookkeeping) gives every job the
    memo and reference its own constructor gives."""
    models, limits, prefetch = _jobs(seed)
    built = SpeedupFunction.build_many(models, limits, 2, 8, prefetch)
    for m, lim, pre, fn in zip(models, limits, prefetch, built, strict=True):
        own = SpeedupFunction(m, lim, ref_nodes=2, ref_replicas=8, prefetch=pre)
        assert fn.reference_goodput == own.reference_goodput
        assert fn._memo == own._memo
        assert (fn.model is None) == (m is None)


@pytest.mark.parametrize("seed", range(4))
def test_deferred_tables_fill_to_the_same_values(seed: int) -> None:
    """Deferred build: references at once, the rest on the first look-up that misses (one
    job) or in one call for many (fill_many); both end with the eager build's memo."""
    models, limits, prefetch = _jobs(seed)
    eager = SpeedupFunction.build_many(models, limits, 2, 8, prefetch)
    lazy = SpeedupFunction.build_many(models, limits, 2, 8, prefetch, defer=True)
    for fn, want in zip(lazy, eager, strict=True):
        assert fn.reference_goodput == want.reference_goodput
        assert len(fn._memo) <= 2  # the reference and one GPU only
    first, rest = lazy[0], lazy[1:]
    key = max(set(eager[0]._memo) - set(first._memo))
    assert first.scalar(*key) == eager[0]._memo[key]  # a miss fills the job's whole table
    SpeedupFunction.fill_many(rest)
    for fn, want in zip(lazy, eager, strict=True):
        assert fn._memo == want._memo
        assert fn._pending is None


def test_a_window_of_gpus_is_priced_first_and_the_rest_on_a_miss() -> None:
    """fill_many(upto=...) prices each job's shapes of at most that many GPUs; a look-up
    past them prices the rest; the memo ends as the eager build's."""
    models, limits, prefetch = _jobs(5)
    eager = SpeedupFunction.build_many(models, limits, 2, 8, prefetch)
    lazy = SpeedupFunction.build_many(models, limits, 2, 8, prefetch, defer=True)
    SpeedupFunction.fill_many(lazy, [6] * len(lazy))
    memos = [dict(fn._memo) for fn in lazy]
    SpeedupFunction.fill_many(lazy, [6] * len(lazy))  # asked again: nothing left within 6
    assert [fn._memo for fn in lazy] == memos
    assert all(fn._pending is None or fn._pending_least > 6 for fn in lazy)
    for fn, want in zip(lazy, eager, strict=True):
        small = {key: v for key, v in want._memo.items() if key[1] <= 6}
        assert {key: v for key, v in fn._memo.items() if key[1] <= 6} == small
        beyond = sorted(set(want._memo) - set(fn._memo))
        if beyond:
            assert all(key[1] > 6 for key in beyond) and fn._pending is not None
            assert fn.scalar(*beyond[-1]) == want._memo[beyond[-1]]
        assert fn._memo == want._memo

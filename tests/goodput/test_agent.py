"""The in-job agent's batch rule: noise gate, 2x trust region, adoption threshold, and the
artifact-compatible mode the simulator reproduces the paper with."""

from __future__ import annotations

import pytest

from coadapt.goodput import BatchLimits, GoodputModel, GradParams, PerfParams
from coadapt.goodput.agent import (
    MIN_MEASUREMENTS,
    MIN_STEPS_PER_EPOCH,
    MIN_TIMED_TO_SHRINK,
    Reason,
    choose_batch,
    epoch_limits,
    noise_readings,
    split_total,
    trust_limits,
)

PERF = PerfParams(
    alpha_grad=0.1,
    beta_grad=0.01,
    alpha_local=0.05,
    beta_local=0.02,
    alpha_node=0.3,
    beta_node=0.05,
    gamma=1.0,
)
# Very noisy gradients: large batches are nearly as efficient as small ones, so the optimum
# is far above the initial batch of 32.
NOISY = GoodputModel(PERF, GradParams(sqr=0.001, var=10.0), 32)
LIMITS = BatchLimits(init_batch_size=32, max_batch_size=4096, max_local_bsz=512)
READY = MIN_MEASUREMENTS


def test_no_model_keeps_the_current_batch() -> None:
    choice = choose_batch(None, LIMITS, (32, 0), 1, 1, READY)
    assert choice.config == (32, 0) and choice.reason is Reason.NO_MODEL


def test_gate_keeps_the_batch_until_enough_noise_measurements() -> None:
    gated = choose_batch(NOISY, LIMITS, (16, 0), 1, 2, READY - 1)
    assert gated.config == (16, 0) and gated.reason is Reason.GATED
    ready = choose_batch(NOISY, LIMITS, (16, 0), 1, 2, READY)
    assert ready.reason is Reason.ADOPTED and ready.config != (16, 0)


def test_pinned_batch_is_not_gated() -> None:
    pinned = BatchLimits(32, 256, max_local_bsz=64, pinned_batch=256)
    choice = choose_batch(NOISY, pinned, (64, 3), 1, 1, 0)
    assert choice.reason is not Reason.GATED


def test_trust_region_grows_the_batch_at_most_2x_per_retune() -> None:
    free = choose_batch(NOISY, LIMITS, (16, 0), 1, 2, READY, artifact_compatible=True)
    m, s = free.config
    assert 2 * m * (s + 1) > 64  # unguarded, the optimum is well past 2x
    step = (16, 0)
    for _ in range(3):  # each re-tune at most doubles M = 2 m (s + 1)
        guarded = choose_batch(NOISY, LIMITS, step, 1, 2, READY)
        assert guarded.reason is Reason.ADOPTED
        assert 2 * guarded.config[0] * (guarded.config[1] + 1) == 2 * 2 * step[0] * (step[1] + 1)
        step = guarded.config
    assert trust_limits(LIMITS, 100).max_batch_size == 200
    assert trust_limits(LIMITS, 4000).max_batch_size == 4096
    assert trust_limits(LIMITS, 8).max_batch_size == 32  # never below M0


def test_small_predicted_gains_are_not_adopted() -> None:
    # A 32% predicted gain is adopted at the default 5% threshold, not at a 50% one.
    gain = choose_batch(NOISY, LIMITS, (16, 0), 1, 2, READY)
    assert gain.reason is Reason.ADOPTED
    assert 1.05 < gain.best_goodput / gain.current_goodput < 1.5
    stuck = choose_batch(NOISY, LIMITS, (16, 0), 1, 2, READY, threshold=0.5)
    assert stuck.config == (16, 0) and stuck.reason is Reason.KEPT
    assert stuck.best == gain.best


def test_artifact_mode_is_the_plain_optimum_over_the_full_limits() -> None:
    choice = choose_batch(NOISY, LIMITS, (32, 0), 2, 8, 0, artifact_compatible=True)
    opt = NOISY.optimize(2, 8, LIMITS)
    assert choice.config == (int(opt.local_bsz), int(opt.accum_steps))
    assert choice.reason is Reason.ARTIFACT
    assert choice.best_goodput == pytest.approx(float(opt.goodput))


def test_split_total_uses_the_fewest_accumulation_steps_that_fit() -> None:
    assert split_total(256, 4, None) == (64, 0)
    assert split_total(256, 2, 64) == (64, 1)
    assert split_total(100, 3, 16) == (12, 2)
    with pytest.raises(ValueError, match="replicas >= 1"):
        split_total(10, 0, None)


def test_one_replica_grows_without_accumulating_in_the_shipped_mode() -> None:
    """The library measures noise between consecutive steps, so one replica may grow its
    micro-batch; the artifact measures it only between micro-batches and accumulates."""
    shipped = choose_batch(NOISY, LIMITS, (32, 0), 1, 1, READY)
    assert shipped.reason is Reason.ADOPTED and shipped.config == (64, 0)
    artifact = choose_batch(NOISY, LIMITS, (32, 0), 1, 1, READY, artifact_compatible=True)
    assert artifact.config[1] >= 1  # past M0 on one replica: at least one accumulation step
    assert trust_limits(LIMITS, 32).accumulate_to_measure is False
    assert LIMITS.accumulate_to_measure is True  # the scheduler's and simulator's default


def test_explore_tries_a_larger_optimum_below_the_threshold() -> None:
    """With one micro-batch size timed, the model's fixed/per-sample split is a prior: a
    larger optimum is tried even when predicted to gain less than the threshold."""
    gain = choose_batch(NOISY, LIMITS, (16, 0), 1, 2, READY)
    assert gain.reason is Reason.ADOPTED  # the optimum, ~32% better
    kept = choose_batch(NOISY, LIMITS, (16, 0), 1, 2, READY, threshold=0.5)
    assert kept.reason is Reason.KEPT
    tried = choose_batch(NOISY, LIMITS, (16, 0), 1, 2, READY, threshold=0.5, explore=True)
    assert tried.reason is Reason.ADOPTED and tried.config == gain.config
    # exploring never waives the threshold for a smaller batch
    big = (128, 0)
    shrink = choose_batch(
        GoodputModel(PERF, GradParams(sqr=1.0, var=1e-6), 32), LIMITS, big, 1, 2, READY
    )
    shrink_explore = choose_batch(
        GoodputModel(PERF, GradParams(sqr=1.0, var=1e-6), 32),
        LIMITS,
        big,
        1,
        2,
        READY,
        threshold=100.0,
        explore=True,
    )
    assert shrink.reason is Reason.ADOPTED and shrink.config[0] < big[0]
    assert shrink_explore.reason is Reason.KEPT


def test_a_barely_timed_batch_is_not_left_for_a_smaller_one() -> None:
    """Shrinking waits for MIN_TIMED_TO_SHRINK timed steps at the current (m, s): one burst
    of load over a new size's first few steps once sent jobs back to M0 for good."""
    quiet = GoodputModel(PERF, GradParams(sqr=1.0, var=1e-6), 32)  # large batches do not pay
    big = (128, 0)
    early = choose_batch(quiet, LIMITS, big, 1, 2, READY, timed_steps=MIN_TIMED_TO_SHRINK - 1)
    assert early.config == big and early.reason is Reason.MEASURING
    assert early.best is not None and early.best[0] < big[0]  # the optimum is still reported
    sure = choose_batch(quiet, LIMITS, big, 1, 2, READY, timed_steps=MIN_TIMED_TO_SHRINK)
    assert sure.reason is Reason.ADOPTED and sure.config == early.best
    # no count (the simulator: exact step times) changes nothing, and growing never waits
    assert choose_batch(quiet, LIMITS, big, 1, 2, READY).config == early.best
    grow = choose_batch(NOISY, LIMITS, (16, 0), 1, 2, READY, timed_steps=1)
    assert grow.reason is Reason.ADOPTED and grow.config[0] > 16


def test_epoch_limits_keep_a_few_steps_per_epoch_on_small_data() -> None:
    cancer = epoch_limits(LIMITS, 426)  # 426 samples: M <= 426 // 8 = 53
    assert cancer.max_batch_size == 426 // MIN_STEPS_PER_EPOCH == 53
    assert epoch_limits(LIMITS, 10**6).max_batch_size == LIMITS.max_batch_size  # large data
    assert epoch_limits(LIMITS, 100).max_batch_size == 32  # never below M0
    noisy = choose_batch(NOISY, cancer, (32, 0), 1, 1, READY)
    assert noisy.reason is Reason.ADOPTED and noisy.config == (53, 0)
    with pytest.raises(ValueError, match="dataset_size"):
        epoch_limits(LIMITS, 0)


def test_explore_goes_to_the_trust_region_edge_not_a_nearby_size() -> None:
    """A second size close to the first (32 -> 40) leaves the fixed/per-sample split to timing
    noise; exploring tries the 2x edge when the optimum is larger at all."""
    modest = GoodputModel(PERF, GradParams(sqr=1.0, var=10.0), 32)
    plain = choose_batch(modest, LIMITS, (32, 0), 1, 1, READY, threshold=0.5)
    assert plain.best is not None and 32 < plain.best[0] < 64  # the optimum is a bit larger
    tried = choose_batch(modest, LIMITS, (32, 0), 1, 1, READY, threshold=0.5, explore=True)
    assert tried.reason is Reason.ADOPTED and tried.config == (64, 0)
    # the optimum is 36 and the model predicts 64 below 32: not explored, since a job sent
    # to 2x on a +0.2% optimum paid for the larger batch and left it (digits CNN, issue 19)
    slight = GoodputModel(PERF, GradParams(sqr=1.0, var=4.0), 32)
    assert float(slight.goodput(1, 1, 64, 0)) < float(slight.goodput(1, 1, 32, 0))
    edge = choose_batch(slight, LIMITS, (32, 0), 1, 1, READY, explore=True)
    assert edge.reason is Reason.KEPT and edge.config == (32, 0)
    assert edge.best is not None and edge.best[0] > 32
    assert choose_batch(slight, LIMITS, (32, 0), 1, 1, READY).config == (32, 0)  # 36: < 5%
    flat = GoodputModel(PERF, GradParams(sqr=1.0, var=1.0), 32)  # optimum at M0: stay
    assert choose_batch(flat, LIMITS, (32, 0), 1, 1, READY, explore=True).config == (32, 0)


def test_noise_band_keeps_a_move_the_estimate_cannot_tell() -> None:
    """With |G|² known only to ±4 (exploring) or ±0.8 (shrinking), neither move holds up at
    the unfavourable end of the band: keep, where the exact φ moves (the digits CNN explored
    on φ = 324-903, brute force 30-44, and shrank back when the estimate settled; issue 19)."""
    grow = GoodputModel(PERF, GradParams(sqr=1.0, var=20.0), 32)
    explored = choose_batch(grow, LIMITS, (32, 0), 1, 1, READY, explore=True)
    assert explored.config == (64, 0)
    unsure = GoodputModel(PERF, GradParams(sqr=1.0, var=20.0, sqr_err=4.0), 32)
    kept = choose_batch(unsure, LIMITS, (32, 0), 1, 1, READY, explore=True)
    assert kept.reason is Reason.KEPT and kept.config == (32, 0)
    # growing from a timed size follows the centre (the trust region bounds it)
    assert choose_batch(unsure, LIMITS, (32, 0), 1, 1, READY).config == (64, 0)
    shrink = GradParams(sqr=1.0, var=2.0)
    assert choose_batch(GoodputModel(PERF, shrink, 32), LIMITS, (64, 0), 1, 1, READY).config == (
        32,
        0,
    )
    unsure = GoodputModel(PERF, GradParams(sqr=1.0, var=2.0, sqr_err=0.8), 32)
    kept = choose_batch(unsure, LIMITS, (64, 0), 1, 1, READY)
    assert kept.reason is Reason.KEPT and kept.config == (64, 0)
    # confidence 0: the centre decides, as with exact φ
    centre = choose_batch(unsure, LIMITS, (64, 0), 1, 1, READY, confidence=0)
    assert centre.config == (32, 0)


def test_noise_band_moves_when_even_the_cautious_reading_says_so() -> None:
    """A move that holds at the unfavourable end of the band is taken, to that end's optimum."""
    big = GoodputModel(PERF, GradParams(sqr=1.0, var=40.0, sqr_err=0.8), 32)
    grown = choose_batch(big, LIMITS, (32, 0), 1, 1, READY, explore=True)
    assert grown.reason is Reason.ADOPTED and grown.config == (64, 0)
    small = GoodputModel(PERF, GradParams(sqr=1.0, var=2.0, sqr_err=0.8), 32)
    exact = choose_batch(
        GoodputModel(PERF, GradParams(1.0, 2.0), 32), LIMITS, (128, 0), 1, 1, READY
    )
    shrunk = choose_batch(small, LIMITS, (128, 0), 1, 1, READY)
    assert shrunk.reason is Reason.ADOPTED
    assert exact.config[0] < shrunk.config[0] < 128  # to the high reading's optimum


def test_noise_readings_bracket_the_noise_scale() -> None:
    model = GoodputModel(PERF, GradParams(sqr=1.0, var=10.0, sqr_err=0.5, var_err=2.0), 32)
    low, high = noise_readings(model, 1.0)
    assert low.grad.pgns(32) < model.grad.pgns(32) < high.grad.pgns(32)
    assert noise_readings(model, 3.0)[1].grad.pgns(32) == float("inf")  # |G|² floored at 0
    exact = GoodputModel(PERF, GradParams(sqr=1.0, var=10.0), 32)
    assert noise_readings(exact, 1.0) == (exact, exact)

"""The throughput profile's row times: the lower quartile of recent steps, so that a few
interrupted steps (a GIL-holding import, another process's time slice) do not make a batch
size look dearer than it is (issue 19), and the history survives a checkpoint."""

from __future__ import annotations

import math

import numpy as np
import pytest

from coadapt.train.profile import MIN_RECENT, RECENT, Profile

KEY = (1, 1, 32, 0)


def test_a_few_slow_steps_do_not_move_the_row_time() -> None:
    p = Profile()
    rng = np.random.default_rng(0)
    times = list(1e-3 * (1 + 0.05 * rng.random(24)))
    times[3:6] = [30e-3, 25e-3, 12e-3]  # a burst: three steps interrupted
    for t in times:
        p.record_iter(KEY, t)
    mean = sum(times) / len(times)
    assert mean > 2.5e-3  # the mean the profile used to report
    assert p.iter_time(KEY) == pytest.approx(np.percentile(times, 25))
    assert p.iter_time(KEY) < 1.05e-3
    obs = p.observations()
    assert obs is not None and obs.iter_time[0] == pytest.approx(p.iter_time(KEY))
    assert p.table()[0]["iter_time"] == pytest.approx(p.iter_time(KEY))
    assert p.table()[0]["count"] == len(times)


def test_only_recent_steps_count_and_few_steps_use_the_mean() -> None:
    p = Profile()
    for _ in range(RECENT):
        p.record_iter(KEY, 4e-3)  # an old regime ...
    for _ in range(RECENT):
        p.record_iter(KEY, 1e-3)  # ... replaced by the last RECENT steps
    assert p.iter_time(KEY) == pytest.approx(1e-3)
    q = Profile()
    for t in (1e-3, 3e-3)[: MIN_RECENT - 1]:
        q.record_iter(KEY, t)
    assert q.iter_time(KEY) == pytest.approx(1e-3 if MIN_RECENT == 2 else 2e-3)
    assert math.isnan(q.grad_time(KEY)) and math.isnan(q.iter_time((1, 1, 64, 0)))


def test_the_recent_history_survives_a_checkpoint_and_old_ones_load() -> None:
    p = Profile()
    for t in (1e-3, 2e-3, 9e-3, 1.1e-3):
        p.record_iter(KEY, t)
        p.record_grad(KEY, t / 2)
    q = Profile()
    q.load_state_dict(p.state_dict())
    assert q.iter_time(KEY) == p.iter_time(KEY) and q.grad_time(KEY) == p.grad_time(KEY)
    old = {"rows": p.state_dict()["rows"]}  # a checkpoint from before the recent history
    r = Profile()
    r.load_state_dict(old)
    assert r.iter_time(KEY) == pytest.approx((1e-3 + 2e-3 + 9e-3 + 1.1e-3) / 4)
    r.record_iter(KEY, 1e-3)  # recording again starts a recent history
    assert r.rows[KEY][0] == 5


def test_micro_batch_only_rows_reach_the_fit_but_not_the_controller() -> None:
    """The halves of split steps are micro-batch times only: the job's own fit reads them
    (NaN ``iter_time``); the table the controller fits on keeps whole steps."""
    p = Profile()
    p.record_grad((1, 1, 16, 0), 0.9e-3)
    assert p.observations() is None  # no optimizer step timed yet
    p.record_iter(KEY, 1e-3)
    p.record_grad(KEY, 1e-3)
    obs = p.observations()
    assert obs is not None
    got = dict(
        zip(obs.local_bsz.tolist(), zip(obs.iter_time, obs.grad_time, strict=True), strict=True)
    )
    assert got[32.0] == (pytest.approx(1e-3), pytest.approx(1e-3))
    assert math.isnan(got[16.0][0]) and got[16.0][1] == pytest.approx(0.9e-3)
    assert [row["local_bsz"] for row in p.table()] == [32]


def test_a_row_time_read_between_records_follows_every_new_record() -> None:
    """Row times are cached between records (a re-tune reads each row several times); a new
    step, a new micro-batch or a restored checkpoint must never leave a stale time."""
    p = Profile()
    for t in (1e-3, 1e-3, 1e-3, 1e-3):
        p.record_iter(KEY, t)
        p.record_grad(KEY, t / 2)
    assert p.iter_time(KEY) == pytest.approx(1e-3)
    assert p.grad_time(KEY) == pytest.approx(0.5e-3)
    rng = np.random.default_rng(1)
    seen = [1e-3] * 4
    for t in 1e-3 * (2.0 + rng.random(40)):
        p.record_iter(KEY, float(t))
        seen.append(float(t))
        assert p.iter_time(KEY) == pytest.approx(np.percentile(seen[-RECENT:], 25))
    assert p.grad_time(KEY) == pytest.approx(0.5e-3)  # the other column kept its time
    p.record_grad(KEY, 9e-3)
    assert p.grad_time(KEY) == pytest.approx(np.percentile([0.5e-3] * 4 + [9e-3], 25))
    q = Profile()
    q.record_iter(KEY, 7e-3)
    assert q.iter_time(KEY) == pytest.approx(7e-3)
    q.load_state_dict(p.state_dict())
    assert q.iter_time(KEY) == p.iter_time(KEY)

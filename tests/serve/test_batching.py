"""SLO-driven batching: the AIMD rule and the batcher, on an injected clock (deterministic)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from coadapt.serve.batching import AimdBatchSize, Batcher, BatchResult


def test_aimd_grows_on_full_batches_within_budget_and_backs_off_over_it() -> None:
    p = AimdBatchSize(slo_s=0.05, initial=8, increase=4, decrease=0.5, max_size=20)
    assert p.budget_s == pytest.approx(0.025)
    assert p.observe(8, 0.010) == 12  # full and fast: additive increase
    assert p.observe(5, 0.010) == 12  # not full: no evidence that more fits
    assert p.observe(12, 0.010) == 16
    assert p.observe(16, 0.010) == 20
    assert p.observe(20, 0.010) == 20  # capped
    assert p.observe(20, 0.030) == 10  # over budget: multiplicative decrease
    assert p.observe(3, 0.030) == 5  # even a small slow batch backs off
    for _ in range(10):
        p.observe(1, 1.0)
    assert p.current == 1  # floor


def test_aimd_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="slo_s"):
        AimdBatchSize(slo_s=0)
    with pytest.raises(ValueError, match="min_size"):
        AimdBatchSize(initial=0)


class FakeModel:
    """Doubles its input; each forward advances the fake clock by ``per_row_s`` per row."""

    def __init__(self, per_row_s: float) -> None:
        self.now = 0.0
        self.per_row_s = per_row_s
        self.batches: list[int] = []
        self.fail = False

    def clock(self) -> float:
        return self.now

    def run(self, x: np.ndarray) -> BatchResult[str]:
        if self.fail:
            raise RuntimeError("model exploded")
        self.batches.append(len(x))
        self.now += self.per_row_s * len(x)
        return BatchResult(x * 2, f"v{len(self.batches)}")


async def _submit_all(b: Batcher[str], blocks: list[np.ndarray]) -> list[tuple[np.ndarray, str]]:
    b.start()
    try:
        return await asyncio.gather(*(b.submit(x) for x in blocks))
    finally:
        await b.stop()


def test_queued_requests_share_one_forward_and_get_their_own_rows_back() -> None:
    model = FakeModel(per_row_s=0.001)
    b = Batcher(model.run, AimdBatchSize(slo_s=1.0, initial=6), clock=model.clock)
    blocks = [np.full((n, 2), i, dtype=np.float32) for i, n in enumerate([1, 2, 3, 1, 4])]
    results = asyncio.run(_submit_all(b, blocks))
    # all five were queued before the consumer ran: 1+2+3 fill 6 rows, then 1+4 (limit 10)
    assert model.batches == [6, 5]
    for block, (out, _) in zip(blocks, results, strict=True):
        assert np.array_equal(out, block * 2)
    assert [tag for _, tag in results] == ["v1", "v1", "v1", "v2", "v2"]


def test_a_request_larger_than_the_limit_runs_alone() -> None:
    model = FakeModel(per_row_s=0.0)
    b = Batcher(model.run, AimdBatchSize(initial=2, increase=1), clock=model.clock)
    blocks = [np.ones((1, 1), np.float32), np.ones((5, 1), np.float32)]
    asyncio.run(_submit_all(b, blocks))
    assert model.batches == [1, 5]


def test_slow_forwards_shrink_the_batch_limit() -> None:
    model = FakeModel(per_row_s=0.01)  # 8 rows = 80 ms > 25 ms budget
    policy = AimdBatchSize(slo_s=0.05, initial=8, decrease=0.5)
    b = Batcher(model.run, policy, clock=model.clock)
    blocks = [np.ones((1, 1), np.float32) for _ in range(16)]
    asyncio.run(_submit_all(b, blocks))
    # 80 ms and 40 ms overrun: halve; 2 rows take 20 ms, within budget and full: +4
    assert model.batches == [8, 4, 2, 2]
    assert policy.current == 6


def test_a_failing_forward_fails_every_request_of_its_batch() -> None:
    model = FakeModel(per_row_s=0.0)
    model.fail = True
    b = Batcher(model.run, AimdBatchSize(), clock=model.clock)

    async def go() -> list[object]:
        b.start()
        try:
            return await asyncio.gather(
                *(b.submit(np.ones((1, 1), np.float32)) for _ in range(3)),
                return_exceptions=True,
            )
        finally:
            await b.stop()

    outs = asyncio.run(go())
    assert all(isinstance(o, RuntimeError) and "exploded" in str(o) for o in outs)


def test_submit_before_start_is_an_error() -> None:
    b = Batcher(FakeModel(0).run, AimdBatchSize())
    with pytest.raises(RuntimeError, match="start"):
        asyncio.run(b.submit(np.ones((1, 1), np.float32)))


def test_forwards_on_an_executor_thread_give_the_same_answers() -> None:
    from concurrent.futures import ThreadPoolExecutor

    model = FakeModel(per_row_s=0.001)
    with ThreadPoolExecutor(1) as pool:
        b = Batcher(model.run, AimdBatchSize(initial=4), executor=pool, clock=model.clock)
        blocks = [np.full((1, 3), i, dtype=np.float32) for i in range(10)]
        results = asyncio.run(_submit_all(b, blocks))
    assert sum(model.batches) == 10 and max(model.batches) <= 8
    for block, (out, _) in zip(blocks, results, strict=True):
        assert np.array_equal(out, block * 2)

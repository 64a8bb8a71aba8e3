"""Dynamic batching driven by a latency SLO (Clipper's adaptive batching).

Requests queue in an asyncio :class:`Batcher`; whenever the model is free it takes as many
queued rows as the current maximum allows and runs **one** forward for all of them. The
maximum follows AIMD against the SLO (:class:`AimdBatchSize`): while batches finish within the
budget and are full, it grows by a fixed step; a batch that overruns the budget cuts it by a
factor. The budget is a fraction of the p99 target because a request may wait for the batch
in flight before its own runs: two forwards must fit in the target.

The clock is injected, so the tests drive both classes deterministically.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")


@dataclass
class AimdBatchSize:
    """The maximum rows per forward, adapted to keep latency within ``slo_s``."""

    slo_s: float = 0.05
    budget_fraction: float = 0.5  # a forward may take this share of the SLO
    initial: int = 8
    min_size: int = 1
    max_size: int = 1024
    increase: int = 4  # rows added after a full batch within budget
    decrease: float = 0.9  # factor applied after a batch over budget (Clipper: 10% back-off)
    current: int = field(init=False)

    def __post_init__(self) -> None:
        if self.slo_s <= 0 or not 0 < self.budget_fraction <= 1:
            raise ValueError("slo_s must be > 0 and budget_fraction in (0, 1]")
        if not 1 <= self.min_size <= self.initial <= self.max_size:
            raise ValueError("need 1 <= min_size <= initial <= max_size")
        if self.increase < 1 or not 0 < self.decrease < 1:
            raise ValueError("increase must be >= 1 and decrease in (0, 1)")
        self.current = self.initial

    @property
    def budget_s(self) -> float:
        return self.slo_s * self.budget_fraction

    def observe(self, rows: int, duration_s: float) -> int:
        """Account one forward of ``rows`` rows that took ``duration_s``; the new maximum."""
        if duration_s > self.budget_s:
            self.current = max(self.min_size, int(self.current * self.decrease))
        elif rows >= self.current:
            self.current = min(self.max_size, self.current + self.increase)
        return self.current


@dataclass
class _Pending(Generic[T]):
    rows: np.ndarray
    future: asyncio.Future[tuple[np.ndarray, T]]


@dataclass(frozen=True)
class BatchResult(Generic[T]):
    """What a model run returns: the outputs, row for row, and a tag (the model version)."""

    outputs: np.ndarray
    tag: T


class Batcher(Generic[T]):
    """Queue requests (each a block of rows) and run them through ``run`` in batches.

    ``run(rows) -> BatchResult`` is called with the concatenated rows of one batch, on
    ``executor`` (a single thread keeps forwards off the event loop) or inline when it is
    ``None``. ``on_batch(rows, duration_s)`` sees every batch (metrics).
    """

    def __init__(
        self,
        run: Callable[[np.ndarray], BatchResult[T]],
        policy: AimdBatchSize,
        *,
        executor: Executor | None = None,
        clock: Callable[[], float] = time.perf_counter,
        on_batch: Callable[[int, float], None] | None = None,
    ) -> None:
        self._run = run
        self.policy = policy
        self._executor = executor
        self._clock = clock
        self._on_batch = on_batch
        self._queue: deque[_Pending[T]] = deque()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.batches = 0

    @property
    def queued(self) -> int:
        return len(self._queue)

    def start(self) -> None:
        """Start the consumer on the running loop."""
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._consume())

    async def stop(self) -> None:
        """Stop the consumer once the queue is empty (drain), then cancel it."""
        while self._queue:
            await asyncio.sleep(0.001)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def submit(self, rows: np.ndarray) -> tuple[np.ndarray, T]:
        """The outputs for ``rows`` and the tag of the model that computed them."""
        if self._wake is None:
            raise RuntimeError("Batcher.start() was not called")
        fut: asyncio.Future[tuple[np.ndarray, T]] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(rows, fut))
        self._wake.set()
        return await fut

    def take(self) -> list[_Pending[T]]:
        """The requests of the next batch: queued ones up to the policy's row limit (at least
        one request, even a larger one, so nothing starves)."""
        limit = self.policy.current
        batch: list[_Pending[T]] = []
        rows = 0
        while self._queue:
            n = len(self._queue[0].rows)
            if batch and rows + n > limit:
                break
            batch.append(self._queue.popleft())
            rows += n
        return batch

    async def _consume(self) -> None:
        wake = self._wake
        if wake is None:
            raise RuntimeError("Batcher.start() was not called")
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                wake.clear()
                await wake.wait()
            batch = self.take()
            if not batch:
                continue
            x = (
                np.concatenate([p.rows for p in batch])
                if len(batch) > 1
                else np.array(batch[0].rows)
            )
            t0 = self._clock()
            try:
                if self._executor is None:
                    result = self._run(x)
                else:
                    result = await loop.run_in_executor(self._executor, self._run, x)
            except Exception as exc:  # the model failed: every request of the batch learns why
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            dt = self._clock() - t0
            self.batches += 1
            self.policy.observe(len(x), dt)
            if self._on_batch is not None:
                self._on_batch(len(x), dt)
            start = 0
            for p in batch:
                n = len(p.rows)
                if not p.future.done():  # a cancelled request (client gone) is skipped
                    p.future.set_result((result.outputs[start : start + n], result.tag))
                start += n

"""AdaptiveDataLoader: micro-batches of a batch size that changes while the job runs.

The global sample order of an epoch is a seeded permutation that does not depend on the
number of replicas. An optimizer step consumes the next ``M = K * m * (s + 1)`` samples of
that order, laid out as ``s + 1`` micro-steps × ``K`` replicas × ``m`` samples; replica ``r``
takes its ``m`` samples of every micro-step. Position (samples consumed by completed steps)
and epoch are therefore all that is needed to resume, at any K, with the same data order:
1 → 2 → 1 replicas reads exactly the samples an uninterrupted run would have read.

The last step of an epoch uses ``m' = remaining // (K * (s + 1))`` and drops the fewer than
``K * (s + 1)`` samples left over (every replica needs a non-empty batch for the all-reduce).

With ``split_next`` set (one replica, no accumulation), the next step's m samples come as two
micro-batches, ⌊m/2⌋ and the rest, each weighted by its share (``micro_weight``): the same
optimizer step, but two gradients at one set of weights, which is what an unbiased noise
measurement needs (:func:`coadapt.train.gns.halves_estimate`).

A plain :class:`~torch.utils.data.TensorDataset` with the default collation is fetched with
one index per tensor (``t[idx]``) instead of ``m`` ``__getitem__`` calls and a stack: the same
tensors, without ~10 µs of Python per sample (``batched_fetch``; pass ``False`` for the
per-sample path that :class:`torch.utils.data.DataLoader` takes).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset
from torch.utils.data import default_collate as _default_collate

from coadapt.train.context import TrainConfigError, TrainingContext, current


def split_batch(total: int, replicas: int, max_local_bsz: int | None) -> tuple[int, int]:
    """(m, s) for a total batch: the fewest accumulation steps whose micro-batch fits."""
    if total < 1 or replicas < 1:
        raise TrainConfigError(f"need total batch >= 1 and replicas >= 1, got {total}, {replicas}")
    per_replica = -(-total // replicas)
    cap = max_local_bsz if max_local_bsz is not None else per_replica
    accum = max(-(-per_replica // cap) - 1, 0)
    local = -(-per_replica // (accum + 1))
    return local, accum


class AdaptiveDataLoader:
    """Per-replica micro-batches over a map-style dataset, with resumable position.

    ``batch_size`` is the user's M0 (what the LR was tuned for). ``max_batch_size`` bounds the
    total batch the job may grow to, ``max_local_bsz`` the per-replica micro-batch (memory),
    ``pinned_batch_size`` fixes M so only its split adapts. Iterate with
    ``for epoch in loader.epochs(n): for batch in loader: ...``.
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        batch_size: int,
        *,
        max_batch_size: int | None = None,
        max_local_bsz: int | None = None,
        min_local_bsz: int = 1,
        pinned_batch_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        context: TrainingContext | None = None,
        name: str = "loader",
        batched_fetch: bool | None = None,
    ) -> None:
        if batch_size < 1:
            raise TrainConfigError(f"batch_size must be >= 1, got {batch_size}")
        if max_batch_size is not None and max_batch_size < batch_size:
            raise TrainConfigError(f"max_batch_size ({max_batch_size}) < batch_size ({batch_size})")
        if max_local_bsz is not None and max_local_bsz < min_local_bsz:
            raise TrainConfigError("max_local_bsz must be >= min_local_bsz")
        self.dataset = dataset
        self.size = len(dataset)  # type: ignore[arg-type]
        if self.size < 1:
            raise TrainConfigError("the dataset is empty")
        self.ctx = context if context is not None else current()
        # A per-replica cap learned from an out-of-memory failure wins over the user's: the
        # total batch is kept with more accumulation steps (coadapt.train.memory).
        cap = self.ctx.memory_cap
        if cap is not None:
            max_local_bsz = cap if max_local_bsz is None else min(max_local_bsz, cap)
            min_local_bsz = min(min_local_bsz, max_local_bsz)
        self.memory_cap = cap
        self.init_batch_size = batch_size
        self.max_batch_size = pinned_batch_size or max_batch_size or batch_size
        self.max_local_bsz = max_local_bsz
        self.min_local_bsz = min_local_bsz
        self.pinned_batch_size = pinned_batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.collate_fn = collate_fn or _default_collate
        plain_tensors = (
            isinstance(dataset, TensorDataset)
            and collate_fn is None
            and type(dataset).__getitem__ is TensorDataset.__getitem__
        )
        if batched_fetch and not plain_tensors:
            raise TrainConfigError(
                "batched_fetch needs a plain TensorDataset and the default collate_fn"
            )
        self.batched_fetch = plain_tensors if batched_fetch is None else batched_fetch
        self._tensors: tuple[torch.Tensor, ...] = (
            dataset.tensors if self.batched_fetch and isinstance(dataset, TensorDataset) else ()
        )
        self.replicas = self.ctx.world_size
        self.rank = self.ctx.rank
        self.epoch = 0
        self.position = 0  # samples of this epoch consumed by completed optimizer steps
        self.num_epochs: int | None = None  # declared by epochs(n); None until then
        self.local_bsz, self.accum_steps = split_batch(
            pinned_batch_size or batch_size, self.replicas, max_local_bsz
        )
        self.micro_index = 0
        self.is_sync_step = True
        self.step_local_bsz = self.local_bsz  # m of the in-flight step (smaller at epoch end)
        # One replica without accumulation measures its gradient noise on a step split into
        # two micro-batches (set by AdaptiveModel before the step; see split_step).
        self.split_next = False
        self.split_step = False  # the in-flight step is such a split step
        self.step_accum = self.accum_steps  # micro-batches of the in-flight step, minus one
        self.micro_weight = 1.0  # this micro-batch's share of the in-flight step's samples
        self.piece_bsz = self.local_bsz  # samples of the in-flight step's first micro-batch
        self.fetch_start = self.step_start = time.perf_counter()
        self.last_global_indices: np.ndarray = np.zeros(0, dtype=np.int64)
        self._pending = 0  # samples of the in-flight step, committed by commit_step()
        self._perm_epoch = -1
        self._perm: np.ndarray = np.zeros(0, dtype=np.int64)
        self._getitems = getattr(dataset, "__getitems__", None)
        self.ctx.local_batch = lambda: self.step_local_bsz
        restored = self.ctx.register(name, self)
        too_big = max_local_bsz is not None and self.local_bsz > max_local_bsz
        if restored and (self._saved_replicas != self.replicas or too_big):
            total = self._saved_total
            self.local_bsz, self.accum_steps = split_batch(
                max(total, self.replicas), self.replicas, max_local_bsz
            )

    # -- configuration --------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        """Current total batch M = K * m * (s + 1)."""
        return self.replicas * self.local_bsz * (self.accum_steps + 1)

    def set_batch(self, local_bsz: int, accum_steps: int) -> None:
        """Change (m, s); takes effect at the next optimizer step."""
        if local_bsz < 1 or accum_steps < 0:
            raise TrainConfigError(f"invalid micro-batch {local_bsz} / accumulation {accum_steps}")
        self.local_bsz, self.accum_steps = int(local_bsz), int(accum_steps)

    # -- order ----------------------------------------------------------------------------
    def permutation(self, epoch: int) -> np.ndarray:
        """The global sample order of ``epoch`` (independent of the replica count)."""
        if epoch != self._perm_epoch:
            if self.shuffle:
                rng = np.random.default_rng([self.seed, epoch])
                self._perm = rng.permutation(self.size).astype(np.int64)
            else:
                self._perm = np.arange(self.size, dtype=np.int64)
            self._perm_epoch = epoch
        return self._perm

    def _fetch(self, idx: np.ndarray) -> Any:
        if self._tensors:  # what default_collate would build, without the per-sample loop
            index = torch.from_numpy(idx)
            return [t[index] for t in self._tensors]
        items: Sequence[Any]
        keys = idx.tolist()
        if self._getitems is not None:
            items = self._getitems(keys)
        else:
            items = [self.dataset[i] for i in keys]
        return self.collate_fn(list(items))

    def commit_step(self) -> None:
        """Mark the in-flight optimizer step complete (its samples are now consumed)."""
        self.position += self._pending
        self._pending = 0

    def __len__(self) -> int:
        """Micro-batches left in this epoch at the current batch size (an estimate)."""
        steps = max(self.size - self.position, 0) // max(self.batch_size, 1)
        return steps * (self.accum_steps + 1)

    def __iter__(self) -> Iterator[Any]:
        """Micro-batches for this replica from the current position to the end of the epoch."""
        epoch = self.epoch
        perm = self.permutation(epoch)
        while True:
            if self._pending:  # user did not use AdaptiveModel: the step completed anyway
                self.commit_step()
            k, m, s = self.replicas, self.local_bsz, self.accum_steps
            remaining = self.size - self.position
            if remaining < k * m * (s + 1):
                m = remaining // (k * (s + 1))
                if m < 1:
                    break
            total = k * m * (s + 1)
            chunk = perm[self.position : self.position + total]
            self.last_global_indices = chunk
            self._pending = total
            self.step_local_bsz = m
            # A split step: the same m samples as two micro-batches, the first of m // 2.
            self.split_step = self.split_next and k == 1 and s == 0 and m >= 2
            bounds = (
                [0, m // 2, m]
                if self.split_step
                else [(j * k + self.rank) * m for j in range(s + 1)] + [total]
            )
            self.step_accum = len(bounds) - 2
            self.piece_bsz = bounds[1] - bounds[0] if self.split_step else m
            for j in range(self.step_accum + 1):
                start = bounds[j]
                stop = bounds[j + 1] if self.split_step else start + m
                self.micro_index = j
                self.is_sync_step = j == self.step_accum
                self.micro_weight = (stop - start) / m / (s + 1)
                self.fetch_start = time.perf_counter()
                if j == 0:
                    self.step_start = self.fetch_start
                yield self._fetch(chunk[start:stop])
        if self._pending:
            self.commit_step()
        self.epoch = epoch + 1
        self.position = 0

    def epochs(self, num_epochs: int) -> Iterator[int]:
        """Epoch numbers from the restored one up to ``num_epochs`` (resumes mid-epoch).

        ``num_epochs`` is also the job's declared length: :attr:`fraction_done` reports
        progress against it, which the scheduler uses to favour jobs near their end."""
        self.num_epochs = int(num_epochs)
        while self.epoch < num_epochs:
            epoch = self.epoch
            yield epoch
            if self.epoch == epoch:  # the body left the epoch early: move on
                self.epoch, self.position, self._pending = epoch + 1, 0, 0

    @property
    def fraction_done(self) -> float | None:
        """Epochs done (the current one by samples consumed) over the epochs declared in
        :meth:`epochs`; None when none were declared."""
        if not self.num_epochs or self.num_epochs <= 0:
            return None
        within = min(self.position / self.size, 1.0) if self.size > 0 else 0.0
        return min(max((self.epoch + within) / self.num_epochs, 0.0), 1.0)

    # -- checkpoint -----------------------------------------------------------------------
    _saved_replicas = 1
    _saved_total = 1

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "local_bsz": self.local_bsz,
            "accum_steps": self.accum_steps,
            "replicas": self.replicas,
            "size": self.size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["size"]) != self.size:
            raise TrainConfigError(
                f"checkpointed dataset had {state['size']} samples, this one has {self.size}"
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self.seed = int(state["seed"])
        self.local_bsz, self.accum_steps = int(state["local_bsz"]), int(state["accum_steps"])
        self._saved_replicas = int(state["replicas"])
        self._saved_total = self._saved_replicas * self.local_bsz * (self.accum_steps + 1)
        self._pending = 0

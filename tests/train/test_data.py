"""AdaptiveDataLoader: replica-independent order, partitioning, resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import TensorDataset

from coadapt.train import AdaptiveDataLoader, TrainConfigError, split_batch

from .helpers import FakeContext

DATA = TensorDataset(torch.arange(100))


def consumed(k: int, m: int, s: int, epochs: int = 1, size: int = 100) -> list[list[int]]:
    """Global sample order of `epochs` epochs, reassembled from K replicas, per step."""
    data = TensorDataset(torch.arange(size))
    loaders = [
        AdaptiveDataLoader(data, batch_size=8, seed=5, context=FakeContext(r, k)) for r in range(k)
    ]
    for ld in loaders:
        ld.set_batch(m, s)
    steps: list[list[int]] = []
    for _ in range(epochs):
        its = [iter(ld) for ld in loaders]
        while True:
            micro = [[next(it, None) for it in its] for _ in range(s + 1)]
            if micro[0][0] is None:
                break
            flat = [int(v) for j in range(s + 1) for r in range(k) for v in micro[j][r][0]]
            assert flat == loaders[0].last_global_indices.tolist()
            steps.append(flat)
    return steps


@settings(max_examples=25, deadline=None)
@given(k=st.integers(1, 4), m=st.integers(1, 9), s=st.integers(0, 2))
def test_global_order_is_independent_of_replicas(k: int, m: int, s: int) -> None:
    base = [i for step in consumed(1, 7, 0) for i in step]
    got = [i for step in consumed(k, m, s) for i in step]
    assert got == base[: len(got)]  # same order; only the tail that cannot be split is dropped
    assert len(base) - len(got) < k * (s + 1) + 7
    assert len(set(got)) == len(got)


def test_epochs_use_different_seeded_permutations() -> None:
    ld = AdaptiveDataLoader(DATA, batch_size=10, seed=1, context=FakeContext())
    a = np.concatenate([b[0].numpy() for b in ld])
    b = np.concatenate([b[0].numpy() for b in ld])
    assert ld.epoch == 2 and sorted(a) == sorted(b) == list(range(100))
    assert not np.array_equal(a, b)
    again = AdaptiveDataLoader(DATA, batch_size=10, seed=1, context=FakeContext())
    assert np.array_equal(np.concatenate([x[0].numpy() for x in again]), a)


def test_resume_mid_epoch_at_other_replica_count() -> None:
    ld = AdaptiveDataLoader(DATA, batch_size=10, seed=2, context=FakeContext())
    it = iter(ld)
    first = [next(it)[0].tolist() for _ in range(3)]
    ld.commit_step()  # the third step completed
    state = ld.state_dict()
    assert state["position"] == 30
    rest0 = AdaptiveDataLoader(
        DATA, batch_size=10, seed=2, context=FakeContext(0, 2, {"loader": state})
    )
    rest1 = AdaptiveDataLoader(
        DATA, batch_size=10, seed=2, context=FakeContext(1, 2, {"loader": state})
    )
    assert rest0.batch_size == 10 and rest0.local_bsz == 5
    resumed = [a[0].tolist() + b[0].tolist() for a, b in zip(rest0, rest1, strict=True)]
    full = [
        b[0].tolist()
        for b in AdaptiveDataLoader(DATA, batch_size=10, seed=2, context=FakeContext())
    ]
    assert first + resumed == full


def test_epochs_iterator_resumes_and_advances() -> None:
    ld = AdaptiveDataLoader(
        DATA,
        batch_size=30,
        context=FakeContext(
            saved={
                "loader": {
                    "epoch": 2,
                    "position": 60,
                    "seed": 0,
                    "local_bsz": 30,
                    "accum_steps": 0,
                    "replicas": 1,
                    "size": 100,
                }
            }
        ),
    )
    seen = []
    for epoch in ld.epochs(4):
        seen.append((epoch, sum(1 for _ in ld)))
    assert seen == [(2, 2), (3, 4)]  # 30+10; 30+30+30+10


def test_accumulation_flags_and_split() -> None:
    ld = AdaptiveDataLoader(DATA, batch_size=12, max_local_bsz=4, context=FakeContext())
    assert (ld.local_bsz, ld.accum_steps, ld.batch_size) == (4, 2, 12)
    flags = []
    for _ in ld:
        flags.append((ld.micro_index, ld.is_sync_step))
        if len(flags) == 3:
            break
    assert flags == [(0, False), (1, False), (2, True)]
    assert split_batch(100, 3, 16) == (12, 2)
    with pytest.raises(TrainConfigError):
        split_batch(0, 1, None)
    with pytest.raises(TrainConfigError):
        AdaptiveDataLoader(DATA, batch_size=8, max_batch_size=4, context=FakeContext())

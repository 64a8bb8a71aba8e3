"""Fixtures for the coadapt.train tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from coadapt.train.context import TrainEnv, TrainingContext


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[TrainingContext]:
    """A single-process context writing metrics and checkpoints under tmp_path."""
    c = TrainingContext(
        TrainEnv(metrics_file=tmp_path / "metrics.jsonl", checkpoint_dir=tmp_path / "ck")
    )
    yield c
    c.shutdown()

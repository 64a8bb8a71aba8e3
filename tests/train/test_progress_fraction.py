"""``AdaptiveDataLoader.fraction_done``: the job's progress against the epochs its script
declared (``loader.epochs(n)``), which the library reports for the scheduler."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

from coadapt.protocol import ProgressRecord, parse_record
from coadapt.train import AdaptiveDataLoader

from .helpers import ROOT, TINY, FakeContext, _env

DATA = TensorDataset(torch.arange(100))
DATASET_SIZE = 256  # tiny_train.py's dataset


def test_unknown_until_epochs_are_declared_then_counts_epochs_and_position() -> None:
    ld = AdaptiveDataLoader(DATA, batch_size=10, seed=1, context=FakeContext())
    assert ld.fraction_done is None
    seen = []
    for _ in ld.epochs(4):
        for i, _batch in enumerate(ld):
            if i == 4:  # half of the epoch's 10 steps committed after this one's commit
                ld.commit_step()
                seen.append(ld.fraction_done)
    assert seen[:2] == [0.5 / 4, 1.5 / 4]
    assert ld.fraction_done == 1.0


def test_resumed_loader_reports_from_its_restored_position() -> None:
    ld = AdaptiveDataLoader(DATA, batch_size=10, seed=1, context=FakeContext())
    ld.load_state_dict({**ld.state_dict(), "epoch": 2, "position": 50})
    for _ in ld.epochs(5):
        assert ld.fraction_done == 2.5 / 5
        break


def test_the_record_carries_the_fraction() -> None:
    rec = parse_record(ProgressRecord(step=3, epoch=1, fraction=0.3).to_json())
    assert isinstance(rec, ProgressRecord) and rec.fraction == 0.3
    bad = parse_record({"kind": "progress", "fraction": "x"})
    assert isinstance(bad, ProgressRecord) and bad.fraction is None


def test_a_real_training_process_reports_its_fraction(tmp_path: Path) -> None:
    """End to end in a real process: the tiny script declares ``loader.epochs(100)``; its last
    progress record's fraction is (epoch + position / size) / 100 of its own last step."""
    env = {
        **_env(),
        "COADAPT_METRICS_FILE": str(tmp_path / "metrics.jsonl"),
        "COADAPT_CHECKPOINT_DIR": str(tmp_path / "ck"),
        "OMP_NUM_THREADS": "1",
    }
    log = tmp_path / "log.jsonl"
    subprocess.run(
        [sys.executable, str(TINY), "--log", str(log), "--max-steps", "30"],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=120,
        capture_output=True,
    )
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if r.get("kind") == "progress"][-1]
    assert last["fraction"] is not None and 0.0 < last["fraction"] < 1.0
    assert last["fraction"] == pytest.approx(
        (last["epoch"] + last["position"] / DATASET_SIZE) / 100, rel=1e-9
    )

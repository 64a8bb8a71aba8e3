"""Shared fixtures: a tiny custom workload that simulates in well under a second."""

from __future__ import annotations

from pathlib import Path

import pytest

SMALL_WORKLOAD = """name,time,application,num_replicas,batch_size
bert-0,0,bert,1,12
ncf-1,30,ncf,1,256
cifar10-2,60,cifar10,2,256
bert-3,100,bert,2,24
ncf-4,200,ncf,1,512
"""


@pytest.fixture
def small_workload_path(tmp_path: Path) -> Path:
    path = tmp_path / "small.csv"
    path.write_text(SMALL_WORKLOAD)
    return path

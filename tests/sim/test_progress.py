"""The simulator's ``JobInfo.progress``: epochs done over the epochs the job runs, as a live
training script reports it, in every snapshot the policy sees."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from coadapt.policies import ClusterSnapshot, Decision, PolicyState, make_policy
from coadapt.sim import SimConfig, load_workload, parse_cluster
from coadapt.sim.engine import Simulator


class Recorder:
    """Wraps a policy and keeps each round's progress per job."""

    def __init__(self, name: str) -> None:
        self.inner = make_policy(name)
        self.name, self.batch_mode = self.inner.name, self.inner.batch_mode
        self.seen: list[dict[str, float | None]] = []

    def optimize(
        self, snapshot: ClusterSnapshot, state: PolicyState, rng: np.random.Generator
    ) -> Decision:
        self.seen.append({k: j.progress for k, j in snapshot.jobs.items()})
        return self.inner.optimize(snapshot, state, rng)


def test_progress_rises_from_zero_towards_one_per_job(small_workload_path: Path) -> None:
    policy = Recorder("pollux")
    sim = Simulator(load_workload(str(small_workload_path)), parse_cluster("1x4"), policy)
    result = sim.run()
    assert all(j.completion_time is not None for j in result.jobs)
    series: dict[str, list[float]] = {}
    for round_ in policy.seen:
        for name, f in round_.items():
            assert f is not None and 0.0 <= f <= 1.0
            series.setdefault(name, []).append(f)
    for name, values in series.items():
        assert values == sorted(values), name  # never goes back
        assert values[0] < 0.5, name
    assert any(v[-1] > 0.5 for v in series.values())


def test_fraction_done_counts_epochs_and_the_position_in_the_current_one(
    small_workload_path: Path,
) -> None:
    sim = Simulator(
        load_workload(str(small_workload_path)), parse_cluster("1x4"), make_policy("pollux")
    )
    job = sim._jobs[0]
    app = job.app
    total = app.completion_epoch + 1
    assert job.fraction_done() == 0.0
    job.epoch = 1
    job.progress = (app.progress_at(1) + app.progress_at(2)) / 2
    assert job.fraction_done() == 1.5 / total
    job.completion_time = 10.0
    assert job.fraction_done() == 1.0


def test_runs_that_read_progress_stay_deterministic(small_workload_path: Path) -> None:
    """The default pollux reads progress; two runs are still identical."""
    wl = load_workload(str(small_workload_path))
    runs = [
        Simulator(wl, parse_cluster("1x4"), make_policy("pollux"), SimConfig(seed=2)).run()
        for _ in range(2)
    ]
    assert runs[0] == runs[1]

"""Issue 13.3: a retried job is decided the moment its delay ends, and never waits on idle
slots (the real Pollux policy, the fake executor, a hand-moved clock)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from coadapt.controller.reconciler import Controller, ControllerConfig
from coadapt.controller.spec import parse_spec
from coadapt.controller.states import JobState
from coadapt.controller.store import Store
from coadapt.executors import FakeExecutor
from coadapt.policies import ClusterSnapshot, JobInfo, NodeInfo, make_policy
from coadapt.policies.pollux_problem import PolluxProblem
from tests.controller.conftest import FakeClock, make_spec


def _controller(store: Store, tmp_path: Path, clock: FakeClock) -> Controller:
    cfg = ControllerConfig(
        state_dir=tmp_path / "state", interval=60.0, backoff_base=4.0, restart_delay=30.0
    )
    return Controller(store, FakeExecutor(slots=4), make_policy("pollux"), cfg, clock)


def test_a_retry_is_relaunched_when_its_delay_ends_on_an_idle_cluster(
    sqlite_store: Store, tmp_path: Path
) -> None:
    clock = FakeClock()
    ctl = _controller(sqlite_store, tmp_path, clock)
    ex = ctl.executor
    assert isinstance(ex, FakeExecutor)
    tenant = sqlite_store.create_tenant("alice", 0.0)[0]
    job = sqlite_store.create_job(
        tenant, parse_spec(make_spec(max_restarts=3, max_replicas=2)), clock()
    )
    clock.advance(1.0)
    ctl.step()
    assert sqlite_store.get_job(job.id).state is JobState.RUNNING
    for failure in (1, 2):
        clock.advance(1.0)
        ex.finish(job.id, 3)
        ctl.step()
        j = sqlite_store.get_job(job.id)
        assert j.state is JobState.PENDING and j.failures == failure
        # The next round is due exactly when the delay ends, not an interval later.
        assert ctl.next_round_at == j.not_before
        clock.now = j.not_before - 0.01
        ctl.step()
        assert not ex.running(job.id)  # still sitting out its delay
        clock.now = j.not_before
        ctl.step()
        j = sqlite_store.get_job(job.id)
        # Relaunched at once although age < restarts × δ (the factor alone would be zero).
        assert j.state is JobState.RUNNING and j.attempt == failure + 1, j
        assert j.num_restarts == failure
        assert j.submit_time + j.num_restarts * 30.0 > clock()
        assert len(ex.running(job.id)) >= 1


def _info(name: str, restarts: int) -> JobInfo:
    return JobInfo(
        name=name,
        submit_time=0.0,
        attained_service=0.0,
        num_restarts=restarts,
        min_replicas=0,
        max_replicas=4,
        max_gpus_held=2,
    )


def test_a_pending_job_with_a_zero_restart_factor_still_gets_idle_gpus() -> None:
    snap = ClusterSnapshot(
        now=10.0,
        nodes=(NodeInfo("local", 4),),
        jobs={"old": _info("old", 0), "retried": _info("retried", 3)},
        current={"old": (2,)},
        restart_delay=30.0,
    )
    problem = PolluxProblem(snap)
    # The running job keeps its raw factor; the job holding nothing is floored above zero.
    assert problem.realloc_factor[0] == 10.0 / 40.0
    assert 0.0 < problem.realloc_factor[1] < 1e-3
    decided = make_policy("pollux").optimize(snap, {}, np.random.default_rng(0)).allocations
    assert sum(decided.get("retried", (0,))) > 0
    assert sum(sum(a) for a in decided.values()) == 4  # no slot left idle

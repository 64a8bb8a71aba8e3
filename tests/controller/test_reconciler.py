"""The control loop against the fake executor and a hand-moved clock (deterministic)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from coadapt.controller.db import sqlite_url
from coadapt.controller.reconciler import Controller, ControllerConfig
from coadapt.controller.states import JobState
from coadapt.controller.store import Store
from coadapt.executors import FakeExecutor
from coadapt.policies import (
    BatchMode,
    ClusterSnapshot,
    Decision,
    PolicyState,
    make_policy,
)
from tests.controller.conftest import FakeClock, Rig


@dataclass
class ScriptedPolicy:
    """Returns whatever the test put in ``plan`` (job name -> GPUs); records its snapshots."""

    plan: dict[str, int] = field(default_factory=dict)
    name: str = "scripted"
    batch_mode: BatchMode = BatchMode.ADAPTIVE
    seen: list[ClusterSnapshot] = field(default_factory=list)

    def optimize(
        self, snapshot: ClusterSnapshot, state: PolicyState, rng: np.random.Generator
    ) -> Decision:
        self.seen.append(snapshot)
        return Decision({k: (v,) for k, v in self.plan.items() if k in snapshot.jobs})


RigFactory = Callable[..., Rig]


@pytest.fixture
def rig(sqlite_store: Store, tmp_path: Path) -> RigFactory:
    def build(
        policy: Any = None,
        slots: int = 4,
        exit_on_stop: bool = True,
        store: Store | None = None,
        **config: Any,
    ) -> Rig:
        db = store if store is not None else sqlite_store
        clock = FakeClock()
        executor = FakeExecutor(slots=slots, exit_on_stop=exit_on_stop)
        pol = policy if policy is not None else ScriptedPolicy()
        cfg = ControllerConfig(
            state_dir=tmp_path / "state",
            interval=60.0,
            stop_grace=10.0,
            backoff_base=2.0,
            metrics_base_url="http://127.0.0.1:1",
            **config,
        )
        tenant = db.tenant_by_name("alice") or db.create_tenant("alice", 0.0)[0]
        return Rig(db, executor, clock, Controller(db, executor, pol, cfg, clock), tenant, pol)

    return build


def test_launch_sets_the_training_environment(rig: RigFactory) -> None:
    r = rig()
    job = r.submit(args=["--out", "${COADAPT_CHECKPOINT_DIR}/x"])
    r.policy.plan = {job.id: 2}
    r.step()
    job = r.job(job.id)
    assert (job.state, job.replicas, job.attempt) == (JobState.RUNNING, 2, 1)
    reps = sorted(r.executor.running(job.id), key=lambda x: x.spec.rank)
    assert [x.spec.rank for x in reps] == [0, 1]
    env = reps[1].spec.env
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "2" and env["LOCAL_RANK"] == "1"
    assert (
        env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == reps[0].spec.env["MASTER_PORT"]
    )
    assert env["COADAPT_JOB_ID"] == job.id and env["COADAPT_NUM_NODES"] == "1"
    assert env["COADAPT_RESTARTS"] == "0"
    assert env["COADAPT_CHECKPOINT_DIR"].endswith(f"jobs/{job.id}/checkpoints")
    assert env["COADAPT_METRICS_URL"].endswith(
        f"/api/v1/jobs/{job.id}/metrics?token={r.store.job_token(job.id)}"
    )
    assert reps[0].spec.argv[-1] == env["COADAPT_CHECKPOINT_DIR"] + "/x"
    assert {x.spec.slot for x in reps} == {0, 1}


def test_rescale_is_sigterm_then_restart_at_the_new_allocation(rig: RigFactory) -> None:
    r = rig()
    job = r.submit()
    r.policy.plan = {job.id: 1}
    r.step()
    first = r.executor.running(job.id)
    r.policy.plan = {job.id: 3}
    r.step(advance=61)  # next round: the policy wants 3
    assert r.job(job.id).state is JobState.RESCALING
    assert first[0].signals == ["SIGTERM"]
    r.step()  # the replica exited 0 after its checkpoint; relaunch at 3
    job = r.job(job.id)
    assert (job.state, job.replicas, job.attempt, job.num_restarts) == (JobState.RUNNING, 3, 2, 1)
    assert job.max_gpus_held == 3
    assert all(x.spec.env["COADAPT_RESTARTS"] == "1" for x in r.executor.running(job.id))
    assert r.executor.finish(job.id, 0) == 3
    r.step()
    job = r.job(job.id)
    assert job.state is JobState.SUCCEEDED and job.replicas == 0
    assert job.attained_service == pytest.approx(1 * 61 + 3 * 0)


def test_failure_is_retried_with_exponential_backoff_then_fails(rig: RigFactory) -> None:
    r = rig()
    job = r.submit(max_restarts=2)
    r.policy.plan = {job.id: 1}
    r.step()
    delays = []
    for attempt in (1, 2):
        r.executor.finish(job.id, 3)
        r.step()
        j = r.job(job.id)
        assert j.state is JobState.PENDING and j.failures == attempt
        assert "exited with code 3" in (j.reason or "")
        delays.append(j.not_before - r.clock())
        r.step(advance=delays[-1] - 0.5)
        assert not r.executor.running(job.id)  # still backing off
        r.step(2, advance=0.5)  # eligible again: relaunched by the next (coalesced) round
        assert r.job(job.id).attempt == attempt + 1
    assert delays == [2.0, 4.0]
    r.executor.finish(job.id, 3)
    r.step()
    j = r.job(job.id)
    assert j.state is JobState.FAILED and "gave up after 2 restarts" in (j.reason or "")


def test_one_failed_replica_stops_the_others(rig: RigFactory) -> None:
    r = rig()
    job = r.submit(max_restarts=1)
    r.policy.plan = {job.id: 2}
    r.step()
    r.executor.finish(job.id, 9, rank=1)
    r.step()  # rank 0 gets SIGTERM, exits 0 (fake), attempt settles as a failure
    r.step()
    j = r.job(job.id)
    assert j.state is JobState.PENDING and j.failures == 1 and "rank 1" in (j.reason or "")


def test_cancel_stops_then_kills_after_the_grace(rig: RigFactory) -> None:
    r = rig(exit_on_stop=False)
    job = r.submit()
    r.policy.plan = {job.id: 2}
    r.step()
    r.store.update_job(job.id, r.clock(), state=JobState.CANCELLED)
    r.step()
    reps = r.executor.running(job.id)
    assert len(reps) == 2 and all(x.signals == ["SIGTERM"] for x in reps)
    r.step(advance=11)
    assert not r.executor.running(job.id)
    assert r.job(job.id).state is JobState.CANCELLED


def test_unresponsive_rescale_is_killed_and_not_counted_as_failure(rig: RigFactory) -> None:
    r = rig(exit_on_stop=False)
    job = r.submit()
    r.policy.plan = {job.id: 1}
    r.step()
    r.policy.plan = {job.id: 2}
    r.step(advance=61)
    assert r.job(job.id).state is JobState.RESCALING
    r.step(advance=11)  # grace over: SIGKILL
    r.step()
    j = r.job(job.id)
    assert (j.state, j.replicas, j.failures) == (JobState.RUNNING, 2, 0)


def test_slots_are_never_over_committed(rig: RigFactory) -> None:
    r = rig(exit_on_stop=False)
    a, b = r.submit(name="a"), r.submit(name="b")
    r.policy.plan = {a.id: 4}
    r.step()
    r.policy.plan = {a.id: 1, b.id: 3}
    r.step(advance=61)
    assert r.job(a.id).state is JobState.RESCALING
    assert r.job(b.id).state is JobState.PENDING  # a still holds all 4 slots
    assert len(r.executor.running()) == 4
    r.executor.finish(a.id, 0)
    r.step()
    assert (r.job(a.id).replicas, r.job(b.id).replicas) == (1, 3)
    assert len(r.executor.running()) == 4
    slots = sorted(x.spec.slot for x in r.executor.running())
    assert slots == [0, 1, 2, 3]


def test_a_restarted_controller_adopts_instead_of_relaunching(rig: RigFactory) -> None:
    r = rig()
    job = r.submit()
    r.policy.plan = {job.id: 2}
    r.step()
    pids = sorted(x.handle.pid for x in r.executor.running())
    # A new controller process: same database and machine, fresh memory.
    r2 = rig(policy=ScriptedPolicy(plan={job.id: 2}))
    r2.executor = r.executor
    r2.controller = Controller(r.store, r.executor, r2.policy, r.controller.config, r.clock)
    r2.step(3, advance=1)
    assert sorted(x.handle.pid for x in r.executor.running()) == pids
    assert len(r.executor.replicas) == 2  # nothing launched twice
    assert r.job(job.id).attempt == 1


def test_a_launch_interrupted_by_a_crash_is_redone(rig: RigFactory) -> None:
    r = rig()
    job = r.submit()
    # The crashed controller had marked the job RUNNING and written a replica row, but the
    # process never started (no pid file).
    r.store.update_job(job.id, r.clock(), state=JobState.RUNNING, attempt=1, replicas=2)
    r.store.add_replica(job.id, 1, 0, 0, "/nowhere", "/nowhere/log", r.clock())
    r.policy.plan = {job.id: 2}
    r.step()  # the row is marked lost, the job goes back to PENDING ...
    r.step()  # ... and is launched again as attempt 2, without counting a failure
    j = r.job(job.id)
    assert (j.state, j.attempt, j.failures, j.replicas) == (JobState.RUNNING, 2, 0, 2)


def test_launch_errors_fail_the_job_after_max_restarts(rig: RigFactory) -> None:
    r = rig()
    job = r.submit(max_restarts=0)
    r.policy.plan = {job.id: 1}
    r.executor.launch_failures = 1
    r.step()
    r.step()
    j = r.job(job.id)
    assert j.state is JobState.FAILED and "launch failed" in (j.reason or "")
    assert any(e.kind == "launch-error" for e in r.store.events(job.id))


def test_policy_error_is_recorded_and_the_loop_survives(rig: RigFactory) -> None:
    r = rig(slots=2)
    job = r.submit()
    r.policy.plan = {job.id: 5}  # over-commits a 2-slot node
    r.step()
    assert r.job(job.id).desired_replicas == 0
    assert [e.kind for e in r.store.events(kinds=["policy-error"])] == ["policy-error"]


def test_prompt_round_on_submit_and_interval_otherwise(rig: RigFactory) -> None:
    r = rig()
    r.step()
    rounds = len(r.policy.seen)
    r.step(advance=1)
    assert len(r.policy.seen) == rounds  # nothing changed, interval not due
    r.submit()
    r.step(advance=1)
    assert len(r.policy.seen) == rounds + 1  # the set of schedulable jobs changed
    r.step(advance=61)
    assert len(r.policy.seen) == rounds + 2
    r.controller.poke()
    r.step(advance=0.5)
    assert len(r.policy.seen) == rounds + 2  # prompt rounds are at most 1 per second
    r.step(advance=0.5)
    assert len(r.policy.seen) == rounds + 3


def test_snapshot_carries_the_job_figures(rig: RigFactory) -> None:
    r = rig(slots=4)
    job = r.submit(max_replicas=8, replicas=2, priority=3)
    r.store.merge_report(
        job.id,
        {
            "perf": {
                "alpha_grad": 0.01,
                "beta_grad": 0.001,
                "alpha_local": 0.005,
                "beta_local": 0.001,
                "alpha_node": 0.01,
                "beta_node": 0.001,
                "gamma": 1.0,
            },
            "grad": {"sqr": 1.0, "var": 2.0},
        },
    )
    r.policy.plan = {job.id: 2}
    r.step()
    r.step(advance=61)
    info = r.policy.seen[-1].jobs[job.id]
    assert info.max_replicas == 4 and info.requested_replicas == 2 and info.priority == 3
    assert info.goodput is not None and info.goodput.init_batch_size == 32
    assert info.limits is not None and info.limits.max_batch_size == 256
    assert info.max_gpus_held == 2 and info.attained_service == pytest.approx(2 * 61)
    assert r.policy.seen[-1].current[job.id] == (2,)
    assert info.step_time is not None and info.step_time(2) < info.step_time(1)


@pytest.mark.parametrize("name", ["pollux", "fifo", "tiresias", "optimus", "pollux-ga"])
def test_real_policies_drive_the_loop_deterministically(
    rig: RigFactory, name: str, tmp_path: Path
) -> None:
    def run(tag: str) -> list[tuple[str, int]]:
        db = Store.open(sqlite_url(tmp_path / f"{tag}.db"))
        r = rig(policy=make_policy(name), seed=7, store=db)
        ids = [r.submit(name=f"j{i}", max_replicas=2).id for i in range(3)]
        out: list[tuple[str, int]] = []
        for _ in range(4):
            r.step(advance=61)
            jobs = [r.job(i) for i in ids]
            out.extend((j.name, j.replicas) for j in jobs)
            assert sum(len(r.executor.running(i)) for i in ids) <= 4
        db.close()
        return out

    first, second = run("a"), run("b")
    assert first == second
    assert any(k > 0 for _, k in first)

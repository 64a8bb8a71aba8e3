"""Out-of-memory co-adaptation, the controller's half (issue 13.4): an OOM replica teaches
the job a per-replica batch cap, the retry is not a failure while the cap still shrinks, the
policy never counts on a bigger micro-batch, and the job's API view says so."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import text

from coadapt.controller.api import job_view
from coadapt.controller.db import make_engine, migrate, sqlite_url
from coadapt.controller.reconciler import Controller, ControllerConfig
from coadapt.controller.snapshot import job_info
from coadapt.controller.spec import parse_spec
from coadapt.controller.states import JobState
from coadapt.controller.store import Store
from coadapt.executors import FakeExecutor, LocalExecutor, ReplicaPhase, ReplicaStatus
from coadapt.executors.base import OOM_EXIT_CODE
from coadapt.train.memory import record_oom
from tests.controller.conftest import FakeClock, Rig, make_spec
from tests.controller.test_reconciler import ScriptedPolicy

PERF = {
    "alpha_grad": 0.01,
    "beta_grad": 0.001,
    "alpha_local": 0.005,
    "beta_local": 0.001,
    "alpha_node": 0.01,
    "beta_node": 0.001,
    "gamma": 1.0,
}


@pytest.fixture
def r(sqlite_store: Store, tmp_path: Path) -> Rig:
    clock = FakeClock()
    executor = FakeExecutor(slots=4)
    policy = ScriptedPolicy()
    cfg = ControllerConfig(state_dir=tmp_path / "state", interval=60.0, backoff_base=2.0)
    tenant = sqlite_store.create_tenant("alice", 0.0)[0]
    ctl = Controller(sqlite_store, executor, policy, cfg, clock)
    return Rig(sqlite_store, executor, clock, ctl, tenant, policy)


def _oom(r: Rig, job_id: str, code: int = 137) -> None:
    """Rank 0 ends for lack of memory, as the local executor reports it."""
    rep = next(x for x in r.executor.running(job_id) if x.spec.rank == 0)
    rep.status = ReplicaStatus(ReplicaPhase.EXITED, code, "killed by the OOM killer", oom=True)


def test_an_oom_shrinks_the_cap_until_batch_one_then_fails_for_real(r: Rig) -> None:
    job = r.submit(batch_size=32, max_restarts=1)
    r.policy.plan = {job.id: 2}
    r.step()
    r.store.merge_report(job.id, {"local_bsz": 16, "accum_steps": 0})
    caps = []
    for expected in (8, 4, 2, 1):
        _oom(r, job.id)
        r.step()  # the other rank is stopped (SIGTERM, exits 0)
        r.step()  # the attempt is settled: pending, with the learned cap, at once
        j = r.job(job.id)
        assert j.state in (JobState.PENDING, JobState.RUNNING), j.reason
        assert j.failures == 0 and j.max_local_bsz == expected
        caps.append(expected)
        if j.state is JobState.PENDING:
            r.step()
        running = r.executor.running(job.id)
        assert running and all(
            x.spec.env["COADAPT_MAX_LOCAL_BSZ"] == str(expected) for x in running
        )
    assert caps == [8, 4, 2, 1]
    assert r.job(job.id).memory_limit == {"max_local_bsz": 1, "oom_local_bsz": 2, "ooms": 4}
    events = [e.message for e in r.store.events(job.id) if "ran out of memory" in e.message]
    assert "per-replica batch 16; retrying with per-replica batch <= 8" in events[0]
    # Batch 1 does not fit either: now an ordinary failure (max_restarts=1: one retry).
    _oom(r, job.id)
    r.step(2)
    j = r.job(job.id)
    assert j.state is JobState.PENDING and j.failures == 1
    assert "out of memory even at per-replica batch 1" in (j.reason or "")
    r.step(2, advance=3)
    _oom(r, job.id)
    r.step(2)
    j = r.job(job.id)
    assert j.state is JobState.FAILED and "out of memory even at per-replica batch 1" in (
        j.reason or ""
    )


def test_the_batch_the_library_recorded_wins_over_the_stale_report(r: Rig) -> None:
    job = r.submit(batch_size=64)
    r.policy.plan = {job.id: 1}
    r.step()
    r.store.merge_report(job.id, {"local_bsz": 64})  # the last progress report
    # The job retuned to m=48 since, ran out of memory there and said so before exiting.
    record_oom(r.controller.job_dir(job.id) / "checkpoints", 48)
    _oom(r, job.id, code=OOM_EXIT_CODE)
    r.step()
    j = r.job(job.id)
    assert j.memory_limit == {"max_local_bsz": 24, "oom_local_bsz": 48, "ooms": 1}


def test_without_any_report_the_submitted_split_is_halved(r: Rig) -> None:
    job = r.submit(batch_size=30, max_local_bsz=12)
    r.policy.plan = {job.id: 2}
    r.step()
    _oom(r, job.id)
    r.step(2)
    assert r.job(job.id).max_local_bsz == 6  # min(ceil(30 / 2), 12) = 12 failed


def test_the_policy_never_sees_a_micro_batch_above_the_cap(r: Rig) -> None:
    job = r.submit(batch_size=32, max_batch_size=1024, max_local_bsz=256)
    r.store.merge_report(job.id, {"perf": PERF, "grad": {"sqr": 1.0, "var": 50.0}})
    before = job_info(r.job(job.id), 4)
    assert before.limits is not None and before.limits.max_local_bsz == 256
    r.store.update_job(
        job.id, r.clock(), memory_limit={"max_local_bsz": 8, "oom_local_bsz": 16, "ooms": 1}
    )
    info = job_info(r.job(job.id), 4)
    assert info.limits is not None and info.limits.max_local_bsz == 8
    assert info.goodput is not None
    choice = info.goodput.optimize(np.array([1, 1]), np.array([1, 4]), info.limits)
    assert np.all(choice.local_bsz <= 8)
    assert np.any(choice.total_batch > 8 * np.array([1, 4]))  # bigger M via accumulation


def test_the_job_view_shows_what_was_learned(r: Rig) -> None:
    job = r.submit()
    assert job_view(r.job(job.id))["memory_limit"] is None
    r.store.update_job(
        job.id, r.clock(), memory_limit={"max_local_bsz": 8, "oom_local_bsz": 16, "ooms": 1}
    )
    view = job_view(r.job(job.id))
    assert view["memory_limit"]["text"] == (
        "memory limit: per-replica batch ≤ 8 (learned after OOM at 16)"
    )
    json.dumps(view)


def test_upgrade_from_0003_keeps_rows_without_a_limit(tmp_path: Path) -> None:
    engine = make_engine(sqlite_url(tmp_path / "old.db"))
    try:
        migrate(engine, "0003")
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO tenants (id, name, is_admin, created_at) VALUES "
                    "('t1', 'a', false, 0)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO jobs (id, tenant_id, name, spec, state, priority, submit_time,"
                    " updated_at, attempt, replicas, desired_replicas, num_restarts, failures,"
                    " not_before, attained_service, max_gpus_held) VALUES ('j1', 't1', 'old',"
                    " '{}', 'RUNNING', 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO replicas (job_id, attempt, rank, slot, node, status, run_dir,"
                    " log_path, started_at) VALUES ('j1', 1, 0, 0, 'local', 'live', '/r', '/l', 0)"
                )
            )
        migrate(engine)
    finally:
        engine.dispose()
    store = Store.open(sqlite_url(tmp_path / "old.db"))
    try:
        job = store.get_job("j1")
        assert job.memory_limit is None and job.max_local_bsz is None
        assert [rep.oom for rep in store.replicas("j1")] == [False]
    finally:
        store.close()


def test_a_real_job_that_runs_out_of_memory_finishes_with_a_smaller_batch(
    sqlite_store: Store, tmp_path: Path
) -> None:
    """Controller + local executor + the training library, no fakes: the script's forward
    "does not fit" above 10 samples per replica; it exits 86 twice (m = 32, then 16) and
    finishes at m = 8 with 3 accumulation steps, no failure counted."""
    script = Path(__file__).resolve().parents[1] / "train" / "scripts" / "crash_train.py"
    log = tmp_path / "steps.jsonl"
    policy = ScriptedPolicy()
    cfg = ControllerConfig(state_dir=tmp_path / "state", interval=60.0, min_round_gap=0.0)
    ctl = Controller(sqlite_store, LocalExecutor(slots=1), policy, cfg)
    tenant = sqlite_store.create_tenant("alice", 0.0)[0]
    spec = make_spec(
        script=str(script),
        args=["--log", str(log), "--max-steps", "20", "--batch-size", "32", "--oom-above", "10"],
        batch_size=32,
        max_restarts=0,
        env={"OMP_NUM_THREADS": "1", "COADAPT_CHECKPOINT_INTERVAL": "0"},
    )
    job = sqlite_store.create_job(tenant, parse_spec(spec), time.time())
    policy.plan = {job.id: 1}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not sqlite_store.get_job(job.id).state.is_terminal:
        ctl.step()
        time.sleep(0.1)
    j = sqlite_store.get_job(job.id)
    assert j.state is JobState.SUCCEEDED, (j.reason, [e.message for e in sqlite_store.events(j.id)])
    assert j.failures == 0 and j.attempt == 3
    assert j.memory_limit == {"max_local_bsz": 8, "oom_local_bsz": 16, "ooms": 2}
    codes = [r.exit_code for r in sqlite_store.replicas(j.id)]
    assert codes == [OOM_EXIT_CODE, OOM_EXIT_CODE, 0]
    assert [r.oom for r in sqlite_store.replicas(j.id)] == [True, True, False]
    last = [json.loads(x) for x in log.read_text().splitlines()][-2]
    assert (last["step"], last["local_bsz"], last["accum_steps"]) == (20, 8, 3)

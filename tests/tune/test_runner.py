"""The tuning loop on the real Store (SQLite, and PostgreSQL where cheap), an injected clock,
and job states driven directly through the Store (no processes: the job loop's part is
tested in tests/controller; here the trial jobs' life is played by hand)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest
from optuna.trial import TrialState as OS

from coadapt.controller.states import JobState
from coadapt.controller.store import Job, Store, Tenant
from coadapt.protocol import CancelCause
from coadapt.tune.runner import MARKER_ENV, TuneRunner
from coadapt.tune.spec import parse_experiment
from coadapt.tune.store import Experiment, ExperimentState, TrialState, TuneStore
from tests.controller.conftest import HERE, TINY_JOB, FakeClock


def exp_spec(**over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "exp",
        "space": {
            "lr": {"type": "float", "low": 0.001, "high": 1.0, "log": True},
            "width": {"type": "categorical", "choices": [8, 16, 32]},
        },
        "objective": {"metric": "accuracy", "direction": "maximize"},
        "sampler": "random",
        "seed": 0,
        "parallelism": 2,
        "max_trials": 6,
        "max_retries": 1,
        "dead_after_s": 100,
        "trial": {"script": str(TINY_JOB), "working_dir": str(HERE)},
    }
    spec.update(over)
    return spec


class Env:
    """A store, a tenant, a clock and a runner on one database."""

    def __init__(self, store: Store, slots: int = 8, policy: str = "fifo") -> None:
        self.store = store
        self.tune = TuneStore(store)
        self.clock = FakeClock()
        self.slots = slots
        self.policy = policy
        self.tenant, _ = store.create_tenant("alice", self.clock())
        self.runners: list[TuneRunner] = []
        self.runner = self.new_runner()

    def new_runner(self) -> TuneRunner:
        """A fresh runner (as after a controller restart): no memory but the database."""
        # A callable, as the server passes: the capacity follows the cluster's inventory.
        runner = TuneRunner(self.store, lambda: self.slots, self.policy, self.clock)
        self.runners.append(runner)
        return runner

    def close(self) -> None:
        for runner in self.runners:
            runner.close()
        self.store.close()

    def submit(self, tenant: Tenant | None = None, **over: Any) -> Experiment:
        spec = parse_experiment(exp_spec(**over))
        return self.tune.create_experiment(
            tenant or self.tenant, spec.name, spec.model_dump(mode="json"), self.clock()
        )

    def job(self, job_id: str | None) -> Job:
        assert job_id is not None
        return self.store.get_job(job_id)

    def start(self, job_id: str | None) -> None:
        assert job_id is not None
        self.store.update_job(
            job_id, self.clock(), state=JobState.RUNNING, started_at=self.clock(), replicas=1
        )

    def report(self, job_id: str | None, *values: float, first_step: int = 1) -> None:
        assert job_id is not None
        for i, v in enumerate(values):
            self.clock.advance(1.0)
            self.store.add_metric(job_id, "accuracy", v, first_step + i, self.clock())

    def end(self, job_id: str | None, state: JobState) -> None:
        assert job_id is not None
        if self.job(job_id).state is JobState.PENDING:
            self.start(job_id)
        self.store.update_job(job_id, self.clock(), state=state, replicas=0)

    def active(self, exp_id: str) -> list[Any]:
        return self.tune.trials(exp_id, states=(TrialState.PENDING, TrialState.RUNNING))

    def optuna_states(self, exp: Experiment) -> dict[int, OS]:
        study = self.runner.study(exp, parse_experiment(exp.spec))
        return {t.number: t.state for t in study.get_trials(deepcopy=False)}


@pytest.fixture
def env(tmp_path: Any) -> Iterator[Env]:
    from coadapt.controller.db import sqlite_url

    e = Env(Store.open(sqlite_url(tmp_path / "tune.db")))
    yield e
    e.close()


@pytest.fixture
def env_any(db_url: str) -> Iterator[Env]:
    e = Env(Store.open(db_url))
    yield e
    e.close()


def test_trials_are_asked_up_to_parallelism_as_jobs_of_the_tenant(env_any: Env) -> None:
    env = env_any
    exp = env.submit()
    env.runner.step()
    env.runner.step()  # idempotent: nothing more while both run
    trials = env.tune.trials(exp.id)
    assert [t.number for t in trials] == [0, 1]
    assert all(t.state is TrialState.RUNNING and t.attempts == 1 for t in trials)
    for t in trials:
        job = env.job(t.job_id)
        assert job.tenant_id == env.tenant.id
        assert job.name == f"exp-t{t.number}"
        assert job.spec["env"][MARKER_ENV] == f"{exp.id}/{t.number}/1"
        assert job.spec["max_restarts"] == 0 and job.spec["max_replicas"] == 1
        assert "--lr" in job.spec["args"]
    assert env.optuna_states(exp) == {0: OS.RUNNING, 1: OS.RUNNING}
    assert len(env.store.list_jobs()) == 2


def test_success_is_told_and_the_next_trial_asked(env: Env) -> None:
    exp = env.submit()
    env.runner.step()
    first = env.tune.trials(exp.id)[0]
    env.start(first.job_id)
    env.report(first.job_id, 0.5, 0.7)
    env.end(first.job_id, JobState.SUCCEEDED)
    env.runner.step()
    done = env.tune.trial(exp.id, 0)
    assert done is not None and done.state is TrialState.SUCCEEDED and done.value == 0.7
    assert [p[:2] for p in done.curve] == [[1.0, 0.5], [2.0, 0.7]]
    assert env.optuna_states(exp)[0] is OS.COMPLETE
    study = env.runner.study(exp, parse_experiment(exp.spec))
    assert study.trials[0].value == 0.7 and study.trials[0].intermediate_values == {1: 0.5, 2: 0.7}
    assert len(env.active(exp.id)) == 2  # trial 2 replaced it
    exp = env.tune.get_experiment(exp.id)
    assert exp.best_value == 0.7 and exp.best_trial == 0
    assert [h[1] for h in exp.best_history] == [0.5, 0.7]


def test_a_failed_trial_is_retried_with_a_new_job_then_given_up(env: Env) -> None:
    exp = env.submit(max_retries=1, parallelism=1)
    env.runner.step()
    t = env.tune.trials(exp.id)[0]
    first_job = t.job_id
    env.end(first_job, JobState.FAILED)
    env.runner.step()
    t = env.tune.trials(exp.id)[0]
    assert t.state is TrialState.RUNNING and t.attempts == 2 and t.job_id != first_job
    assert env.job(t.job_id).spec["env"][MARKER_ENV] == f"{exp.id}/0/2"
    assert env.optuna_states(exp)[0] is OS.RUNNING  # same Optuna trial
    env.end(t.job_id, JobState.FAILED)
    env.runner.step()
    t = env.tune.trials(exp.id)[0]
    assert t.state is TrialState.FAILED and "gave up after 2 attempt(s)" in (t.reason or "")
    assert env.optuna_states(exp)[0] is OS.FAIL
    assert [x.number for x in env.active(exp.id)] == [1]  # a new trial takes its slot


def test_a_succeeded_job_without_a_value_is_a_failed_attempt(env: Env) -> None:
    exp = env.submit(max_retries=0, parallelism=1)
    env.runner.step()
    t = env.tune.trials(exp.id)[0]
    env.end(t.job_id, JobState.SUCCEEDED)
    env.runner.step()
    t = env.tune.trials(exp.id)[0]
    assert t.state is TrialState.FAILED and "no 'accuracy' value" in (t.reason or "")


def test_a_dead_trial_is_cancelled_and_retried(env: Env) -> None:
    exp = env.submit(dead_after_s=100, parallelism=1)
    env.runner.step()
    t = env.tune.trials(exp.id)[0]
    env.start(t.job_id)
    env.report(t.job_id, 0.3)
    env.clock.advance(50)
    env.runner.step()
    assert env.tune.trials(exp.id)[0].attempts == 1  # reported 51 s ago: alive
    env.clock.advance(60)
    env.runner.step()
    old = env.job(t.job_id)
    assert old.state is JobState.CANCELLED and (old.reason or "").startswith("tune: dead")
    t2 = env.tune.trials(exp.id)[0]
    assert t2.state is TrialState.RUNNING and t2.attempts == 2 and t2.job_id != t.job_id
    # a queued job is not dead: the scheduler may hold it back for long
    env.clock.advance(1000)
    env.runner.step()
    assert env.tune.trials(exp.id)[0].attempts == 2


def test_reaching_the_target_ends_the_experiment_and_cancels_the_rest(env: Env) -> None:
    exp = env.submit(target=0.9, max_trials=None, parallelism=3)
    env.runner.step()
    a, b, c = env.tune.trials(exp.id)
    env.start(a.job_id)
    env.start(b.job_id)
    env.report(b.job_id, 0.4)
    env.report(a.job_id, 0.8, 0.95)  # reached mid-training
    env.runner.step()
    exp = env.tune.get_experiment(exp.id)
    assert exp.state is ExperimentState.SUCCEEDED and exp.best_value == 0.95
    assert exp.target_reached_at is not None and "trial #0" in (exp.reason or "")
    for t in (a, b, c):
        assert env.job(t.job_id).state is JobState.CANCELLED
    states = {t.number: t.state for t in env.tune.trials(exp.id)}
    assert states == {0: TrialState.SUCCEEDED, 1: TrialState.CANCELLED, 2: TrialState.CANCELLED}
    assert env.optuna_states(exp) == {0: OS.COMPLETE, 1: OS.FAIL, 2: OS.FAIL}
    env.runner.step()
    assert len(env.tune.trials(exp.id)) == 3


def test_pruned_trials_are_cancelled_and_told_pruned(env: Env) -> None:
    exp = env.submit(
        parallelism=2,
        max_steps=4,
        early_stopping={"rule": "median", "grace_steps": 1, "min_peers": 1},
    )
    env.runner.step()
    a, b = env.tune.trials(exp.id)
    env.start(a.job_id)
    env.report(a.job_id, 0.8, 0.9, 0.92, 0.93)
    env.end(a.job_id, JobState.SUCCEEDED)
    env.start(b.job_id)
    env.report(b.job_id, 0.1, 0.12)
    env.runner.step()
    job = env.job(b.job_id)
    assert job.state is JobState.CANCELLED and (job.reason or "").startswith("tune: pruned")
    b = env.tune.trial(exp.id, 1)  # type: ignore[assignment]
    assert b is not None and b.state is TrialState.PRUNED and b.value == 0.12
    assert env.optuna_states(exp)[1] is OS.PRUNED


def test_preempted_trials_are_cancelled_and_told_pruned(env: Env) -> None:
    from collections.abc import Sequence

    from coadapt.tune.policies import ClusterView, ExperimentView, Grant, Stop

    env.slots = 2
    a = env.submit(name="a", parallelism=2, max_trials=20, max_steps=10)
    env.runner.step()  # fifo: a takes both slots
    t0, t1 = env.tune.trials(a.id)
    b = env.submit(name="b", parallelism=1, max_trials=20)
    env.start(t0.job_id)
    env.report(t0.job_id, 0.3, 0.31, 0.32)
    seen: list[ExperimentView] = []

    def preempting(views: Sequence[ExperimentView], cluster: ClusterView) -> dict[str, Grant]:
        seen.extend(views)
        assert cluster.free_slots == 0
        return {
            a.id: Grant(1, stop=(Stop(0, b.id, "0 vs 1 gap fraction per GPU-s"),)),
            b.id: Grant(1),
        }

    env.runner.policy = preempting
    env.runner.step()
    # the view offers the running trial with its curve and measured seconds per step
    run = {v.id: v for v in seen}[a.id].running_trials
    assert [(r.number, len(r.curve), r.step_s) for r in run] == [(0, 3, 1.0), (1, 0, None)]
    job = env.job(t0.job_id)
    assert job.state is JobState.CANCELLED
    assert job.reason == f"tune: preempted for {b.id}: 0 vs 1 gap fraction per GPU-s"
    stopped = env.tune.trial(a.id, 0)
    assert stopped is not None and stopped.state is TrialState.PRUNED and stopped.value == 0.32
    study = env.runner.study(a, parse_experiment(a.spec))
    frozen = study.get_trials(deepcopy=False)[0]
    assert frozen.state is OS.PRUNED and frozen.intermediate_values == {1: 0.3, 2: 0.31, 3: 0.32}
    assert [e.kind for e in env.store.events(t0.job_id, kinds=["tune-preempted"])] == [
        "tune-preempted"
    ]
    assert env.job(t1.job_id).state is JobState.PENDING  # the other trial runs on
    assert [t.number for t in env.tune.trials(a.id)] == [0, 1]  # nothing new for a
    (nb,) = env.tune.trials(b.id)  # the freed slot went to b
    assert nb.job_id is not None and env.job(nb.job_id).state is JobState.PENDING


def test_a_preemption_interrupted_by_a_crash_is_settled_as_pruned(env: Env) -> None:
    exp = env.submit(parallelism=1, max_trials=20)
    env.runner.step()
    (t,) = env.tune.trials(exp.id)
    env.start(t.job_id)
    env.report(t.job_id, 0.4, 0.41)
    # cancelled with its cause, then the controller died before the trial row changed
    env.runner._cancel_job(
        t.job_id, env.clock(), CancelCause.TUNE_PREEMPTED, "tune: preempted for exp-other"
    )
    assert env.store.get_job(t.job_id).cancel_cause is CancelCause.TUNE_PREEMPTED
    env.new_runner().step()
    settled = env.tune.trial(exp.id, 0)
    assert settled is not None and settled.state is TrialState.PRUNED and settled.value == 0.41
    assert env.optuna_states(exp)[0] is OS.PRUNED


def test_max_trials_and_cancel_end_experiments(env: Env) -> None:
    exp = env.submit(max_trials=2, parallelism=2)
    env.runner.step()
    for t in env.tune.trials(exp.id):
        env.start(t.job_id)
        env.report(t.job_id, 0.5)
        env.end(t.job_id, JobState.SUCCEEDED)
    env.runner.step()
    exp = env.tune.get_experiment(exp.id)
    assert exp.state is ExperimentState.SUCCEEDED and "max_trials 2" in (exp.reason or "")
    assert len(env.tune.trials(exp.id)) == 2

    other = env.submit(name="other", max_trials=10)
    env.runner.step()
    env.tune.cancel_experiment(other.id, env.tenant, env.clock())
    env.runner.step()
    assert all(t.state is TrialState.CANCELLED for t in env.tune.trials(other.id))
    assert all(env.job(t.job_id).state is JobState.CANCELLED for t in env.tune.trials(other.id))


def test_other_jobs_slots_are_left_alone(tmp_path: Any) -> None:
    from coadapt.controller.db import sqlite_url
    from coadapt.controller.spec import parse_spec
    from tests.controller.conftest import make_spec

    env = Env(Store.open(sqlite_url(tmp_path / "t.db")), slots=3)
    try:
        store = env.store
        job = store.create_job(env.tenant, parse_spec(make_spec(name="big")), env.clock())
        store.update_job(job.id, env.clock(), state=JobState.RUNNING, replicas=2)
        exp = env.submit(parallelism=4)
        env.runner.step()
        assert len(env.tune.trials(exp.id)) == 1
    finally:
        env.close()


def test_resume_after_restart_loses_and_duplicates_nothing(
    env_any: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = env_any
    exp = env.submit(parallelism=3, max_trials=5)
    spec = parse_experiment(exp.spec)
    # 1. a crash after Optuna's ask, before the row: Optuna has trial 0, we have nothing
    from coadapt.tune.samplers import ask_params

    ask_params(env.runner.study(exp, spec), spec)
    # 2. a crash after the job was created, before the row got its id
    crashing = env.new_runner()
    real = crashing.tune.update_trial

    def crash(trial_id: int, **changes: Any) -> Any:
        if changes.get("state") is TrialState.RUNNING:
            raise RuntimeError("controller killed")
        return real(trial_id, **changes)

    monkeypatch.setattr(crashing.tune, "update_trial", crash)
    with pytest.raises(RuntimeError):
        crashing.step()
    assert len(env.store.list_jobs()) == 1  # trial 0's job exists, unrecorded
    # 3. a new controller on the same database
    fresh = env.new_runner()
    fresh.step()
    fresh.step()
    trials = env.tune.trials(exp.id)
    assert [t.number for t in trials] == [0, 1, 2]
    jobs = env.store.list_jobs()
    markers = sorted(j.spec["env"][MARKER_ENV] for j in jobs)
    assert markers == [f"{exp.id}/{n}/1" for n in range(3)]  # one job per trial, no more
    assert {t.job_id for t in trials} == {j.id for j in jobs}
    assert all(t.state is TrialState.RUNNING for t in trials)
    study = fresh.study(exp, spec)
    assert [t.number for t in study.get_trials(deepcopy=False)] == [0, 1, 2]
    # finish everything; the budget of 5 trials holds across the restart
    for _ in range(4):
        for t in env.active(exp.id):
            if env.job(t.job_id).state is JobState.PENDING:
                env.start(t.job_id)
            env.report(t.job_id, 0.5)
            env.end(t.job_id, JobState.SUCCEEDED)
        env.new_runner().step()  # a restart every round
    trials = env.tune.trials(exp.id)
    assert [t.number for t in trials] == [0, 1, 2, 3, 4]
    assert all(t.state is TrialState.SUCCEEDED for t in trials)
    assert env.tune.get_experiment(exp.id).state is ExperimentState.SUCCEEDED
    assert len(env.store.list_jobs()) == 5


def test_a_trial_asked_but_not_fully_suggested_is_failed_not_run(env: Env) -> None:
    exp = env.submit(parallelism=1)
    study = env.runner.study(exp, parse_experiment(exp.spec))
    study.ask()  # the controller died before suggesting any parameter
    env.runner.step()
    assert env.optuna_states(exp) == {0: OS.FAIL, 1: OS.RUNNING}
    assert [t.number for t in env.tune.trials(exp.id)] == [1]


def test_capacity_follows_nodes_joining_and_leaving(env: Env) -> None:
    """On a Ray cluster nodes come and go: the next tick grants what the cluster has now."""
    env.slots = 2
    exp = env.submit(parallelism=4, max_trials=20)
    env.runner.step()
    assert len(env.tune.trials(exp.id)) == 2
    env.slots = 4  # a node joined
    env.runner.step()
    assert len(env.tune.trials(exp.id)) == 4


def test_a_gp_ei_experiment_on_a_controller_without_torch_fails_naming_the_extra(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Accepted before torch went missing (a reinstall): the loop ends it with the reason and
    starts no trial with another sampler."""
    exp = env.submit(sampler="gp-ei")
    real = importlib.util.find_spec

    def no_torch(name: str, *args: Any) -> Any:
        return None if name == "torch" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", no_torch)
    env.runner.step()
    ended = env.tune.get_experiment(exp.id)
    assert ended.state is ExperimentState.FAILED
    assert ended.reason is not None and "needs torch" in ended.reason
    assert env.tune.trials(exp.id) == []

"""The control loop on a multi-node cluster (fake executor, hand-moved clock): the snapshot
has the executor's nodes, allocations are per node, placement changes re-allocate, and nodes
that leave or join are handled at the next round."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from coadapt.controller.reconciler import Controller, ControllerConfig
from coadapt.controller.states import JobState
from coadapt.controller.store import Store
from coadapt.executors import FakeExecutor
from coadapt.policies import BatchMode, ClusterSnapshot, Decision, PolicyState
from tests.controller.conftest import FakeClock, Rig


@dataclass
class NodePolicy:
    """Returns ``plan`` (job -> node -> replicas) as tuples in the snapshot's node order."""

    plan: dict[str, dict[str, int]] = field(default_factory=dict)
    name: str = "by-node"
    batch_mode: BatchMode = BatchMode.ADAPTIVE
    seen: list[ClusterSnapshot] = field(default_factory=list)

    def optimize(
        self, snapshot: ClusterSnapshot, state: PolicyState, rng: np.random.Generator
    ) -> Decision:
        self.seen.append(snapshot)
        return Decision(
            {
                job: tuple(per.get(n.name, 0) for n in snapshot.nodes)
                for job, per in self.plan.items()
                if job in snapshot.jobs
            }
        )


@pytest.fixture
def rig(sqlite_store: Store, tmp_path: Path) -> Callable[..., Rig]:
    def build(nodes: dict[str, int] | None = None, **config: Any) -> Rig:
        clock = FakeClock()
        executor = FakeExecutor(nodes=nodes or {"a": 2, "b": 2})
        policy = NodePolicy()
        cfg = ControllerConfig(
            state_dir=tmp_path / "state", interval=60.0, stop_grace=10.0, **config
        )
        tenant = sqlite_store.create_tenant("alice", 0.0)[0]
        ctl = Controller(sqlite_store, executor, policy, cfg, clock)
        return Rig(sqlite_store, executor, clock, ctl, tenant, policy)

    return build


def test_snapshot_has_the_executors_nodes_and_per_node_allocations(
    rig: Callable[..., Rig],
) -> None:
    r = rig()
    job = r.submit()
    r.policy.plan = {job.id: {"a": 1, "b": 2}}
    r.step()
    assert [(n.name, n.gpus) for n in r.policy.seen[-1].nodes] == [("a", 2), ("b", 2)]
    r.step(advance=61)
    assert r.policy.seen[-1].current[job.id] == (1, 2)
    assert r.controller.slots == 4


def test_a_job_across_two_nodes_launches_as_one_group(rig: Callable[..., Rig]) -> None:
    r = rig()
    job = r.submit()
    r.policy.plan = {job.id: {"a": 1, "b": 2}}
    r.step()
    j = r.job(job.id)
    assert (j.state, j.replicas, j.allocation) == (JobState.RUNNING, 3, {"a": 1, "b": 2})
    assert j.desired_allocation == {"a": 1, "b": 2}
    assert len(r.executor.groups) == 1  # the whole attempt in one launch_group call
    specs = r.executor.groups[0]
    assert [(s.rank, s.node, s.slot) for s in specs] == [(0, "a", 0), (1, "b", 0), (2, "b", 1)]
    env = {s.rank: s.env for s in specs}
    assert [env[i]["LOCAL_RANK"] for i in range(3)] == ["0", "0", "1"]
    assert [env[i]["LOCAL_WORLD_SIZE"] for i in range(3)] == ["1", "2", "2"]
    assert [env[i]["GROUP_RANK"] for i in range(3)] == ["0", "1", "1"]
    assert {env[i]["COADAPT_NUM_NODES"] for i in range(3)} == {"2"}
    assert {env[i]["WORLD_SIZE"] for i in range(3)} == {"3"}
    assert len({env[i]["MASTER_PORT"] for i in range(3)}) == 1
    rows = r.store.replicas(job.id)
    assert [(x.rank, x.node, x.status) for x in rows] == [
        (0, "a", "live"),
        (1, "b", "live"),
        (2, "b", "live"),
    ]


def test_slots_are_per_node(rig: Callable[..., Rig]) -> None:
    r = rig()
    a, b = r.submit(name="a"), r.submit(name="b")
    r.policy.plan = {a.id: {"a": 2}, b.id: {"b": 2}}
    r.step()
    placed = sorted((x.spec.node, x.spec.slot) for x in r.executor.running())
    assert placed == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]


def test_a_placement_change_is_a_reallocation(rig: Callable[..., Rig]) -> None:
    r = rig()
    job = r.submit()
    r.policy.plan = {job.id: {"a": 1, "b": 1}}
    r.step()
    r.policy.plan = {job.id: {"a": 2}}  # same count, other nodes
    r.step(advance=61)
    assert r.job(job.id).state is JobState.RESCALING
    assert all(x.signals == ["SIGTERM"] for x in r.executor.replicas.values())
    assert any("a:1+b:1 -> a:2" in e.message for e in r.store.events(job.id))
    r.step()  # exited 0 after checkpointing: relaunched on a only
    j = r.job(job.id)
    assert (j.state, j.attempt, j.allocation, j.failures) == (JobState.RUNNING, 2, {"a": 2}, 0)
    assert sorted(x.spec.node for x in r.executor.running(job.id)) == ["a", "a"]


def test_a_lost_node_restarts_the_job_on_what_remains(rig: Callable[..., Rig]) -> None:
    r = rig()
    job = r.submit(max_restarts=0)  # a node loss is not the job's failure
    r.policy.plan = {job.id: {"a": 1, "b": 1}}
    r.step()
    survivor = next(x for x in r.executor.running(job.id) if x.spec.node == "a")
    assert r.executor.remove_node("b") == 1
    r.policy.plan = {job.id: {"a": 2}}
    r.step(advance=1)  # b's replica is lost; a's gets SIGTERM (checkpoint), the job re-plans
    assert survivor.signals == ["SIGTERM"]
    lost = [x for x in r.store.replicas(job.id, attempt=1) if x.status == "lost"]
    assert [x.node for x in lost] == ["b"] and "node b lost" in (lost[0].reason or "")
    r.step(advance=1)
    j = r.job(job.id)
    assert (j.state, j.attempt, j.failures, j.allocation) == (JobState.RUNNING, 2, 0, {"a": 2})
    assert [n.name for n in r.policy.seen[-1].nodes] == ["a"]
    assert any(e.kind == "nodes" and "left: b" in e.message for e in r.store.events())
    assert any("restarting from the last checkpoint" in e.message for e in r.store.events(j.id))


def test_a_replica_that_fails_on_a_departed_node_is_lost_not_failed(
    rig: Callable[..., Rig],
) -> None:
    r = rig()
    job = r.submit(max_restarts=0)
    r.policy.plan = {job.id: {"a": 1, "b": 1}}
    r.step()
    r.executor._nodes.pop("b")  # the inventory already lacks b; the process dies after
    r.executor.finish(job.id, 1, rank=1)
    r.step(2, advance=1)
    j = r.job(job.id)
    assert j.state is not JobState.FAILED and j.failures == 0
    assert [x.status for x in r.store.replicas(job.id, attempt=1)] == ["exited", "lost"]


def test_a_pending_job_waits_while_its_chosen_node_is_gone(rig: Callable[..., Rig]) -> None:
    r = rig()
    job = r.submit()
    r.store.update_job(job.id, r.clock(), desired_replicas=2, desired_allocation={"c": 2})
    r.controller._next_round = float("inf")  # no round: only the stale decision acts
    r.controller._last_schedulable = frozenset({job.id})
    r.step()
    assert not r.policy.seen
    assert r.job(job.id).state is JobState.PENDING and not r.executor.replicas


def test_a_joining_node_is_used_at_the_next_round(rig: Callable[..., Rig]) -> None:
    r = rig(nodes={"a": 2})
    job = r.submit()
    r.policy.plan = {job.id: {"a": 2}}
    r.step()
    rounds = len(r.policy.seen)
    r.executor.add_node("c", 2)
    r.policy.plan = {job.id: {"a": 2, "c": 2}}
    r.step(advance=1.5)  # a prompt round, not the 60 s interval
    assert len(r.policy.seen) == rounds + 1
    assert [n.name for n in r.policy.seen[-1].nodes] == ["a", "c"]
    assert r.job(job.id).state is JobState.RESCALING
    r.step()
    assert r.job(job.id).allocation == {"a": 2, "c": 2}
    assert r.controller.slots == 4


def test_a_placement_that_never_comes_is_retried_without_a_failure(
    rig: Callable[..., Rig],
) -> None:
    r = rig()
    job = r.submit(max_restarts=0)
    r.policy.plan = {job.id: {"a": 1, "b": 1}}
    r.step()
    r.executor.evict(job.id, "placement group not placed within 60s")
    r.step(advance=1)
    j = r.job(job.id)
    assert j.failures == 0 and j.state in (JobState.PENDING, JobState.RUNNING)
    r.step(advance=1)
    assert r.job(job.id).attempt == 2 and r.job(job.id).state is JobState.RUNNING


def test_finished_attempts_are_released(rig: Callable[..., Rig]) -> None:
    r = rig()
    job = r.submit()
    r.policy.plan = {job.id: {"a": 1, "b": 1}}
    r.step()
    r.step()
    run_dir = r.store.replicas(job.id)[0].run_dir
    assert r.executor.retained[-1] == {run_dir}
    r.executor.finish(job.id, 0)
    r.step()
    assert r.job(job.id).state is JobState.SUCCEEDED
    assert r.executor.retained[-1] == set()

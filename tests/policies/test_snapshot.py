"""The one snapshot builder: the rules the simulator and the controller share."""

from __future__ import annotations

import pytest

from coadapt.policies import NodeInfo
from coadapt.policies.snapshot import (
    JobFacts,
    accrued_service,
    allocation_dict,
    allocation_tuple,
    build_snapshot,
)

NODES = (NodeInfo("a", 4), NodeInfo("b", 2))


def test_attained_service_counts_gpus_held_since_the_last_account() -> None:
    assert accrued_service(100.0, 3, 10.0, 30.0) == 160.0
    assert accrued_service(100.0, 3, None, 30.0) == 100.0  # already counted up to now
    assert accrued_service(100.0, 0, 10.0, 30.0) == 100.0  # holds nothing
    assert accrued_service(100.0, 3, 40.0, 30.0) == 100.0  # clock behind the account


def test_bounds_are_clamped_to_the_cluster() -> None:
    facts = JobFacts("j", 0.0, min_replicas=9, max_replicas=64, requested_replicas=8)
    info = build_snapshot([facts], NODES, 1.0, 30.0).jobs["j"]
    assert (info.min_replicas, info.max_replicas, info.requested_replicas) == (6, 6, 6)
    free = build_snapshot([JobFacts("k", 0.0, max_replicas=0)], NODES, 1.0, 30.0).jobs["k"]
    assert free.max_replicas == 1 and free.requested_replicas is None and free.min_replicas == 0


def test_snapshot_carries_the_facts_and_service_up_to_now() -> None:
    facts = [
        JobFacts(
            "run",
            5.0,
            attained_service=50.0,
            service_since=90.0,
            gpus_held=2,
            num_restarts=1,
            max_gpus_held=4,
            priority=3,
            remaining_iterations=10.0,
            allocation={"a": 2},
        ),
        JobFacts("wait", 6.0),
    ]
    snap = build_snapshot(facts, NODES, 100.0, 12.0)
    assert list(snap.jobs) == ["run", "wait"] and snap.restart_delay == 12.0
    run = snap.jobs["run"]
    assert run.attained_service == 70.0 and run.priority == 3 and run.num_restarts == 1
    assert run.max_gpus_held == 4 and run.remaining_iterations == 10.0
    assert dict(snap.current) == {"run": (2, 0)}


def test_replicas_on_a_node_that_left_are_gone() -> None:
    facts = [
        JobFacts("split", 0.0, allocation={"a": 1, "gone": 3}),
        JobFacts("lost", 0.0, allocation={"gone": 2}),
    ]
    snap = build_snapshot(facts, NODES, 1.0, 30.0)
    assert dict(snap.current) == {"split": (1, 0)}  # "lost" holds nothing that exists


def test_duplicate_job_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="repeated: x"):
        build_snapshot([JobFacts("x", 0.0), JobFacts("x", 1.0)], NODES, 1.0, 30.0)


def test_allocation_round_trip() -> None:
    assert allocation_tuple({"b": 2, "zz": 1}, NODES) == (0, 2)
    assert allocation_dict((0, 2), NODES) == {"b": 2}
    assert allocation_tuple(allocation_dict((3, 1), NODES), NODES) == (3, 1)

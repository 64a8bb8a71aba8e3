"""The control loop on a heterogeneous cluster and with GPU sharing (fake executor, hand-moved
clock): the snapshot carries node types and a job's ``gpu_types``, allocations stay on one
allowed type, a packed guest starts on exactly its host's slots (and the packing survives a
controller restart), and a guest no longer packed moves to slots of its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from coadapt.controller.reconciler import PACKING_KEY, Controller, ControllerConfig
from coadapt.controller.snapshot import PERF_GPU_TYPE, job_facts
from coadapt.controller.states import JobState
from coadapt.controller.store import Store
from coadapt.executors import FakeExecutor
from coadapt.goodput import PerfParams
from coadapt.policies import BatchMode, ClusterSnapshot, Decision, PolicyState
from coadapt.protocol import EventKind
from tests.controller.conftest import FakeClock, Rig


@dataclass
class PackPolicy:
    """Returns ``plan`` (job -> node -> replicas) and ``packed`` (guest -> host) as given."""

    plan: dict[str, dict[str, int]] = field(default_factory=dict)
    packed: dict[str, str] = field(default_factory=dict)
    name: str = "pack-by-hand"
    batch_mode: BatchMode = BatchMode.ADAPTIVE
    seen: list[ClusterSnapshot] = field(default_factory=list)

    def optimize(
        self, snapshot: ClusterSnapshot, state: PolicyState, rng: np.random.Generator
    ) -> Decision:
        self.seen.append(snapshot)
        allocs = {
            job: tuple(per.get(n.name, 0) for n in snapshot.nodes)
            for job, per in self.plan.items()
            if job in snapshot.jobs
        }
        packed = {g: h for g, h in self.packed.items() if g in allocs and h in allocs}
        return Decision(allocs, packed=packed)


@pytest.fixture
def rig(sqlite_store: Store, tmp_path: Path) -> Callable[..., Rig]:
    def build(nodes: dict[str, int], types: dict[str, str] | None = None, **config: Any) -> Rig:
        clock = FakeClock()
        executor = FakeExecutor(nodes=nodes, gpu_types=types)
        cfg = ControllerConfig(state_dir=tmp_path / "state", interval=60.0, stop_grace=10.0)
        tenant = sqlite_store.create_tenant("alice", 0.0)[0]
        ctl = Controller(sqlite_store, executor, PackPolicy(), cfg, clock)
        return Rig(sqlite_store, executor, clock, ctl, tenant, ctl.policy)

    return build


def slots_of(r: Rig, job_id: str) -> set[tuple[str, int]]:
    return {(rep.spec.node, rep.spec.slot) for rep in r.executor.running(job_id)}


def test_the_snapshot_carries_node_types_and_job_gpu_types(rig: Callable[..., Rig]) -> None:
    r = rig({"n1": 2, "n2": 4}, {"n1": "a100", "n2": "t4"})
    job = r.submit(gpu_types=["A100"])
    r.policy.plan = {job.id: {"n1": 2}}
    r.step()
    snap = r.policy.seen[-1]
    assert [(n.name, n.gpus, n.gpu_type) for n in snap.nodes] == [
        ("n1", 2, "a100"),
        ("n2", 4, "t4"),
    ]
    assert snap.jobs[job.id].gpu_types == ("a100",)
    assert r.controller.nodes[1].gpu_type == "t4"
    # The attempt's type is stamped on the job for the next profile to be filed under.
    assert r.job(job.id).report == {"gpu_type": "a100"}


def test_an_allocation_across_types_or_outside_gpu_types_is_refused_alone(
    rig: Callable[..., Rig],
) -> None:
    r = rig({"n1": 2, "n2": 2}, {"n1": "a100", "n2": "t4"})
    job, other = r.submit(gpu_types=["t4"]), r.submit(name="other")
    for plan, words in (({"n1": 1, "n2": 1}, "spans GPU types"), ({"n1": 1}, "outside")):
        r.policy.plan = {job.id: plan, other.id: {"n2": 1}}
        r.controller.poke()
        r.step(advance=2.0)
        errors = [e for e in r.store.events(None) if e.kind == EventKind.POLICY_ERROR]
        assert errors and words in errors[-1].message and job.id in errors[-1].message
        assert not r.executor.running(job.id)
        assert slots_of(r, other.id) == {("n2", 0)}  # the rest of the round stands
    r.policy.plan = {job.id: {"n2": 1}, other.id: {"n2": 1}}
    r.controller.poke()
    r.step(advance=2.0)
    assert slots_of(r, job.id) == {("n2", 1)}


def test_goodput_by_type_files_the_model_under_the_type_it_was_measured_on(
    rig: Callable[..., Rig],
) -> None:
    r = rig({"n1": 1}, {"n1": "v100"})
    job = r.submit()
    perf = dict.fromkeys(PerfParams.__dataclass_fields__, 0.01) | {"gamma": 1.0}
    r.store.merge_report(job.id, {"perf": perf, "grad": {"sqr": 1.0, "var": 1.0}})
    assert job_facts(r.job(job.id)).goodput_by_type is None  # no type known: type-less only
    r.store.merge_report(job.id, {PERF_GPU_TYPE: "v100"})
    facts = job_facts(r.job(job.id))
    assert facts.goodput is not None and facts.goodput_by_type == {"v100": facts.goodput}


def test_a_packed_guest_starts_on_its_hosts_slot_and_counts_nothing(
    rig: Callable[..., Rig], sqlite_store: Store, tmp_path: Path
) -> None:
    r = rig({"local": 1})
    host, guest = r.submit(name="host", max_replicas=1), r.submit(name="guest", max_replicas=1)
    r.policy.plan = {host.id: {"local": 1}, guest.id: {"local": 1}}
    r.policy.packed = {guest.id: host.id}
    r.step()  # the host launches into the free slot
    r.step()  # the guest joins it once the host's replica is live
    assert slots_of(r, host.id) == slots_of(r, guest.id) == {("local", 0)}
    assert r.job(guest.id).state is JobState.RUNNING
    [alloc] = [e for e in r.store.events(guest.id) if e.kind == EventKind.ALLOC]
    assert alloc.message.endswith(f"[0], shared with {host.id}")
    assert alloc.data is not None and alloc.data["packed_with"] == host.id
    assert sqlite_store.meta_get(PACKING_KEY) == f'{{"{guest.id}": "{host.id}"}}'
    # A restarted controller keeps the packing: neither job moves.
    fresh = Controller(
        sqlite_store,
        r.executor,
        r.policy,
        ControllerConfig(state_dir=tmp_path / "state", interval=60.0, stop_grace=10.0),
        r.clock,
    )
    fresh.step()
    fresh.step()
    assert r.job(guest.id).state is JobState.RUNNING and r.job(guest.id).attempt == 1
    assert r.job(host.id).attempt == 1


def test_a_guest_waits_for_its_host_a_host_joins_its_guest_and_unpacking_moves_one(
    rig: Callable[..., Rig],
) -> None:
    r = rig({"local": 2})
    host, guest = r.submit(name="host", max_replicas=1), r.submit(name="guest", max_replicas=1)
    r.policy.plan = {host.id: {"local": 1}, guest.id: {"local": 1}}
    r.policy.packed = {guest.id: host.id}
    r.executor.launch_failures = 1  # the host's first launch fails
    r.step()
    assert not r.executor.running(guest.id)  # the guest waits for a running host
    # The host sits out its retry delay, so the policy runs the guest alone meanwhile; once
    # the host is back and the pair packed again, the host joins the guest on its slot.
    for _ in range(10):
        r.step(advance=1.0)
        if slots_of(r, host.id):
            break
    assert slots_of(r, host.id) == slots_of(r, guest.id) == {("local", 0)}
    assert r.job(guest.id).attempt == 1  # the guest never moved
    assert not [e for e in r.store.events(guest.id) if e.kind == EventKind.RESCALE]
    guest_attempt = r.job(guest.id).attempt
    # Unpacked (same per-node counts): the host, started later, moves to a slot of its own.
    r.policy.packed = {}
    r.controller.poke()
    r.step(advance=2.0)
    assert r.job(host.id).state is JobState.RESCALING
    moved = [e.message for e in r.store.events(host.id) if e.kind == EventKind.RESCALE]
    assert moved and f"no longer packed with {guest.id}" in moved[-1]
    r.step()
    r.step()
    assert slots_of(r, host.id) == {("local", 1)} and slots_of(r, guest.id) == {("local", 0)}
    assert r.job(guest.id).attempt == guest_attempt


def test_a_running_job_packed_onto_a_running_host_moves_onto_its_slots(
    rig: Callable[..., Rig],
) -> None:
    r = rig({"local": 2})
    host, guest = r.submit(name="host", max_replicas=1), r.submit(name="guest", max_replicas=1)
    r.policy.plan = {host.id: {"local": 1}, guest.id: {"local": 1}}
    r.step()
    at = slots_of(r, host.id)
    assert len(at) == 1 and slots_of(r, guest.id) == {("local", 0), ("local", 1)} - at
    r.policy.packed = {guest.id: host.id}
    r.controller.poke()
    r.step(advance=2.0)
    moved = [e.message for e in r.store.events(guest.id) if e.kind == EventKind.RESCALE]
    assert moved and f"packed with {host.id}" in moved[-1]
    r.step()
    r.step()
    assert slots_of(r, guest.id) == at and r.job(host.id).attempt == 1
    # The host finishes first: its guest keeps running where it is.
    r.executor.finish(host.id)
    r.step()
    r.step()
    assert r.job(host.id).state is JobState.SUCCEEDED
    assert slots_of(r, guest.id) == at and r.job(guest.id).attempt == 2

"""The control loop with a serving plane: co-scheduled rounds, serving rounds, slot hand-over.

The plane here is a stand-in that records what the loop asks and "starts" a replica on each
granted slot no training replica holds; the real one (:mod:`coadapt.deploy.plane`) is tested
with real processes in ``tests/deploy``.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from coadapt.controller.reconciler import Controller, ControllerConfig
from coadapt.controller.serving import SERVING_STATE_KEY, ServingPlane, Slot
from coadapt.controller.states import JobState
from coadapt.controller.store import Store
from coadapt.executors import FakeExecutor
from coadapt.policies.autoscale import DemandWindow, Deployment, StaticAutoscaler
from coadapt.policies.coschedule import Reservation
from tests.controller.conftest import FakeClock, Rig
from tests.controller.test_reconciler import ScriptedPolicy


class NoDemand:
    def window(self, deployment: str, start: float, end: float) -> DemandWindow:
        return DemandWindow(end=end)


@dataclass
class StandInPlane:
    """Holds, per deployment, the granted slots that training has left."""

    deps: list[Deployment]
    counts: dict[str, int]
    held: dict[str, set[Slot]] = field(default_factory=dict)
    calls: int = 0

    def deployments(self) -> list[Deployment]:
        return self.deps

    def demand(self) -> NoDemand:
        return NoDemand()

    def autoscaler(self) -> StaticAutoscaler:
        return StaticAutoscaler(self.counts)

    def occupied(self) -> Set[Slot]:
        return set().union(*self.held.values()) if self.held else set()

    def run_dirs(self) -> Set[str]:
        return set()

    def reconcile(
        self, reservations: Mapping[str, Reservation], busy: Set[Slot], now: float
    ) -> None:
        self.calls += 1
        for name in list(self.held):
            if name not in reservations:
                del self.held[name]
        for name, res in reservations.items():
            mine = self.held.setdefault(name, set())
            for node, k in res.placement.items():
                here = sorted(s for s in mine if s[0] == node)
                for extra in here[k:]:
                    mine.discard(extra)
                taken = self.occupied() | set(busy)
                for slot in range(16):
                    if len([s for s in mine if s[0] == node]) >= k:
                        break
                    if (node, slot) not in taken:
                        mine.add((node, slot))


@pytest.fixture
def serving_rig(sqlite_store: Store, tmp_path: Path) -> tuple[Rig, StandInPlane]:
    clock = FakeClock()
    executor = FakeExecutor(slots=4, exit_on_stop=True)
    policy = ScriptedPolicy()
    plane = StandInPlane([Deployment("web", capacity_rps=100.0, ready_s=5.0)], {"web": 1})
    assert isinstance(plane, ServingPlane)
    cfg = ControllerConfig(
        state_dir=tmp_path / "state", interval=60.0, stop_grace=10.0, serving_interval=5.0
    )
    tenant = sqlite_store.tenant_by_name("alice") or sqlite_store.create_tenant("alice", 0.0)[0]
    controller = Controller(sqlite_store, executor, policy, cfg, clock, serving=plane)
    return Rig(sqlite_store, executor, clock, controller, tenant, policy), plane


def _training_slots(rig: Rig) -> set[Slot]:
    return {(r.node, r.slot) for r in rig.store.replicas() if r.exit_code is None}


def test_serving_is_granted_first_and_training_never_lands_on_its_slots(
    serving_rig: tuple[Rig, StandInPlane],
) -> None:
    rig, plane = serving_rig
    job = rig.submit()
    rig.policy.plan = {job.id: 3}
    rig.step()
    assert rig.controller.reservations["web"].slots == 1
    assert rig.job(job.id).state is JobState.RUNNING and rig.job(job.id).replicas == 3
    assert len(plane.occupied()) == 1
    assert not plane.occupied() & _training_slots(rig)
    # the inner policy saw the cluster without the serving slot
    assert rig.policy.seen[-1].total_gpus == 3


def test_a_serving_round_that_needs_training_slots_shrinks_training_then_hands_over(
    serving_rig: tuple[Rig, StandInPlane],
) -> None:
    rig, plane = serving_rig
    job = rig.submit()
    rig.policy.plan = {job.id: 3}
    rig.step()
    rounds = len(rig.policy.seen)
    rig.step(advance=5.0)  # a serving round that fits: no full round
    assert len(rig.policy.seen) == rounds
    plane.counts["web"] = 2
    rig.policy.plan = {job.id: 2}
    rig.step(advance=5.0)  # serving wants a slot training holds: a full round follows
    assert len(rig.policy.seen) == rounds + 1
    assert rig.controller.reservations["web"].slots == 2
    for _ in range(6):  # training stops (SIGTERM), exits, relaunches on 2 slots
        rig.step(advance=1.0)
    assert rig.job(job.id).replicas == 2
    assert len(plane.occupied()) == 2
    assert not plane.occupied() & _training_slots(rig)
    # serving gives a slot back: a full round lets training regrow at once
    plane.counts["web"] = 1
    rig.policy.plan = {job.id: 3}
    rig.step(advance=5.0)
    assert rig.controller.reservations["web"].slots == 1
    assert rig.job(job.id).desired_replicas == 3


def test_the_reservations_survive_a_controller_restart(
    serving_rig: tuple[Rig, StandInPlane], tmp_path: Path
) -> None:
    rig, plane = serving_rig
    rig.step()
    assert rig.store.meta_get(SERVING_STATE_KEY)
    again = Controller(
        rig.store,
        rig.executor,
        ScriptedPolicy(),
        rig.controller.config,
        rig.clock,
        serving=plane,
    )
    assert again.reservations == rig.controller.reservations
    assert again.reservations["web"].slots == 1


def test_the_training_policys_own_state_is_kept_apart_from_serving(
    serving_rig: tuple[Rig, StandInPlane],
) -> None:
    rig, plane = serving_rig
    job = rig.submit()
    rig.policy.plan = {job.id: 2}
    rig.step()
    assert rig.store.meta_get(rig.controller.policy_state_key) == "{}"
    plane.deps = []  # the last deployment is deleted: serving holds nothing any more
    rig.step(advance=5.0)
    assert rig.controller.reservations == {}
    assert plane.occupied() == set()


def test_serving_alone_is_scheduled_and_training_launches_around_its_replicas(
    serving_rig: tuple[Rig, StandInPlane],
) -> None:
    rig, plane = serving_rig
    rig.step()  # no training job at all: serving is still decided and started
    assert plane.occupied() == {("local", 0)}
    job = rig.submit()
    rig.policy.plan = {job.id: 3}
    rig.step(advance=1.0)
    assert _training_slots(rig) == {("local", 1), ("local", 2), ("local", 3)}

"""The policy's memory across rounds survives a controller restart (issue 14.3).

Tiresias' queues used to live on the policy object and vanished with the process; they now
come back in ``Decision.state``, which the controller stores with the round counter and hands
back to a new policy object after a restart (a kill -9 loses nothing committed).
"""

from __future__ import annotations

from pathlib import Path

from coadapt.controller.reconciler import Controller, ControllerConfig
from coadapt.controller.spec import parse_spec
from coadapt.controller.store import Store
from coadapt.executors import FakeExecutor
from coadapt.policies.tiresias import TiresiasPolicy
from tests.controller.conftest import FakeClock, make_spec

THRESHOLD = 4 * 600  # GPU-seconds: 4 slots for 600 s demote a job to queue 1


def _controller(store: Store, executor: FakeExecutor, clock: FakeClock, tmp: Path) -> Controller:
    """A fresh controller and a fresh policy object, as after a restart."""
    cfg = ControllerConfig(
        state_dir=tmp / "state",
        interval=60.0,
        stop_grace=10.0,
        backoff_base=2.0,
        metrics_base_url="http://127.0.0.1:1",
    )
    return Controller(store, executor, TiresiasPolicy(threshold=THRESHOLD), cfg, clock)


def _demoted_then_restarted(tmp_path: Path, forget: bool) -> dict[str, int]:
    store = Store.open(f"sqlite:///{tmp_path / 'coadapt.db'}")
    try:
        clock = FakeClock()
        executor = FakeExecutor(slots=4)
        tenant = store.create_tenant("alice", 0.0)[0]
        ctl = _controller(store, executor, clock, tmp_path)
        old = store.create_job(tenant, parse_spec(make_spec(name="old", replicas=4)), clock())
        ctl.step()
        assert store.get_job(old.id).replicas == 4
        clock.advance(600.0)
        assert ctl.schedule(clock()) == {old.id: 4}  # demoted, but nobody else waits
        key = ctl.policy_state_key
        assert '"queues": [[], ["' in (store.meta_get(key) or "")
        if forget:
            store.meta_set(key, "{}")
        # kill -9: the process and its policy object are gone; a new one opens the same store.
        ctl = _controller(store, executor, clock, tmp_path)
        store.create_job(tenant, parse_spec(make_spec(name="new", replicas=4)), clock())
        clock.advance(60.0)
        desired = ctl.schedule(clock())
        return {store.get_job(k).name: v for k, v in desired.items()}
    finally:
        store.close()


def test_tiresias_queues_survive_a_controller_restart(tmp_path: Path) -> None:
    desired = _demoted_then_restarted(tmp_path, forget=False)
    assert desired["old"] == 0 and desired["new"] == 4  # queue 0 (new) goes first


def test_without_the_stored_state_the_demotion_is_lost(tmp_path: Path) -> None:
    """The control: the stored state, not anything else, is what keeps the queues."""
    desired = _demoted_then_restarted(tmp_path, forget=True)
    assert desired["old"] == 4 and desired["new"] == 0

"""GPU sharing in the simulator: co-location fractions, the memory rule, utilisation."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from coadapt.policies import BatchMode, ClusterSnapshot, Decision, PolicyState, make_policy
from coadapt.sim import SimConfig, SimulationError, Simulator, parse_cluster, simulate, summarise
from coadapt.sim.gpu_types import colocation_table
from coadapt.sim.synthetic import packing_workload
from coadapt.sim.workload import parse_workload


@dataclass
class _Scripted:
    """A test policy: fixed allocations and packing; records the snapshots it saw."""

    allocations: dict[str, tuple[int, ...]]
    packed: dict[str, str]
    name: str = "scripted"
    batch_mode: BatchMode = BatchMode.FIXED
    last: ClusterSnapshot | None = None

    def optimize(
        self, snapshot: ClusterSnapshot, state: PolicyState, rng: np.random.Generator
    ) -> Decision:
        del state, rng
        self.last = snapshot
        return Decision(dict(self.allocations), {}, {}, dict(self.packed))


def _workload(*rows: str) -> str:
    return "name,time,application,num_replicas,batch_size\n" + "\n".join(rows) + "\n"


def _progress_after(
    rows: tuple[str, ...], allocs: dict[str, tuple[int, ...]], packed: dict[str, str], steps: int
) -> dict[str, float]:
    wl = parse_workload(_workload(*rows), "w.csv")
    sim = Simulator(wl, parse_cluster("1x1"), _Scripted(allocs, packed), SimConfig(restart_delay=0))
    for _ in range(steps):
        sim.step()
    return {j.spec.name: j.progress for j in sim._jobs}


def test_packed_jobs_advance_at_their_colocation_fractions() -> None:
    # Long epochs (ncf at batch 256, deepspeech2 at 20): 2 minutes of training stay inside epoch 0.
    ds, ncf = "ds,0,deepspeech2,1,20", "ncf,0,ncf,1,256"
    alone_ds = _progress_after((ds,), {"ds": (1,)}, {}, 3)["ds"]
    alone_ncf = _progress_after((ncf,), {"ncf": (1,)}, {}, 3)["ncf"]
    both = _progress_after((ds, ncf), {"ds": (1,), "ncf": (1,)}, {"ds": "ncf"}, 3)
    frac_ds, frac_ncf = colocation_table()["deepspeech2", "ncf"]
    assert both["ds"] == pytest.approx(alone_ds * frac_ds, rel=1e-9)
    assert both["ncf"] == pytest.approx(alone_ncf * frac_ncf, rel=1e-9)
    assert frac_ds + frac_ncf > 1.0  # this pair gains from sharing


def test_snapshot_exposes_the_table_and_packing_keys_by_the_memory_rule() -> None:
    rows = ("small,0,cifar10,1,128", "large,0,cifar10,1,1024", "wide,0,cifar10,2,256")
    policy = _Scripted({}, {})
    Simulator(parse_workload(_workload(*rows), "w.csv"), parse_cluster("1x4"), policy).step()
    snap = policy.last
    assert snap is not None and snap.colocation == colocation_table()
    keys = {k: j.packing_key for k, j in snap.jobs.items()}
    assert keys == {"small": "cifar10", "large": None, "wide": None}


def test_packing_off_hands_no_table() -> None:
    policy = _Scripted({}, {})
    wl = parse_workload(_workload("small,0,cifar10,1,128"), "w.csv")
    Simulator(wl, parse_cluster("1x1"), policy, SimConfig(packing=False)).step()
    assert policy.last is not None and not policy.last.colocation
    assert policy.last.jobs["small"].packing_key is None


@pytest.mark.parametrize(
    ("rows", "packed", "match"),
    [
        (("a,0,cifar10,1,128", "b,0,bert,1,12"), {"a": "b"}, "memory limit"),
        (
            ("a,0,cifar10,1,128", "b,0,cifar10,1,128", "c,0,ncf,1,256"),
            {"a": "c", "b": "c"},
            "more than one",
        ),
    ],
)
def test_engine_rejects_packings_the_rules_forbid(
    rows: tuple[str, ...], packed: dict[str, str], match: str
) -> None:
    allocs: dict[str, tuple[int, ...]] = {k.split(",")[0]: (1,) for k in rows}
    wl = parse_workload(_workload(*rows), "w.csv")
    sim = Simulator(wl, parse_cluster("1x1"), _Scripted(allocs, packed))
    with pytest.raises(SimulationError, match=match):
        sim.step()


def test_packing_raises_effective_utilisation_and_cuts_jct_for_gavel() -> None:
    wl = packing_workload(num_jobs=24, hours=0.5, seed=1)
    cluster = parse_cluster("1x4")
    off = summarise(simulate(wl, cluster, make_policy("gavel"), SimConfig(packing=False)))
    on = summarise(simulate(wl, cluster, make_policy("gavel"), SimConfig(packing=True)))
    assert off.effective_util == pytest.approx(off.gpu_util)  # nothing shared
    assert on.effective_util > on.gpu_util
    assert on.avg_jct_s < off.avg_jct_s
    assert 0.0 < on.gpu_util <= 1.0


def test_packing_workload_is_deterministic_and_one_gpu() -> None:
    a, b = packing_workload(seed=5), packing_workload(seed=5)
    assert a == b and len(a.jobs) == 96
    assert all(j.num_replicas == 1 for j in a.jobs)
    assert [j.submit_time for j in a.jobs] == sorted(j.submit_time for j in a.jobs)
    assert packing_workload(seed=6) != a


def _adaptive_batches(packed: dict[str, str], steps: int) -> tuple[dict[str, int], ClusterSnapshot]:
    rows = ("a,0,cifar10,1,128", "b,0,cifar10,1,128")
    policy = _Scripted({"a": (1,), "b": (1,)} if packed else {"a": (1,)}, packed)
    policy.batch_mode = BatchMode.ADAPTIVE
    sim = Simulator(parse_workload(_workload(*rows), "w.csv"), parse_cluster("1x1"), policy)
    for _ in range(steps):
        sim.step()
    assert policy.last is not None
    return {j.spec.name: j._total for j in sim._jobs}, policy.last


def test_a_packed_adaptive_job_keeps_its_batch_within_the_memory_rule() -> None:
    half = 1024 // 2  # cifar10's largest traced per-GPU batch, halved
    alone, _ = _adaptive_batches({}, 60)
    assert alone["a"] > half  # alone, the agent grows past what two jobs on one GPU fit
    shared, snap = _adaptive_batches({"a": "b"}, 60)
    assert 0 < shared["a"] <= half and 0 < shared["b"] <= half
    # ... so the pair stays packable: the next round may keep it without a restart.
    assert snap.jobs["a"].packing_key == snap.jobs["b"].packing_key == "cifar10"

"""GPU sharing decisions: the JCT rule, stable pairs, and who is the guest."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from coadapt.goodput import BatchLimits
from coadapt.policies import ClusterSnapshot, NodeInfo
from coadapt.policies.packing import half_memory_factor, split_guests, time_saved_by_sharing
from coadapt.policies.pollux import PACKED_STATE_KEY, PolluxPolicy
from tests.policies.builders import toy_job

RNG = np.random.default_rng(0)
# Batches that fit in half a GPU's memory (256 / 2): sharing costs these jobs no goodput.
SMALL = {"max_replicas": 1, "max_gpus_held": 1, "limits": BatchLimits(64, 128, 8, 256)}


def test_time_saved_by_sharing_against_shortest_first() -> None:
    # Host 1 h, guest 2 h alone. One after the other: 1 + 3 = 4 h summed.
    # Shared at 0.9/0.8: host done at 1/0.9 h; the guest did 0.8/0.9 h and finishes alone.
    saved = time_saved_by_sharing(3600.0, 7200.0, 0.9, 0.8)
    shared = 2 * 3600.0 / 0.9 + 7200.0 - 0.8 * 3600.0 / 0.9
    assert saved == pytest.approx(4 * 3600.0 - shared)
    assert saved > 0
    # Gandiva's rule holds (0.55 + 0.55 > 1) but both jobs slow nearly 2x: JCT is lost.
    assert time_saved_by_sharing(3600.0, 7200.0, 0.55, 0.55) < 0
    # Symmetric in who is the host when the fractions are equal.
    assert time_saved_by_sharing(100.0, 50.0, 0.7, 0.7) == pytest.approx(
        time_saved_by_sharing(50.0, 100.0, 0.7, 0.7)
    )


def _one_gpu(fractions: tuple[float, float]) -> ClusterSnapshot:
    jobs = {
        "host": toy_job("host", packing_key="cifar", **SMALL),
        "guest": toy_job("guest", packing_key="ncf", submit_time=100.0, **SMALL),
    }
    return ClusterSnapshot(
        now=3600.0,
        nodes=(NodeInfo("a", 1),),
        jobs=jobs,
        current={"host": (1,)},
        colocation={("cifar", "ncf"): fractions},
    )


def test_a_pair_that_costs_jct_is_not_packed_but_gandivas_rule_alone_would() -> None:
    weak = _one_gpu((0.55, 0.55))
    assert PolluxPolicy().optimize(weak, {}, RNG).packed == {}
    assert PolluxPolicy(packing_rule="gain").optimize(weak, {}, RNG).packed == {"guest": "host"}
    assert PolluxPolicy().optimize(_one_gpu((0.9, 0.8)), {}, RNG).packed == {"guest": "host"}
    with pytest.raises(ValueError, match="packing_rule"):
        PolluxPolicy(packing_rule="always")


def _full_node() -> ClusterSnapshot:
    """One 2-GPU node: a and b on a GPU each, g packed with b (three jobs, two GPUs)."""
    jobs = {
        name: toy_job(name, packing_key="cifar", submit_time=t, **SMALL)
        for name, t in (("a", 0.0), ("b", 10.0), ("g", 20.0), ("c", 30.0))
    }
    return ClusterSnapshot(
        now=3600.0,
        nodes=(NodeInfo("n", 2),),
        jobs=jobs,
        current={"a": (1,), "b": (1,), "g": (1,)},
        colocation={("cifar", "cifar"): (0.9, 0.9)},
    )


def test_the_guest_is_read_from_the_policy_state_not_guessed() -> None:
    snap = _full_node()
    # GPUs per node cannot tell who shares: without the state the later job is the guest.
    assert split_guests(snap) == {"b": "a"}
    assert split_guests(snap, {"g": "b"}) == {"g": "b"}
    # A remembered pair the snapshot no longer shows (nothing over-committed) is dropped.
    assert split_guests(replace(snap, current={"a": (1,), "b": (1,)}), {"g": "b"}) == {}


def test_a_stable_pair_is_kept_and_a_waiting_challenger_does_not_split_it() -> None:
    full = _full_node()
    # One GPU: b runs, g shares it, c waits. c is nearly done (it weighs more than g, whose
    # length is unknown), so taking g's place would raise FITNESS_p: only hysteresis keeps g.
    near_end = {"progress": 0.9, "attained_service": 3600.0}
    snap = replace(
        full,
        nodes=(NodeInfo("n", 1),),
        jobs={
            "b": replace(full.jobs["b"], **near_end),
            "g": full.jobs["g"],
            "c": replace(full.jobs["c"], **near_end),
        },
        current={"b": (1,), "g": (1,)},
    )
    fresh = replace(snap, current={"b": (1,)})  # the same choice with nobody packed yet
    assert PolluxPolicy().optimize(fresh, {}, RNG).packed == {"c": "b"}
    decision = PolluxPolicy().optimize(snap, {PACKED_STATE_KEY: {"g": "b"}}, RNG)
    assert decision.allocations == {"b": (1,), "g": (1,)}  # no restart for the guest
    assert decision.packed == {"g": "b"}
    assert decision.state == {PACKED_STATE_KEY: {"g": "b"}}  # carried to the next round
    # A round later the same: nothing moves.
    again = PolluxPolicy().optimize(snap, decision.state, RNG)
    assert again.allocations == decision.allocations and again.packed == decision.packed


def test_half_memory_factor_prices_a_batch_that_no_longer_fits() -> None:
    fits = toy_job("a", **SMALL)
    assert half_memory_factor(fits) == pytest.approx(1.0)
    wide = toy_job("b", limits=BatchLimits(64, 4096, 8, 256))  # picks big batches alone
    assert 0.0 < half_memory_factor(wide) < 1.0
    assert half_memory_factor(replace(wide, goodput=None)) == 1.0

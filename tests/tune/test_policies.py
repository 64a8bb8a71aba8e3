"""Cross-tenant tuning policies on crafted snapshots (pure functions, no database)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from coadapt.tune.policies import (
    POLICY_NAMES,
    ClusterView,
    ExperimentView,
    RunningTrial,
    Stop,
    algorithm1,
    algorithm1_update,
    ei_per_gpu,
    ei_scores,
    fifo,
    get_policy,
)


def view(id: str, submit: float, **over: Any) -> ExperimentView:
    base: dict[str, Any] = {"parallelism": 4, "running": 0, "target": 0.95}
    base.update(over)
    return ExperimentView(id=id, tenant=id, submit_time=submit, **base)


def test_fifo_serves_experiments_in_submission_order_up_to_parallelism() -> None:
    exps = [view("b", 2.0), view("a", 1.0), view("c", 3.0)]
    grants = fifo(exps, ClusterView(now=10, total_slots=6, free_slots=6))
    assert {k: g.slots for k, g in grants.items()} == {"a": 4, "b": 2, "c": 0}


def test_fifo_never_preempts_and_skips_experiments_at_target() -> None:
    exps = [view("a", 1.0, running=4, best=0.96), view("b", 2.0, running=1)]
    grants = fifo(exps, ClusterView(now=10, total_slots=6, free_slots=1))
    assert grants["a"].slots == 4  # at target: no new trial, the running ones stay
    assert grants["b"].slots == 2


def test_algorithm1_lowers_priority_when_the_top_results_converge() -> None:
    # k*m = 6 results needed; then the top-3 gap is 0.001 < G0 = 0.01: P -> 1
    results = (0.5, 0.6, 0.7, 0.8, 0.9, 0.901, 0.902)
    st = algorithm1_update(results, "maximize", {})
    assert st["P"] == 1 and st["j"] == 1 and st["G"] == pytest.approx(0.005)
    assert st["seen"] == 7
    # spread-out top results: no change
    st2 = algorithm1_update((0.1, 0.3, 0.5, 0.7, 0.9, 0.2, 0.4), "maximize", {})
    assert st2["P"] == 0
    # g ≈ g' (the mean of earlier gaps) also counts as converged
    st3 = algorithm1_update((0.1, 0.3, 0.5, 0.7, 0.9, 0.2, 0.4, 0.05), "maximize", st2)
    assert st3["P"] == 1


def test_algorithm1_gives_free_slots_to_unconverged_experiments_first() -> None:
    converged = view("old", 1.0, results=(0.5, 0.6, 0.7, 0.8, 0.9, 0.901, 0.902))
    fresh = view("new", 2.0)
    grants = algorithm1([converged, fresh], ClusterView(now=10, total_slots=5, free_slots=5))
    assert grants["new"].slots == 4 and grants["old"].slots == 1
    assert grants["old"].priority == -1 and grants["new"].priority == 0


def test_algorithm1_raises_priority_again_when_the_cluster_is_idle() -> None:
    state = {"P": 2, "j": 2, "G": 0.0025, "gaps": [0.001], "seen": 7, "idle": 0}
    e = view("a", 1.0, results=(0.5,) * 7, state=state, parallelism=2)
    cluster = ClusterView(now=10, total_slots=8, free_slots=8)
    for _ in range(3):  # idle_rounds = 3
        g = algorithm1([e], cluster)["a"]
        e = view("a", 1.0, results=(0.5,) * 7, state=g.state, parallelism=2)
    assert g.state["P"] == 1


def test_ei_prefers_the_experiment_with_more_expected_improvement_per_gpu_second() -> None:
    # same cost; "near" sits just under its target with results that often reach it,
    # "far" has a wide gap its results never come close to closing
    near = view(
        "near",
        2.0,
        target=0.95,
        best=0.94,
        results=(0.90, 0.93, 0.94, 0.92, 0.95 - 0.02),
        trial_costs=(10.0,) * 5,
    )
    far = view(
        "far",
        1.0,
        target=0.99,
        best=0.70,
        results=(0.5, 0.6, 0.7, 0.55, 0.65),
        trial_costs=(10.0,) * 5,
    )
    grants = ei_per_gpu([far, near], ClusterView(now=10, total_slots=5, free_slots=5))
    assert grants["near"].slots == 4 and grants["far"].slots == 1
    assert grants["near"].priority > grants["far"].priority
    # cheaper trials (pruning) raise the score
    cheap = ei_scores(view("x", 0, best=0.7, results=(0.5, 0.6, 0.7), trial_costs=(1.0,)), 1, 10)
    dear = ei_scores(view("x", 0, best=0.7, results=(0.5, 0.6, 0.7), trial_costs=(10.0,)), 1, 10)
    assert cheap[0] == pytest.approx(10 * dear[0])


def test_ei_gives_nothing_at_target_and_little_when_a_running_trial_will_reach_it() -> None:
    done = view("done", 1.0, best=0.96, results=(0.96, 0.5, 0.6))
    assert ei_scores(done, 4, 10.0) == []
    climbing = ((1.0, 0.80), (2.0, 0.90), (3.0, 0.94), (4.0, 0.955), (5.0, 0.96))
    hopeful = view(
        "h",
        1.0,
        best=0.93,
        max_steps=10,
        running=1,
        curves=(climbing,),
        results=(0.80, 0.85, 0.93),
        target=0.95,
    )
    blind = view(
        "b", 1.0, best=0.93, max_steps=10, running=0, results=(0.80, 0.85, 0.93), target=0.95
    )
    assert ei_scores(hopeful, 1, 10.0)[0] < 0.5 * ei_scores(blind, 1, 10.0)[0]


def test_ei_starves_nobody() -> None:
    strong = view(
        "strong", 1.0, best=0.94, results=(0.93, 0.94, 0.92), trial_costs=(5.0,) * 3, running=3
    )
    weak = view(
        "weak",
        0.0,
        target=0.99,
        best=0.5,
        results=(0.4, 0.45, 0.5),
        trial_costs=(5.0,) * 3,
        idle_since=0.0,
    )
    # just idle: the weak one waits
    g = ei_per_gpu([strong, weak], ClusterView(now=5.0, total_slots=4, free_slots=1))
    assert g["strong"].slots == 4 and g["weak"].slots == 0
    # idle for more than starve_factor (3) typical trials (5 s): served first
    g = ei_per_gpu([strong, weak], ClusterView(now=20.0, total_slots=4, free_slots=1))
    assert g["weak"].slots == 1 and g["strong"].slots == 3
    assert "starving" in g["weak"].why


def test_new_experiments_get_an_optimistic_prior() -> None:
    measured = view("m", 1.0, best=0.8, results=(0.6, 0.7, 0.8), trial_costs=(5.0,) * 3)
    new = view("n", 2.0)
    g = ei_per_gpu([measured, new], ClusterView(now=1.0, total_slots=4, free_slots=4))
    assert g["n"].slots >= 1
    # unmeasured experiments each get a first trial before any gets a second
    fresh = [view(x, float(i)) for i, x in enumerate("abc")]
    g = ei_per_gpu(fresh, ClusterView(now=1.0, total_slots=4, free_slots=3))
    assert [g[x].slots for x in "abc"] == [1, 1, 1]


def _contended(curve: tuple[tuple[float, float], ...], step_s: float) -> list[ExperimentView]:
    """Slot-less cluster: "slow" runs one trial (``curve``, 20 steps in all, ``step_s`` per
    step); "hot" waits, cheap trials that often reach its target."""
    run = RunningTrial(7, curve, elapsed_s=2.0 + step_s * len(curve), step_s=step_s)
    slow = view(
        "slow",
        1.0,
        parallelism=1,
        running=1,
        target=0.95,
        best=0.6,
        max_steps=20,
        results=(0.5, 0.55, 0.6),
        trial_costs=(200.0,) * 3,
        curves=(curve,),
        running_trials=(run,),
    )
    hot = view(
        "hot",
        2.0,
        parallelism=1,
        target=0.95,
        best=0.94,
        results=(0.9, 0.93, 0.94, 0.96 - 0.03),
        trial_costs=(20.0,) * 4,
    )
    return [slow, hot]


FULL = ClusterView(now=100.0, total_slots=1, free_slots=0)
FLAT = tuple((float(i), 0.5 + 0.001 * i) for i in range(1, 7))  # predicted ~0.52, target 0.95


def test_ei_preempts_a_hopeless_slow_trial_for_a_much_better_waiting_one() -> None:
    g = ei_per_gpu(_contended(FLAT, step_s=10.0), FULL)
    assert [(s.trial, s.to) for s in g["slow"].stop] == [(7, "hot")]
    assert g["slow"].slots == 0 and g["hot"].slots == 1  # slots count after the stops
    assert "stop 1" in g["slow"].why and not g["hot"].stop


def test_ei_does_not_preempt_where_it_should_not() -> None:
    # predicted to reach the target (mean >= target): kept, however dear
    climbing = tuple((float(i), 0.97 - 0.5 / i) for i in range(1, 7))
    assert not ei_per_gpu(_contended(climbing, step_s=10.0), FULL)["slow"].stop
    # too early to judge: 3 of 20 steps < min_progress 0.25
    assert not ei_per_gpu(_contended(FLAT[:3], step_s=10.0), FULL)["slow"].stop
    # cheap steps left (its start-up is sunk): finishing costs ~nothing, keep it
    assert not ei_per_gpu(_contended(FLAT, step_s=0.001), FULL)["slow"].stop
    # hysteresis: worth less than preempt_ratio times more is not enough
    assert not ei_per_gpu(_contended(FLAT, 10.0), FULL, {"preempt_ratio": 1e9})["slow"].stop
    # an unmeasured alternative (its score is the optimistic prior) stops nothing
    slow, hot = _contended(FLAT, step_s=10.0)
    fresh = dataclasses.replace(hot, results=(0.9, 0.93))
    assert not ei_per_gpu([slow, fresh], FULL)["slow"].stop
    # a free slot is handed out instead of preempting
    free = ClusterView(now=100.0, total_slots=2, free_slots=1)
    g = ei_per_gpu(_contended(FLAT, step_s=10.0), free)
    assert not g["slow"].stop and g["hot"].slots == 1
    # fifo and algorithm1 never preempt
    for policy in (fifo, algorithm1):
        grants = policy(_contended(FLAT, step_s=10.0), FULL)
        assert all(gr.stop == () for gr in grants.values())


def test_a_stop_names_the_trial_and_the_experiment_it_yields_to() -> None:
    stop = ei_per_gpu(_contended(FLAT, step_s=10.0), FULL)["slow"].stop[0]
    assert stop == Stop(7, "hot", stop.why) and "per GPU-s" in stop.why


def test_policies_by_name() -> None:
    assert POLICY_NAMES == ("fifo", "algorithm1", "ei-per-gpu")
    assert get_policy("fifo") is fifo
    with pytest.raises(ValueError, match="accepted: fifo, algorithm1, ei-per-gpu"):
        get_policy("lottery")

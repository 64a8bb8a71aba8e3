"""The tuning replay: deterministic, exact on hand-made curve banks, the recorded bank valid."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from coadapt.tune.sim import BankTask, RecordedConfig, SimTenant, load_bank, simulate

ROOT = Path(__file__).resolve().parents[2]
BANK = ROOT / "benchmarks" / "data" / "tune_curves.json"
HEAVY = ROOT / "benchmarks" / "data" / "tune_curves_heavy.json"


def bank(name: str, finals: list[float], epoch_s: float = 1.0, startup: float = 0.5) -> BankTask:
    """A one-parameter task whose config ``i`` climbs to ``finals[i]`` over 3 epochs."""
    configs = {
        (i,): RecordedConfig({"c": i}, (f * 0.5, f * 0.9, f), (epoch_s,) * 3)
        for i, f in enumerate(finals)
    }
    return BankTask(name, {"c": list(range(len(finals)))}, configs, startup, 3)


def test_time_to_target_is_exact_on_a_simple_bank() -> None:
    task = bank("a", [0.95] * 4)  # every config reaches 0.95 at epoch 3; 0.9*0.95 < 0.9
    r = simulate([SimTenant("a", task, target=0.9, parallelism=1)], 1, "fifo", seed=0)
    assert r.time_to_target == {"a": pytest.approx(0.5 + 3 * 1.0)}
    assert r.trials == {"a": 1} and r.makespan_s == pytest.approx(3.5)


def test_the_replay_is_deterministic_and_depends_on_the_seed() -> None:
    finals = [0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.99]
    tenants = [
        SimTenant("a", bank("a", finals), target=0.94, parallelism=2),
        SimTenant("b", bank("b", finals[::-1]), target=0.94, parallelism=2, arrival=0.001),
    ]
    runs = [simulate(tenants, 3, "ei-per-gpu", seed=s) for s in (0, 0, 1, 2, 3)]
    assert runs[0] == runs[1]
    assert len({r.sum_s for r in runs}) > 1


def test_fifo_serves_the_first_tenant_first() -> None:
    finals = [0.5, 0.6, 0.7, 0.99]
    tenants = [
        SimTenant("first", bank("first", finals), target=0.98, parallelism=2),
        SimTenant("second", bank("second", finals), target=0.98, parallelism=2, arrival=0.001),
    ]
    r = simulate(tenants, 2, "fifo", seed=0)
    # the second tenant gets a slot only once the first one is done
    assert r.time_to_target["first"] is not None and r.time_to_target["second"] is not None
    assert r.time_to_target["second"] >= r.time_to_target["first"]


def test_early_stopping_prunes_in_the_replay() -> None:
    finals = [0.3] * 6 + [0.95] * 2
    es = {"rule": "median", "grace_steps": 1, "min_peers": 1}
    t = SimTenant(
        "a", bank("a", finals), target=0.99, parallelism=2, max_trials=8, early_stopping=es
    )
    r = simulate([t], 2, "fifo", seed=0)
    assert r.time_to_target == {"a": None} and r.makespan_s is None
    assert r.trials == {"a": 8} and r.pruned["a"] > 0


def long_bank(name: str, finals: list[float], epochs: int, epoch_s: float) -> BankTask:
    """Config ``i`` saturates towards ``finals[i]`` over ``epochs`` epochs of ``epoch_s``."""
    configs = {
        (i,): RecordedConfig(
            {"c": i}, tuple(f * (1 - 0.5 ** (k + 1)) for k in range(epochs)), (epoch_s,) * epochs
        )
        for i, f in enumerate(finals)
    }
    return BankTask(name, {"c": list(range(len(finals)))}, configs, 1.0, epochs)


def test_preemption_is_applied_deterministically_and_only_by_ei() -> None:
    # "slow": 100 s trials, mostly hopeless; "hot": 5 s trials. Once hot is measured (3
    # results) a slow trial past min_progress gives its slot up for hot's next trial.
    slow = SimTenant("slow", long_bank("slow", [0.5] * 7 + [0.99], 10, 10.0), 0.98, 0.0, 2)
    finals = [0.6, 0.65, 0.7, 0.75, 0.8, 0.82, 0.85, 0.95]
    hot = SimTenant("hot", long_bank("hot", finals, 4, 1.0), 0.88, 0.001, 2)
    runs = [simulate([slow, hot], 3, "ei-per-gpu", seed=s) for s in (0, 0)]
    assert runs[0] == runs[1]
    r = runs[0]
    assert r.preempted["slow"] > 0
    assert all(r.pruned[n] >= r.preempted[n] for n in r.pruned)  # preempted: PRUNED
    base = simulate([slow, hot], 3, "fifo", seed=0)
    assert base.preempted == {"slow": 0, "hot": 0}
    assert r.time_to_target["hot"] is not None and base.time_to_target["hot"] is not None
    assert r.time_to_target["hot"] < base.time_to_target["hot"]
    off = simulate([slow, hot], 3, "ei-per-gpu", seed=0, params={"preempt_ratio": 0.0})
    assert off.preempted == {"slow": 0, "hot": 0}


def test_the_recorded_bank_is_complete() -> None:
    import json

    tasks = load_bank(BANK)
    assert 3 <= len(tasks) <= 4
    for task in tasks.values():
        assert 48 <= len(task.configs) <= 120
        assert len(task.configs) == len(list(itertools.product(*task.space.values())))
        for c in task.configs.values():
            assert len(c.accuracy) == len(c.epoch_s) == task.epochs
            assert all(0.0 <= a <= 1.0 for a in c.accuracy) and all(s > 0 for s in c.epoch_s)
        assert task.startup_s > 0
    prov = json.loads(BANK.read_text())["provenance"]
    assert {"command", "date", "machine", "torch", "sklearn"} <= set(prov)


def test_the_heavy_bank_is_complete_and_training_dominates() -> None:
    import json

    tasks = load_bank(HEAVY)
    assert 3 <= len(tasks) <= 4
    for task in tasks.values():
        assert 24 <= len(task.configs) <= 36
        assert len(task.configs) == len(list(itertools.product(*task.space.values())))
        training = []
        for c in task.configs.values():
            assert len(c.accuracy) == len(c.epoch_s) == task.epochs
            assert all(0.0 <= a <= 1.0 for a in c.accuracy) and all(s > 0 for s in c.epoch_s)
            training.append(sum(c.epoch_s))
        # what makes it representative of DL tuning: a trial is mostly training
        assert sum(training) / len(training) > 2 * task.startup_s > 0
    prov = json.loads(HEAVY.read_text())["provenance"]
    assert {"command", "date", "machine", "torch", "sklearn", "workers", "note"} <= set(prov)

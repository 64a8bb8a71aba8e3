"""The tuning replay: deterministic, exact on hand-made curve banks, the recorded bank valid."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from coadapt.tune.sim import BankTask, RecordedConfig, SimTenant, load_bank, simulate

ROOT = Path(__file__).resolve().parents[2]
BANK = ROOT / "benchmarks" / "data" / "tune_curves.json"


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

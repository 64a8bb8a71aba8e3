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
            assert len(c.accuracy) == len(c.epoch_s) == len(c.loss) == task.epochs
            assert all(0.0 <= a <= 1.0 for a in c.accuracy) and all(s > 0 for s in c.epoch_s)
            assert all(0.0 <= v <= 100.0 for v in c.loss)  # held-out log-loss, capped
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
            assert len(c.accuracy) == len(c.epoch_s) == len(c.loss) == task.epochs
            assert all(0.0 <= a <= 1.0 for a in c.accuracy) and all(s > 0 for s in c.epoch_s)
            assert all(0.0 <= v <= 100.0 for v in c.loss)  # held-out log-loss, capped
            training.append(sum(c.epoch_s))
        # what makes it representative of DL tuning: a trial is mostly training
        assert sum(training) / len(training) > 2 * task.startup_s > 0
    prov = json.loads(HEAVY.read_text())["provenance"]
    assert {"command", "date", "machine", "torch", "sklearn", "workers", "note"} <= set(prov)


def _mirrored(task: BankTask) -> BankTask:
    """The same task with a ``loss`` curve of ``1 - accuracy`` for every configuration."""
    configs = {
        k: RecordedConfig(c.params, c.accuracy, c.epoch_s, tuple(1.0 - a for a in c.accuracy))
        for k, c in task.configs.items()
    }
    return BankTask(task.name, task.space, configs, task.startup_s, task.epochs)


@pytest.mark.parametrize("policy", ["fifo", "algorithm1", "ei-per-gpu"])
def test_minimizing_a_mirrored_loss_replays_like_maximizing_accuracy(policy: str) -> None:
    # loss = 1 - accuracy, target 1 - T: every decision (pruning, targets, the policy's
    # ranking) must be the same as maximising accuracy to T
    finals = [0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.99, 0.4, 0.3]
    es = {"rule": "median", "grace_steps": 1, "min_peers": 2}

    def tenants(metric: str) -> list[SimTenant]:
        out = []
        for i, (name, fs) in enumerate((("a", finals), ("b", finals[::-1]), ("c", finals[3:]))):
            task = _mirrored(bank(name, fs, epoch_s=1.0 + i))
            loss = metric == "loss"
            out.append(
                SimTenant(
                    name,
                    task,
                    target=round(1.0 - 0.94, 12) if loss else 0.94,
                    arrival=0.001 * i,
                    parallelism=2,
                    early_stopping=es,
                    metric=metric,
                    direction="minimize" if loss else "maximize",
                )
            )
        return out

    for seed in (0, 1, 2):
        acc = simulate(tenants("accuracy"), 3, policy, seed=seed)
        loss = simulate(tenants("loss"), 3, policy, seed=seed)
        assert acc.makespan_s is not None
        assert loss.time_to_target == acc.time_to_target
        assert (loss.trials, loss.pruned, loss.preempted) == (acc.trials, acc.pruned, acc.preempted)


def test_a_loss_target_is_reached_from_above() -> None:
    # config i's loss falls 1.0 -> 0.5 -> l_i; only the 0.1 one reaches 0.15
    configs = {
        (i,): RecordedConfig({"c": i}, (0.0,) * 3, (1.0,) * 3, (1.0, 0.5, f))
        for i, f in enumerate([0.4, 0.3, 0.1])
    }
    task = BankTask("l", {"c": [0, 1, 2]}, configs, 0.5, 3)
    t = SimTenant("l", task, target=0.15, parallelism=3, metric="loss", direction="minimize")
    r = simulate([t], 3, "fifo", seed=0)
    assert r.time_to_target == {"l": pytest.approx(0.5 + 3 * 1.0)} and r.trials == {"l": 3}
    assert task.best_values("loss", "minimize") == [0.4, 0.3, 0.1]
    with pytest.raises(ValueError, match="no loss curves"):
        bank("a", [0.9]).configs[(0,)].values("loss")

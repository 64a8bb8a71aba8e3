"""Replay of multi-tenant tuning on a simulated cluster, from learning curves recorded for real.

A *curve bank* holds, for each tenant's task, every configuration of a discrete search space
with the per-epoch held-out accuracy (and, in banks recorded since, the held-out log-loss) and
the per-epoch seconds measured by really training it (see
``benchmarks/tune_tenants.py --record``), plus the measured start-up cost of a trial process.
The simulator runs experiments on ``slots`` slots with a virtual clock:

* each tenant's objective is one recorded metric (``accuracy``, maximised, or ``loss``,
  minimised: :attr:`SimTenant.metric`/:attr:`SimTenant.direction`); pruning, targets and the
  policies see it with that direction;
* trials are proposed by the real samplers (:func:`coadapt.tune.samplers.create_study` on an
  in-memory Optuna storage, :func:`~coadapt.tune.samplers.ask_params`) over the bank's space
  (categorical parameters, so every proposal has a recorded curve) and told like the live loop;
* a trial takes ``startup_s`` then reports its recorded epochs one by one at their recorded
  durations; after each report the same :func:`coadapt.tune.pruning.decide` may stop it, and an
  experiment ends the moment a reported value reaches its target (its other trials are
  cancelled), as in :class:`coadapt.tune.runner.TuneRunner`;
* after every event the same policy function (:mod:`coadapt.tune.policies`) grants slots;
  the trials it preempts (:attr:`~coadapt.tune.policies.Grant.stop`) are stopped first, as
  PRUNED with their curve so far (the runner's cancel), then the new trials start.

It is deterministic: events at equal times are ordered by a sequence number, the samplers are
seeded from ``(seed, tenant index)``, and nothing reads the wall clock.
"""

from __future__ import annotations

import functools
import heapq
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coadapt.tune.direction import at_least_as_good, best_of, better, maximizing
from coadapt.tune.policies import ClusterView, ExperimentView, Grant, RunningTrial, get_policy


@dataclass(frozen=True)
class RecordedConfig:
    params: dict[str, Any]
    accuracy: tuple[float, ...]  # after each epoch
    epoch_s: tuple[float, ...]  # seconds each epoch took (training + evaluation)
    loss: tuple[float, ...] = ()  # held-out log-loss after each epoch (empty: not recorded)

    def values(self, metric: str) -> tuple[float, ...]:
        """The recorded curve of ``metric`` (``accuracy`` or ``loss``)."""
        if metric == "accuracy":
            return self.accuracy
        if metric == "loss":
            if not self.loss:
                raise ValueError("this bank has no loss curves (re-record it)")
            return self.loss
        raise ValueError(f"unknown metric {metric!r} (accuracy or loss)")


@dataclass(frozen=True)
class BankTask:
    """One tenant's task: a discrete space and every configuration's recorded curve."""

    name: str
    space: dict[str, list[Any]]  # parameter -> its values (in order)
    configs: dict[tuple[Any, ...], RecordedConfig]
    startup_s: float  # a trial process' start (interpreter, imports, data) before epoch 1
    epochs: int

    def key(self, params: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(params[p] for p in self.space)

    def best_accuracies(self) -> list[float]:
        """Each configuration's best reported accuracy (what a target is compared with)."""
        return sorted(max(c.accuracy) for c in self.configs.values())

    def best_values(self, metric: str, direction: str) -> list[float]:
        """Each configuration's best reported ``metric`` by ``direction``, worst first."""
        return sorted(
            (best_of(direction, c.values(metric)) for c in self.configs.values()),
            reverse=not maximizing(direction),
        )


def load_bank(path: str | Path) -> dict[str, BankTask]:
    """Read a curve bank written by ``benchmarks/tune_tenants.py --record``."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    tasks: dict[str, BankTask] = {}
    for name, t in data["tasks"].items():
        space = {p: list(v) for p, v in t["space"].items()}
        configs = {}
        for c in t["configs"]:
            rc = RecordedConfig(
                dict(c["params"]),
                tuple(c["accuracy"]),
                tuple(c["epoch_s"]),
                tuple(c.get("loss", ())),
            )
            configs[tuple(rc.params[p] for p in space)] = rc
        tasks[name] = BankTask(name, space, configs, float(t["startup_s"]), int(t["epochs"]))
    return tasks


@dataclass(frozen=True)
class SimTenant:
    """One tenant's experiment in the replay."""

    name: str
    task: BankTask
    target: float
    arrival: float = 0.0
    parallelism: int = 4
    sampler: str = "random"
    max_trials: int = 200
    early_stopping: dict[str, Any] = field(default_factory=lambda: {"rule": "none"})
    sampler_seed: int | None = None  # default: derived from the run's seed and its index
    metric: str = "accuracy"  # the objective: a recorded curve (accuracy or loss)
    direction: str = "maximize"  # the objective's direction (loss: minimize)


@dataclass
class _Trial:
    number: int
    tenant: int
    config: RecordedConfig
    started: float
    curve: list[tuple[float, float]] = field(default_factory=list)
    state: str = "RUNNING"
    ended: float | None = None
    preempted: bool = False
    #: The :class:`optuna.trial.Trial` from ``ask``: its curve is reported through it.
    handle: Any = field(default=None, repr=False, compare=False)

    def cost(self, now: float) -> float:
        return (self.ended if self.ended is not None else now) - self.started

    def step_s(self) -> float | None:
        """Seconds per step between its reports (what the runner measures from their times)."""
        k = len(self.curve)
        return sum(self.config.epoch_s[1:k]) / (k - 1) if k >= 2 else None


@dataclass
class _Exp:
    index: int
    tenant: SimTenant
    spec: Any
    study: Any
    trials: list[_Trial] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    arrived: bool = False
    done_at: float | None = None
    best: float | None = None
    idle_since: float | None = None

    @property
    def active(self) -> list[_Trial]:
        return [t for t in self.trials if t.state == "RUNNING"]


@dataclass(frozen=True)
class SimResult:
    policy: str
    seed: int
    time_to_target: dict[str, float | None]  # from the tenant's arrival; None: not reached
    trials: dict[str, int]
    pruned: dict[str, int]
    gpu_seconds: dict[str, float]
    makespan_s: float | None  # first arrival -> the last target reached (None: not all)
    sum_s: float | None  # sum of the tenants' times to target (None: not all)
    busy_fraction: float  # slot-seconds used / slot-seconds available until the end
    preempted: dict[str, int] = field(default_factory=dict)  # trials the policy stopped


def experiment_spec(t: SimTenant, seed: int) -> Any:
    """The :class:`ExperimentSpec` of a replayed tenant (categorical bank space)."""
    from coadapt.tune.spec import parse_experiment

    return parse_experiment(
        {
            "name": t.name,
            "space": {p: {"type": "categorical", "choices": v} for p, v in t.task.space.items()},
            "objective": {"metric": t.metric, "direction": t.direction},
            "sampler": t.sampler,
            "seed": seed,
            "parallelism": t.parallelism,
            "max_trials": t.max_trials,
            "target": t.target,
            "max_steps": t.task.epochs,
            "early_stopping": t.early_stopping,
            "trial": {"command": "true"},
        }
    )


def simulate(
    tenants: Sequence[SimTenant],
    slots: int,
    policy: str,
    seed: int = 0,
    horizon_s: float = 1e7,
    params: Mapping[str, float] | None = None,
) -> SimResult:
    """Replay ``tenants`` on ``slots`` slots under ``policy``; deterministic in ``seed``.
    ``params`` go to the policy (``algorithm1`` and ``ei-per-gpu`` take them: ablations)."""
    import optuna
    from optuna.trial import TrialState as OS

    from coadapt.tune.pruning import decide
    from coadapt.tune.samplers import GridExhausted, ask_params, create_study

    optuna.logging.set_verbosity(logging.WARNING)
    policy_fn = get_policy(policy)
    if params:
        policy_fn = functools.partial(policy_fn, params=params)  # type: ignore[call-arg]
    exps: list[_Exp] = []
    for i, t in enumerate(tenants):
        spec = experiment_spec(t, t.sampler_seed if t.sampler_seed is not None else seed * 1000 + i)
        study = create_study(optuna.storages.InMemoryStorage(), f"{t.name}-{seed}", spec)
        exps.append(_Exp(i, t, spec, study))
    events: list[tuple[float, int, str, int, int]] = []  # (time, seq, kind, exp, trial)
    seq = 0

    def push(when: float, kind: str, exp: int, trial: int = -1) -> None:
        nonlocal seq
        heapq.heappush(events, (when, seq, kind, exp, trial))
        seq += 1

    for e in exps:
        push(e.tenant.arrival, "arrive", e.index)
    busy = 0.0
    last_t = min((t.arrival for t in tenants), default=0.0)
    now = last_t

    def end_trial(e: _Exp, tr: _Trial, state: str) -> None:
        tr.state, tr.ended = state, now
        if state in ("COMPLETE", "PRUNED"):
            for step, v in tr.curve:  # Optuna's public path: Trial.report, then tell
                tr.handle.report(v, int(step))
        if state == "COMPLETE":
            e.study.tell(tr.handle, tr.curve[-1][1], skip_if_finished=True)
        elif state == "PRUNED":
            e.study.tell(tr.handle, state=OS.PRUNED, skip_if_finished=True)
        else:
            e.study.tell(tr.handle, state=OS.FAIL, skip_if_finished=True)
        if not e.active:
            e.idle_since = now

    while events:
        now = events[0][0]
        if now > horizon_s:
            break
        running = sum(len(e.active) for e in exps)
        busy += running * (now - last_t)
        last_t = now
        while events and events[0][0] == now:
            _, _, kind, ei, ti = heapq.heappop(events)
            e = exps[ei]
            if kind == "arrive":
                e.arrived, e.idle_since = True, now
                continue
            tr = e.trials[ti]
            if tr.state != "RUNNING":
                continue  # cancelled or pruned meanwhile
            step = len(tr.curve) + 1
            direction = e.tenant.direction
            curve = tr.config.values(e.tenant.metric)
            value = curve[step - 1]
            tr.curve.append((float(step), value))
            if math.isfinite(value) and (e.best is None or better(direction, value, e.best)):
                e.best = value
            if e.done_at is None and at_least_as_good(direction, value, e.tenant.target):
                e.done_at = now
                end_trial(e, tr, "COMPLETE")
                for other in e.active:
                    end_trial(e, other, "CANCELLED")
                continue
            if step >= len(curve):
                end_trial(e, tr, "COMPLETE")
                continue
            peers = [o.curve for o in e.trials if o is not tr and o.curve]
            finals = [
                o.curve[-1][1]
                for o in e.trials
                if o.state == "COMPLETE" and o.curve and math.isfinite(o.curve[-1][1])
            ]
            pick = max if maximizing(direction) else min
            d = decide(
                e.spec.early_stopping,
                direction,
                e.spec.max_steps,
                tr.curve,
                peers,
                pick(finals) if finals else None,
            )
            if d.stop:
                end_trial(e, tr, "PRUNED")
                continue
            push(now + tr.config.epoch_s[step], "epoch", ei, ti)
        if all(e.done_at is not None for e in exps):
            break
        # the policy round, as the live loop runs it after observing
        live = [e for e in exps if e.arrived and e.done_at is None]
        if not live:
            continue
        views = [_view(e, now) for e in live]
        free = slots - sum(len(e.active) for e in exps)
        grants: dict[str, Grant] = policy_fn(views, ClusterView(now, slots, max(free, 0)))
        stopped: dict[str, int] = {}
        for e, v in zip(live, views, strict=True):  # preempted trials first: they free slots
            g = grants.get(v.id)
            numbers = {s.trial for s in g.stop} if g is not None else set()
            for tr in e.active:
                if tr.number in numbers:
                    tr.preempted = True
                    end_trial(e, tr, "PRUNED")
            stopped[v.id] = v.running - len(e.active)
        for e, v in zip(live, views, strict=True):
            g = grants.get(v.id)
            if g is None:
                continue
            e.state = dict(g.state)
            for _ in range(max(g.slots - (v.running - stopped[v.id]), 0)):
                if len(e.trials) >= e.tenant.max_trials:
                    break
                try:
                    trial, params = ask_params(e.study, e.spec)
                except GridExhausted:
                    break
                config = e.tenant.task.configs[e.tenant.task.key(params)]
                tr = _Trial(trial.number, e.index, config, now, handle=trial)
                e.trials.append(tr)
                e.idle_since = None
                push(
                    now + e.tenant.task.startup_s + config.epoch_s[0],
                    "epoch",
                    e.index,
                    len(e.trials) - 1,
                )
    first = min((t.arrival for t in tenants), default=0.0)
    ttt = {
        e.tenant.name: (e.done_at - e.tenant.arrival if e.done_at is not None else None)
        for e in exps
    }
    reached = [v for v in ttt.values() if v is not None]
    all_done = len(reached) == len(exps)
    end = max((e.done_at for e in exps if e.done_at is not None), default=now)
    span = max(end - first, 1e-9)
    return SimResult(
        policy=policy,
        seed=seed,
        time_to_target=ttt,
        trials={e.tenant.name: len(e.trials) for e in exps},
        pruned={e.tenant.name: sum(t.state == "PRUNED" for t in e.trials) for e in exps},
        gpu_seconds={e.tenant.name: sum(t.cost(now) for t in e.trials) for e in exps},
        makespan_s=end - first if all_done else None,
        sum_s=sum(reached) if all_done else None,
        busy_fraction=min(busy / (slots * span), 1.0),
        preempted={e.tenant.name: sum(t.preempted for t in e.trials) for e in exps},
    )


def _view(e: _Exp, now: float) -> ExperimentView:
    done = [t for t in e.trials if t.state == "COMPLETE"]
    done.sort(key=lambda t: (t.ended or 0.0, t.number))
    ended = [t for t in e.trials if t.state in ("COMPLETE", "PRUNED")]
    return ExperimentView(
        id=e.tenant.name,
        tenant=e.tenant.name,
        submit_time=e.tenant.arrival,
        parallelism=e.tenant.parallelism,
        running=len(e.active),
        direction=e.tenant.direction,
        target=e.tenant.target,
        max_steps=e.tenant.task.epochs,
        results=tuple(t.curve[-1][1] for t in done if t.curve),
        pruned=tuple(t.curve[-1][1] for t in e.trials if t.state == "PRUNED" and t.curve),
        curves=tuple(tuple(t.curve) for t in e.active),
        trial_costs=tuple(t.cost(now) for t in ended),
        gpu_seconds=sum(t.cost(now) for t in e.trials),
        best=e.best,
        idle_since=e.idle_since if not e.active else None,
        state=dict(e.state),
        running_trials=tuple(
            RunningTrial(t.number, tuple(t.curve), t.cost(now), t.step_s()) for t in e.active
        ),
    )


def summary(values: Sequence[float | None]) -> tuple[float, float]:
    """Mean and (population) standard deviation of the values that are not None."""
    xs = [v for v in values if v is not None]
    if not xs:
        return math.nan, math.nan
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))

"""Cross-tenant tuning policies: which experiments may start trials now (pure functions).

A policy sees a snapshot of every running experiment (:class:`ExperimentView`) and of the
cluster (:class:`ClusterView`) and returns a :class:`Grant` per experiment: how many trials
it may have running now, the priority its new trial jobs get, and the policy's updated
per-experiment memory (persisted by the caller and handed back next round). The live tuning
loop (:mod:`coadapt.tune.runner`), the simulator (:mod:`coadapt.tune.sim`) and the tests call
the same functions, so what the benchmark measures is what the controller runs.

A grant below what an experiment already runs only means it starts nothing new; a running
trial is stopped only when a policy names it in :attr:`Grant.stop` (a :class:`Stop`: the trial
number and the experiment its slot goes to). The caller stops those first (cancels the job,
tells Optuna PRUNED with the last intermediate value), then starts
``slots - (running - len(stop))`` new trials. ``fifo`` and ``algorithm1`` never preempt.

Policies (``--tune-policy``):

``fifo``
    Experiments in submission order take free slots up to their parallelism (the second-level
    FIFO of a Mesos framework that seed 003 compares against).

``algorithm1``
    Seed 003's Algorithm 1. Each experiment keeps a priority level ``P`` (0 = highest). Once it
    has ``n > k*m`` results, each new result recomputes ``g``, the smallest gap between
    neighbours among its ``m`` best results; if ``g < G`` (the current threshold) or
    ``g ≈ g'`` (the mean of the previous gaps, within ``approx``), the next trial's priority is
    lowered (``P + 1``), and the threshold moves on to ``G_j = G0 * shrink**j``. A lowered
    experiment declines offers: free slots go to lower ``P`` first (FIFO within a level), which
    is where Mesos sends the offers a framework skips. When slots stay free after every
    experiment took what it wanted (the cluster is idle, "refused offers did not shrink") for
    ``idle_rounds`` rounds, every lowered experiment's priority is raised by one. Parameters
    (:data:`ALGORITHM1_DEFAULTS`): k=2, m=3, G0=0.01, shrink=0.5, approx=0.1, idle_rounds=3.

``ei-per-gpu`` (this project's policy)
    Free slots go, one at a time, to the experiment whose *next* trial is expected to close
    the largest fraction of its remaining gap to target per GPU-second. For an experiment
    with best value ``b`` and target ``T`` (maximising; minimising is mirrored) the value of
    running ``r`` trials plus ``q`` new ones is ``E[min(max(Y), T) - b]^+ / (T - b)`` where
    ``max(Y)`` is the best outcome among them: new trials are draws from a kernel density of
    the experiment's own results so far (finished values and the last values of pruned trials,
    i.e. including the chance of being pruned), running trials are their learning-curve
    predictions (:func:`coadapt.tune.curves.extrapolate` to ``max_steps``, a normal with the
    prediction's band as ±2σ). The marginal gain of the ``q``-th new trial, divided by the
    experiment's mean GPU-seconds per trial (pruned trials are cheap, so early stopping makes
    an experiment cheaper), is its score. Consequences: an experiment at target gets nothing;
    one whose running trial is already predicted to reach the target gets little (more trials
    would be cancelled at the finish); experiments close to their target with good odds go
    first (shortest-expected-remaining-work first, which minimises the sum of times to
    target). An experiment with fewer than ``min_results`` results scores an optimistic prior
    (each trial closes the gap with probability p0 = ``prior_closure``, so its k-th parallel
    trial adds ``p0 (1 - p0)^(k-1)``): it must be measured before it can be ranked, and new
    experiments each get a first trial before any gets a second. Nobody starves: an experiment
    that has had no trial running for ``starve_factor`` typical trial durations is served
    before any score.
    Without a target, the target is taken as best + 2 standard deviations of its results.

    Preemption (cross-tenant early stopping). When no slot is free and an experiment still
    wants one, a running trial may give up its slot. The trial's worth is the gap fraction it
    is expected to close (its marginal contribution to the closure above, from its
    learning-curve prediction) per GPU-second it still needs (its measured seconds per step
    times the steps left); the alternative's worth is the waiting experiment's next-trial
    score (a whole new trial: start-up included, via the mean trial cost). A trial is stopped
    only if the alternative is worth ``preempt_ratio`` times more (hysteresis: a replacement
    pays start-up again and its own outcome is uncertain), it has reported at least
    ``min_progress`` of ``max_steps`` (and 3 points, so its curve can be extrapolated), its
    prediction does not reach the target (mean below it), and its experiment has a target and
    ``max_steps``. The alternative must be measured (``min_results`` results): the optimistic
    prior of an unmeasured experiment orders free slots, it does not stop trials. A running
    trial's expected gain counts as at least ``min_gain`` of the gap (an extrapolation is
    never certain), so a trial with little left to run is kept: stopping it would save next
    to nothing. The worst trial goes first; each stop hands its slot to that
    alternative, whose next score is then the one to beat. Where trials cost little beyond
    their start-up (the sunk part), the steps left are cheap and nothing is stopped.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import ndtr

from coadapt.tune.direction import at_least_as_good, maximizing

Curve = Sequence[tuple[float, float]]


@dataclass(frozen=True)
class RunningTrial:
    """A running trial, as far as preempting it is concerned."""

    number: int  # its Optuna trial number (unique within the experiment)
    curve: tuple[tuple[float, float], ...] = ()  # (step, value) reported so far
    elapsed_s: float = 0.0  # GPU-seconds it has held its slot(s)
    step_s: float | None = None  # measured seconds per step (None: elapsed / steps)


@dataclass(frozen=True)
class ExperimentView:
    """What a policy knows about one running experiment."""

    id: str
    tenant: str
    submit_time: float
    parallelism: int
    running: int  # trials holding or queued for slots now
    direction: str = "maximize"
    target: float | None = None
    max_steps: int | None = None
    results: tuple[float, ...] = ()  # final values of completed trials, in completion order
    pruned: tuple[float, ...] = ()  # last values of pruned trials
    curves: tuple[tuple[tuple[float, float], ...], ...] = ()  # running trials' curves
    trial_costs: tuple[float, ...] = ()  # GPU-seconds of each finished (or pruned) trial
    gpu_seconds: float = 0.0  # spent so far in all
    best: float | None = None  # best value reported so far (any step)
    idle_since: float | None = None  # since when it has had no trial running (None: has one)
    slots_per_trial: int = 1
    state: Mapping[str, Any] = field(default_factory=dict)  # the policy's memory
    running_trials: tuple[RunningTrial, ...] = ()  # what preemption may stop (none: nothing)

    @property
    def done(self) -> bool:
        return (
            self.target is not None
            and self.best is not None
            and at_least_as_good(self.direction, self.best, self.target)
        )


@dataclass(frozen=True)
class ClusterView:
    now: float
    total_slots: int  # slots tuning may use (the cluster minus other jobs' slots)
    free_slots: int  # of those, not held by any trial now


@dataclass(frozen=True)
class Stop:
    """Preempt running trial ``trial``: its slot goes to experiment ``to``."""

    trial: int
    to: str
    why: str = ""


@dataclass(frozen=True)
class Grant:
    slots: int  # trials it may have running after the stops (running - len(stop) + new)
    priority: int = 0  # job priority of its new trials (higher first)
    state: dict[str, Any] = field(default_factory=dict)
    why: str = ""
    stop: tuple[Stop, ...] = ()  # running trials to stop first (preempted)


Policy = Callable[[Sequence[ExperimentView], ClusterView], dict[str, Grant]]


def _want(e: ExperimentView) -> int:
    """How many more trials the experiment could start (0 once it reached its target)."""
    return 0 if e.done else max(e.parallelism - e.running, 0)


def _hand_out(order: Sequence[ExperimentView], free: int, why: str) -> tuple[dict[str, int], int]:
    """Free slots to experiments in ``order``, each up to its parallelism."""
    extra: dict[str, int] = {}
    for e in order:
        k = min(_want(e), free // max(e.slots_per_trial, 1))
        extra[e.id] = k
        free -= k * max(e.slots_per_trial, 1)
    return extra, free


# -- fifo ---------------------------------------------------------------------------------
def fifo(experiments: Sequence[ExperimentView], cluster: ClusterView) -> dict[str, Grant]:
    order = sorted(experiments, key=lambda e: (e.submit_time, e.id))
    extra, _ = _hand_out(order, cluster.free_slots, "fifo")
    return {
        e.id: Grant(e.running + extra[e.id], 0, dict(e.state), f"fifo: {e.running}+{extra[e.id]}")
        for e in order
    }


# -- algorithm 1 (seed 003) ---------------------------------------------------------------
ALGORITHM1_DEFAULTS: dict[str, float] = {
    "k": 2,  # results needed: n > k*m
    "m": 3,  # the m best results are compared
    "G0": 0.01,  # first gap threshold (objective units)
    "shrink": 0.5,  # G_j = G0 * shrink**j
    "approx": 0.1,  # g ≈ g' when |g - g'| <= approx * g'
    "idle_rounds": 3,  # rounds with slots left over before lowered experiments are raised
}


def algorithm1_update(
    results: Sequence[float],
    direction: str,
    state: Mapping[str, Any],
    params: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Feed the results not seen yet through Algorithm 1; return the new state.

    State: ``P`` (priority level, 0 highest), ``j`` (threshold index), ``G`` (threshold),
    ``gaps`` (the g of every result processed), ``seen`` (results processed).
    """
    p = {**ALGORITHM1_DEFAULTS, **(params or {})}
    k, m = int(p["k"]), int(p["m"])
    st: dict[str, Any] = {
        "P": int(state.get("P", 0)),
        "j": int(state.get("j", 0)),
        "G": float(state.get("G", p["G0"])),
        "gaps": list(state.get("gaps", [])),
        "seen": int(state.get("seen", 0)),
        "idle": int(state.get("idle", 0)),
    }
    for n in range(st["seen"] + 1, len(results) + 1):
        if n <= k * m:
            continue
        ranked = sorted(results[:n], reverse=maximizing(direction))[:m]
        g = min(abs(a - b) for a, b in itertools.pairwise(ranked))
        prev = st["gaps"][-5:]
        g_mean = sum(prev) / len(prev) if prev else None
        converged = g < st["G"] or (
            g_mean is not None and abs(g - g_mean) <= p["approx"] * max(g_mean, 1e-12)
        )
        pi = st["P"] + 1 if converged else st["P"]
        if pi > st["P"]:
            st["P"] = pi
            st["j"] += 1
            st["G"] = p["G0"] * p["shrink"] ** st["j"]
        st["gaps"] = [*st["gaps"], g][-20:]
    st["seen"] = max(st["seen"], len(results))
    return st


def algorithm1(
    experiments: Sequence[ExperimentView],
    cluster: ClusterView,
    params: Mapping[str, float] | None = None,
) -> dict[str, Grant]:
    p = {**ALGORITHM1_DEFAULTS, **(params or {})}
    states = {e.id: algorithm1_update(e.results, e.direction, e.state, p) for e in experiments}
    order = sorted(experiments, key=lambda e: (states[e.id]["P"], e.submit_time, e.id))
    extra, left = _hand_out(order, cluster.free_slots, "algorithm1")
    idle = left > 0 and any(not e.done for e in experiments)
    for e in experiments:
        st = states[e.id]
        if idle and st["P"] > 0:
            st["idle"] += 1
            if st["idle"] >= int(p["idle_rounds"]):
                st["P"] -= 1  # the cluster is idle: raise the priority again
                st["idle"] = 0
        else:
            st["idle"] = 0
    return {
        e.id: Grant(
            e.running + extra[e.id],
            -states[e.id]["P"],
            states[e.id],
            f"algorithm1: P={states[e.id]['P']} {e.running}+{extra[e.id]}",
        )
        for e in order
    }


# -- expected improvement per GPU-second (ours) -------------------------------------------
EI_DEFAULTS: dict[str, float] = {
    "min_results": 3,  # results before an experiment is ranked by its own distribution
    "prior_closure": 0.5,  # optimistic expected fraction of the gap a measured-less trial closes
    "starve_factor": 3.0,  # idle for this many typical trial durations -> served first
    "grid": 96,  # integration points
    "preempt_ratio": 3.0,  # stop a trial if a waiting one is worth this many times more (0: off)
    "min_progress": 0.25,  # ... and only once it reported this fraction of max_steps
    "min_gain": 0.01,  # a running trial's expected gain is taken as at least this gap fraction
}


def _closures(
    samples: Sequence[float],
    bandwidth: float,
    q_values: Sequence[int],
    running: Sequence[tuple[float, float]],
    best: float,
    target: float,
    grid: int,
) -> list[float]:
    """E[(min(max of outcomes, T) - b)^+] / (T - b) for ``q`` new draws (a Gaussian KDE of
    ``samples``) plus the ``running`` (mean, sigma) predictions, for each ``q``; maximising
    frame. Midpoint rule on ``grid`` points over [b, T]."""
    gap = target - best
    if gap <= 0:
        return [0.0 for _ in q_values]
    ys = best + (np.arange(grid) + 0.5) * (gap / grid)
    cdf_new = ndtr((ys[:, None] - np.asarray(samples)[None, :]) / bandwidth).mean(axis=1)
    cdf_run = np.ones(grid)
    for mu, sigma in running:
        cdf_run *= ndtr((ys - mu) / max(sigma, 1e-9))
    return [float(np.mean(1.0 - cdf_new**q * cdf_run)) for q in q_values]


@functools.lru_cache(maxsize=8192)
def _prediction(
    curve: tuple[tuple[float, float], ...], max_steps: int | None
) -> tuple[float, float] | None:
    """(mean, sigma) of a running trial's final value, in the experiment's own units
    (memoised: a curve is re-predicted only when it grows)."""
    if len(curve) < 3:
        return None
    from coadapt.tune.curves import extrapolate

    at = float(max_steps) if max_steps is not None else float(curve[-1][0])
    try:
        pred = extrapolate(list(curve), at)
    except (ValueError, ArithmeticError):
        return None
    mean = float(pred.mean)
    sigma = abs(float(pred.high) - float(pred.low)) / 4.0
    if not math.isfinite(mean) or not math.isfinite(sigma):
        return None
    return mean, sigma


@dataclass(frozen=True)
class _Frame:
    """An experiment's distribution of outcomes, in the maximising frame."""

    sign: float
    samples: list[float]
    best: float
    target: float
    bandwidth: float


def _frame(e: ExperimentView) -> _Frame | None:
    """Best, target and KDE bandwidth of ``e`` (None: no result or reported value yet)."""
    sign = 1.0 if maximizing(e.direction) else -1.0
    samples = [sign * v for v in (*e.results, *e.pruned) if math.isfinite(v)]
    if not samples and e.best is None:
        return None
    best = max([sign * e.best] if e.best is not None else [], default=-math.inf)
    best = max([best, *samples])
    mean = sum(samples) / len(samples) if samples else best
    sd = math.sqrt(sum((x - mean) ** 2 for x in samples) / max(len(samples) - 1, 1))
    if e.target is not None:
        target = sign * e.target
    else:
        target = best + 2.0 * max(sd, 1e-3 * max(abs(best), 1.0))
    spread = max(sd, 1e-3 * max(abs(target - best), abs(best), 1e-6))
    bandwidth = 1.06 * spread * max(len(samples), 1) ** -0.2
    return _Frame(sign, samples, best, target, bandwidth)


def _measured(e: ExperimentView, p: Mapping[str, float]) -> bool:
    """Whether ``e`` is ranked by its own results (else by the prior)."""
    fr = _frame(e)
    return fr is not None and len(fr.samples) >= int(p["min_results"])


def _mean_cost(e: ExperimentView, typical_cost: float) -> float:
    """GPU-seconds of one more trial: the experiment's mean so far (pruned ones included)."""
    costs = [c for c in e.trial_costs if c > 0 and math.isfinite(c)]
    cost = sum(costs) / len(costs) if costs else typical_cost
    return max(cost, 1e-9) * max(e.slots_per_trial, 1)


def ei_scores(
    e: ExperimentView, q_max: int, typical_cost: float, params: Mapping[str, float] | None = None
) -> list[float]:
    """Score (gap fraction per GPU-second) of the experiment's 1st..q_max-th new trial."""
    p = {**EI_DEFAULTS, **(params or {})}
    if e.done or q_max <= 0:
        return []
    cost = _mean_cost(e, typical_cost)
    fr = _frame(e)
    if fr is None or len(fr.samples) < int(p["min_results"]):
        # Not measured yet: each trial closes the gap with prior probability p0, so the q-th
        # of k = running + q parallel trials adds p0 (1 - p0)^(k-1): the first trial of an
        # unmeasured experiment outranks a second or third one (measure everyone first).
        p0 = p["prior_closure"]
        return [p0 * (1.0 - p0) ** (e.running + q) / cost for q in range(q_max)]
    running: list[tuple[float, float]] = []
    unpredicted = 0
    for curve in e.curves:
        pred = _prediction(tuple(curve), e.max_steps)
        if pred is None:
            unpredicted += 1
        else:
            running.append((fr.sign * pred[0], pred[1]))
    unpredicted += max(e.running - len(e.curves), 0)
    qs = [unpredicted + q for q in range(q_max + 1)]
    closure = _closures(fr.samples, fr.bandwidth, qs, running, fr.best, fr.target, int(p["grid"]))
    return [max(b - a, 0.0) / cost for a, b in itertools.pairwise(closure)]


def keep_scores(
    e: ExperimentView, params: Mapping[str, float] | None = None
) -> dict[int, float | None]:
    """Worth of letting each running trial finish: the gap fraction it is expected to add
    (beside the experiment's other running trials) per GPU-second it still needs. None: not
    preemptible (too early to judge, predicted to reach the target, no target or no
    ``max_steps``)."""
    p = {**EI_DEFAULTS, **(params or {})}
    out: dict[int, float | None] = {r.number: None for r in e.running_trials}
    if e.done or e.target is None or e.max_steps is None or not e.running_trials:
        return out
    fr = _frame(e)
    if fr is None:
        return out
    min_steps = max(3.0, p["min_progress"] * e.max_steps)
    preds: dict[int, tuple[float, float]] = {}
    for r in e.running_trials:
        pred = _prediction(tuple(r.curve), e.max_steps)
        if pred is not None:
            preds[r.number] = (fr.sign * pred[0], pred[1])
    grid = int(p["grid"])
    kde = fr.samples or [fr.best]  # unused with no new draws (q = 0), but must not be empty
    everyone = _closures(kde, fr.bandwidth, [0], list(preds.values()), fr.best, fr.target, grid)[0]
    for r in e.running_trials:
        if r.number not in preds or not r.curve:
            continue
        steps = r.curve[-1][0]
        mu, _ = preds[r.number]
        if steps < min_steps or steps >= e.max_steps or mu >= fr.target:
            continue
        others = [v for k, v in preds.items() if k != r.number]
        without = _closures(kde, fr.bandwidth, [0], others, fr.best, fr.target, grid)[0]
        step_s = r.step_s if r.step_s is not None and r.step_s > 0 else r.elapsed_s / steps
        left = max(step_s * (e.max_steps - steps), 1e-9) * max(e.slots_per_trial, 1)
        out[r.number] = max(everyone - without, p["min_gain"]) / left
    return out


def ei_per_gpu(
    experiments: Sequence[ExperimentView],
    cluster: ClusterView,
    params: Mapping[str, float] | None = None,
) -> dict[str, Grant]:
    p = {**EI_DEFAULTS, **(params or {})}
    all_costs = [c for e in experiments for c in e.trial_costs if c > 0 and math.isfinite(c)]
    typical = sorted(all_costs)[len(all_costs) // 2] if all_costs else 60.0
    free = cluster.free_slots
    extra = {e.id: 0 for e in experiments}
    why = {e.id: "" for e in experiments}
    # 1. starvation guard: long-idle experiments first (longest idle first)
    starve_after = p["starve_factor"] * typical
    starving = sorted(
        (
            e
            for e in experiments
            if _want(e) > 0
            and e.idle_since is not None
            and cluster.now - e.idle_since >= starve_after
        ),
        key=lambda e: (e.idle_since, e.submit_time, e.id),
    )
    for e in starving:
        if free >= e.slots_per_trial:
            extra[e.id] += 1
            free -= e.slots_per_trial
            why[e.id] = "starving; "
    # 2. the rest by marginal expected gap closure per GPU-second
    scores = {e.id: ei_scores(e, _want(e) - extra[e.id], typical, p) for e in experiments}
    by_id = {e.id: e for e in experiments}

    def next_score(e: ExperimentView) -> float | None:
        taken = extra[e.id] - (1 if why[e.id] else 0)
        s = scores[e.id]
        return s[taken] if taken < len(s) else None

    while free > 0:
        best_id, best_score = None, -1.0
        for e in sorted(experiments, key=lambda x: (x.submit_time, x.id)):
            s = next_score(e)
            if s is not None and s > best_score and free >= e.slots_per_trial:
                best_id, best_score = e.id, s
        if best_id is None:  # work-conserving: a zero score still beats an idle slot
            break
        extra[best_id] += 1
        free -= by_id[best_id].slots_per_trial
    # 3. preemption: a running trial worth far less per remaining GPU-second than a waiting
    # experiment's next trial gives up its slot (worst ratio first)
    stops: dict[str, list[Stop]] = {e.id: [] for e in experiments}
    ratio = p["preempt_ratio"]
    # only a measured alternative (its score from its own results, not the optimistic prior
    # that makes unmeasured experiments go first) may take a running trial's slot
    measured = {e.id for e in experiments if _measured(e, p)}
    if ratio > 0:
        victims = sorted(
            (
                (k, e.id, n)
                for e in experiments
                for n, k in keep_scores(e, p).items()
                if k is not None
            ),
            key=lambda v: (v[0], v[1], v[2]),
        )
        for keep, vid, number in victims:
            alt, alt_score = None, 0.0
            for e in sorted(experiments, key=lambda x: (x.submit_time, x.id)):
                s = next_score(e)
                if (
                    s is not None
                    and e.id in measured
                    and s > alt_score
                    and e.slots_per_trial <= by_id[vid].slots_per_trial
                ):
                    alt, alt_score = e, s
            if alt is None or alt_score <= ratio * keep:
                continue
            stops[vid].append(
                Stop(
                    number,
                    alt.id,
                    f"{keep:.3g} vs {alt_score:.3g} gap fraction per GPU-s",
                )
            )
            extra[alt.id] += 1
    grants = {}
    for e in experiments:
        own = scores[e.id]
        head = f"{own[0]:.3g}/GPU-s" if own else "-"
        st = tuple(stops[e.id])
        cut = f", stop {len(st)}" if st else ""
        grants[e.id] = Grant(
            e.running - len(st) + extra[e.id],
            0,
            dict(e.state),
            f"ei-per-gpu: {why[e.id]}score {head}, {e.running}+{extra[e.id]}{cut}",
            st,
        )
    # Running trials' jobs keep their priority; new ones are ordered by score.
    ranked = sorted(experiments, key=lambda e: -(scores[e.id][0] if scores[e.id] else 0.0))
    for rank, e in enumerate(ranked):
        g = grants[e.id]
        grants[e.id] = Grant(g.slots, len(ranked) - rank, g.state, g.why, g.stop)
    return grants


POLICIES: dict[str, Policy] = {
    "fifo": fifo,
    "algorithm1": algorithm1,
    "ei-per-gpu": ei_per_gpu,
}
POLICY_NAMES: tuple[str, ...] = tuple(POLICIES)


def get_policy(name: str) -> Policy:
    """The policy called ``name``; ``ValueError`` naming the accepted ones otherwise."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown tuning policy {name!r}; accepted: {', '.join(POLICY_NAMES)}"
        ) from None

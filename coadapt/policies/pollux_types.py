"""Type-aware FITNESS_p: a job runs on one GPU type at a time; types are shared by goodput.

FITNESS_p stays a power mean of per-job speedups, with one change: a job's speedup on type t is
its goodput there over its goodput on the fair share of its *best* type, so a V100 and a K80
allocation of the same job are priced on one scale (Sia's normalisation, seed 001). Each type is
then a homogeneous problem (:class:`PolluxProblem` over that type's nodes, the job's model on
that type, scaled as above) that the homogeneous optimiser solves; what couples the types is
only which job runs where. That is decided by

1. **placement by type:** running jobs stay on their type; the types are solved in turn, best
   GPUs first, each offered the jobs still waiting; a waiting job placed on one type is taken
   out of the next ones;
2. **type moves:** a job is tried on another type (types with free GPUs first, then by the
   speedup it would gain); on small problems (``SMALL_JOBS``) also two jobs swapping types and
   chains (one job onto free GPUs, another into the type it left). The types touched are
   re-solved and the move is kept if the sum of FITNESS_p's terms rises. Every move costs a
   solve per type touched, so the number tried is bounded.

A job is excluded from a type by a cap of zero GPUs there, so each type's problem is built once
per round. Never more GPUs of a type than exist (each problem has only that type's nodes),
one type per job, ``JobInfo.allows`` respected (a job is in a type's problem only if allowed).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from coadapt.policies.base import Allocation, ClusterSnapshot, JobInfo
from coadapt.policies.pollux_problem import (
    FloatArray,
    IntArray,
    Levers,
    PolluxProblem,
    combine_weights,
    priority_weights,
)

MakeProblem = Callable[[ClusterSnapshot, int], PolluxProblem]
Solve = Callable[[PolluxProblem], tuple[IntArray, float]]
Polish = Callable[[PolluxProblem, IntArray], IntArray]
#: Type moves tried per round on small problems (at most SMALL_JOBS jobs: swaps and chains
#: too) and on larger ones (single moves onto free GPUs only, best first, until MAX_MISSES
#: fail in a row: each costs two solves, and the round has a latency budget).
SMALL_JOBS = 8
MOVES_SMALL = 48
MOVES_LARGE = 4
#: Consecutive moves that did not pay before the search gives up (they are tried best first).
MAX_MISSES = 2


def current_type(snapshot: ClusterSnapshot, job: str) -> str | None:
    """The type of the GPUs ``job`` holds now (None: none; the most-held type if mixed)."""
    alloc = snapshot.current.get(job)
    if alloc is None:
        return None
    width = min(len(alloc), len(snapshot.nodes))
    row = np.asarray(alloc[:width])
    held: dict[str, int] = {}
    for i in np.flatnonzero(row > 0).tolist():  # the nodes it holds, not every node
        t = snapshot.nodes[i].gpu_type
        held[t] = held.get(t, 0) + int(row[i])
    if not held:
        return None
    return max(sorted(held), key=lambda t: held[t])


def _on_type(job: JobInfo, gpu_type: str) -> JobInfo:
    """``job`` as a one-type problem sees it: ``replace(job, goodput=job.goodput_on(gpu_type),
    goodput_by_type=None, gpu_types=None)``, made by copying the frozen instance's fields at
    once (dataclasses.replace walks and re-validates every field: a 2048-GPU round on three
    types makes ~3000 of these)."""
    clone = object.__new__(JobInfo)
    fields = clone.__dict__
    fields.update(job.__dict__)
    fields["goodput"] = job.goodput_on(gpu_type)
    fields["goodput_by_type"] = None
    fields["gpu_types"] = None
    return clone


def type_snapshot(
    snapshot: ClusterSnapshot, gpu_type: str, held: dict[str, str | None] | None = None
) -> ClusterSnapshot:
    """``snapshot`` restricted to ``gpu_type``: its nodes, the jobs allowed on it (with their
    model for it), and their current allocations if they are on it. ``held``: each job's
    :func:`current_type`, when the caller has it already (one per round, not one per type)."""
    idx = [i for i, n in enumerate(snapshot.nodes) if n.gpu_type == gpu_type]
    take = np.asarray(idx, dtype=np.int64)
    jobs: dict[str, JobInfo] = {}
    current: dict[str, Allocation] = {}
    for name, job in snapshot.jobs.items():
        if not job.allows(gpu_type):
            continue
        jobs[name] = _on_type(job, gpu_type)
        alloc = snapshot.current.get(name)
        if alloc is None:
            continue
        on = held[name] if held is not None else current_type(snapshot, name)
        if on == gpu_type:
            current[name] = tuple(np.asarray(alloc, dtype=np.int64)[take].tolist())
    return replace(
        snapshot, nodes=tuple(snapshot.nodes[i] for i in idx), jobs=jobs, current=current
    )


def power_mean(speedups: FloatArray, weights: FloatArray | None, p: float, eps: float) -> float:
    """FITNESS_p of a speedup vector (eq. 15, weighted as :class:`PolluxProblem` weighs)."""
    if speedups.size == 0:
        return 1.0
    x = speedups + eps
    w = np.ones_like(x) if weights is None else weights
    if p == 0:
        return float(np.exp(np.sum(w * np.log(x)) / w.sum()))
    return float((np.sum(w * x**p) / w.sum()) ** (1.0 / p))


def term(speedup: float, p: float, eps: float) -> float:
    """One job's unweighted term of FITNESS_p's order-preserving sum (as
    :meth:`PolluxProblem.utility`)."""
    x = speedup + eps
    if p == 0:
        return math.log(x)
    return -(x**p) if p < 0 else float(x**p)


@dataclass
class _TypeProblem:
    gpu_type: str
    problem: PolluxProblem
    nodes: list[int]  # global node indices
    index: dict[str, int]  # job name -> row in the problem
    caps: IntArray  # the job's own caps on this type
    base: IntArray  # the job's current rows on this type


class TypedPollux:
    """One round of type-aware FITNESS_p (see the module docstring)."""

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        make_problem: MakeProblem,
        solve: Solve,
        levers: Levers,
        max_moves: int | None = None,
        polish: Polish | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.solve = solve
        self.polish = polish
        self.names = list(snapshot.jobs)
        jobs = list(snapshot.jobs.values())
        total = snapshot.total_gpus
        fair_share = max(1, math.ceil(total / max(len(jobs), 1)))
        self.weights = combine_weights(
            priority_weights([j.priority for j in jobs]), levers.service_weights(jobs)
        )
        self.row = {name: i for i, name in enumerate(self.names)}
        self.speedups: dict[str, float] = {}
        self.held = {name: current_type(snapshot, name) for name in self.names}
        self.types: list[_TypeProblem] = []
        for t in snapshot.gpu_types:
            sub = type_snapshot(snapshot, t, self.held)
            if not sub.jobs or not sub.nodes:
                continue
            pb = make_problem(sub, fair_share)
            index = {name: i for i, name in enumerate(pb.names)}
            if self.weights is not None:
                pb.weights = self.weights[[self.row[n] for n in pb.names]]
            nodes = [i for i, n in enumerate(snapshot.nodes) if n.gpu_type == t]
            self.types.append(
                _TypeProblem(t, pb, nodes, index, pb.max_replicas.copy(), pb.base.copy())
            )
        self._scale()
        self.p = self.types[0].problem.p if self.types else -1.0
        self.eps = self.types[0].problem.epsilon if self.types else 1e-3
        self.small = len(jobs) <= SMALL_JOBS
        small = self.small
        self.max_moves = (
            max_moves if max_moves is not None else (MOVES_SMALL if small else MOVES_LARGE)
        )

    def _scale(self) -> None:
        """Speedups on one scale across types: relative to the job's best type's reference."""
        best: dict[str, float] = {}
        fitted: dict[str, bool] = {}
        for tp in self.types:
            for name, j in tp.index.items():
                fn = tp.problem.speedup_fns[j]
                best[name] = max(best.get(name, 0.0), fn.reference_goodput)
                fitted[name] = fitted.get(name, True) and fn.model is not None
        for tp in self.types:
            scale = np.ones(tp.problem.num_jobs)
            for name, j in tp.index.items():
                fn = tp.problem.speedup_fns[j]
                if fitted[name] and best[name] > 0:  # no model somewhere: no cross-type info
                    scale[j] = fn.reference_goodput / best[name]
            tp.problem.set_scale(scale)

    # ------------------------------------------------------------- assignment
    def _solve_type(self, tp: _TypeProblem, assign: dict[str, str | None]) -> IntArray:
        pb = tp.problem
        for name, j in tp.index.items():
            here = assign.get(name) in (tp.gpu_type, None)
            pb.max_replicas[j] = tp.caps[j] if here else 0
            pb.base[j] = tp.base[j] if assign.get(name) == tp.gpu_type else 0
        state, _ = self.solve(pb)
        return state

    def _mop_up(
        self, order: list[_TypeProblem], assign: dict[str, str | None], states: dict[str, IntArray]
    ) -> None:
        """Jobs left without GPUs where they were placed (a type offered more jobs than it has
        GPUs) are offered to every type again, in the same order, where a type has GPUs free
        or the cluster has a GPU for every job (otherwise someone must wait anyway). A job a
        re-solve leaves without GPUs is offered to the next types (two passes at most)."""
        room = len(self.names) <= self.snapshot.total_gpus
        for _ in range(2):
            changed = False
            for tp in order:
                self._demote(assign, states)
                free = tp.problem.node_caps.sum() > states[tp.gpu_type].sum()
                if (room or free) and any(assign[name] is None for name in tp.index):
                    states[tp.gpu_type] = self._solve_type(tp, assign)
                    self._claim(tp, states[tp.gpu_type], assign)
                    changed = True
            self._demote(assign, states)
            if not changed or all(a is not None for a in assign.values()):
                return

    def _demote(self, assign: dict[str, str | None], states: dict[str, IntArray]) -> None:
        """A job its type's solution left without GPUs is waiting again."""
        for tp in self.types:
            state = states.get(tp.gpu_type)
            if state is None:
                continue
            for name, j in tp.index.items():
                if assign[name] == tp.gpu_type and state[j].sum() == 0:
                    assign[name] = None

    @staticmethod
    def _claim(tp: _TypeProblem, state: IntArray, assign: dict[str, str | None]) -> None:
        """Waiting jobs that got GPUs on ``tp`` now belong to it."""
        for name, j in tp.index.items():
            if assign[name] is None and state[j].sum() > 0:
                assign[name] = tp.gpu_type

    def _utilities(self, tp: _TypeProblem, state: IntArray) -> FloatArray:
        s = tp.problem.job_speedups(state[None])[0]
        return np.array([tp.problem.utility(j, float(s[j])) for j in range(len(s))])

    def run(self) -> tuple[dict[str, Allocation], float]:
        """Allocations (global node order) and the decision's FITNESS_p."""
        assign: dict[str, str | None] = {}
        for name in self.names:
            t = self.held[name]
            job = self.snapshot.jobs[name]
            assign[name] = t if t is not None and job.allows(t) else None
        states: dict[str, IntArray] = {}
        # Best GPUs first: the type where jobs' speedups are highest on average.
        order = sorted(self.types, key=lambda tp: (-float(np.mean(tp.problem.scale)), tp.gpu_type))
        for tp in order:
            states[tp.gpu_type] = self._solve_type(tp, assign)
            self._claim(tp, states[tp.gpu_type], assign)
        self._mop_up(order, assign, states)
        if len(self.types) > 1:
            self._moves(assign, states)
        if self.polish is not None:
            self._polish(assign, states)
        return self._result(assign, states)

    def _polish(self, assign: dict[str, str | None], states: dict[str, IntArray]) -> None:
        """The final per-type improvement (pair re-placements), with the final assignment."""
        assert self.polish is not None
        for tp in self.types:
            pb = tp.problem
            for name, j in tp.index.items():
                mine = assign.get(name) == tp.gpu_type
                pb.max_replicas[j] = tp.caps[j] if mine else 0
                pb.base[j] = tp.base[j] if mine else 0
            state = states[tp.gpu_type]
            polished = self.polish(pb, state)
            if pb.fitness(polished[None])[0] > pb.fitness(state[None])[0]:
                states[tp.gpu_type] = polished

    def _total(self, states: dict[str, IntArray], assign: dict[str, str | None]) -> float:
        """Σ of FITNESS_p's terms over all jobs (idle jobs at speedup 0)."""
        total = 0.0
        counted: set[str] = set()
        for tp in self.types:
            u = self._utilities(tp, states[tp.gpu_type])
            for name, j in tp.index.items():
                if assign[name] == tp.gpu_type:
                    total += float(u[j])
                    counted.add(name)
        for name in self.names:
            if name not in counted:
                w = 1.0 if self.weights is None else float(self.weights[self.row[name]])
                total += w * term(0.0, self.p, self.eps)
        return total

    def _scales(self, name: str) -> dict[str, float]:
        return {
            tp.gpu_type: float(tp.problem.scale[tp.index[name]])
            for tp in self.types
            if name in tp.index
        }

    def _candidates(
        self, assign: dict[str, str | None], states: dict[str, IntArray]
    ) -> list[dict[str, str]]:
        """Re-assignments to try, most promising first: single moves onto types with free
        GPUs, then other single moves by speedup gained, then (small problems) swaps of two
        jobs' types and chains (one job onto free GPUs, another into the place it left)."""
        free = {
            tp.gpu_type: int(tp.problem.node_caps.sum() - states[tp.gpu_type].sum())
            for tp in self.types
        }
        scored: list[tuple[int, float, int, dict[str, str]]] = []
        for i, name in enumerate(self.names):
            scales = self._scales(name)
            here = assign[name]
            for t, sc in sorted(scales.items()):
                if t != here and (self.small or free[t] > 0):  # large: only onto free GPUs
                    gain = sc - (scales[here] if here is not None else 0.0)
                    scored.append((0 if free[t] > 0 else 1, -gain, i, {name: t}))
        if self.small:
            for a, b in itertools.combinations(self.names, 2):
                ta, tb = assign[a], assign[b]
                sa, sb = self._scales(a), self._scales(b)
                if ta is None or tb is None or ta == tb or tb not in sa or ta not in sb:
                    continue
                gain = sa[tb] - sa[ta] + sb[ta] - sb[tb]
                scored.append((2, -gain, self.row[a], {a: tb, b: ta}))
            # Chains: one job onto a type with free GPUs, another into the place it left.
            for a in self.names:
                ta, sa = assign[a], self._scales(a)
                if ta is None:
                    continue
                for t in sorted(sa):
                    if t == ta or free[t] <= 0:
                        continue
                    for b in self.names:
                        if b != a and assign[b] != ta and ta in self._scales(b):
                            scored.append((3, 0.0, self.row[a], {a: t, b: ta}))
        scored.sort(key=lambda c: c[:3])
        return [c[3] for c in scored]

    def _moves(self, assign: dict[str, str | None], states: dict[str, IntArray]) -> None:
        by_type = {tp.gpu_type: tp for tp in self.types}
        total = self._total(states, assign)
        tried = 0
        while tried < self.max_moves:
            improved = False
            misses = 0
            for change in self._candidates(assign, states):
                if tried >= self.max_moves or (not self.small and misses >= MAX_MISSES):
                    return
                tried += 1
                misses += 1
                trial_assign = {**assign, **change}
                touched = sorted(
                    {t for t in change.values()}
                    | {t for n in change if (t := assign[n]) is not None}
                )
                trial = dict(states)
                for t in touched:
                    trial[t] = self._solve_type(by_type[t], trial_assign)
                    self._claim(by_type[t], trial[t], trial_assign)
                if any(trial[t][by_type[t].index[n]].sum() == 0 for n, t in change.items()):
                    continue  # a moved job found no room where it went
                value = self._total(trial, trial_assign)
                if value > total + 1e-12 * max(1.0, abs(total)):
                    assign.update(trial_assign)
                    states.update(trial)
                    total = value
                    improved = True
                    misses = 0
                    break  # the candidates' order depends on the new state
            if not improved:
                return

    def _result(
        self, assign: dict[str, str | None], states: dict[str, IntArray]
    ) -> tuple[dict[str, Allocation], float]:
        width = len(self.snapshot.nodes)
        allocs: dict[str, Allocation] = {}
        speedups = np.zeros(len(self.names))
        for tp in self.types:
            state = states[tp.gpu_type]
            s = tp.problem.job_speedups(state[None])[0]
            held = state.sum(axis=1)
            mine = [
                (name, j)
                for name, j in tp.index.items()
                if assign[name] == tp.gpu_type and held[j] > 0
            ]
            rows = np.zeros((len(mine), width), dtype=np.int64)  # global node order
            rows[:, tp.nodes] = state[[j for _, j in mine]]
            for (name, j), row in zip(mine, rows.tolist(), strict=True):
                allocs[name] = tuple(row)
                speedups[self.row[name]] = float(s[j])
        self.speedups = {n: float(speedups[self.row[n]]) for n in allocs}
        return allocs, power_mean(speedups, self.weights, self.p, self.eps)

    # ------------------------------------------------------ for packing
    def one_gpu(self, name: str, gpu_type: str, changed: bool) -> float:
        """The job's speedup on one GPU of ``gpu_type`` (0 if it may not run there)."""
        for tp in self.types:
            if tp.gpu_type == gpu_type and name in tp.index:
                return tp.problem.speedup(tp.index[name], 1, 1, changed)
        return 0.0

    def term(self, name: str, speedup: float) -> float:
        """The job's weighted term of FITNESS_p's order-preserving sum."""
        w = 1.0 if self.weights is None else float(self.weights[self.row[name]])
        return w * term(speedup, self.p, self.eps)

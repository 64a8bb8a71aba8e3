"""Pollux's scheduling policy with a fast optimiser: ``pollux-unaware`` (the authors' objective)
and the default ``pollux`` (the same optimiser with :data:`DEFAULT_LEVERS`, GPU types and
packing; ``docs/hetero.md``, "The default policy").

The paper maximises FITNESS_p with a genetic algorithm: 100 individuals × 100 generations,
seconds per round at 64 GPUs. FITNESS_p is a sum of per-job terms, and a job's term depends
on its allocation only through (nodes, GPUs, changed?), so we can optimise structurally:

1. **Counts.** Each job's term as a function of its GPU count (on the fewest nodes; its current
   count scored as kept) is tabulated from one vectorised goodput evaluation per round. A lazy
   greedy hands out GPUs by marginal gain per GPU, looking up to a node's worth ahead to get
   past non-concave steps; then swaps of 1..G GPUs move capacity from the job that loses least
   to the job that gains most until no swap helps.
2. **Packing.** Jobs keeping their count keep their placement; shrinking jobs release their
   least-used nodes; growing jobs extend on their own nodes, then onto the freest nodes the
   interference rule allows; new jobs go best-fit.
3. **Local search** on the real placement: hand out leftover GPUs (with ``Levers.leap`` also
   in whole nodes past one node's worth: a young job may gain only from a large growth), move
   single GPUs from cheap donors to the jobs that gain most, and put changed jobs back where
   they were when that pays.
   On small problems a second search starts from the current allocation, which catches
   bin-packing effects the count phase cannot see.

The result is never worse than keeping every allocation as it is. (Step 2 places GPUs on
nodes; GPU *sharing* is :mod:`coadapt.policies.packing`.) Policy and GA share
:class:`PolluxProblem`, so their fitness values are directly comparable
(``benchmarks/policy_scaling.py``), and both honour ``JobInfo.priority`` the same way: through
the priority weights of FITNESS_p (:mod:`coadapt.policies.pollux_problem`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from coadapt.policies.base import BatchMode, ClusterSnapshot, Decision, PolicyState
from coadapt.policies.packing import OneGpu, Term, choose_packing, split_guests
from coadapt.policies.polish import polish_pairs
from coadapt.policies.pollux_problem import (
    FloatArray,
    IntArray,
    Levers,
    PolluxProblem,
    remaining_work,
)
from coadapt.policies.pollux_types import MakeProblem, TypedPollux

_TOL = 1e-12
#: Policy state key of the pairs packed last round (guest -> host), read back next round.
PACKED_STATE_KEY = "packed"
#: The default ``pollux``'s levers (see :class:`Levers`, plus the fairness power ``p``; chosen
#: on the artifact workloads, ``docs/hetero.md``). ``remaining_power``/``settle`` read
#: ``JobInfo.progress`` and change nothing for jobs that declare no length. ``leap`` (growth
#: into idle GPUs past a node's worth) with ``hold`` 0.25 to pay for its restarts and a
#: stronger remaining-work weight: issue 18's fourth stop. ``p`` = +0.5 with a stronger weight
#: and ``hold`` 0.3 (fifth stop): with the weight, a less equalising mean lets short jobs
#: finish first (SRPT's gain) while a job without GPUs still gains most from its first ones
#: (any p < 1 keeps that, so no job starves behind busier ones). Where no job declares a
#: length there is no weight to act on, and p stays the paper's −1 (``p_undeclared``).
#: ``srpt_q`` 0.8 (seventh stop): the jobs with over 50 GPU-h still to do are served nearly
#: one after another, heSRPT's rank shares, instead of side by side.
DEFAULT_LEVERS: dict[str, Any] = {
    "explore": 4.0,
    "first": 4,
    "hold": 0.3,
    "leap": True,
    "p": 0.5,
    "p_undeclared": -1.0,
    "remaining_power": 1.25,
    "settle": 1.0,
    "srpt_q": 0.8,
}


@dataclass(frozen=True)
class _Move:
    """A growth of job ``job`` by GPUs placed as (node, count) pairs."""

    gain: float  # change of Σ g, the sum that orders states like FITNESS_p
    job: int
    plan: tuple[tuple[int, int], ...]

    @property
    def gpus(self) -> int:
        return sum(c for _, c in self.plan)


class _Search:
    """Mutable search state over one :class:`PolluxProblem`."""

    def __init__(self, problem: PolluxProblem, state: IntArray, floor: int = 0) -> None:
        self.pb = problem
        self.floor = floor  # donors keep at least this many GPUs (1: admission is settled)
        self.state = state.copy()
        self.free = problem.node_caps - self.state.sum(axis=0)
        self.k = self.state.sum(axis=1)
        # Per-row statistics in whole-matrix calls, then one scalar utility per job (a per-row
        # sum / count / compare was most of a 2048-GPU search's set-up).
        ks = self.k.tolist()
        spans = np.count_nonzero(self.state, axis=1).tolist()
        changed = np.any(self.state != problem.base, axis=1).tolist()
        self.idle = problem.idle_terms()
        self.util = np.array(
            [self._utility_of(j, ks[j], spans[j], changed[j]) for j in range(problem.num_jobs)]
        )
        # dist_owner[n] = index of the distributed job on node n, or -1.
        self.dist_owner = np.full(problem.num_nodes, -1, dtype=np.int64)
        for j in range(problem.num_jobs):
            if spans[j] > 1:
                self.dist_owner[self.state[j] > 0] = j

    # ------------------------------------------------------------- utilities
    def _utility_of(self, j: int, k: int, nodes: int, changed: bool) -> float:
        """Job j's term with ``k`` GPUs on ``nodes`` nodes (``changed``: not its current row)."""
        if k == 0:
            return self.idle[j]
        return self.pb.utility(j, self.pb.speedup(j, nodes, k, changed))

    def _row_utility(self, j: int, row: IntArray) -> float:
        k = int(row.sum())
        if k == 0:  # skip the node count and comparison: nothing is held
            return self._utility_of(j, 0, 0, False)
        nodes = int(np.count_nonzero(row))
        changed = bool((row != self.pb.base[j]).any())  # same shape: array_equal's checks
        return self._utility_of(j, k, nodes, changed)

    def _grown_utility(
        self, j: int, plan: tuple[tuple[int, int], ...], spans: int, differ: set[int]
    ) -> float:
        """Job j's utility once ``plan`` is added to its row, from the row's statistics
        (``spans``: nodes it holds, ``differ``: nodes where its row is not its current
        allocation), without a copy of the row."""
        row, base = self.state[j], self.pb.base[j]
        k, changed = int(self.k[j]), False
        for n, c in plan:
            held = int(row[n])
            k += c
            spans += held == 0
            changed = changed or held + c != int(base[n])
        if not changed:  # the plan's nodes match: any other node that differs still does
            changed = not differ.issubset(n for n, _ in plan)
        return self._utility_of(j, k, spans, changed)

    # ---------------------------------------------------------------- growth
    def _allowed_multi(self, j: int, nodes: IntArray) -> bool:
        """Whether job j may be distributed over all of ``nodes`` (no other distributed job
        is on any of them)."""
        if not self.pb.avoid_interference:
            return True
        owners = self.dist_owner[nodes]
        return bool(((owners == -1) | (owners == j)).all())

    def _grow_plan(self, j: int, extra: int) -> tuple[tuple[int, int], ...] | None:
        """Where ``extra`` more GPUs for job j would go, or None if they do not fit."""
        row = self.state[j]
        own = np.flatnonzero(row > 0)
        plan: dict[int, int] = {}
        need = extra
        if own.size == 0:
            fits = np.flatnonzero(self.free >= extra)
            if fits.size:  # best fit: the node with the least free GPUs that holds it
                n = int(fits[np.argmin(self.free[fits])])
                return ((n, extra),)
        else:
            for n in own[np.argsort(-self.free[own], kind="stable")]:
                take = int(min(self.free[n], need))
                if take > 0:
                    plan[int(n)] = take
                    need -= take
                if need == 0:
                    return tuple(plan.items())
            # Spilling onto new nodes makes the job distributed: all its nodes must allow it.
            if not self._allowed_multi(j, own):
                return None
        # Nodes it does not use yet, most free first (stable), that allow it: vectorised, as
        # this runs for every growth size of every job in every greedy step (a Python loop
        # over the nodes was a fifth of a 2048-GPU round).
        order = np.argsort(-self.free, kind="stable")
        ok = (self.free[order] > 0) & (row[order] == 0)
        if self.pb.avoid_interference:
            owner = self.dist_owner[order]
            ok &= (owner == -1) | (owner == j)
        candidates = order[ok]
        if candidates.size == 0:
            return None
        reach = np.cumsum(self.free[candidates])
        if int(reach[-1]) < need:
            return None
        last = int(np.searchsorted(reach, need))  # the first node that completes it
        for i in range(last):
            plan[int(candidates[i])] = int(self.free[candidates[i]])
        before = int(reach[last - 1]) if last > 0 else 0
        plan[int(candidates[last])] = need - before
        return tuple(plan.items())

    def _reach(self, j: int) -> int:
        """The most extra GPUs :meth:`_grow_plan` can place for job j (it returns None for
        more): the free GPUs on its own nodes, plus, where it may spread, those on the nodes
        the interference rule lets it take; a job on no node may also take the freest node.
        In a crowded round most growth sizes do not fit (free GPUs sit on other distributed
        jobs' nodes), and sizing each one cost a sort of every node."""
        row = self.state[j]
        own = row > 0
        own_free = int(self.free[own].sum())
        held = np.flatnonzero(own)
        if held.size and not self._allowed_multi(j, held):
            return own_free
        ok = (self.free > 0) & ~own
        if self.pb.avoid_interference:
            ok &= (self.dist_owner == -1) | (self.dist_owner == j)
        spread = own_free + int(self.free[ok].sum())
        if held.size == 0:
            return max(spread, int(self.free.max(initial=0)))
        return spread

    def best_growth(self, j: int) -> _Move | None:
        k = int(self.k[j])
        cap = int(self.pb.max_replicas[j])
        if cap <= k:  # first: in a type's problem most jobs are capped at 0 (placed elsewhere)
            return None
        room = min(cap - k, int(self.free.sum()))
        if room <= 0:
            return None
        start = max(1, int(self.pb.min_replicas[j]) - k) if k == 0 else 1
        horizon = min(room, max(self.pb.gpus_per_node, start))
        best: _Move | None = None
        reach = self._reach(j)
        row = self.state[j]
        spans = int(np.count_nonzero(row))
        differ = set(np.flatnonzero(row != self.pb.base[j]).tolist())
        for extra in self.pb.levers.growth_sizes(start, horizon, room, self.pb.gpus_per_node):
            if extra > reach:  # _grow_plan would say None: skip its work
                continue
            plan = self._grow_plan(j, extra)
            if plan is None:
                continue
            gain = self._grown_utility(j, plan, spans, differ) - self.util[j]
            if best is None or gain / extra > best.gain / best.gpus + _TOL:
                best = _Move(gain, j, plan)
        return best

    def _gain_ceiling(self, j: int, free_gpus: int) -> float:
        """An upper bound on the gain of :meth:`best_growth` for job j when ``free_gpus`` GPUs
        are free in all: its best speedup over the counts a growth step may reach, priced as
        if unchanged and never discounted, minus its utility now (+inf where the utility does
        not rise with the speedup, -inf where it cannot grow)."""
        pb = self.pb
        if pb.weights is not None and float(np.min(pb.weights)) < 0:
            return math.inf  # the utility would not rise with the speedup
        k = int(self.k[j])
        room = min(int(pb.max_replicas[j]) - k, free_gpus)
        if room <= 0:
            return -math.inf
        start = max(1, int(pb.min_replicas[j]) - k) if k == 0 else 1
        sizes = pb.levers.growth_sizes(
            start, min(room, max(pb.gpus_per_node, start)), room, pb.gpus_per_node
        )
        fn, per_node = pb.speedup_fns[j], pb.gpus_per_node
        best = 0.0
        for extra in sizes:
            count = k + extra
            if count <= per_node:
                best = max(best, fn.scalar(1, count))
            if count >= 2:
                best = max(best, fn.scalar(2, count))
        factor = max(1.0, float(pb.realloc_factor[j]) * (1.0 - pb.switch_margin))
        return pb.utility(j, best * float(pb.scale[j]) * factor) - float(self.util[j])

    def apply(self, move: _Move) -> None:
        j = move.job
        for n, c in move.plan:
            self.state[j, n] += c
            self.free[n] -= c
        self._refresh(j)

    def _refresh(self, j: int, util: float | None = None) -> None:
        """Job j's count, utility (``util``: known already for this row) and node marks."""
        self.k[j] = int(self.state[j].sum())
        self.util[j] = self._row_utility(j, self.state[j]) if util is None else util
        self.dist_owner[self.dist_owner == j] = -1
        if np.count_nonzero(self.state[j]) > 1:
            self.dist_owner[self.state[j] > 0] = j

    def greedy(self) -> None:
        """Lazy greedy on gain per GPU: re-evaluate the popped job, apply if still best."""
        heap: list[tuple[float, int]] = []
        # Only jobs below their cap can grow (in a type's problem most are capped at 0).
        for j in np.flatnonzero(self.pb.max_replicas > self.k).tolist():
            move = self.best_growth(j)
            if move is not None and move.gain > _TOL:
                heap.append((-move.gain / move.gpus, j))
        heapq.heapify(heap)
        while heap and self.free.sum() > 0:
            _, j = heapq.heappop(heap)
            move = self.best_growth(j)
            if move is None or move.gain <= _TOL:
                continue
            rate = move.gain / move.gpus
            if heap and rate < -heap[0][0] - _TOL:
                heapq.heappush(heap, (-rate, j))  # stale: someone else is better now
                continue
            self.apply(move)
            nxt = self.best_growth(j)
            if nxt is not None and nxt.gain > _TOL:
                heapq.heappush(heap, (-nxt.gain / nxt.gpus, j))

    # ---------------------------------------------------------- local search
    def _shrink_option(self, j: int) -> tuple[float, int] | None:
        """Loss of Σ g when job j gives up one GPU, and the node it comes from."""
        k = int(self.k[j])
        if k <= max(self.floor, 0):
            return None
        if 0 < k - 1 < int(self.pb.min_replicas[j]):
            return None
        own = np.flatnonzero(self.state[j] > 0)
        n = int(own[np.argmin(self.state[j][own])])  # emptying a node can lower N
        row = self.state[j].copy()
        row[n] -= 1
        return self.util[j] - self._row_utility(j, row), n

    def _shrink_options(self) -> list[tuple[float, int] | None]:
        """:meth:`_shrink_option` of every job, its row statistics taken matrix-wide."""
        pb, state, base = self.pb, self.state, self.pb.base
        rows = np.arange(pb.num_jobs)
        # The node each job gives up from: its first node holding the fewest of its GPUs.
        n_min = np.argmin(np.where(state > 0, state, np.iinfo(np.int64).max), axis=1)
        at, base_at = state[rows, n_min], base[rows, n_min]
        spans = (np.count_nonzero(state, axis=1) - (at == 1)).tolist()
        # Positions differing from the current allocation once the GPU is given up.
        diffs = np.count_nonzero(state != base, axis=1) - (at != base_at) + (at - 1 != base_at)
        ks, mins = self.k.tolist(), pb.min_replicas.tolist()
        nodes, changed = n_min.tolist(), (diffs > 0).tolist()
        out: list[tuple[float, int] | None] = []
        for j in range(pb.num_jobs):
            k = ks[j]
            if k <= max(self.floor, 0) or 0 < k - 1 < mins[j]:
                out.append(None)
                continue
            lost = self._utility_of(j, k - 1, spans[j], changed[j])
            out.append((float(self.util[j]) - lost, nodes[j]))
        return out

    def _grow_estimate(self, j: int) -> float:
        """Gain of one more GPU for job j on the nodes it already spans (a cheap bound used
        to short-list receivers)."""
        pb = self.pb
        k = int(self.k[j])
        if k >= pb.max_replicas[j] or (k == 0 and pb.min_replicas[j] > 1):
            return -np.inf
        nodes = max(int(np.count_nonzero(self.state[j])), 1)
        return pb.utility(j, pb.speedup(j, nodes, k + 1, changed=True)) - float(self.util[j])

    def _grow_estimates(self) -> FloatArray:
        """:meth:`_grow_estimate` of every job, its row statistics taken matrix-wide."""
        pb = self.pb
        ks, caps, mins = self.k.tolist(), pb.max_replicas.tolist(), pb.min_replicas.tolist()
        spans = np.maximum(np.count_nonzero(self.state, axis=1), 1).tolist()
        out = np.full(pb.num_jobs, -np.inf)
        for j in range(pb.num_jobs):
            k = ks[j]
            if k >= caps[j] or (k == 0 and mins[j] > 1):
                continue
            gain = pb.utility(j, pb.speedup(j, spans[j], k + 1, changed=True))
            out[j] = gain - float(self.util[j])
        return out

    def transfers(self, max_rounds: int, shortlist: int = 48) -> bool:
        """Move single GPUs from cheap donors to the jobs that gain most from them.

        Each round takes the few donors that lose least by giving up one GPU, and scores the
        short-listed receivers (largest estimated gain) taking that GPU on that node; the best
        move that raises Σ g is applied. Donor and receiver estimates are updated
        incrementally, so a round costs O(donors × shortlist), not O(J²).
        """
        pb = self.pb
        improved = False
        shrink = self._shrink_options()
        estimate = self._grow_estimates()
        for _ in range(max_rounds):
            options = sorted(
                (opt[0], j, opt[1]) for j, opt in enumerate(shrink) if opt is not None
            )[:6]
            if not options:
                return improved
            if pb.num_jobs > shortlist:
                receivers = np.argpartition(-estimate, shortlist - 1)[:shortlist]
            else:
                receivers = np.arange(pb.num_jobs)
            receivers = receivers[np.isfinite(estimate[receivers])]
            best_gain, best_move = 1e-9, (-1, -1, -1)
            for loss, d, n in options:
                self.state[d, n] -= 1  # tentatively: the owner map must see d's new shape
                self._refresh(d)
                owner_n = int(self.dist_owner[n])
                for r in receivers.tolist():
                    if r == d:
                        continue
                    if self.k[r] > 0 and self.state[r, n] == 0 and pb.avoid_interference:
                        # r spreads onto n: it becomes (or stays) distributed there.
                        if owner_n not in (-1, r):
                            continue
                        own = self.dist_owner[self.state[r] > 0]
                        if np.any((own != -1) & (own != r)):
                            continue
                    row = self.state[r].copy()
                    row[n] += 1
                    gain = self._row_utility(r, row) - self.util[r] - loss
                    if gain > best_gain:
                        best_gain, best_move = gain, (d, r, n)
                self.state[d, n] += 1
                self._refresh(d)
            d, r, n = best_move
            if d < 0:
                return improved
            self.state[d, n] -= 1
            self._refresh(d)
            self.state[r, n] += 1
            self._refresh(r)
            for j in (d, r):
                shrink[j] = self._shrink_option(j)
                estimate[j] = self._grow_estimate(j)
            improved = True
        return improved

    def transfers_wide(self, max_rounds: int) -> bool:
        """Like :meth:`transfers`, but each receiver may regrow anywhere (slower, wider)."""
        improved = False
        for _ in range(max_rounds):
            options = [(opt[0], j, opt[1]) for j, opt in enumerate(self._shrink_options()) if opt]
            if not options:
                return improved
            options.sort()
            donors = options[: min(len(options), 6)]
            receivers = np.argsort(self.util, kind="stable")
            moved = False
            # A donor's row without its GPU, and with it, is the same for every receiver
            # tried this round: price each once.
            given: dict[int, float] = {}
            kept = {d: float(self.util[d]) for _, d, _ in donors}
            free_gpus = int(self.free.sum()) + 1  # once a donor gave up its GPU
            for r in receivers[: min(len(receivers), 24)]:
                r = int(r)
                if self.k[r] >= self.pb.max_replicas[r]:
                    continue
                ceiling = self._gain_ceiling(r, free_gpus)
                if ceiling == -math.inf:
                    continue  # no room to grow into
                # Rounding slack: the ceiling prices the speedup in another order of products.
                slack = 1e-9 * (1.0 + abs(ceiling) + abs(float(self.util[r])))
                for loss, d, n in donors:
                    if d == r or ceiling - loss + slack <= 1e-9:
                        continue  # r could not gain more than d would lose
                    self.state[d, n] -= 1
                    self.free[n] += 1
                    self._refresh(d, given.get(d))
                    given[d] = float(self.util[d])
                    move = self.best_growth(r)
                    if move is not None and move.gain - loss > 1e-9:
                        self.apply(move)
                        moved = improved = True
                        break
                    self.state[d, n] += 1
                    self.free[n] -= 1
                    self._refresh(d, kept[d])
                if moved:
                    break
            if not moved:
                return improved
        return improved

    def reverts(self) -> bool:
        """Put a changed job back on its current allocation when that is feasible and pays."""
        improved = False
        # Row j changes only at its own turn, so every row's test can be taken up front.
        skip = ~np.any(self.state != self.pb.base, axis=1) | (self.pb.base.sum(axis=1) == 0)
        for j in np.flatnonzero(~skip).tolist():
            base = self.pb.base[j]
            free_if = self.free + self.state[j]
            if np.any(base > free_if):
                continue
            if self.pb.avoid_interference and np.count_nonzero(base) > 1:
                owners = self.dist_owner[base > 0]
                if np.any((owners != -1) & (owners != j)):
                    continue
            gain = self._row_utility(j, base) - self.util[j]
            if gain > 1e-9:
                self.free = free_if - base
                self.state[j] = base
                self._refresh(j)
                improved = True
        return improved


class _CountRows:
    """U[j][K]: job j's utility term with K GPUs on the fewest nodes that hold them, each row
    computed only as far as it is read (``upto``): with more jobs than GPUs the count choice
    reads about a third of the rows' entries.

    K equal to the job's current GPU count is scored as *kept* (no re-allocation factor), on
    the node count it has now; packing (below) then tries to keep it exactly there.
    """

    def __init__(self, problem: PolluxProblem) -> None:
        self.pb = problem
        # A type-aware round solves each type's problem several times with other caps and
        # bases (assignments, moves): a job's row depends only on (cap, its current GPUs and
        # nodes) and on the problem's pricing, so rows (as far as they were computed) are kept
        # per problem while the pricing is unchanged.
        token = problem.pricing_token()
        if problem.count_rows[0] != token:
            problem.count_rows = (token, {})
        rows_by_key = problem.count_rows[1]
        self.caps: list[int] = problem.max_replicas.tolist()
        self.base_k: list[int] = problem.base.sum(axis=1).tolist()
        self.base_n: list[int] = np.count_nonzero(problem.base, axis=1).tolist()
        self.rows: list[list[float]] = []
        idle = problem.idle_terms()
        for j in range(problem.num_jobs):
            key = (j, self.caps[j], self.base_k[j], self.base_n[j])
            row = rows_by_key.get(key)
            if row is None:
                row = rows_by_key[key] = [idle[j]]
            self.rows.append(row)

    def upto(self, j: int, k: int) -> list[float]:
        """Job j's row, computed at least to ``min(k, cap)`` (read-only: rows are shared)."""
        row = self.rows[j]
        stop = min(k, self.caps[j])
        if len(row) <= stop:
            pb, g = self.pb, self.pb.gpus_per_node
            base_k, base_n = self.base_k[j], self.base_n[j]
            for count in range(len(row), stop + 1):
                if count == base_k:
                    s = pb.speedup(j, base_n, count, changed=False)
                else:
                    s = pb.speedup(j, min(-(-count // g), pb.num_nodes), count, changed=True)
                row.append(pb.utility(j, s))
        return row


def _las_admission(problem: PolluxProblem, tables: _CountRows) -> list[int]:
    """First GPUs in least-attained-service order (ties: earlier submission).

    When more jobs wait than there are GPUs, FITNESS_p at p < 0 is nearly indifferent to
    *which* jobs hold the scarce first GPUs (each idle job costs about 1/ε), so we settle that
    choice the way that minimises mean JCT: short jobs first, as 2D-LAS does. The paper's GA
    does the same implicitly — its repair step gives capacity to jobs in attained-service order.
    """
    jobs = problem.jobs
    order = sorted(  # higher priority first (the objective weighs it that way too)
        range(problem.num_jobs),
        key=lambda j: (-jobs[j].priority, jobs[j].attained_service, jobs[j].submit_time, j),
    )
    counts = [0] * problem.num_jobs
    free = problem.total_gpus
    for j in order:
        k = max(1, int(problem.min_replicas[j]))
        if k <= free and k <= tables.caps[j] and tables.upto(j, k)[k] > tables.rows[j][0]:
            counts[j] = k
            free -= k
    return counts


def _choose_counts(
    problem: PolluxProblem,
    tables: _CountRows,
    admission: str = "fitness",
    remember_steps: bool = True,
) -> list[int]:
    """How many GPUs each job gets: lazy greedy on gain per GPU, then 1-GPU swaps.

    ``remember_steps=False`` recomputes every step (the plain code, for the tests)."""
    g = problem.gpus_per_node
    mins = [int(x) for x in problem.min_replicas]
    if admission == "las":
        counts = _las_admission(problem, tables)
        admitted = [k > 0 for k in counts]
    else:
        counts = [0] * problem.num_jobs
        admitted = [True] * problem.num_jobs
    free = problem.total_gpus - sum(counts)
    base_ks = problem.base.sum(axis=1).tolist()

    # best_step(j) reads the free GPUs only below a threshold (its look-ahead, and the way
    # back to the current count): above it the step is a function of the job's count alone,
    # kept until that count changes (most heap pops re-ask a job whose count did not).
    steps_known: dict[int, tuple[int, int, tuple[float, int]]] = {}

    def best_step(j: int) -> tuple[float, int]:
        k = counts[j]
        known = steps_known.get(j)
        if known is not None and known[0] == k and free >= known[1]:
            return known[2]
        step = _best_step(j, k)
        base_k = base_ks[j]
        threshold = max(g, mins[j], base_k - k)
        if free >= threshold and remember_steps:
            steps_known[j] = (k, threshold, step)
        return step

    def _best_step(j: int, k: int) -> tuple[float, int]:
        top = min(tables.caps[j], k + max(g, mins[j]), k + free)
        base_k = base_ks[j]
        back = top < base_k <= k + free and base_k > k  # the way back to the current count
        row = tables.upto(j, base_k if back else top)
        lo = max(k + 1, mins[j]) if k == 0 else k + 1
        best_rate, best_k = 0.0, k
        for k2 in range(lo, top + 1):
            rate = (row[k2] - row[k]) / (k2 - k)
            if rate > best_rate + _TOL:
                best_rate, best_k = rate, k2
        if back:
            rate = (row[base_k] - row[k]) / (base_k - k)
            if rate > best_rate + _TOL:
                best_rate, best_k = rate, base_k
        return best_rate, best_k

    # A job with no GPU count to choose (capped at 0 here, none held) keeps 0: best_step and
    # refresh would leave it as it starts (most jobs of a type's problem in a typed round).
    idle = [
        tables.caps[j] == 0 and counts[j] == 0 and base_ks[j] == 0 for j in range(problem.num_jobs)
    ]
    heap = []
    for j in range(problem.num_jobs):
        if not admitted[j] or idle[j]:
            continue
        rate, k2 = best_step(j)
        if k2 > counts[j]:
            heap.append((-rate, j))
    heapq.heapify(heap)
    while heap and free > 0:
        _, j = heapq.heappop(heap)
        rate, k2 = best_step(j)
        if k2 <= counts[j]:
            continue
        if heap and rate < -heap[0][0] - _TOL:
            heapq.heappush(heap, (-rate, j))
            continue
        free -= k2 - counts[j]
        counts[j] = k2
        rate, k3 = best_step(j)
        if k3 > counts[j]:
            heapq.heappush(heap, (-rate, j))
    # Swaps of 1..G GPUs: move them from the job that loses least to the job that gains most.
    # Moving several at once gets past non-concave steps (3 GPUs worse than 2 or 4 per GPU).
    steps = max(1, min(g, 8))
    neg = -np.inf
    up = np.full((steps + 1, problem.num_jobs), neg)
    down = np.full((steps + 1, problem.num_jobs), np.inf)
    floor = 1 if admission == "las" else 0  # LAS decided who runs; swaps only resize

    def refresh(j: int) -> None:
        k, cap = counts[j], tables.caps[j]
        row = tables.upto(j, k + steps)
        for a in range(1, steps + 1):
            grow = k + a <= cap and admitted[j] and (k > 0 or k + a >= mins[j])
            up[a, j] = row[k + a] - row[k] if grow else neg
            rest = k - a
            shrink = rest >= floor and (rest == 0 or rest >= mins[j]) and rest >= 0
            down[a, j] = row[k] - row[rest] if shrink else np.inf

    for j in range(problem.num_jobs):
        if not idle[j]:
            refresh(j)
    for _ in range(4 * problem.total_gpus + problem.num_jobs):
        if free > 0:  # idle GPUs: hand them out by gain per GPU
            best_rate, best_a, best_r = _TOL, 0, -1
            for a in range(1, min(steps, free) + 1):
                r = int(np.argmax(up[a]))
                if up[a, r] / a > best_rate:
                    best_rate, best_a, best_r = up[a, r] / a, a, r
            if best_r >= 0:
                counts[best_r] += best_a
                free -= best_a
                refresh(best_r)
                continue
        best_gain, move = 1e-9, (0, -1, -1)
        for a in range(1, steps + 1):
            r = int(np.argmax(up[a]))
            if up[a, r] == neg:
                continue
            d = int(np.argmin(down[a]))
            if d == r:
                saved = down[a, d]
                down[a, d] = np.inf
                d = int(np.argmin(down[a]))
                down[a, r] = saved
            gain = up[a, r] - down[a, d]
            if gain > best_gain:
                best_gain, move = gain, (a, r, d)
        a, r, d = move
        if r < 0:
            break
        counts[r] += a
        counts[d] -= a
        refresh(r)
        refresh(d)
    return counts


def _pack(problem: PolluxProblem, counts: list[int]) -> IntArray:
    """Place the chosen counts on nodes, moving as little as possible.

    Jobs keeping their GPU count keep their placement. Jobs that shrink give up GPUs on their
    least-used nodes first; jobs that grow add GPUs on their own nodes first and then on the
    freest nodes the interference rule allows (largest jobs first); new jobs go best-fit onto
    one node when they fit on one. A job that cannot be placed whole gets what fits (at least
    its minimum, else nothing); the search after packing repairs the rest.
    """
    state = np.zeros_like(problem.base)
    free = problem.node_caps.copy()
    owner = np.full(problem.num_nodes, -1, dtype=np.int64)
    g = problem.gpus_per_node
    avoid = problem.avoid_interference

    def claim(j: int) -> None:
        if np.count_nonzero(state[j]) > 1:
            owner[state[j] > 0] = j

    def fits_multi(j: int, n: int) -> bool:
        return not avoid or int(owner[n]) in (-1, j)

    resize: list[int] = []
    fresh: list[int] = []
    base_k = problem.base.sum(axis=1).tolist()
    for j, k in enumerate(counts):
        kb = base_k[j]
        if k <= 0:
            continue
        if kb == 0:
            fresh.append(j)
        elif k == kb:
            base = problem.base[j]
            state[j] = base
            free -= base
            claim(j)
        else:
            resize.append(j)
    # Shrinking jobs first: they release capacity the growing ones may need.
    resize.sort(key=lambda j: (counts[j] > base_k[j], -counts[j]))
    for j in resize:
        row = problem.base[j].copy()
        if np.any(row > free) or (
            avoid
            and np.count_nonzero(row) > 1
            and np.any((owner[row > 0] != -1) & (owner[row > 0] != j))
        ):
            fresh.append(j)  # its old place is taken: place it like a new job
            continue
        excess = int(row.sum()) - counts[j]
        while excess > 0:  # shrink: empty the least-used nodes first
            used = np.flatnonzero(row > 0)
            n = int(used[np.argmin(row[used])])
            take = min(int(row[n]), excess)
            row[n] -= take
            excess -= take
        state[j] = row
        free -= row
        need = counts[j] - int(row.sum())
        own = np.flatnonzero(row > 0)
        for n in own[np.argsort(-free[own], kind="stable")]:  # grow: own nodes first, freest
            if need == 0:
                break
            if free[n] > 0:
                take = int(min(free[n], need))
                state[j, n] += take
                free[n] -= take
                need -= take
        if need > 0 and all(fits_multi(j, int(n)) for n in np.flatnonzero(state[j] > 0)):
            for n in np.argsort(-free, kind="stable"):
                if need == 0:
                    break
                if state[j, n] == 0 and free[n] > 0 and fits_multi(j, int(n)):
                    take = int(min(free[n], need))
                    state[j, n] = take
                    free[n] -= take
                    need -= take
        claim(j)
    fresh.sort(key=lambda j: -counts[j])
    for j in fresh:
        k = counts[j]
        if k <= g:
            fits = np.flatnonzero(free >= k)
            if fits.size:
                n = int(fits[np.argmin(free[fits])])
                state[j, n] = k
                free[n] -= k
                continue
        need = k
        for n in np.argsort(-free, kind="stable"):
            if free[n] <= 0 or need == 0:
                break
            if not fits_multi(j, int(n)):
                continue
            take = int(min(free[n], need))
            state[j, n] = take
            need -= take
        placed = int(state[j].sum())
        if placed < max(int(problem.min_replicas[j]), 1):
            state[j] = 0
            continue
        free -= state[j]
        claim(j)
    return state


def search(
    problem: PolluxProblem, admission: str, search_rounds: int, exhaustive_limit: int
) -> tuple[IntArray, float]:
    """The best allocation matrix found for ``problem`` and its FITNESS_p (never worse than
    keeping every allocation as it is)."""
    floor = 1 if admission == "las" else 0
    problem.price_live()
    counts = _choose_counts(problem, _CountRows(problem), admission)
    starts = [_pack(problem, counts)]
    if problem.num_jobs * problem.total_gpus <= exhaustive_limit:
        # Small problems: also search from the current allocation placement-aware, which
        # catches bin-packing effects the count phase cannot see.
        starts.append(problem.base)
    best, fit = problem.base, float(problem.fitness(problem.base[None])[0])
    for i, start in enumerate(starts):
        state = _Search(problem, start, floor)
        state.greedy()  # hand out GPUs the packing left over
        for _ in range(3):
            changed = state.reverts()
            # Transfers are the expensive move: the extra start gets a few rounds.
            if i == 0:
                changed = state.transfers(search_rounds) or changed
            else:
                changed = state.transfers_wide(max(search_rounds // 10, 1)) or changed
            if not changed:
                break
            state.greedy()
        value = float(problem.fitness(state.state[None])[0])
        if value > fit + 1e-15:  # never worse than standing still
            best, fit = state.state.copy(), value
    return best, fit


class PolluxUnawarePolicy:
    """The authors' FITNESS_p (eq. 15-16) with a greedy + local-search optimiser, blind to GPU
    types and sharing (``pollux-unaware``: the baseline the default ``pollux`` is measured
    against; it matches the authors' Pollux on the artifact workloads).

    ``p``: fairness exponent of the power mean (-1 in the paper). ``epsilon``: added to each
    speedup so an idle job counts as a large finite loss at p < 0. ``avoid_interference``: no
    two distributed jobs share a node. ``switch_margin``: extra discount on a changed
    allocation, to damp churn in live clusters (0 reproduces the paper's objective).
    ``admission``: ``"fitness"`` lets the objective pick which jobs run when GPUs are scarce;
    ``"las"`` admits in least-attained-service order first (a 2D-LAS flavour). ``fair_reference``:
    see :class:`PolluxProblem`. ``exhaustive_limit``: jobs × GPUs below which the second search
    start runs. The remaining options are the :class:`Levers` (all off: the paper's objective).

    On several GPU types it stays type-blind in goodput (each job's type-less model on every
    type) but places each job on one type it allows, as such clusters require.
    """

    name = "pollux-unaware"
    batch_mode = BatchMode.ADAPTIVE
    type_aware = True  # one GPU type per job, ``JobInfo.allows`` respected (not goodput)

    def __init__(
        self,
        p: float = -1.0,
        epsilon: float = 1e-3,
        avoid_interference: bool = True,
        search_rounds: int = 50,
        switch_margin: float = 0.0,
        admission: str = "fitness",
        exhaustive_limit: int = 64 * 64,
        fair_reference: str = "packed",
        payback: float = 0.0,
        service_scale: float = 3600.0,
        service_power: float = 0.0,
        explore: float = 2.0,
        first: int = 1,
        hold: float = 0.0,
        remaining_scale: float = 36000.0,
        remaining_power: float = 0.0,
        settle: float = 0.0,
        phi_growth: float = 0.0,
        leap: bool = False,
        p_undeclared: float | None = None,
        srpt_q: float = 0.0,
        srpt_long: float = 180000.0,
    ) -> None:
        if admission not in ("fitness", "las"):
            raise ValueError(f"admission must be 'fitness' or 'las', got {admission!r}")
        if fair_reference not in ("packed", "spread"):
            raise ValueError(f"fair_reference must be 'packed' or 'spread', got {fair_reference!r}")
        self.levers = Levers(
            payback,
            service_scale,
            service_power,
            explore,
            first,
            hold,
            remaining_scale,
            remaining_power,
            settle,
            phi_growth,
            leap,
            srpt_q,
            srpt_long,
        )
        self.fair_reference = fair_reference
        self.exhaustive_limit = exhaustive_limit
        self.admission = admission
        self.p = p
        self.p_undeclared = p_undeclared
        self.switch_margin = switch_margin
        self.epsilon = epsilon
        self.avoid_interference = avoid_interference
        self.search_rounds = search_rounds

    def power(self, snapshot: ClusterSnapshot) -> float:
        """FITNESS_p's p for this snapshot: ``p_undeclared`` (when set) if no job reports its
        progress, since a less equalising p pays only together with the remaining-work
        weight, which needs declared lengths; ``p`` otherwise."""
        if self.p_undeclared is None:
            return self.p
        declared = any(job.progress is not None for job in snapshot.jobs.values())
        return self.p if declared else self.p_undeclared

    def problem(
        self, snapshot: ClusterSnapshot, fair_share: int | None = None, p: float | None = None
    ) -> PolluxProblem:
        """The round's problem; ``p``: FITNESS_p's power (None: :meth:`power` of ``snapshot``)."""
        return PolluxProblem(
            snapshot,
            self.power(snapshot) if p is None else p,
            self.epsilon,
            self.avoid_interference,
            self.switch_margin,
            self.fair_reference,
            self.levers,
            fair_share,
        )

    def problems_for(self, snapshot: ClusterSnapshot) -> MakeProblem:
        """How :class:`TypedPollux` builds each type's problem from ``snapshot``: with the
        whole snapshot's p (a type that no job reporting progress is allowed on must not be
        solved, nor its fitness summed, with another p)."""
        p = self.power(snapshot)

        def make(sub: ClusterSnapshot, fair_share: int) -> PolluxProblem:
            return self.problem(sub, fair_share, p)

        return make

    def growth_cap(self, max_gpus_held: int, max_replicas: int) -> int:
        """Most GPUs a job may get given the most it ever held (the exploration cap)."""
        return self.levers.cap(max_gpus_held, max_replicas)

    def solve(self, problem: PolluxProblem) -> tuple[IntArray, float]:
        """This policy's optimiser on one (homogeneous) problem."""
        return search(problem, self.admission, self.search_rounds, self.exhaustive_limit)

    def optimize(
        self, snapshot: ClusterSnapshot, state: PolicyState, rng: np.random.Generator
    ) -> Decision:
        """Maximise FITNESS_p; ``diagnostics["fitness"]`` is the decision's FITNESS_p."""
        del state, rng  # stateless; deterministic: ties break by job order
        if len(snapshot.gpu_types) > 1 and snapshot.jobs:
            # Type-blind in goodput (every type is worth the same to a job), but a job still
            # runs on one type, one it allows: the baseline a type-aware policy is measured by.
            blind = replace(
                snapshot,
                jobs={k: replace(j, goodput_by_type=None) for k, j in snapshot.jobs.items()},
            )
            allocs, fit = TypedPollux(
                blind, self.problems_for(blind), self.solve, self.levers
            ).run()
            return Decision(allocs, diagnostics={"fitness": fit})
        problem = self.problem(snapshot)
        if problem.num_jobs == 0 or problem.num_nodes == 0:
            return Decision({})
        best, fit = self.solve(problem)
        return Decision(problem.to_allocations(best), diagnostics={"fitness": fit})


class PolluxPolicy(PolluxUnawarePolicy):
    """The default ``pollux``: FITNESS_p with fewer restarts and faster ramp-up, across GPU
    types, with GPU sharing.

    On one GPU type with no per-type models it is exactly :class:`PolluxUnawarePolicy` with
    :data:`DEFAULT_LEVERS` (measured one by one on the artifact workloads, ``docs/hetero.md``),
    plus pair re-placements on small problems (:mod:`coadapt.policies.polish`; none at 16×4).
    With several types it allocates by per-type goodput (:mod:`coadapt.policies.pollux_types`),
    and where the snapshot lists co-location figures it packs waiting 1-GPU jobs onto running
    ones when that raises FITNESS_p and (``packing_rule="jct"``) saves the pair summed
    completion time (:mod:`coadapt.policies.packing`). Its state holds the pairs it packed
    (``PACKED_STATE_KEY``), so the next round knows which job of a shared GPU is the guest.
    """

    name = "pollux"

    def __init__(self, packing_rule: str = "jct", **options: Any) -> None:
        if packing_rule not in ("jct", "gain"):
            raise ValueError(f"packing_rule must be 'jct' or 'gain', got {packing_rule!r}")
        self.packing_rule = packing_rule
        merged = {**DEFAULT_LEVERS, **options}
        super().__init__(**merged)

    def _time_left(self, snapshot: ClusterSnapshot) -> Callable[[str], float | None] | None:
        """A job's remaining time alone on one GPU for the packing rule (``"jct"``): its
        remaining work (GPU-s, from its declared progress; unknown counts as one
        ``remaining_scale``, as in the weights). ``"gain"``: Gandiva's rule alone (no JCT
        check), kept to measure against."""
        if self.packing_rule == "gain":
            return None
        unknown = self.levers.remaining_scale

        def time_left(name: str) -> float | None:
            return remaining_work(snapshot.jobs[name], unknown)

        return time_left

    def solve(self, problem: PolluxProblem) -> tuple[IntArray, float]:
        """The homogeneous optimiser, then pair re-placements on small problems."""
        best, fit = super().solve(problem)
        polished = polish_pairs(problem, best)
        if not np.array_equal(polished, best):
            value = float(problem.fitness(polished[None])[0])
            if value > fit:
                return polished, value
        return best, fit

    def optimize(
        self, snapshot: ClusterSnapshot, state: PolicyState, rng: np.random.Generator
    ) -> Decision:
        """Maximise FITNESS_p across types; ``diagnostics["fitness"]`` is the allocation's
        FITNESS_p (packing gains not included), ``diagnostics["packed"]`` the guests."""
        del rng  # deterministic: ties break by job order
        if not snapshot.jobs or not snapshot.nodes:
            return Decision({})
        # The state holds last round's pairs only (GPUs per node cannot say who is the guest).
        known = state.get(PACKED_STATE_KEY) if isinstance(state, dict) else None
        previous = split_guests(snapshot, known if isinstance(known, dict) else None)
        snap = snapshot
        if previous:  # packed guests over-commit their GPU: the optimiser sees them waiting
            snap = replace(
                snapshot,
                current={k: v for k, v in snapshot.current.items() if k not in previous},
            )
        plain = len(snap.gpu_types) == 1 and all(
            j.goodput_by_type is None and j.allows(snap.gpu_types[0]) for j in snap.jobs.values()
        )
        one_gpu: OneGpu
        term: Term
        if plain:
            problem = self.problem(snap)
            best, fit = self.solve(problem)
            allocs = problem.to_allocations(best)
            speedups = problem.job_speedups(best[None])[0]
            held = {n: float(speedups[j]) for j, n in enumerate(problem.names) if n in allocs}
            index = {n: j for j, n in enumerate(problem.names)}

            def one_gpu(name: str, gpu_type: str, changed: bool) -> float:
                return problem.speedup(index[name], 1, 1, changed)

            def term(name: str, speedup: float) -> float:
                return problem.utility(index[name], speedup)
        else:
            # The second search start is for small problems as a whole, not per type.
            limit = self.exhaustive_limit
            if len(snap.jobs) * snap.total_gpus > limit:
                limit = 0

            def solve(problem: PolluxProblem) -> tuple[IntArray, float]:
                return search(problem, self.admission, self.search_rounds, limit)

            typed = TypedPollux(
                snap, self.problems_for(snap), solve, self.levers, polish=polish_pairs
            )
            allocs, fit = typed.run()
            held, one_gpu, term = typed.speedups, typed.one_gpu, typed.term
        # The original snapshot: whether a guest stays on its GPU is read from its current
        # allocation, which ``snap`` hides (without it a young packed pair is split up).
        packed = choose_packing(
            snapshot,
            allocs,
            held,
            one_gpu,
            term,
            previous,
            self._time_left(snapshot),
        )
        for guest, host in packed.items():
            allocs[guest] = allocs[host]
        diagnostics = {"fitness": fit, "packed": float(len(packed))}
        state_out: PolicyState = {PACKED_STATE_KEY: dict(packed)} if packed else {}
        return Decision(allocs, state=state_out, diagnostics=diagnostics, packed=packed)

"""Pollux's scheduling policy with a fast optimiser (the default ``pollux``).

The paper maximises FITNESS_p with a genetic algorithm: 100 individuals × 100 generations,
seconds per round at 64 GPUs. FITNESS_p is a sum of per-job terms, and a job's term depends on
its allocation only through (nodes, GPUs, changed?), so a search that moves one job at a time
can evaluate each move exactly in O(1). We do that:

1. **Greedy by marginal gain per GPU** (lazy priority queue): repeatedly apply the best
   growth of one job by 1..G GPUs, where the GPUs come from its own nodes first, then from a
   best-fit node or, for multi-node growth, from the freest nodes the interference rule allows.
   Looking up to a node's worth of GPUs ahead gets past non-concave steps (crossing a node
   boundary, leaving the current allocation and paying the re-allocation factor).
2. **Local search**: move one GPU from the job that loses least to the job that gains most,
   and put changed jobs back on their current allocation when that pays, until no move helps.

It runs from two starts — the empty cluster and the current allocation — and keeps the better
state (by FITNESS_p itself). Policy and GA share :class:`PolluxProblem`, so their fitness values
are directly comparable (``benchmarks/policy_scaling.py``).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from coadapt.policies.base import Allocation, BatchMode, ClusterSnapshot
from coadapt.policies.pollux_problem import IntArray, PolluxProblem

_TOL = 1e-12


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

    def __init__(self, problem: PolluxProblem, state: IntArray) -> None:
        self.pb = problem
        self.state = state.copy()
        self.free = problem.node_caps - self.state.sum(axis=0)
        self.k = self.state.sum(axis=1)
        self.util = np.array([self._row_utility(j, self.state[j]) for j in range(problem.num_jobs)])
        # dist_owner[n] = index of the distributed job on node n, or -1.
        self.dist_owner = np.full(problem.num_nodes, -1, dtype=np.int64)
        for j in range(problem.num_jobs):
            if np.count_nonzero(self.state[j]) > 1:
                self.dist_owner[self.state[j] > 0] = j

    # ------------------------------------------------------------- utilities
    def _row_utility(self, j: int, row: IntArray) -> float:
        k = int(row.sum())
        if k == 0:
            return self.pb.utility(0.0)
        nodes = int(np.count_nonzero(row))
        changed = not np.array_equal(row, self.pb.base[j])
        return self.pb.utility(self.pb.speedup(j, nodes, k, changed))

    def _plan_utility(self, j: int, plan: tuple[tuple[int, int], ...]) -> float:
        row = self.state[j].copy()
        for n, c in plan:
            row[n] += c
        return self._row_utility(j, row)

    # ---------------------------------------------------------------- growth
    def _allowed_multi(self, j: int, n: int) -> bool:
        if not self.pb.avoid_interference:
            return True
        owner = int(self.dist_owner[n])
        return owner in (-1, j)

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
            if not all(self._allowed_multi(j, int(n)) for n in own):
                return None
        candidates = [
            int(n)
            for n in np.argsort(-self.free, kind="stable")
            if self.free[n] > 0 and row[n] == 0 and int(n) not in plan
        ]
        for n in candidates:
            if not self._allowed_multi(j, n):
                continue
            take = int(min(self.free[n], need))
            plan[n] = plan.get(n, 0) + take
            need -= take
            if need == 0:
                return tuple(plan.items())
        return None

    def best_growth(self, j: int) -> _Move | None:
        k = int(self.k[j])
        cap = int(self.pb.max_replicas[j])
        room = min(cap - k, int(self.free.sum()))
        if room <= 0:
            return None
        start = max(1, int(self.pb.min_replicas[j]) - k) if k == 0 else 1
        horizon = min(room, max(self.pb.gpus_per_node, start))
        best: _Move | None = None
        for extra in range(start, horizon + 1):
            plan = self._grow_plan(j, extra)
            if plan is None:
                continue
            gain = self._plan_utility(j, plan) - self.util[j]
            if best is None or gain / extra > best.gain / best.gpus + _TOL:
                best = _Move(gain, j, plan)
        return best

    def apply(self, move: _Move) -> None:
        j = move.job
        for n, c in move.plan:
            self.state[j, n] += c
            self.free[n] -= c
        self._refresh(j)

    def _refresh(self, j: int) -> None:
        self.k[j] = int(self.state[j].sum())
        self.util[j] = self._row_utility(j, self.state[j])
        self.dist_owner[self.dist_owner == j] = -1
        if np.count_nonzero(self.state[j]) > 1:
            self.dist_owner[self.state[j] > 0] = j

    def greedy(self) -> None:
        """Lazy greedy on gain per GPU: re-evaluate the popped job, apply if still best."""
        heap: list[tuple[float, int]] = []
        for j in range(self.pb.num_jobs):
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
        if k <= 0:
            return None
        if 0 < k - 1 < int(self.pb.min_replicas[j]):
            return None
        own = np.flatnonzero(self.state[j] > 0)
        n = int(own[np.argmin(self.state[j][own])])  # emptying a node can lower N
        row = self.state[j].copy()
        row[n] -= 1
        return self.util[j] - self._row_utility(j, row), n

    def transfers(self, max_rounds: int) -> bool:
        """Move single GPUs from cheap donors to needy receivers while it pays."""
        improved = False
        for _ in range(max_rounds):
            options = []
            for j in range(self.pb.num_jobs):
                opt = self._shrink_option(j)
                if opt is not None:
                    options.append((opt[0], j, opt[1]))
            if not options:
                return improved
            options.sort()
            donors = options[: min(len(options), 6)]
            receivers = np.argsort(self.util, kind="stable")
            moved = False
            for r in receivers[: min(len(receivers), 24)]:
                r = int(r)
                if self.k[r] >= self.pb.max_replicas[r]:
                    continue
                for loss, d, n in donors:
                    if d == r:
                        continue
                    self.state[d, n] -= 1
                    self.free[n] += 1
                    self._refresh(d)
                    move = self.best_growth(r)
                    if move is not None and move.gain - loss > 1e-9:
                        self.apply(move)
                        moved = improved = True
                        break
                    self.state[d, n] += 1
                    self.free[n] -= 1
                    self._refresh(d)
                if moved:
                    break
            if not moved:
                return improved
        return improved

    def reverts(self) -> bool:
        """Put a changed job back on its current allocation when that is feasible and pays."""
        improved = False
        for j in range(self.pb.num_jobs):
            base = self.pb.base[j]
            if np.array_equal(self.state[j], base) or base.sum() == 0:
                continue
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


def _count_utilities(problem: PolluxProblem) -> list[list[float]]:
    """U[j][K]: job j's utility term with K GPUs on the fewest nodes that hold them.

    K equal to the job's current GPU count is scored as *kept* (no re-allocation factor), on
    the node count it has now; packing (below) then tries to keep it exactly there.
    """
    g = problem.gpus_per_node
    tables: list[list[float]] = []
    for j in range(problem.num_jobs):
        cap = int(problem.max_replicas[j])
        base_k = int(problem.base[j].sum())
        base_n = int(np.count_nonzero(problem.base[j]))
        row = [problem.utility(0.0)]
        for k in range(1, cap + 1):
            if k == base_k:
                row.append(problem.utility(problem.speedup(j, base_n, k, changed=False)))
            else:
                n = min(-(-k // g), problem.num_nodes)
                row.append(problem.utility(problem.speedup(j, n, k, changed=True)))
        tables.append(row)
    return tables


def _choose_counts(problem: PolluxProblem, tables: list[list[float]]) -> list[int]:
    """How many GPUs each job gets: lazy greedy on gain per GPU, then 1-GPU swaps."""
    g = problem.gpus_per_node
    counts = [0] * problem.num_jobs
    free = problem.total_gpus
    mins = [int(x) for x in problem.min_replicas]

    def best_step(j: int) -> tuple[float, int]:
        k = counts[j]
        row = tables[j]
        top = min(len(row) - 1, k + max(g, mins[j]), k + free)
        lo = max(k + 1, mins[j]) if k == 0 else k + 1
        best_rate, best_k = 0.0, k
        for k2 in range(lo, top + 1):
            rate = (row[k2] - row[k]) / (k2 - k)
            if rate > best_rate + _TOL:
                best_rate, best_k = rate, k2
        base_k = int(problem.base[j].sum())
        if top < base_k <= k + free and base_k > k:  # the way back to the current allocation
            rate = (row[base_k] - row[k]) / (base_k - k)
            if rate > best_rate + _TOL:
                best_rate, best_k = rate, base_k
        return best_rate, best_k

    heap = []
    for j in range(problem.num_jobs):
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
    # 1-GPU swaps: move a GPU from the job that loses least to the job that gains most.
    neg = -np.inf
    up = np.full(problem.num_jobs, neg)
    down = np.full(problem.num_jobs, np.inf)

    def refresh(j: int) -> None:
        k, row = counts[j], tables[j]
        up[j] = row[k + 1] - row[k] if k + 1 < len(row) and (k > 0 or mins[j] <= 1) else neg
        if k > 0 and (k - 1 == 0 or k - 1 >= mins[j]):
            down[j] = row[k] - row[k - 1]
        else:
            down[j] = np.inf

    for j in range(problem.num_jobs):
        refresh(j)
    for _ in range(4 * problem.total_gpus + problem.num_jobs):
        r = int(np.argmax(up))
        if free > 0 and up[r] > _TOL:
            counts[r] += 1
            free -= 1
            refresh(r)
            continue
        d = int(np.argmin(down))
        if d == r:
            saved = down[d]
            down[d] = np.inf
            d = int(np.argmin(down))
            down[r] = saved
        if up[r] - down[d] <= 1e-9:
            break
        counts[r] += 1
        counts[d] -= 1
        refresh(r)
        refresh(d)
    return counts


def _pack(problem: PolluxProblem, counts: list[int]) -> IntArray:
    """Place the chosen counts on nodes, keeping unchanged jobs where they are.

    Distributed jobs take the freest nodes no other distributed job uses; single-node jobs
    go best-fit. A job that cannot be placed whole gets what still fits (the search after
    packing repairs the rest).
    """
    state = np.zeros_like(problem.base)
    free = problem.node_caps.copy()
    owner = np.full(problem.num_nodes, -1, dtype=np.int64)
    g = problem.gpus_per_node
    pending = []
    for j, k in enumerate(counts):
        base = problem.base[j]
        if k > 0 and k == int(base.sum()) and np.all(base <= free):
            multi = np.count_nonzero(base) > 1
            if not (multi and problem.avoid_interference and np.any(owner[base > 0] != -1)):
                state[j] = base
                free -= base
                if multi:
                    owner[base > 0] = j
                continue
        if k > 0:
            pending.append(j)
    pending.sort(key=lambda j: -counts[j])
    for j in pending:
        k = counts[j]
        if k <= g:
            fits = np.flatnonzero(free >= k)
            if fits.size:
                n = int(fits[np.argmin(free[fits])])
                state[j, n] = k
                free[n] -= k
                continue
        order = np.argsort(-free, kind="stable")
        need = k
        used = []
        for n in order:
            if free[n] <= 0 or need == 0:
                break
            if problem.avoid_interference and owner[n] != -1:
                continue
            take = int(min(free[n], need))
            state[j, n] = take
            used.append(int(n))
            need -= take
        if need > 0 or (0 < int(state[j].sum()) < int(problem.min_replicas[j])):
            state[j] = 0  # could not place it whole: leave it to the fill-up search
            continue
        for n in used:
            free[n] -= state[j, n]
        if len(used) > 1:
            owner[used] = j
    return state


class PolluxPolicy:
    """FITNESS_p-maximising Pollux policy (eq. 15-16) with a greedy + local-search optimiser."""

    name = "pollux"
    batch_mode = BatchMode.ADAPTIVE

    def __init__(
        self,
        p: float = -1.0,
        epsilon: float = 1e-3,
        avoid_interference: bool = True,
        search_rounds: int = 50,
    ) -> None:
        self.p = p
        self.epsilon = epsilon
        self.avoid_interference = avoid_interference
        self.search_rounds = search_rounds
        self.last_fitness: float | None = None

    def problem(self, snapshot: ClusterSnapshot) -> PolluxProblem:
        return PolluxProblem(snapshot, self.p, self.epsilon, self.avoid_interference)

    def optimize(
        self, snapshot: ClusterSnapshot, rng: np.random.Generator
    ) -> dict[str, Allocation]:
        del rng  # deterministic: ties break by job order
        problem = self.problem(snapshot)
        if problem.num_jobs == 0 or problem.num_nodes == 0:
            self.last_fitness = None
            return {}
        counts = _choose_counts(problem, _count_utilities(problem))
        search = _Search(problem, _pack(problem, counts))
        search.greedy()  # use fragments packing left over
        for _ in range(3):
            changed = search.reverts()
            changed = search.transfers(self.search_rounds) or changed
            if not changed:
                break
            search.greedy()
        state = search.state
        fit = float(problem.fitness(state[None])[0])
        base_fit = float(problem.fitness(problem.base[None])[0])
        if base_fit > fit:  # never worse than standing still
            state, fit = problem.base, base_fit
        self.last_fitness = fit
        return problem.to_allocations(state)

"""Pair re-placement for small problems: the bin-packing moves a greedy search cannot see.

The optimiser's moves change one job at a time or hand single GPUs from one job to another, so
it misses optima that re-place two jobs at once (job A spreads over two nodes so that job B
fits whole on one). On small clusters we can afford to enumerate: for every pair of jobs, take
both off the cluster and try every placement of the two (each a vector of GPUs per node) that
fits what the others leave, the interference rule included; keep the best pair if it raises
Σ g. Vectorised over placements; only for a few nodes of a few GPUs (``SMALL_SHAPES``).
"""

from __future__ import annotations

import itertools

import numpy as np

from coadapt.policies.pollux_problem import FloatArray, IntArray, PolluxProblem

#: Most placements per job (product of (GPUs per node + 1)) for which the polish runs.
SMALL_SHAPES = 625
MAX_JOBS = 8


def _shapes(caps: IntArray) -> IntArray:
    return np.array(list(itertools.product(*(range(int(c) + 1) for c in caps))), dtype=np.int64)


def _table(problem: PolluxProblem, j: int, shapes: IntArray) -> FloatArray:
    """Job j's term for every shape (-inf where the shape breaks its bounds)."""
    k = shapes.sum(axis=1)
    nodes = np.count_nonzero(shapes, axis=1)
    changed = np.any(shapes != problem.base[j][None, :], axis=1)
    cap, least = int(problem.max_replicas[j]), max(int(problem.min_replicas[j]), 1)
    out = np.full(len(shapes), -np.inf)
    for i in range(len(shapes)):
        kk = int(k[i])
        if kk == 0:
            out[i] = problem.utility(j, 0.0)
        elif least <= kk <= cap:
            s = problem.speedup(j, int(nodes[i]), kk, bool(changed[i]))
            out[i] = problem.utility(j, s)
    return out


def polish_pairs(problem: PolluxProblem, state: IntArray, passes: int = 2) -> IntArray:
    """``state`` improved by pair re-placements (unchanged if the problem is not small)."""
    caps = problem.node_caps
    if problem.num_jobs < 2 or problem.num_jobs > MAX_JOBS:
        return state
    if int(np.prod(caps + 1)) > SMALL_SHAPES:
        return state
    shapes = _shapes(caps)
    multi = np.count_nonzero(shapes, axis=1) > 1
    masks = (shapes > 0).astype(np.int64) @ (1 << np.arange(len(caps), dtype=np.int64))
    tables = [_table(problem, j, shapes) for j in range(problem.num_jobs)]
    state = state.copy()

    def index_of(row: IntArray) -> int:
        return int(np.flatnonzero(np.all(shapes == row[None, :], axis=1))[0])

    for _ in range(passes):
        improved = False
        for a, b in itertools.combinations(range(problem.num_jobs), 2):
            others = np.delete(np.arange(problem.num_jobs), [a, b])
            free = caps - state[others].sum(axis=0)
            taken = 0  # nodes used by the other distributed jobs
            for o in others.tolist():
                if np.count_nonzero(state[o]) > 1:
                    taken |= int(masks[index_of(state[o])])
            ok = np.all(shapes <= free[None, :], axis=1)
            if problem.avoid_interference:
                ok &= ~(multi & ((masks & taken) != 0))
            ia = np.flatnonzero(ok & np.isfinite(tables[a]))
            ib = np.flatnonzero(ok & np.isfinite(tables[b]))
            if ia.size == 0 or ib.size == 0:
                continue
            fits = np.all(shapes[ia][:, None, :] + shapes[ib][None, :, :] <= free, axis=2)
            if problem.avoid_interference:
                both = multi[ia][:, None] & multi[ib][None, :]
                fits &= ~(both & ((masks[ia][:, None] & masks[ib][None, :]) != 0))
            value = np.where(fits, tables[a][ia][:, None] + tables[b][ib][None, :], -np.inf)
            best = np.unravel_index(int(np.argmax(value)), value.shape)
            now = tables[a][index_of(state[a])] + tables[b][index_of(state[b])]
            if value[best] > now + 1e-12 * max(1.0, abs(now)):
                state[a] = shapes[ia[best[0]]]
                state[b] = shapes[ib[best[1]]]
                improved = True
        if not improved:
            break
    return state

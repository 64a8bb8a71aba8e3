"""The exact optimum of (type-aware) FITNESS_p on small snapshots, to check the optimiser.

FITNESS_p is not linear in the GPUs a job gets (goodput is concave-ish, the power mean is not
a sum), but it is a monotone function of a *sum of per-job terms*, and a job's term depends
only on its own allocation. So we enumerate every allocation of every job (each vector of GPUs
per node of one type, within the job's cap; plus "no GPUs"), price each one exactly as the
policy does, and pick one per job with a 0-1 MILP (``scipy.optimize.milp``, HiGHS):

* maximise Σ term(job, allocation) · x, one x per (job, allocation), binary;
* Σ x = 1 per job; per node, Σ GPUs · x ≤ the node's GPUs;
* with interference avoidance, per node at most one multi-node allocation.

The objective is linear in x because the terms are precomputed, which is what makes an exact
solver usable. Enumeration grows as (GPUs per node + 1) ** nodes per job, so this is for
snapshots of a few nodes (≤ 4 nodes of ≤ 4 GPUs and ≤ 6 jobs solve in well under a second).
"""

from __future__ import annotations

import itertools

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from coadapt.policies.base import Allocation, ClusterSnapshot, PolicyError
from coadapt.policies.pollux import PolluxUnawarePolicy
from coadapt.policies.pollux_types import TypedPollux, power_mean

#: Largest (allocations enumerated in all) the exact check accepts.
MAX_OPTIONS = 200_000


def exact_optimum(
    snapshot: ClusterSnapshot, policy: PolluxUnawarePolicy
) -> tuple[dict[str, Allocation], float]:
    """The allocations maximising ``policy``'s type-aware FITNESS_p, and that fitness."""
    typed = TypedPollux(snapshot, policy.problems_for(snapshot), policy.solve, policy.levers)
    names = typed.names
    width = len(snapshot.nodes)
    terms: list[float] = []
    owner: list[int] = []
    rows: list[tuple[int, ...]] = []
    speed: list[float] = []
    for i, name in enumerate(names):  # the "no GPUs" option of every job
        terms.append(typed.term(name, 0.0))
        owner.append(i)
        rows.append((0,) * width)
        speed.append(0.0)
    for tp in typed.types:
        pb = tp.problem
        caps = [snapshot.nodes[n].gpus for n in tp.nodes]
        shapes = list(itertools.product(*(range(c + 1) for c in caps)))
        if len(shapes) * len(tp.index) > MAX_OPTIONS:
            raise PolicyError(
                f"snapshot too large for the exact check: {len(shapes)} allocations per job "
                f"on {tp.gpu_type}; use at most a few nodes"
            )
        for name, j in tp.index.items():
            cap, least = int(tp.caps[j]), max(int(pb.min_replicas[j]), 1)
            for shape in shapes:
                k = sum(shape)
                if k < least or k > cap:
                    continue
                changed = not np.array_equal(np.asarray(shape), tp.base[j])
                nodes = sum(1 for x in shape if x)
                s = pb.speedup(j, nodes, k, changed)
                row = [0] * width
                for local, x in zip(tp.nodes, shape, strict=True):
                    row[local] = x
                terms.append(typed.term(name, s))
                owner.append(names.index(name))
                rows.append(tuple(row))
                speed.append(s)
    count = len(terms)
    a = np.array(rows, dtype=np.float64).T  # (nodes, options)
    one = np.zeros((len(names), count))
    one[owner, np.arange(count)] = 1.0
    constraints = [
        LinearConstraint(one, 1.0, 1.0),
        LinearConstraint(a, -np.inf, [n.gpus for n in snapshot.nodes]),
    ]
    if policy.avoid_interference:
        multi = np.array([sum(1 for x in r if x) > 1 for r in rows])
        constraints.append(LinearConstraint((a > 0) & multi[None, :], -np.inf, 1.0))
    result = milp(
        -np.asarray(terms),
        integrality=np.ones(count),
        bounds=Bounds(0.0, 1.0),
        constraints=constraints,
    )
    if result.x is None:
        raise PolicyError(f"exact check found no solution: {result.message}")
    chosen = np.flatnonzero(result.x > 0.5)
    allocs: dict[str, Allocation] = {}
    speedups = np.zeros(len(names))
    for c in chosen.tolist():
        if any(rows[c]):
            allocs[names[owner[c]]] = rows[c]
            speedups[owner[c]] = speed[c]
    return allocs, power_mean(speedups, typed.weights, typed.p, typed.eps)

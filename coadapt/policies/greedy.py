"""Greedy placement shared by the baseline policies (Tiresias, Optimus, FIFO).

The baselines place a job by repeatedly taking GPUs from the node with the most free GPUs
(ties: the lowest node index), which packs small jobs and spreads large ones over few nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from coadapt.policies.base import Allocation, ClusterSnapshot, JobInfo, PolicyError


def free_gpus(snapshot: ClusterSnapshot, allocations: Mapping[str, Allocation]) -> list[int]:
    """Free GPUs per node after ``allocations``."""
    free = [n.gpus for n in snapshot.nodes]
    for alloc in allocations.values():
        for i, x in enumerate(alloc):
            free[i] -= int(x)
    return free


def place_greedy(free: list[int], gpus: int) -> Allocation:
    """Take ``gpus`` GPUs from the nodes with most free GPUs first; updates ``free`` in place."""
    if gpus > sum(x for x in free if x > 0):
        raise PolicyError(f"cannot place {gpus} GPUs on {sum(free)} free")
    alloc = [0] * len(free)
    left = gpus
    while left > 0:
        node = max(range(len(free)), key=lambda i: (free[i], -i))
        take = min(free[node], left)
        alloc[node] += take
        free[node] -= take
        left -= take
    return tuple(alloc)


def place_one_type(free: list[int], gpus: int, node_types: Sequence[str]) -> Allocation | None:
    """:func:`place_greedy` within one GPU type (a job runs on one type at a time): the type
    with the most free GPUs that fits them (ties: by name); None if no type fits them."""
    kinds = sorted(set(node_types))
    if len(kinds) == 1:
        return place_greedy(free, gpus) if gpus <= sum(x for x in free if x > 0) else None
    room = {
        k: sum(max(f, 0) for f, t in zip(free, node_types, strict=True) if t == k) for k in kinds
    }
    fits = [k for k in kinds if room[k] >= gpus]
    if not fits:
        return None
    kind = max(fits, key=lambda k: (room[k], -kinds.index(k)))
    masked = [f if t == kind else 0 for f, t in zip(free, node_types, strict=True)]
    alloc = place_greedy(masked, gpus)
    for i, x in enumerate(alloc):
        free[i] -= x
    return alloc


def requested_gpus(job: JobInfo) -> int | None:
    """GPUs a static-configuration job asks for, or None if it can never be granted.

    The request is ``requested_replicas`` (``max_replicas`` when unset); a request outside the
    job's own ``[min_replicas, max_replicas]`` cannot be honoured by a fixed-size policy.
    """
    want = job.requested_replicas if job.requested_replicas is not None else job.max_replicas
    if want < max(1, job.min_replicas) or want > job.max_replicas:
        return None
    return want


def by_priority(keys: Iterable[str], jobs: Mapping[str, JobInfo]) -> list[str]:
    """``keys`` with higher ``JobInfo.priority`` first, keeping their order among equals.

    Priorities come from users and from the tuning service (seed 003's Algorithm 1 lowers a
    converged experiment's trials); the static baselines honour them as strict order.
    """
    return sorted(keys, key=lambda k: -jobs[k].priority)

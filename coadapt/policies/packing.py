"""GPU sharing decisions (Gandiva's packing): put a 1-GPU guest on a 1-GPU host's GPU.

Packing is decided after the allocation, on what it left waiting: a waiting job is packed onto
a running 1-GPU job when no GPU of a type it may use is free, the pair's combined speedup with
both slowed to their measured co-location fractions (``ClusterSnapshot.colocation``) beats the
GPU given to either alone (Gandiva's rule), and FITNESS_p's terms rise (they rank the pairs).
Only jobs with a ``packing_key`` whose pair is listed are packed (a pair may be listed in
either order), each host takes one guest, and pairs are chosen greedily by gain (ties by
name), so the result is deterministic.

A guest that is packed now holds its host's allocation in ``snapshot.current``, which
over-commits that GPU; :func:`split_guests` finds such guests so that the optimiser sees
them as waiting and packing decides them again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from coadapt.policies.base import Allocation, ClusterSnapshot

#: Job, GPU type, changed? -> the job's speedup on one GPU of that type.
OneGpu = Callable[[str, str, bool], float]
#: Job, speedup -> the job's (weighted) term of FITNESS_p's order-preserving sum.
Term = Callable[[str, float], float]


def colocation_fractions(
    snapshot: ClusterSnapshot, host_key: str, guest_key: str
) -> tuple[float, float] | None:
    """(host's, guest's) fraction of isolated throughput when they share, or None if unlisted."""
    pair = snapshot.colocation.get((host_key, guest_key))
    if pair is not None:
        return float(pair[0]), float(pair[1])
    pair = snapshot.colocation.get((guest_key, host_key))
    if pair is not None:
        return float(pair[1]), float(pair[0])
    return None


def split_guests(snapshot: ClusterSnapshot) -> dict[str, str]:
    """Guests packed now (guest -> host): 1-GPU jobs with packing keys whose current GPU is
    also the current GPU of an earlier such job, on a node holding more than its GPUs."""
    width = len(snapshot.nodes)
    used = [0] * width
    for alloc in snapshot.current.values():
        for i, k in enumerate(alloc[:width]):
            used[i] += int(k)
    hosts: dict[Allocation, str] = {}
    guests: dict[str, str] = {}
    for name, job in snapshot.jobs.items():
        alloc = tuple(snapshot.current.get(name, ()))
        if job.packing_key is None or sum(alloc) != 1:
            continue
        node = next(i for i, k in enumerate(alloc) if k)
        if alloc in hosts and used[node] > snapshot.nodes[node].gpus:
            guests[name] = hosts[alloc]
            used[node] -= 1
        else:
            hosts[alloc] = name
    return guests


def choose_packing(
    snapshot: ClusterSnapshot,
    allocations: Mapping[str, Allocation],
    held: Mapping[str, float],
    one_gpu: OneGpu,
    term: Term,
    previous: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Guest -> host pairs worth packing (see the module docstring).

    ``held``: each running job's speedup as allocated; ``previous``: the pairs packed now (a
    guest staying on the same GPU is not re-allocated).
    """
    if not snapshot.colocation:
        return {}
    width = len(snapshot.nodes)
    free: dict[str, int] = {}
    used = [0] * width
    for alloc in allocations.values():
        for i, k in enumerate(alloc):
            used[i] += int(k)
    for i, info in enumerate(snapshot.nodes):
        free[info.gpu_type] = free.get(info.gpu_type, 0) + info.gpus - used[i]
    hosts = []
    for name, alloc in allocations.items():
        job = snapshot.jobs[name]
        if job.packing_key is not None and sum(alloc) == 1:
            node = next(i for i, k in enumerate(alloc) if k)
            hosts.append((name, snapshot.nodes[node].gpu_type, tuple(alloc)))
    waiting = [
        name
        for name, job in snapshot.jobs.items()
        if name not in allocations
        and job.packing_key is not None
        and job.max_replicas >= 1
        and job.min_replicas <= 1
        and not any(free.get(t, 0) > 0 for t in free if job.allows(t))
    ]
    before = previous or {}
    options: list[tuple[float, str, str]] = []
    for guest in waiting:
        g_job = snapshot.jobs[guest]
        for host, gpu_type, alloc in hosts:
            if not g_job.allows(gpu_type):
                continue
            h_job = snapshot.jobs[host]
            assert h_job.packing_key is not None and g_job.packing_key is not None
            fractions = colocation_fractions(snapshot, h_job.packing_key, g_job.packing_key)
            if fractions is None:
                continue
            f_host, f_guest = fractions
            stays = before.get(guest) == host and tuple(snapshot.current_of(guest)) == alloc
            s_host = held[host]
            s_guest = one_gpu(guest, gpu_type, not stays)
            if f_host * s_host + f_guest * s_guest <= max(s_host, s_guest):
                continue  # sharing must beat giving the GPU to one of them alone
            gain = (
                term(host, f_host * s_host)
                + term(guest, f_guest * s_guest)
                - term(host, s_host)
                - term(guest, 0.0)
            )
            if gain > 1e-12:
                options.append((-gain, guest, host))
    options.sort()
    packed: dict[str, str] = {}
    taken: set[str] = set()
    for _gain, guest, host in options:
        if guest in packed or host in taken:
            continue
        packed[guest] = host
        taken.add(host)
    return packed

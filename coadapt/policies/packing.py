"""GPU sharing decisions (Gandiva's packing): put a 1-GPU guest on a 1-GPU host's GPU.

Packing is decided after the allocation, on what it left waiting: a waiting job is packed onto
a running 1-GPU job when no GPU of a type it may use is free, the pair's combined speedup with
both slowed to their measured co-location fractions (``ClusterSnapshot.colocation``, times
what each keeps with half the GPU's memory, :func:`half_memory_factor`) beats the GPU given to
either alone (Gandiva's rule), sharing saves the pair summed completion time against running
them shortest first (:func:`time_saved_by_sharing`, when the caller knows remaining times),
and FITNESS_p's terms rise (they rank the pairs). Only jobs with a ``packing_key`` whose pair
is listed are packed (a pair may be listed in either order), each host takes one guest, and
pairs are chosen greedily: guests that stay on the GPU they hold first (a pair that still
pays is never split for a challenger), then by gain (ties by name), so the result is
deterministic.

A guest that is packed now holds its host's allocation in ``snapshot.current``, which
over-commits that GPU; :func:`split_guests` finds such guests (from the pairs the policy
remembered, else inferred) so that the optimiser sees them as waiting and packing decides them
again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

import numpy as np

from coadapt.policies.base import Allocation, ClusterSnapshot, JobInfo

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


def half_memory_factor(job: JobInfo) -> float:
    """The share of its goodput a job keeps on one GPU when it has only half the GPU's memory
    (two jobs share it: the memory rule of packing), from its goodput model: the batch it
    would pick alone may not fit. 1 when unknown (no model or limits, or a pinned batch)."""
    model, limits = job.goodput, job.limits
    if model is None or limits is None or limits.pinned_batch is not None:
        return 1.0
    half = limits.upper_local_bsz // 2
    if half < max(limits.init_batch_size, limits.min_local_bsz):
        return 1.0
    capped = replace(limits, max_batch_size=min(limits.max_batch_size, half), max_local_bsz=half)
    alone = float(model.optimize(1, 1, limits).goodput)
    if not alone > 0.0:
        return 1.0
    return min(float(model.optimize(1, 1, capped).goodput) / alone, 1.0)


def split_guests(
    snapshot: ClusterSnapshot, known: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Guests packed now (guest -> host).

    ``known``: the pairs the policy packed last round (kept in its state), taken first where
    the snapshot still shows both on the same over-committed GPU. Allocations are GPUs per
    node, so the rest is inferred: 1-GPU jobs with packing keys whose current GPU is also the
    current GPU of an earlier such job, on a node holding more than its GPUs. Without
    ``known`` a node with several 1-GPU jobs can name the wrong one the guest; the optimiser
    then moves the real host, a restart for nothing.
    """
    if not any(job.packing_key is not None for job in snapshot.jobs.values()):
        return {}  # nothing can be a guest
    width = len(snapshot.nodes)
    used = [0] * width
    if snapshot.current:
        rows = [
            tuple(alloc[:width]) + (0,) * (width - len(alloc))
            for alloc in snapshot.current.values()
        ]
        used = np.asarray(rows, dtype=np.int64).sum(axis=0).tolist()

    def one_gpu_node(name: str) -> int | None:
        job = snapshot.jobs.get(name)
        alloc = tuple(snapshot.current.get(name, ()))
        if job is None or job.packing_key is None or len(alloc) != width or sum(alloc) != 1:
            return None
        return next(i for i, k in enumerate(alloc) if k)

    guests: dict[str, str] = {}
    paired: set[str] = set()
    for guest, host in sorted((known or {}).items()):
        node = one_gpu_node(guest)
        if (
            node is None
            or guest in paired
            or host in paired
            or one_gpu_node(host) != node
            or used[node] <= snapshot.nodes[node].gpus
        ):
            continue
        guests[guest] = host
        paired.update((guest, host))
        used[node] -= 1
    hosts: dict[Allocation, str] = {}
    for name in snapshot.jobs:
        node = one_gpu_node(name)
        if node is None or name in paired:
            continue
        alloc = tuple(snapshot.current[name])
        if alloc in hosts and used[node] > snapshot.nodes[node].gpus:
            guests[name] = hosts.pop(alloc)
            paired.update((name, guests[name]))
            used[node] -= 1
        else:
            hosts[alloc] = name
    return guests


def time_saved_by_sharing(
    host_left: float, guest_left: float, f_host: float, f_guest: float
) -> float:
    """Summed completion time (s) two jobs save by sharing one GPU at their co-location
    fractions, against running them one after the other, shortest first (SRPT, the order that
    minimises the sum); ``*_left``: each job's remaining time alone on the GPU.

    Sharing slows both jobs to gain throughput, which pays for the pair only at high fractions
    (``2 f_host + f_guest > 2`` when the host finishes first, ``f_host + 2 f_guest > 2`` when
    the guest does); Gandiva's rule (the fractions sum above 1) is necessary, not enough."""
    a, b = max(host_left, 0.0), max(guest_left, 0.0)
    sequential = 2.0 * min(a, b) + max(a, b)
    if a * f_guest <= b * f_host:  # the host finishes first; the guest then runs alone
        shared = a / f_host * (2.0 - f_guest) + b
    else:
        shared = b / f_guest * (2.0 - f_host) + a
    return sequential - shared


def choose_packing(
    snapshot: ClusterSnapshot,
    allocations: Mapping[str, Allocation],
    held: Mapping[str, float],
    one_gpu: OneGpu,
    term: Term,
    previous: Mapping[str, str] | None = None,
    time_left: Callable[[str], float | None] | None = None,
) -> dict[str, str]:
    """Guest -> host pairs worth packing (see the module docstring).

    ``held``: each running job's speedup as allocated; ``previous``: the pairs packed now (a
    guest staying on the same GPU is not re-allocated). ``time_left``: a job's remaining time
    alone on one GPU (None: unknown); where both are known a pair must also save summed
    completion time (:func:`time_saved_by_sharing`; a pair packed now only has to save more
    than the restart its split would cost the guest).
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
    if not waiting or not hosts:
        return {}  # nothing to pair: skip pricing every job's half-memory goodput (2 fits each)
    before = previous or {}
    memory = {name: half_memory_factor(snapshot.jobs[name]) for name in waiting}
    memory.update((name, half_memory_factor(snapshot.jobs[name])) for name, _, _ in hosts)
    options: list[tuple[bool, bool, float, str, str]] = []
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
            f_host *= memory[host]
            f_guest *= memory[guest]
            # On the GPUs it holds now (any host there: allocations are GPUs per node, so
            # pairing with another job of that node costs it no restart).
            stays = tuple(snapshot.current_of(guest)) == alloc
            s_host = held[host]
            s_guest = one_gpu(guest, gpu_type, not stays)
            if f_host * s_host + f_guest * s_guest <= max(s_host, s_guest):
                continue  # sharing must beat giving the GPU to one of them alone
            if time_left is not None:
                host_left, guest_left = time_left(host), time_left(guest)
                if host_left is not None and guest_left is not None:
                    slack = snapshot.restart_delay if stays else 0.0
                    saved = time_saved_by_sharing(host_left, guest_left, f_host, f_guest)
                    if saved + slack <= 0.0:
                        continue  # sharing would cost the pair average JCT
            gain = (
                term(host, f_host * s_host)
                + term(guest, f_guest * s_guest)
                - term(host, s_host)
                - term(guest, 0.0)
            )
            if gain > 1e-12:
                # Kept pairs first (hysteresis): a challenger never splits a pair that still
                # pays, which would restart the guest for a swap of who runs.
                options.append((not stays, before.get(guest) != host, -gain, guest, host))
    options.sort()
    packed: dict[str, str] = {}
    taken: set[str] = set()
    for _moved, _other_host, _gain, guest, host in options:
        if guest in packed or host in taken:
            continue
        packed[guest] = host
        taken.add(host)
    return packed

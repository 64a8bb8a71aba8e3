"""A Gavel-style heterogeneity-aware baseline (Narayanan et al., OSDI'20): max-min fairness
over effective throughput, solved as a linear program every round.

Jobs keep the GPUs and batch they asked for (:attr:`BatchMode.FIXED`). The policy finds the
time-share ``X[j, t]`` of GPU type ``t`` that job ``j`` should get, maximising
``min_j  sum_t X[j, t] * tput[j, t] / tput_equal[j]`` subject to ``sum_t X[j, t] <= 1`` and
``sum_j k_j X[j, t] <= C_t`` (``k_j`` the job's GPUs, ``C_t`` the GPUs of type ``t``), where
``tput_equal[j]`` is the job's throughput under an equal time-share of every type. It is solved
with scipy's ``linprog`` (HiGHS). Gavel's round-based mechanism then turns ``X`` into whole
allocations: every ``round_s`` seconds the (job, type) pairs are served in decreasing
``X[j, t] / (share of the job's time so far spent on t)``, each job on one type only, placed
greedily on that type's nodes; between rounds running jobs keep their GPUs and free GPUs go
to waiting jobs in the same order (work conservation).

Throughput per type comes from the job's goodput model on that type (``JobInfo.goodput_on``,
at its batch: pinned batch if the limits pin one); a job without a model is priced the same on
every type. Simplifications against the paper, all documented in ``docs/hetero.md``: no
placement-sensitivity term, no per-type rounding LP (greedy rounds), and space sharing is a
greedy Gandiva-style pass (a waiting 1-GPU job joins a lone 1-GPU job when the pair's summed
co-location fractions exceed 1) instead of pair variables in the LP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog

from coadapt.policies.base import (
    Allocation,
    BatchMode,
    ClusterSnapshot,
    Decision,
    JobInfo,
    PolicyError,
    PolicyState,
)
from coadapt.policies.greedy import by_priority, requested_gpus

#: Seconds between Gavel's re-allocation rounds (the paper's 6 minutes).
DEFAULT_ROUND_S = 360.0
#: Weight of total normalised throughput against the minimum in the LP objective.
TIE_BREAK = 1e-3
#: Significant digits the throughputs are rounded to before the LP (see :func:`quantize`).
THROUGHPUT_DIGITS = 4


def quantize(values: np.ndarray, digits: int = THROUGHPUT_DIGITS) -> np.ndarray:
    """``values`` rounded to ``digits`` significant digits (zeros stay zero).

    Why: the max-min LP is degenerate (jobs alike in throughput tie), so HiGHS' vertex, and
    with it the whole schedule, flipped on last-bit noise in the fitted throughputs. That noise
    (about 1e-12 relative) comes from the BLAS kernels OpenBLAS picks for the CPU at hand, so
    the same code gave averages up to 2.8% apart on different machines. Rounded inputs make the
    LP, hence the run, the same everywhere unless noise straddles a rounding boundary
    (~1e-8 per value at 4 digits).
    """
    x = np.asarray(values, dtype=np.float64)
    out = np.zeros_like(x)
    nz = np.isfinite(x) & (x != 0)
    if np.any(nz):
        exp = np.floor(np.log10(np.abs(x[nz])))
        unit = 10.0 ** (exp - (digits - 1))
        out[nz] = np.round(x[nz] / unit) * unit
    out[~np.isfinite(x)] = x[~np.isfinite(x)]
    return out


def type_throughput(job: JobInfo, gpu_type: str, gpus: int, gpus_per_node: int) -> float | None:
    """Samples/s of ``job`` on ``gpus`` GPUs of ``gpu_type`` packed on few nodes (None if
    unknown: no model, or no batch limits to price it with)."""
    model = job.goodput_on(gpu_type)
    if model is None or job.limits is None:
        return None
    nodes = max(1, math.ceil(gpus / max(gpus_per_node, 1)))
    value = float(model.optimize(nodes, gpus, job.limits).goodput)
    return value if value > 0 and math.isfinite(value) else None


def throughput_matrix(
    snapshot: ClusterSnapshot, names: list[str], want: dict[str, int]
) -> np.ndarray:
    """``tput[j, t]`` over ``names`` x ``snapshot.gpu_types``; 0 where the job may not run
    (type not allowed, or more GPUs than the type has). Unknown values become the job's
    smallest known one, or 1 on every type if none is known. Rounded by :func:`quantize`."""
    types = snapshot.gpu_types
    per_node = {t: max(n.gpus for n in snapshot.nodes if n.gpu_type == t) for t in types}
    cap = capacities(snapshot)
    out = np.zeros((len(names), len(types)))
    for j, name in enumerate(names):
        job = snapshot.jobs[name]
        row: list[float | None] = [type_throughput(job, t, want[name], per_node[t]) for t in types]
        known = [v for v in row if v is not None]
        fill = min(known) if known else 1.0
        for i, t in enumerate(types):
            if job.allows(t) and want[name] <= cap[i]:
                value = row[i]
                out[j, i] = fill if value is None else value
    return quantize(out)


def capacities(snapshot: ClusterSnapshot) -> np.ndarray:
    """GPUs per type, in ``snapshot.gpu_types`` order."""
    return np.array(
        [sum(n.gpus for n in snapshot.nodes if n.gpu_type == t) for t in snapshot.gpu_types],
        dtype=np.float64,
    )


def max_min_shares(tput: np.ndarray, want: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """The LP: time-shares ``X`` (jobs x types) maximising the smallest normalised throughput.

    ``tput[j, t] == 0`` forbids the pair. Raises :class:`PolicyError` if HiGHS fails.
    """
    n, m = tput.shape
    if n == 0 or cap.sum() <= 0:
        return np.zeros((n, m))
    # Equal share: every job gets the same fraction of time, spread over types by capacity.
    share = min(1.0, float(cap.sum()) / max(float(want.sum()), 1e-9))
    equal = share * (tput * (cap / cap.sum())).sum(axis=1)
    equal = np.where(equal > 0, equal, 1.0)
    nvar = n * m + 1  # X row-major, then z
    c = np.zeros(nvar)
    c[-1] = -1.0
    # Tie-break (a one-step stand-in for Gavel's water-filling): among max-min optima, prefer
    # more total normalised throughput, else jobs off the bottleneck get arbitrary shares.
    c[:-1] = -(tput / equal[:, None]).ravel() * (TIE_BREAK / n)
    rows: list[np.ndarray] = []
    rhs: list[float] = []
    for j in range(n):  # z - sum_t X[j,t] tput[j,t] / equal[j] <= 0
        row = np.zeros(nvar)
        row[j * m : (j + 1) * m] = -tput[j] / equal[j]
        row[-1] = 1.0
        rows.append(row)
        rhs.append(0.0)
    for j in range(n):  # sum_t X[j,t] <= 1
        row = np.zeros(nvar)
        row[j * m : (j + 1) * m] = 1.0
        rows.append(row)
        rhs.append(1.0)
    for t in range(m):  # sum_j k_j X[j,t] <= C_t
        row = np.zeros(nvar)
        row[t : n * m : m] = want
        rows.append(row)
        rhs.append(float(cap[t]))
    bounds: list[tuple[float, float | None]] = [
        (0.0, 1.0 if tput[j, t] > 0 else 0.0) for j in range(n) for t in range(m)
    ]
    bounds.append((0.0, None))
    res = linprog(c, A_ub=np.array(rows), b_ub=np.array(rhs), bounds=bounds, method="highs")
    if res.status != 0:
        raise PolicyError(f"gavel: the max-min LP failed ({res.message})")
    return np.asarray(res.x[:-1]).reshape(n, m).clip(0.0, 1.0)


def _place(free: list[int], nodes: list[int], gpus: int) -> Allocation | None:
    """Take ``gpus`` GPUs from ``nodes`` (indices), most free first; None if they do not fit."""
    if gpus > sum(free[i] for i in nodes):
        return None
    alloc = [0] * len(free)
    left = gpus
    while left > 0:
        node = max(nodes, key=lambda i: (free[i], -i))
        take = min(free[node], left)
        alloc[node] += take
        free[node] -= take
        left -= take
    return tuple(alloc)


@dataclass
class GavelPolicy:
    """Heterogeneity-aware max-min fairness (see the module docstring).

    State (JSON): ``received`` (job -> type -> seconds run there), ``last`` (the clock of the
    last accounting) and ``round_at`` (the clock of the last full round).
    """

    round_s: float = DEFAULT_ROUND_S
    packing: bool = True
    name: str = "gavel"
    batch_mode: BatchMode = BatchMode.FIXED

    def optimize(
        self, snapshot: ClusterSnapshot, state: PolicyState, rng: np.random.Generator
    ) -> Decision:
        del rng  # deterministic
        jobs = snapshot.jobs
        types = snapshot.gpu_types
        node_type = [types.index(n.gpu_type) for n in snapshot.nodes]
        now = float(snapshot.now)
        last = float(state.get("last", now))
        received: dict[str, dict[str, float]] = {
            k: dict(v) for k, v in state.get("received", {}).items() if k in jobs
        }
        for name, alloc in snapshot.current.items():  # account the time since last round
            if name in jobs and any(alloc):
                t = types[node_type[next(i for i, x in enumerate(alloc) if x)]]
                per = received.setdefault(name, {})
                per[t] = per.get(t, 0.0) + max(now - last, 0.0)
        want = {k: w for k, j in jobs.items() if (w := requested_gpus(j) or 0) > 0}
        names = [k for k in by_priority(jobs, jobs) if k in want]
        full_round = now - float(state.get("round_at", -math.inf)) >= self.round_s - 1e-9
        diagnostics: dict[str, float] = {}
        if full_round:  # solve the LP and rank (job, type) pairs afresh
            cap = capacities(snapshot)
            tput = throughput_matrix(snapshot, names, want)
            shares = max_min_shares(tput, np.array([want[k] for k in names], dtype=float), cap)
            order = self._order(names, types, shares, received, snapshot)
            diagnostics["min_share"] = float(shares.sum(axis=1).min()) if names else 0.0
        else:  # between rounds: last round's ranking, then new jobs on any type
            order = [
                (k, types.index(t)) for k, t in state.get("order", []) if k in want and t in types
            ]
            ranked = {k for k, _ in order}
            order += [(k, t) for k in names if k not in ranked for t in range(len(types))]
        allocations: dict[str, Allocation] = {}
        free = [n.gpus for n in snapshot.nodes]
        kept_guests: dict[str, str] = {}
        if not full_round:  # between rounds running jobs (and packed pairs) keep their GPUs
            kept_guests = dict(state.get("packed", {}))
            for name, alloc in snapshot.current.items():
                if name in want and sum(alloc) == want[name] and name not in kept_guests:
                    allocations[name] = alloc
                    for i, x in enumerate(alloc):
                        free[i] -= x
        self._fill(order, want, snapshot, node_type, free, allocations)
        packed = {
            g: h
            for g, h in kept_guests.items()
            if g in want
            and g not in allocations
            and h in allocations
            and sum(allocations[h]) == 1
            and (jobs[g].packing_key, jobs[h].packing_key) in snapshot.colocation
        }
        for guest, host in packed.items():
            allocations[guest] = allocations[host]
        if self.packing:
            self._pack(snapshot, want, allocations, packed)
        new_state: PolicyState = {
            "received": received,
            "last": now,
            "round_at": now if full_round else float(state["round_at"]),
            "order": [[k, types[t]] for k, t in order],
            "packed": packed,
        }
        return Decision(allocations, new_state, diagnostics, packed)

    @staticmethod
    def _order(
        names: list[str],
        types: tuple[str, ...],
        shares: np.ndarray,
        received: dict[str, dict[str, float]],
        snapshot: ClusterSnapshot,
    ) -> list[tuple[str, int]]:
        """(job, type index) pairs with a share, by Gavel's priority X / share received."""
        keyed: list[tuple[float, float, int, str, int]] = []
        for j, name in enumerate(names):
            age = max(snapshot.jobs[name].age(snapshot.now), 1.0)
            for t, gpu_type in enumerate(types):
                x = float(shares[j, t])
                if x <= 1e-9:
                    continue
                got = received.get(name, {}).get(gpu_type, 0.0) / age
                priority = math.inf if got <= 0 else x / got
                keyed.append((-priority, -x, j, name, t))
        keyed.sort()
        return [(name, t) for *_, name, t in keyed]

    @staticmethod
    def _fill(
        order: list[tuple[str, int]],
        want: dict[str, int],
        snapshot: ClusterSnapshot,
        node_type: list[int],
        free: list[int],
        allocations: dict[str, Allocation],
    ) -> None:
        """Serve pairs in order; a job keeps its current GPUs when it stays on their type."""
        for name, t in order:
            if name in allocations:
                continue
            nodes = [i for i, k in enumerate(node_type) if k == t]
            current = snapshot.current_of(name)
            if sum(current) == want[name] and all(
                x <= free[i] and (x == 0 or node_type[i] == t) for i, x in enumerate(current)
            ):
                allocations[name] = current
                for i, x in enumerate(current):
                    free[i] -= x
                continue
            alloc = _place(free, nodes, want[name])
            if alloc is not None:
                allocations[name] = alloc

    @staticmethod
    def _pack(
        snapshot: ClusterSnapshot,
        want: dict[str, int],
        allocations: dict[str, Allocation],
        packed: dict[str, str],
    ) -> None:
        """Gandiva-style: a waiting packable job joins a lone packable 1-GPU job when the
        pair's summed co-location fractions exceed 1 (best pair first); updates in place."""
        jobs, table = snapshot.jobs, snapshot.colocation
        taken = set(packed) | set(packed.values())
        hosts = [
            k
            for k, a in allocations.items()
            if sum(a) == 1 and jobs[k].packing_key and k not in taken
        ]
        waiting = [k for k in jobs if k not in allocations and want.get(k) == 1]
        for guest in waiting:
            key = jobs[guest].packing_key
            if key is None:
                continue
            best: tuple[float, str] | None = None
            for host in hosts:
                pair = table.get((key, str(jobs[host].packing_key)))
                if pair is not None and sum(pair) > 1.0 and (best is None or sum(pair) > best[0]):
                    best = (sum(pair), host)
            if best is not None:
                packed[guest] = best[1]
                allocations[guest] = allocations[best[1]]
                hosts.remove(best[1])

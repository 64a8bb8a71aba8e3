"""The Pollux scheduling problem (seed 000 §4.2): FITNESS_p over allocation matrices.

Shared by the fast optimiser (:mod:`coadapt.policies.pollux`) and the reference genetic
algorithm (:mod:`coadapt.policies.pollux_ga`), so both maximise exactly the same function:

* ``SPEEDUP_j(A_j)`` — the job's best goodput on ``A_j`` over its best goodput on the fair share
  of ``ceil(G / J)`` GPUs, eq. 16. By default (``fair_reference="packed"``, as the authors'
  simulator does) the reference places those GPUs on one node, i.e. the job's best case for its
  fair GPU count; ``"spread"`` uses as few real nodes as hold them. Packed measured better in
  the trace replay (0.782 h vs 0.789 h average JCT over the eight artifact workloads);
* multiplied by the re-allocation factor ``(T_j - R_j δ) / (T_j + δ)`` when ``A_j`` differs
  from the job's current allocation (at least ``PENDING_FACTOR_FLOOR`` for a job holding no
  GPUs, so a job that just retried is never priced at zero while GPUs sit idle);
* ``FITNESS_p = ((1/J) Σ_j (SPEEDUP_j + ε)^p)^(1/p)`` over running *and* pending jobs, eq. 15
  (ε keeps a job with no GPUs finite when p < 0; p = 0 is the geometric mean);
* when the jobs' ``priority`` differs, the mean is weighted: a job weighs
  ``PRIORITY_BASE ** level``, its level being the rank of its priority among the distinct
  priorities present (0 for the lowest, at most ``MAX_PRIORITY_LEVEL``). Priorities are an order,
  not a magnitude (the tuning runner numbers its experiments 1..n), so only the rank counts. At
  p < 0 an idle job costs about ``weight / ε``, so where GPUs are too few for everyone's first
  GPU a higher-priority job is admitted before a lower one, as FIFO, Tiresias and Optimus do;
  once admitted, jobs are sized by goodput with a mild (2× per level) preference for higher
  priority, so a low-priority job still gets the GPUs higher ones gain little from. Equal
  priorities weigh the same: the objective is then exactly eq. 15.

Constraints: node capacity; at most one distributed (multi-node) job per node when
interference avoidance is on; each job between its min replicas (or 0) and its cap
``min(max_replicas, 2 × the most GPUs it ever held)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from coadapt.goodput import BatchLimits, GoodputModel, GradParams, SpeedupFunction, exploration_cap
from coadapt.policies.base import Allocation, ClusterSnapshot, JobInfo

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]
# The least re-allocation factor of a job that holds no GPUs (see PolluxProblem.__init__).
PENDING_FACTOR_FLOOR = 1e-6
#: Weight ratio between neighbouring priority levels, and the most levels that are told apart.
PRIORITY_BASE = 2.0
MAX_PRIORITY_LEVEL = 30


def priority_weights(priorities: list[int]) -> FloatArray | None:
    """Each job's weight in FITNESS_p (see the module docstring); None when all priorities are
    equal (unweighted eq. 15, computed exactly as without priorities)."""
    levels = sorted(set(priorities))
    if len(levels) <= 1:
        return None
    rank = {p: min(i, MAX_PRIORITY_LEVEL) for i, p in enumerate(levels)}
    return np.array([PRIORITY_BASE ** rank[p] for p in priorities], dtype=np.float64)


def combine_weights(a: FloatArray | None, b: FloatArray | None) -> FloatArray | None:
    """The product of two optional weight vectors (None: all ones)."""
    if a is None:
        return b
    return a if b is None else a * b


def remaining_work(job: JobInfo, unknown: float) -> float:
    """GPU-seconds the job still needs, extrapolated from the service it received for the
    fraction of its declared work it did (``unknown`` when it declared none or did none yet)."""
    f = job.progress
    if f is None or f <= 0.0 or job.attained_service <= 0.0:
        return unknown
    return max(job.attained_service, 0.0) * (1.0 - min(f, 1.0)) / f


@dataclass(frozen=True)
class Levers:
    """Departures from the paper's objective that the default ``pollux`` uses (all off here,
    which is exactly the authors' FITNESS_p, i.e. ``pollux-unaware``).

    ``payback``: a changed allocation pays ``payback × δ × current speedup / age`` (the restart
    amortised over the job's expected remaining time), so a job is re-allocated only when the
    gain pays back the restart. ``service_scale``/``service_power``: weight each job by
    ``(1 + attained GPU-s / scale) ** -power``, favouring jobs that have received little
    service (least-attained service approximates shortest-remaining for heavy-tailed DL job
    sizes without oracle knowledge). ``explore``: growth cap as a multiple of the most GPUs
    held (2 in the paper); ``first``: GPUs a job that never ran may start on (1 in the paper).
    ``hold``: a running job's changed allocation is discounted by this fraction (hysteresis
    that, unlike ``switch_margin``, leaves the admission of waiting jobs alone).
    ``remaining_scale``/``remaining_power``: weight each job by ``(1 + remaining GPU-s / scale)
    ** -power``, the remaining work extrapolated from ``JobInfo.progress`` (:func:`remaining_work`;
    unknown counts as one ``scale``), an SRPT flavour from what jobs declare, no oracle.
    ``settle``: a running job's changed allocation is also multiplied by
    ``max(1 - settle × δ / H, 0)``, H its remaining work over the GPUs it holds, so a restart
    must pay back within the job's own remaining time (jobs of unknown length: no change).
    ``phi_growth``: price each job's speedups at a gradient noise scale φ × (1 + phi_growth ×
    (1 − progress)) instead of today's φ: φ grows as training goes on (Pollux §3.1; 5-15× over
    an ImageNet run in the artifact's traces), so a young job's measured φ under-values the
    large allocations it will use well for most of its life (jobs of unknown length: no change).
    ``leap``: the optimiser's hand-out of leftover GPUs (not the count phase) also tries growth
    past one node's worth of GPUs, in whole nodes up to all free GPUs. A restarted job's speedup
    drops by its re-allocation factor at any size, so a growth that pays only when large (a
    young job's low φ makes 4 → 8 GPUs worse than staying, 4 → 32 much better) is invisible to
    steps of at most a node.
    ``srpt_q``/``srpt_long``: heSRPT among the long jobs. The jobs with more than ``srpt_long``
    GPU-s of remaining work (from ``JobInfo.progress``, as above) are ranked largest first,
    i = 1..n, and job i's weight is multiplied by ``(i^e − (i−1)^e) / ((n+1)^e − n^e)``,
    e = 1/(1 − ``srpt_q``): heSRPT's shares for speedup k^q (Berg et al., SIGMETRICS'20),
    scaled so the next rank, every job not long, is 1. With a high q the long jobs are served
    nearly one after another, shortest first, rather than side by side; shorter jobs keep the
    remaining-work weight alone (ranking them too put medium jobs behind dozens of tiny ones).
    Jobs that declare no length are never long.
    """

    payback: float = 0.0
    service_scale: float = 3600.0
    service_power: float = 0.0
    explore: float = 2.0
    first: int = 1
    hold: float = 0.0
    remaining_scale: float = 36000.0
    remaining_power: float = 0.0
    settle: float = 0.0
    phi_growth: float = 0.0
    leap: bool = False
    srpt_q: float = 0.0
    srpt_long: float = 180000.0

    def growth_sizes(self, lo: int, near: int, far: int, per_node: int) -> list[int]:
        """Extra GPUs a growth step tries: every count in ``lo..near`` (up to a node's worth
        ahead), then with ``leap`` whole nodes beyond it and ``far`` (all the room) itself."""
        sizes = list(range(lo, near + 1))
        if self.leap and far > near:
            step = max(per_node, 1)
            sizes += [*range(near - near % step + step, far, step), far]
        return sizes

    def anticipated(self, job: JobInfo) -> GoodputModel | None:
        """The job's goodput model with φ scaled up by its expected growth (``phi_growth``);
        the model unchanged when the lever is off or the job declares no progress."""
        model, f = job.goodput, job.progress
        if model is None or self.phi_growth <= 0 or f is None:
            return model
        growth = 1.0 + self.phi_growth * (1.0 - min(max(f, 0.0), 1.0))
        grad = GradParams(model.grad.sqr, model.grad.var * growth)
        return GoodputModel(model.perf, grad, model.init_batch_size)

    def service_weights(self, jobs: list[JobInfo]) -> FloatArray | None:
        if self.service_power == 0 or not jobs:
            return None
        served = np.array([max(j.attained_service, 0.0) for j in jobs], dtype=np.float64)
        return np.asarray((1.0 + served / self.service_scale) ** -self.service_power)

    def remaining_weights(self, jobs: list[JobInfo]) -> FloatArray | None:
        if self.remaining_power == 0 or not jobs:
            return None
        left = np.array([remaining_work(j, self.remaining_scale) for j in jobs])
        return np.asarray((1.0 + left / self.remaining_scale) ** -self.remaining_power)

    def srpt_weights(self, jobs: list[JobInfo]) -> FloatArray | None:
        if self.srpt_q <= 0 or not jobs:
            return None
        left = np.array([remaining_work(j, 0.0) for j in jobs])  # unknown: never long
        long = np.flatnonzero(left > self.srpt_long)
        if long.size == 0:
            return None
        e = 1.0 / (1.0 - min(self.srpt_q, 0.999))
        order = long[np.argsort(-left[long], kind="stable")]  # largest first: rank 1
        n = order.size
        ranks = np.arange(1, n + 1, dtype=np.float64)
        share = (ranks**e - (ranks - 1) ** e) / ((n + 1) ** e - n**e)
        # jobs with equal remaining work share their ranks' mean (groups follow the ranks)
        _, group = np.unique(-left[order], return_inverse=True)
        w = np.ones(len(jobs))
        w[order] = (np.bincount(group, share) / np.bincount(group))[group]
        return w

    def weights(self, jobs: list[JobInfo]) -> FloatArray | None:
        return combine_weights(
            combine_weights(self.service_weights(jobs), self.remaining_weights(jobs)),
            self.srpt_weights(jobs),
        )

    def cap(self, max_gpus_held: int, max_replicas: int) -> int:
        if max_gpus_held <= 0:
            return max(1, min(max_replicas, self.first))
        if self.explore == 2.0:
            return exploration_cap(max_gpus_held, max_replicas)
        return max(1, min(max_replicas, math.floor(self.explore * max_gpus_held)))


def _limits_for(job: JobInfo) -> BatchLimits:
    if job.limits is not None:
        return job.limits
    m0 = job.goodput.init_batch_size if job.goodput is not None else 1
    return BatchLimits(init_batch_size=m0, max_batch_size=m0)


class PolluxProblem:
    """One round's optimisation problem, built from a snapshot."""

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        p: float = -1.0,
        epsilon: float = 1e-3,
        avoid_interference: bool = True,
        switch_margin: float = 0.0,
        fair_reference: str = "packed",
        levers: Levers | None = None,
        fair_share: int | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.levers = levers or Levers()
        self.switch_margin = float(switch_margin)
        self.p = float(p)
        self.epsilon = float(epsilon)
        self.avoid_interference = avoid_interference
        self.jobs: list[JobInfo] = list(snapshot.jobs.values())
        self.names = [job.name for job in self.jobs]
        self.weights = combine_weights(
            priority_weights([job.priority for job in self.jobs]),
            self.levers.weights(self.jobs),
        )
        self.node_caps: IntArray = np.array([n.gpus for n in snapshot.nodes], dtype=np.int64)
        self.num_jobs = len(self.jobs)
        self.num_nodes = len(snapshot.nodes)
        total = int(self.node_caps.sum())
        self.total_gpus = total
        per_node = int(self.node_caps.max()) if self.num_nodes else 1
        self.gpus_per_node = max(per_node, 1)
        fair_k = max(1, math.ceil(total / max(self.num_jobs, 1)))
        if fair_share is not None:  # a type's sub-problem uses the whole cluster's fair share
            fair_k = max(1, int(fair_share))
        if fair_reference == "packed":
            fair_n = 1
        elif fair_reference == "spread":
            fair_n = max(1, math.ceil(fair_k / self.gpus_per_node))
        else:
            raise ValueError(f"fair_reference must be 'packed' or 'spread', got {fair_reference!r}")
        self.fair = (fair_n, fair_k)
        self.max_replicas: IntArray = np.array(
            [min(self.levers.cap(job.max_gpus_held, job.max_replicas), total) for job in self.jobs],
            dtype=np.int64,
        )
        self.speedup_fns = SpeedupFunction.build_many(
            [self.levers.anticipated(job) for job in self.jobs],
            [_limits_for(job) for job in self.jobs],
            ref_nodes=fair_n,
            ref_replicas=fair_k,
            prefetch=self._prefetch_shapes(),
            defer=True,  # priced per solve, for the jobs it may give GPUs (price_live)
        )
        self.min_replicas: IntArray = np.array(
            [max(job.min_replicas, 0) for job in self.jobs], dtype=np.int64
        )
        delta = snapshot.restart_delay
        factors = []
        for job in self.jobs:
            age = job.age(snapshot.now)
            denom = age + delta
            factors.append(max(age - job.num_restarts * delta, 0.0) / denom if denom > 0 else 0.0)
        self.realloc_factor: FloatArray = np.array(factors, dtype=np.float64)
        self.base: IntArray = self._base_state()
        self.price(np.flatnonzero(self.base.sum(axis=1) > 0).tolist())  # running: read first
        # A job that holds nothing pays its start whenever it starts: waiting saves it no
        # restart, so a zero factor (age < R·δ, e.g. right after a retry) must not price it
        # at zero speedup, which would leave free GPUs idle while it waits (issue 13.3).
        # The floor is tiny: it can only matter where the factor would otherwise be zero.
        idle = self.base.sum(axis=1) == 0
        self.realloc_factor = np.where(
            idle, np.maximum(self.realloc_factor, PENDING_FACTOR_FLOOR), self.realloc_factor
        )
        if self.levers.hold > 0:  # hysteresis: a running job moves only for a clear gain
            self.realloc_factor = np.where(
                idle, self.realloc_factor, self.realloc_factor * (1.0 - self.levers.hold)
            )
        if self.levers.settle > 0:
            self.realloc_factor = self.realloc_factor * self._settle_factors(idle)
        self.scale: FloatArray = np.ones(self.num_jobs, dtype=np.float64)
        self.payback_penalty: FloatArray = np.zeros(self.num_jobs, dtype=np.float64)
        # Count-table rows (``pollux._CountRows``) by (job, cap, GPUs held, nodes held),
        # valid while ``pricing_token()`` is unchanged: a type-aware round re-solves each
        # type's problem several times with other caps and bases.
        self.count_rows: tuple[tuple[object, ...], dict[tuple[int, int, int, int], list[float]]]
        self.count_rows = ((), {})
        self._idle_terms: tuple[tuple[object, ...], list[float]] = ((), [])
        self._set_payback()

    def _settle_factors(self, idle: NDArray[np.bool_]) -> FloatArray:
        """A running job's move pays ``settle × δ`` out of the time it has left at its current
        GPUs (remaining work over GPUs held): ``max(1 − settle δ / H, 0)``, so a job near its
        end is not restarted for a gain it cannot recoup. Unknown length: 1 (no change)."""
        out = np.ones(self.num_jobs, dtype=np.float64)
        delta = self.snapshot.restart_delay
        held = self.base.sum(axis=1)
        for j, job in enumerate(self.jobs):
            if idle[j] or job.progress is None or job.progress <= 0 or held[j] <= 0:
                continue
            horizon = remaining_work(job, math.inf) / float(held[j])
            if horizon <= 0:
                out[j] = 0.0
            elif math.isfinite(horizon):
                out[j] = max(1.0 - self.levers.settle * delta / horizon, 0.0)
        return out

    def idle_terms(self) -> list[float]:
        """Every job's :meth:`utility` at speedup 0 (kept while the pricing is unchanged: a
        search prices every job's row, and in a type's problem most rows are empty)."""
        token = self.pricing_token()
        if self._idle_terms[0] != token:
            self._idle_terms = (token, [self.utility(j, 0.0) for j in range(self.num_jobs)])
        return self._idle_terms[1]

    def price(self, jobs: list[int]) -> None:
        """Price the speedup tables of ``jobs`` now, in one batch-choice call, up to two
        nodes' worth of GPUs past what each holds; the rest on the first look-up past that
        (tables are built deferred: in a type-aware round a job's table on a type it never
        uses is never read, and a search reads about a quarter of the rest, nearly all
        within that window)."""
        held = self.base.sum(axis=1).tolist()
        window = 2 * self.gpus_per_node
        SpeedupFunction.fill_many(
            [self.speedup_fns[j] for j in jobs], [int(held[j]) + window for j in jobs]
        )

    def price_live(self) -> None:
        """:meth:`price` every job this solve may give GPUs (cap above 0)."""
        self.price(np.flatnonzero(self.max_replicas > 0).tolist())

    def pricing_token(self) -> tuple[object, ...]:
        """Everything a job's speedup and utility read besides its cap and current
        allocation (a cache of either is valid while this is unchanged)."""
        w = self.weights
        return (
            self.p,
            self.epsilon,
            self.switch_margin,
            self.num_nodes,
            self.gpus_per_node,
            self.scale.tobytes(),
            self.realloc_factor.tobytes(),
            self.payback_penalty.tobytes(),
            None if w is None else np.asarray(w).tobytes(),
        )

    def set_scale(self, scale: FloatArray) -> None:
        """Multiply each job's speedups by ``scale`` (a type's sub-problem: the job's goodput
        on this type relative to its best type, so speedups compare across types)."""
        self.scale = np.asarray(scale, dtype=np.float64).copy()
        self._set_payback()

    def _set_payback(self) -> None:
        """Restart payback: a change costs the job δ of its current speedup, amortised over
        its expected remaining time (its age, the only estimate a live controller has)."""
        self.payback_penalty[:] = 0.0
        if self.levers.payback <= 0:
            return
        delta = self.snapshot.restart_delay
        for j, job in enumerate(self.jobs):
            k = int(self.base[j].sum())
            if k == 0:
                continue
            nodes = int(np.count_nonzero(self.base[j]))
            s_now = self.speedup_fns[j].scalar(nodes, k) * float(self.scale[j])
            horizon = max(job.age(self.snapshot.now), delta, 1.0)
            self.payback_penalty[j] = self.levers.payback * delta * s_now / horizon

    def _prefetch_shapes(self) -> list[tuple[ArrayLike, ArrayLike] | None]:
        """Each job's :meth:`_compact_shapes`, built once per distinct cap (read-only arrays
        shared by the jobs with that cap: a 2048-GPU round has ~3000 jobs and ~70 caps)."""
        by_cap: dict[int, tuple[ArrayLike, ArrayLike]] = {}
        out: list[tuple[ArrayLike, ArrayLike] | None] = []
        for c in self.max_replicas.tolist():
            shapes = by_cap.get(c)
            if shapes is None:
                shapes = by_cap[c] = self._compact_shapes(c)
            out.append(shapes)
        return out

    def _compact_shapes(self, cap: int) -> tuple[IntArray, IntArray]:
        """(nodes, GPUs) the search mostly asks about: K GPUs on the fewest nodes, and on one
        more; evaluated up front in one vectorised call per job. Also a node's worth plus one
        on one node: the search's cheap growth bound asks it of a job filling one node."""
        k = np.arange(1, max(cap, 1) + 1)
        n = np.maximum(-(-k // self.gpus_per_node), 1)
        nodes = np.minimum(np.concatenate([n, np.minimum(n + 1, k)]), max(self.num_nodes, 1))
        gpus = np.concatenate([k, k])
        if cap > self.gpus_per_node:
            nodes = np.append(nodes, 1)
            gpus = np.append(gpus, self.gpus_per_node + 1)
        return nodes, gpus

    # ----------------------------------------------------------------- states
    def _base_state(self) -> IntArray:
        """Current allocations as a (J, N) matrix, repaired to fit the snapshot's nodes."""
        base = np.zeros((self.num_jobs, self.num_nodes), dtype=np.int64)
        for j, name in enumerate(self.names):
            alloc = self.snapshot.current.get(name)
            if alloc is not None and len(alloc) == self.num_nodes:
                base[j] = np.maximum(np.asarray(alloc, dtype=np.int64), 0)
        return self.repair(base[None])[0]

    def repair(self, states: IntArray) -> IntArray:
        """Make a batch of (P, J, N) states feasible, keeping as much of them as possible.

        Order of enforcement: the interference rule (a later distributed job loses a node
        already used by an earlier one), the per-job cap, node capacity (earlier jobs keep
        their GPUs), and min replicas (a job below its minimum gets nothing).
        """
        states = np.maximum(np.asarray(states, dtype=np.int64), 0).copy()
        if states.size == 0:
            return states
        if self.avoid_interference:
            distributed = np.count_nonzero(states, axis=2) > 1  # (P, J)
            occupied = (states > 0) & distributed[:, :, None]
            conflict = np.cumsum(occupied, axis=1) > 1
            states[conflict & occupied] = 0
        # Cap per job: keep GPUs node by node from the first node.
        capped = np.minimum(np.cumsum(states, axis=2), self.max_replicas[None, :, None])
        states = np.diff(capped, axis=2, prepend=0)
        # Node capacity: earlier jobs keep their GPUs.
        filled = np.minimum(np.cumsum(states, axis=1), self.node_caps[None, None, :])
        states = np.diff(filled, axis=1, prepend=0)
        below = (states.sum(axis=2) < self.min_replicas[None, :]) & (states.sum(axis=2) > 0)
        states[below] = 0
        return states

    def is_feasible(self, state: IntArray) -> bool:
        if np.any(state < 0) or np.any(state.sum(axis=0) > self.node_caps):
            return False
        k = state.sum(axis=1)
        if np.any(k > self.max_replicas) or np.any((k > 0) & (k < self.min_replicas)):
            return False
        if self.avoid_interference:
            distributed = np.count_nonzero(state, axis=1) > 1
            if np.any(((state > 0) & distributed[:, None]).sum(axis=0) > 1):
                return False
        return True

    # --------------------------------------------------------------- speedups
    def speedup(self, j: int, nodes: int, replicas: int, changed: bool) -> float:
        """SPEEDUP_j with the re-allocation factor applied when the allocation changes."""
        if replicas <= 0:
            return 0.0
        value = self.speedup_fns[j].scalar(nodes, replicas) * float(self.scale[j])
        if not changed:
            return value
        value *= self.realloc_factor[j] * (1.0 - self.switch_margin)
        return max(value - float(self.payback_penalty[j]), 0.0)

    def utility(self, j: int, speedup: float) -> float:
        """Job j's term g_j(s) whose sum orders states exactly as FITNESS_p does (its priority
        weight included)."""
        x = speedup + self.epsilon
        if self.p == 0:
            g = math.log(x)
        elif self.p < 0:
            g = -(x**self.p)
        else:
            g = float(x**self.p)
        return g if self.weights is None else g * float(self.weights[j])

    def job_speedups(self, states: IntArray) -> FloatArray:
        """(P, J) speedups (factor included) of a batch of (P, J, N) states."""
        states = np.asarray(states, dtype=np.int64)
        nodes = np.count_nonzero(states, axis=2)
        replicas = states.sum(axis=2)
        out = np.zeros(replicas.shape, dtype=np.float64)
        changed = np.any(states != self.base[None], axis=2)
        if replicas.shape[0] == 1:  # one state (most calls): memo look-ups, no array calls
            out[0] = [
                fn.scalar(n, r) if r > 0 else 0.0
                for fn, n, r in zip(
                    self.speedup_fns, nodes[0].tolist(), replicas[0].tolist(), strict=True
                )
            ]
        else:
            for j, fn in enumerate(self.speedup_fns):
                live = replicas[:, j] > 0
                if np.any(live):
                    out[live, j] = fn(nodes[live, j], replicas[live, j])
        out *= self.scale[None, :]
        factor = self.realloc_factor[None, :] * (1.0 - self.switch_margin)
        moved = np.maximum(out * factor - self.payback_penalty[None, :], 0.0)
        return np.where(changed & (replicas > 0), moved, out)

    def fitness_of_speedups(self, speedups: FloatArray) -> FloatArray:
        x = np.asarray(speedups, dtype=np.float64) + self.epsilon
        if x.shape[-1] == 0:
            return np.ones(x.shape[:-1])
        w = self.weights
        if w is not None and w.shape[0] == x.shape[-1]:
            if self.p == 0:
                return np.exp(np.sum(w * np.log(x), axis=-1) / w.sum())
            return (np.sum(w * x**self.p, axis=-1) / w.sum()) ** (1.0 / self.p)
        if self.p == 0:
            return np.exp(np.mean(np.log(x), axis=-1))
        return np.mean(x**self.p, axis=-1) ** (1.0 / self.p)

    def fitness(self, states: IntArray) -> FloatArray:
        """FITNESS_p (eq. 15) of a batch of (P, J, N) states."""
        return self.fitness_of_speedups(self.job_speedups(states))

    # ------------------------------------------------------------- conversion
    def to_allocations(self, state: IntArray) -> dict[str, Allocation]:
        rows = np.asarray(state, dtype=np.int64).tolist()  # one conversion, not J×N
        return {name: tuple(row) for name, row in zip(self.names, rows, strict=True) if any(row)}

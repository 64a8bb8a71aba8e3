"""The goodput model of a data-parallel training job (Pollux, OSDI'21, eq. 5-14).

Everything here is pure and vectorised: the scheduler scores thousands of candidate
allocations per round, the simulator advances hundreds of jobs, and the in-job library
picks its batch size, all with the same functions. Array arguments broadcast together.

Notation (seed 000): an allocation places K = SUM(a) GPUs on N nodes; each GPU processes a
micro-batch of m samples per gradient step and accumulates s extra micro-batches before it
synchronises, so the total batch is M = K * m * (s + 1). M0 is the batch size the user
submitted the job with (and tuned its learning rate for).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from coadapt.goodput._batch_kernel import compiled as compiled_choice

FloatArray = NDArray[np.float64]

#: Number of total-batch candidates tried by :meth:`GoodputModel.optimize` (as the reference
#: implementation does); a geometric grid between the smallest and largest feasible batch.
BATCH_CANDIDATES = 50
_EPS = 1e-8  # tolerance for the floor/ceil of batch splits


@dataclass(frozen=True)
class PerfParams:
    """θ_sys, the 7 parameters of the iteration-time model (seed 000 eq. 9-13).

    ``T_grad(m) = alpha_grad + beta_grad * m`` is one forward/backward pass over a micro-batch
    of m samples on one GPU. ``T_sync`` is the all-reduce of the gradients: zero on one GPU,
    ``alpha_local + beta_local * (K - 2)`` when all K GPUs are on one node and
    ``alpha_node + beta_node * (K - 2)`` across nodes (the slowest link dominates a ring
    all-reduce; beta models the retrogression from adding replicas beyond two).
    ``T_iter = s * T_grad + (T_grad**gamma + T_sync**gamma) ** (1 / gamma)`` (eq. 12): the last
    micro-batch overlaps its backward pass with synchronisation, ``gamma = 1`` meaning no
    overlap (sum) and ``gamma -> inf`` perfect overlap (max); gamma is kept in [1, 10].
    """

    alpha_grad: float  # seconds: fixed cost of one forward/backward pass
    beta_grad: float  # seconds per sample of a forward/backward pass
    alpha_local: float  # seconds: all-reduce latency between GPUs of one node
    beta_local: float  # seconds per replica beyond two, within one node
    alpha_node: float  # seconds: all-reduce latency across nodes
    beta_node: float  # seconds per replica beyond two, across nodes
    gamma: float  # overlap of compute and sync, in [1, 10]

    def as_array(self) -> FloatArray:
        return np.array(
            [
                self.alpha_grad,
                self.beta_grad,
                self.alpha_local,
                self.beta_local,
                self.alpha_node,
                self.beta_node,
                self.gamma,
            ],
            dtype=np.float64,
        )

    @classmethod
    def from_array(cls, values: ArrayLike) -> PerfParams:
        v = np.asarray(values, dtype=np.float64).ravel()
        if v.shape != (7,):
            raise ValueError(f"PerfParams needs 7 values, got {v.shape[0]}")
        return cls(*(float(x) for x in v))


@dataclass(frozen=True)
class GradParams:
    """Gradient statistics behind the statistical efficiency (seed 000 eq. 6-7).

    ``sqr`` estimates |P g|^2, the squared norm of the (pre-conditioned) true gradient, and
    ``var`` estimates tr(P Σ P^T), the (pre-conditioned) gradient noise of a batch of M0
    samples. Their ratio gives the gradient noise scale
    ``phi = M0 * var / sqr`` (PGNS), and ``EFFICIENCY(M) = (phi + M0) / (phi + M)``.
    """

    sqr: float  # |P g|^2, squared norm of the true (pre-conditioned) gradient
    var: float  # tr(P Σ P^T) of the gradient estimate at batch size M0
    # Standard errors of the two estimates (0: taken as exact, as the simulator's traces
    # are). Only the in-job agent reads them (coadapt.goodput.agent), to act on φ only where
    # its decision does not hinge on the estimate's noise; eq. 7 and 14 use sqr and var.
    sqr_err: float = 0.0
    var_err: float = 0.0

    def pgns(self, init_batch_size: float) -> float:
        """The gradient noise scale φ in samples (infinite when the gradient vanishes)."""
        if self.sqr <= 0:
            return float("inf")
        return float(init_batch_size * self.var / self.sqr)


def grad_time(perf: PerfParams, local_bsz: ArrayLike) -> FloatArray:
    """T_grad(m): one forward/backward pass of a micro-batch of ``local_bsz`` samples."""
    return perf.alpha_grad + perf.beta_grad * np.asarray(local_bsz, dtype=np.float64)


def sync_time(perf: PerfParams, num_nodes: ArrayLike, num_replicas: ArrayLike) -> FloatArray:
    """T_sync(a): gradient all-reduce time; 0 for a single GPU (eq. 10)."""
    nodes = np.asarray(num_nodes)
    replicas = np.asarray(num_replicas)
    conds = [nodes > 1, replicas > 1]
    alpha = np.select(conds, [perf.alpha_node, perf.alpha_local], 0.0)
    beta = np.select(conds, [perf.beta_node, perf.beta_local], 0.0)
    return alpha + beta * np.maximum(replicas - 2, 0)


def iter_time(
    perf: PerfParams,
    num_nodes: ArrayLike,
    num_replicas: ArrayLike,
    local_bsz: ArrayLike,
    accum_steps: ArrayLike,
) -> FloatArray:
    """T_iter(a, m, s), eq. 12: s plain micro-steps plus one overlapped with the all-reduce."""
    tg = grad_time(perf, local_bsz)
    ts = sync_time(perf, num_nodes, num_replicas)
    g = perf.gamma
    overlapped = (tg**g + ts**g) ** (1.0 / g)
    return np.asarray(accum_steps, dtype=np.float64) * tg + overlapped


def total_batch(
    num_replicas: ArrayLike, local_bsz: ArrayLike, accum_steps: ArrayLike
) -> FloatArray:
    """M = K * m * (s + 1)."""
    return (
        np.asarray(num_replicas, dtype=np.float64)
        * np.asarray(local_bsz, dtype=np.float64)
        * (np.asarray(accum_steps, dtype=np.float64) + 1.0)
    )


def efficiency(grad: GradParams, init_batch_size: float, batch_size: ArrayLike) -> FloatArray:
    """EFFICIENCY_t(M) = (phi + M0) / (phi + M), eq. 7, in (0, 1] for M >= M0.

    Written as ``gain / scale`` with the AdaScale gain ``(var + sqr) / (var / scale + sqr)``,
    which stays finite when either statistic is zero.
    """
    scale = np.asarray(batch_size, dtype=np.float64) / float(init_batch_size)
    denom = grad.var / scale + grad.sqr
    with np.errstate(divide="ignore", invalid="ignore"):
        gain = np.where(denom > 0, (grad.var + grad.sqr) / np.where(denom > 0, denom, 1.0), 1.0)
    return gain / scale


@dataclass(frozen=True)
class BatchLimits:
    """What the user allows the job to change about its batch (seed 000 §4.1).

    ``max_batch_size`` bounds the total batch M, ``min_local_bsz``/``max_local_bsz`` the
    per-GPU micro-batch m (the upper bound is the GPU memory limit), ``accumulation`` lets the
    job exceed the memory limit with gradient accumulation, and ``pinned_batch`` fixes M (the job
    then only chooses how to split it). ``accumulate_to_measure``: a single replica that grows
    past M0 must accumulate at least once, because the Pollux artifact measures gradient noise
    only between micro-batches; the shipped library also measures it between consecutive
    steps, so its agent turns this off (else one replica never gains throughput by growing).
    """

    init_batch_size: int
    max_batch_size: int
    min_local_bsz: int = 1
    max_local_bsz: int | None = None
    accumulation: bool = True
    pinned_batch: int | None = None
    accumulate_to_measure: bool = True

    def __post_init__(self) -> None:
        if self.init_batch_size < 1:
            raise ValueError(f"init_batch_size must be >= 1, got {self.init_batch_size}")
        if self.max_batch_size < self.init_batch_size:
            raise ValueError(
                f"max_batch_size ({self.max_batch_size}) must be >= init_batch_size "
                f"({self.init_batch_size})"
            )
        if self.min_local_bsz < 1:
            raise ValueError(f"min_local_bsz must be >= 1, got {self.min_local_bsz}")
        if self.max_local_bsz is not None and self.max_local_bsz < self.min_local_bsz:
            raise ValueError(
                f"max_local_bsz ({self.max_local_bsz}) must be >= min_local_bsz "
                f"({self.min_local_bsz})"
            )
        if self.pinned_batch is not None and self.pinned_batch < 1:
            raise ValueError(f"pinned_batch must be >= 1, got {self.pinned_batch}")

    @property
    def upper_local_bsz(self) -> int:
        return self.max_local_bsz if self.max_local_bsz is not None else self.max_batch_size


@dataclass(frozen=True)
class BatchChoice:
    """Result of eq. 14 for each queried allocation (arrays shaped like the query)."""

    goodput: FloatArray  # samples/s weighted by efficiency; 0 where infeasible
    local_bsz: NDArray[np.int64]  # m*
    accum_steps: NDArray[np.int64]  # s*
    num_replicas: NDArray[np.int64]  # K of each queried allocation

    @property
    def total_batch(self) -> FloatArray:
        return total_batch(self.num_replicas, self.local_bsz, self.accum_steps)


@dataclass(frozen=True)
class GoodputModel:
    """GOODPUT(a, m, s) = THROUGHPUT(a, m, s) * EFFICIENCY(M) for one job (eq. 5).

    The job fits ``perf`` from its own profile and measures ``grad``; it ships both to the
    scheduler as plain data, which is why this object is immutable and cheap to build.
    """

    perf: PerfParams
    grad: GradParams
    init_batch_size: int

    def throughput(
        self,
        num_nodes: ArrayLike,
        num_replicas: ArrayLike,
        local_bsz: ArrayLike,
        accum_steps: ArrayLike,
    ) -> FloatArray:
        """Samples per second, eq. 8."""
        t = iter_time(self.perf, num_nodes, num_replicas, local_bsz, accum_steps)
        return total_batch(num_replicas, local_bsz, accum_steps) / t

    def efficiency(self, batch_size: ArrayLike) -> FloatArray:
        return efficiency(self.grad, self.init_batch_size, batch_size)

    def goodput(
        self,
        num_nodes: ArrayLike,
        num_replicas: ArrayLike,
        local_bsz: ArrayLike,
        accum_steps: ArrayLike,
    ) -> FloatArray:
        """Useful (M0-equivalent) samples per second, eq. 5."""
        m = total_batch(num_replicas, local_bsz, accum_steps)
        return self.throughput(num_nodes, num_replicas, local_bsz, accum_steps) * self.efficiency(m)

    def optimize(
        self, num_nodes: ArrayLike, num_replicas: ArrayLike, limits: BatchLimits
    ) -> BatchChoice:
        """Best (m, s) for each allocation (eq. 14), vectorised over allocations.

        Tries ``BATCH_CANDIDATES`` total batches on a geometric grid between
        ``max(M0, K * min_local_bsz)`` and ``max_batch_size`` (or only the pinned batch), splits
        each into the smallest number of accumulation steps whose micro-batch fits the memory
        limit, and keeps the best. A single GPU that grows past M0 accumulates at least once,
        because gradient noise cannot be measured from one micro-batch. Allocations with no
        feasible configuration get goodput 0.
        """
        nodes_b, replicas_b = np.broadcast_arrays(
            np.asarray(num_nodes, dtype=np.int64), np.asarray(num_replicas, dtype=np.int64)
        )
        shape = replicas_b.shape
        q = replicas_b.size
        cols = BatchColumns.of([self] * 1, [limits], [q])
        good, atomic, accum = optimize_columns(cols, nodes_b.ravel(), replicas_b.ravel())
        return BatchChoice(
            goodput=good.reshape(shape),
            local_bsz=atomic.reshape(shape),
            accum_steps=accum.reshape(shape),
            num_replicas=replicas_b.astype(np.int64),
        )


@dataclass(frozen=True)
class BatchColumns:
    """Per-query model parameters and limits, so many jobs' batch choices (eq. 14) run as one
    vectorised computation (the scheduler prices every job of a round in one call)."""

    perf: FloatArray  # (7, Q): θ_sys of the job each query belongs to
    sqr: FloatArray  # (Q,)
    var: FloatArray  # (Q,)
    init_batch: FloatArray  # (Q,) M0
    min_local: FloatArray  # (Q,)
    upper_local: FloatArray  # (Q,)
    max_batch: FloatArray  # (Q,)
    accumulation: NDArray[np.bool_]  # (Q,)
    pinned: FloatArray  # (Q,) pinned total batch, 0 where free
    accumulate_to_measure: NDArray[np.bool_]  # (Q,) one replica past M0 accumulates

    def columns(self, start: int, stop: int) -> BatchColumns:
        """Queries ``start:stop`` (views, no copy)."""
        return BatchColumns(
            perf=self.perf[:, start:stop],
            sqr=self.sqr[start:stop],
            var=self.var[start:stop],
            init_batch=self.init_batch[start:stop],
            min_local=self.min_local[start:stop],
            upper_local=self.upper_local[start:stop],
            max_batch=self.max_batch[start:stop],
            accumulation=self.accumulation[start:stop],
            pinned=self.pinned[start:stop],
            accumulate_to_measure=self.accumulate_to_measure[start:stop],
        )

    @classmethod
    def of(
        cls, models: list[GoodputModel], limits: list[BatchLimits], counts: list[int]
    ) -> BatchColumns:
        """Columns for ``counts[i]`` queries of job i (``models[i]``, ``limits[i]``)."""
        reps = np.asarray(counts, dtype=np.int64)

        def rep(values: list[float]) -> FloatArray:
            return np.repeat(np.asarray(values, dtype=np.float64), reps)

        perf = np.repeat(np.stack([m.perf.as_array() for m in models], axis=1), reps, axis=1)
        return cls(
            perf=perf,
            sqr=rep([m.grad.sqr for m in models]),
            var=rep([m.grad.var for m in models]),
            init_batch=rep([float(lim.init_batch_size) for lim in limits]),
            min_local=rep([float(lim.min_local_bsz) for lim in limits]),
            upper_local=rep([float(lim.upper_local_bsz) for lim in limits]),
            max_batch=rep([float(lim.max_batch_size) for lim in limits]),
            accumulation=np.repeat(np.array([lim.accumulation for lim in limits]), reps),
            pinned=rep([float(lim.pinned_batch or 0) for lim in limits]),
            accumulate_to_measure=np.repeat(
                np.array([lim.accumulate_to_measure for lim in limits]), reps
            ),
        )


#: Queries priced per pass of :func:`optimize_columns`: its ~20 temporaries of
#: ``BATCH_CANDIDATES`` x queries floats then stay in the caches (a round of 1024 jobs on three
#: GPU types asks ~37k queries a type: 15 MB a temporary, freshly paged in, unsliced).
COLUMN_CHUNK = 512
#: Queries from which :func:`optimize_columns` runs the compiled pass. Smaller calls (a
#: cluster of a few nodes, a job's own re-tune) stay on numpy: the same choices, and no
#: numba import and compile (1-3 s, holding the GIL) in a controller that never needs them.
COMPILED_MIN_QUERIES = 512


def optimize_columns(
    cols: BatchColumns, num_nodes: ArrayLike, num_replicas: ArrayLike
) -> tuple[FloatArray, NDArray[np.int64], NDArray[np.int64]]:
    """Eq. 14 for Q queries at once: (goodput, m*, s*) per query; see GoodputModel.optimize.

    From ``COMPILED_MIN_QUERIES`` queries and with numba, one compiled pass
    (:mod:`coadapt.goodput._batch_kernel`, same arithmetic, same choices; goodputs equal or,
    on AVX-512 CPUs, within the last bits); otherwise
    element-wise numpy in slices of ``COLUMN_CHUNK``."""
    nodes = np.asarray(num_nodes, dtype=np.int64).ravel()
    replicas = np.asarray(num_replicas, dtype=np.int64).ravel()
    q = replicas.size
    choose = compiled_choice() if q >= COMPILED_MIN_QUERIES else None
    if choose is not None:
        good = np.empty(q, dtype=np.float64)
        atomic = np.empty(q, dtype=np.int64)
        accum = np.empty(q, dtype=np.int64)
        choose(
            np.ascontiguousarray(cols.perf, dtype=np.float64),
            *(np.ascontiguousarray(a, dtype=np.float64) for a in _float_columns(cols)),
            np.ascontiguousarray(cols.accumulation, dtype=np.bool_),
            np.ascontiguousarray(cols.pinned, dtype=np.float64),
            np.ascontiguousarray(cols.accumulate_to_measure, dtype=np.bool_),
            nodes,
            replicas,
            _candidate_fractions(),
            _EPS,
            good,
            atomic,
            accum,
        )
        return good, atomic, accum
    if q <= COLUMN_CHUNK:
        return _optimize_slice(cols, nodes, replicas)
    good = np.empty(q, dtype=np.float64)
    atomic = np.empty(q, dtype=np.int64)
    accum = np.empty(q, dtype=np.int64)
    for a in range(0, q, COLUMN_CHUNK):
        b = min(a + COLUMN_CHUNK, q)
        good[a:b], atomic[a:b], accum[a:b] = _optimize_slice(
            cols.columns(a, b), nodes[a:b], replicas[a:b]
        )
    return good, atomic, accum


def _float_columns(cols: BatchColumns) -> tuple[FloatArray, ...]:
    return (
        cols.sqr,
        cols.var,
        cols.init_batch,
        cols.min_local,
        cols.upper_local,
        cols.max_batch,
    )


def _candidate_fractions() -> FloatArray:
    return np.linspace(0.0, 1.0, BATCH_CANDIDATES)


def _optimize_slice(
    cols: BatchColumns, num_nodes: ArrayLike, num_replicas: ArrayLike
) -> tuple[FloatArray, NDArray[np.int64], NDArray[np.int64]]:
    nodes = np.asarray(num_nodes, dtype=np.int64).ravel()
    live = np.asarray(num_replicas, dtype=np.int64).ravel() > 0
    replicas = np.maximum(np.asarray(num_replicas, dtype=np.int64).ravel(), 1).astype(np.float64)
    m0 = cols.init_batch
    pinned = cols.pinned > 0
    lo = np.maximum(m0, cols.min_local * replicas)
    hi = np.maximum(cols.max_batch, lo)
    frac = _candidate_fractions()[:, None]
    batch = lo * (hi / lo) ** frac  # geometric grid, (C, Q)
    batch = np.where(pinned, cols.pinned, batch)
    local = batch / replicas
    accum = np.ceil(local / cols.upper_local - _EPS) - 1
    needs_two = (replicas == 1) & (local > m0 + _EPS) & cols.accumulate_to_measure
    accum = np.where(needs_two, np.maximum(accum, 1), accum)
    accum = np.where(cols.accumulation, np.maximum(accum, 0), 0.0)
    atomic = np.ceil(local / (accum + 1) - _EPS)
    # Throughput (eq. 8-12) with per-column θ_sys.
    ag, bg, al, bl, an, bn, gamma = cols.perf
    tg = ag + bg * atomic
    retro = np.maximum(replicas - 2, 0)
    ts = np.where(nodes > 1, an + bn * retro, np.where(replicas > 1, al + bl * retro, 0.0))
    t_iter = accum * tg + (tg**gamma + ts**gamma) ** (1.0 / gamma)
    total = replicas * atomic * (accum + 1)
    # Efficiency (eq. 7) in its AdaScale-gain form.
    scale = total / m0
    denom = cols.var / scale + cols.sqr
    with np.errstate(divide="ignore", invalid="ignore"):
        gain = np.where(denom > 0, (cols.var + cols.sqr) / np.where(denom > 0, denom, 1.0), 1.0)
    good = total / t_iter * gain / scale
    feasible = (atomic <= cols.upper_local) & live
    feasible &= np.where(
        pinned, atomic >= 1, (atomic >= cols.min_local) & (batch <= cols.max_batch + _EPS)
    )
    good = np.where(feasible, good, 0.0)
    best = np.argmax(good, axis=0)
    idx = np.arange(good.shape[1])
    return (
        good[best, idx],
        atomic[best, idx].astype(np.int64),
        accum[best, idx].astype(np.int64),
    )


def should_adopt(current_goodput: float, new_goodput: float, threshold: float = 0.05) -> bool:
    """Adopt a new batch configuration only when it is predicted to be worth a change.

    Changing M perturbs the optimiser (LR rescaling, a new data split), so small predicted
    gains are not worth the churn; the reference implementation uses a 5% threshold.
    """
    if current_goodput <= 0:
        return new_goodput > 0
    return new_goodput > current_goodput * (1.0 + threshold)

"""SPEEDUP_j(A_j), eq. 16: a job's best goodput on an allocation relative to a reference.

The scheduler evaluates it for many candidate allocations each round, so results are memoised
per (nodes, replicas). The goodput model reads the node count only as "one node or several"
(eq. 11's synchronisation term), so the memo is keyed by :func:`shape_key` and every
multi-node spread of K GPUs is priced once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from coadapt.goodput.model import (
    BatchColumns,
    BatchLimits,
    FloatArray,
    GoodputModel,
    optimize_columns,
)


def shape_key(num_nodes: int, num_replicas: int) -> tuple[int, int]:
    """The memo key of an allocation: nodes folded to 1 (one node) or 2 (several)."""
    return (2 if num_nodes > 1 else 1, num_replicas)


def _shape_queries(
    ref: tuple[int, int], prefetch: Sequence[tuple[ArrayLike, ArrayLike] | None]
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Every job's queries in one pair of (nodes, GPUs) arrays, job after job: the reference,
    one GPU (the fallback reference), then the job's distinct prefetched shapes
    (:func:`shape_key`); and each job's number of queries."""
    jobs = len(prefetch)
    parts_n: list[NDArray[np.int64]] = []
    parts_r: list[NDArray[np.int64]] = []
    parts_j: list[NDArray[np.int64]] = []
    for i, shapes in enumerate(prefetch):
        if shapes is None:
            continue
        pn, pr = np.broadcast_arrays(
            np.asarray(shapes[0], dtype=np.int64), np.asarray(shapes[1], dtype=np.int64)
        )
        parts_n.append(pn.ravel())
        parts_r.append(pr.ravel())
        parts_j.append(np.full(pn.size, i, dtype=np.int64))
    empty = np.zeros(0, dtype=np.int64)
    n = np.where(np.concatenate(parts_n) > 1, 2, 1) if parts_n else empty
    r = np.concatenate(parts_r) if parts_r else empty
    job = np.concatenate(parts_j) if parts_j else empty
    low = int(r.min(initial=0))
    span = int(r.max(initial=0)) - low + 1
    keys = np.unique((job * 3 + n) * span + (r - low))  # sorted: by job, then shape
    job_u, n_u, r_u = keys // (3 * span), (keys // span) % 3, keys % span + low
    distinct = np.bincount(job_u, minlength=jobs).astype(np.int64)
    sizes = distinct + 2
    starts = np.cumsum(sizes) - sizes
    nodes = np.empty(int(sizes.sum()), dtype=np.int64)
    replicas = np.empty_like(nodes)
    nodes[starts], replicas[starts] = ref
    nodes[starts + 1], replicas[starts + 1] = 1, 1
    rank = np.arange(keys.size) - (np.cumsum(distinct) - distinct)[job_u]
    at = starts[job_u] + 2 + rank
    nodes[at], replicas[at] = n_u, r_u
    return nodes, replicas, sizes


def _split_shapes(
    shapes: tuple[ArrayLike, ArrayLike], most: int | None
) -> tuple[tuple[ArrayLike, ArrayLike] | None, tuple[ArrayLike, ArrayLike] | None, int]:
    """``shapes`` split into those of at most ``most`` GPUs and the rest (None: none), and
    the fewest GPUs among the rest (0 when there is none)."""
    if most is None:
        return shapes, None, 0
    nodes, gpus = np.broadcast_arrays(
        np.asarray(shapes[0], dtype=np.int64), np.asarray(shapes[1], dtype=np.int64)
    )
    small = gpus <= most
    if small.all():
        return shapes, None, 0
    first = (nodes[small], gpus[small]) if small.any() else None
    return first, (nodes[~small], gpus[~small]), int(gpus[~small].min())


class SpeedupFunction:
    """Speedup of one job versus a reference allocation (the fair share, eq. 16).

    A job with no fitted model yet is assumed to scale perfectly (the optimistic prior):
    speedup = K / K_ref.
    """

    def __init__(
        self,
        model: GoodputModel | None,
        limits: BatchLimits,
        ref_nodes: int = 1,
        ref_replicas: int = 1,
        prefetch: tuple[ArrayLike, ArrayLike] | None = None,
    ) -> None:
        if ref_replicas < 1 or ref_nodes < 1 or ref_nodes > ref_replicas:
            raise ValueError(f"bad reference allocation: {ref_nodes} nodes, {ref_replicas} GPUs")
        self.model = model
        self.limits = limits
        self.ref_nodes = ref_nodes
        self.ref_replicas = ref_replicas
        self._memo: dict[tuple[int, int], float] = {}
        self._base = float(ref_replicas)
        # Shapes build_many(defer=True) left to price on first use (see fill_many).
        self._pending: tuple[ArrayLike, ArrayLike] | None = None
        self._pending_least = 0  # fewest GPUs among the deferred shapes (0: not known)
        if model is None:
            return
        nodes, replicas = self._queries(prefetch)
        self._absorb(
            nodes, replicas, model.optimize(np.array(nodes), np.array(replicas), limits).goodput
        )

    def _queries(self, prefetch: tuple[ArrayLike, ArrayLike] | None) -> tuple[list[int], list[int]]:
        """The reference, one GPU (fallback reference) and the distinct prefetched shapes."""
        nodes, replicas, _ = _shape_queries(
            shape_key(self.ref_nodes, self.ref_replicas), [prefetch]
        )
        return nodes.tolist(), replicas.tolist()

    def _absorb(self, nodes: list[int], replicas: list[int], good: FloatArray) -> None:
        # The reference may itself be infeasible (fair share below the minimum micro-batch
        # split): fall back to one GPU, which is always feasible.
        base = float(good[0]) if good[0] > 0 else float(good[1])
        self._base = base if base > 0 else 1.0
        values = (np.asarray(good) / self._base).tolist()
        self._memo.update(zip(zip(nodes, replicas, strict=True), values, strict=True))

    @classmethod
    def build_many(
        cls,
        models: list[GoodputModel | None],
        limits: list[BatchLimits],
        ref_nodes: int,
        ref_replicas: int,
        prefetch: Sequence[tuple[ArrayLike, ArrayLike] | None],
        defer: bool = False,
    ) -> list[SpeedupFunction]:
        """Speedup functions for many jobs, priced in two vectorised batch-choice calls, the
        references and then every table (what each job's own constructor would price, in
        whole-array steps: a 2048-GPU round builds ~3000 of these).

        ``defer``: price only the references now and keep each job's prefetch shapes for
        :meth:`fill_many` (or the first look-up that misses): a type-aware round builds every
        job's table on every type it may use, and most of them are never read. The values are
        the same either way (the batch choice is element-wise)."""
        fns = [cls(None, lim, ref_nodes, ref_replicas) for lim in limits]
        fitted = [i for i, m in enumerate(models) if m is not None]
        if not fitted:
            return fns
        # The references first (every speedup is relative to them), the tables after.
        nodes, replicas, sizes = _shape_queries(
            shape_key(ref_nodes, ref_replicas), [None] * len(fitted)
        )
        cols = BatchColumns.of(
            [models[i] for i in fitted],  # type: ignore[misc]
            [limits[i] for i in fitted],
            sizes.tolist(),
        )
        good, _, _ = optimize_columns(cols, nodes, replicas)
        starts = np.cumsum(sizes) - sizes
        # As _absorb: the reference, else one GPU, else 1.
        base = np.where(good[starts] > 0, good[starts], good[starts + 1])
        base = np.where(base > 0, base, 1.0)
        values = (good / np.repeat(base, sizes)).tolist()
        keys = list(zip(nodes.tolist(), replicas.tolist(), strict=True))
        bounds = zip(starts.tolist(), (starts + sizes).tolist(), base.tolist(), strict=True)
        for i, (a, b, ref_goodput) in zip(fitted, bounds, strict=True):
            fn = fns[i]
            fn.model = models[i]
            fn._base = ref_goodput
            fn._memo = dict(zip(keys[a:b], values[a:b], strict=True))
            fn._pending = prefetch[i]
        if not defer:
            SpeedupFunction.fill_many([fns[i] for i in fitted])
        return fns

    @staticmethod
    def fill_many(fns: list[SpeedupFunction], upto: Sequence[int] | None = None) -> None:
        """Price the deferred shapes of ``fns`` in one batch-choice call (see build_many);
        ``upto``: per job, only the shapes of at most that many GPUs (the rest stay deferred,
        priced by the first look-up that misses)."""
        todo: list[SpeedupFunction] = []
        now: list[tuple[ArrayLike, ArrayLike]] = []
        later: list[tuple[ArrayLike, ArrayLike] | None] = []
        leasts: list[int] = []
        for i, fn in enumerate(fns):
            if fn._pending is None or (upto is not None and upto[i] < fn._pending_least):
                continue  # nothing deferred within the window (asked again every solve)
            first, rest, least = _split_shapes(fn._pending, None if upto is None else upto[i])
            if first is None:
                fn._pending_least = least
                continue
            todo.append(fn)
            now.append(first)
            later.append(rest)
            leasts.append(least)
        if not todo:
            return
        ref = shape_key(todo[0].ref_nodes, todo[0].ref_replicas)
        if any(shape_key(fn.ref_nodes, fn.ref_replicas) != ref for fn in todo):
            for fn in todo:  # references differ: one call each (never within a problem)
                SpeedupFunction.fill_many([fn])
            return
        nodes, replicas, sizes = _shape_queries(ref, now)
        cols = BatchColumns.of(
            [fn.model for fn in todo],  # type: ignore[misc]
            [fn.limits for fn in todo],
            sizes.tolist(),
        )
        good, _, _ = optimize_columns(cols, nodes, replicas)
        base = np.array([fn._base for fn in todo], dtype=np.float64)
        values = (good / np.repeat(base, sizes)).tolist()
        keys = list(zip(nodes.tolist(), replicas.tolist(), strict=True))
        starts = (np.cumsum(sizes) - sizes).tolist()
        for fn, rest, least, a, size in zip(
            todo, later, leasts, starts, sizes.tolist(), strict=True
        ):
            # The references are priced already (the same values): the shapes after them.
            fn._memo.update(zip(keys[a + 2 : a + size], values[a + 2 : a + size], strict=True))
            fn._pending, fn._pending_least = rest, least

    @property
    def reference_goodput(self) -> float:
        """The goodput every speedup is relative to (GPUs on the reference for a job without
        a model), so speedups of one job on different GPU types can be put on one scale."""
        return self._base

    def scalar(self, num_nodes: int, num_replicas: int) -> float:
        """Fast path for one allocation (the optimiser's inner loop)."""
        if self.model is None:
            return num_replicas / self._base if num_replicas > 0 else 0.0
        value = self._memo.get((2 if num_nodes > 1 else 1, num_replicas))
        if value is None:
            if self._pending is not None:
                SpeedupFunction.fill_many([self])
                return self.scalar(num_nodes, num_replicas)
            value = float(self(np.array([num_nodes]), np.array([num_replicas]))[0])
        return value

    def __call__(self, num_nodes: ArrayLike, num_replicas: ArrayLike) -> FloatArray:
        SpeedupFunction.fill_many([self])
        nodes = np.asarray(num_nodes, dtype=np.int64)
        replicas = np.asarray(num_replicas, dtype=np.int64)
        nodes, replicas = np.broadcast_arrays(nodes, replicas)
        flat_n = np.where(nodes.ravel() > 1, 2, 1)
        flat_r = replicas.ravel()
        out = np.empty(flat_r.size, dtype=np.float64)
        missing: list[int] = []
        for i, key in enumerate(zip(flat_n.tolist(), flat_r.tolist(), strict=True)):
            value = self._memo.get(key)
            if value is None:
                missing.append(i)
            else:
                out[i] = value
        if missing:
            idx = np.asarray(missing)
            keys = np.unique(np.stack([flat_n[idx], flat_r[idx]]), axis=1)
            values = self._evaluate(keys[0], keys[1])
            for n, r, v in zip(keys[0].tolist(), keys[1].tolist(), values.tolist(), strict=True):
                self._memo[(n, r)] = v
            for i in missing:
                out[i] = self._memo[(int(flat_n[i]), int(flat_r[i]))]
        return out.reshape(replicas.shape)

    def _evaluate(self, nodes: FloatArray, replicas: FloatArray) -> FloatArray:
        result = np.zeros(replicas.shape, dtype=np.float64)
        live = replicas > 0
        if not np.any(live):
            return result
        if self.model is None:
            result[live] = replicas[live] / self._base
            return result
        choice = self.model.optimize(np.maximum(nodes[live], 1), replicas[live], self.limits)
        result[live] = choice.goodput / self._base
        return result

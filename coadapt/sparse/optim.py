"""Row optimizers that run on the parameter servers, in place on embedding-table rows.

A table row is ``float32[dim + opt.state_width(dim)]``: the embedding weights first, then the
optimizer's per-row state. The store hands ``(n, width)`` rows of the *unique* ids of a push and
their ``(n, dim)`` gradients (already summed per id); the optimizer updates both halves in
place. Everything is vectorised float32 numpy with a fixed operation order, so the same inputs
give bit-identical rows on every run (no threads, no reductions whose order can change).
With numba installed, SGD, both AdaGrads and FTRL run a compiled one-pass kernel instead
(:mod:`coadapt.sparse._optim_kernels`; same float32 math, tested against this numpy path).

Implemented: SGD, AdaGrad element-wise (``torch.optim.Adagrad`` semantics) and row-wise (one
accumulator per row, FBGEMM's "row-wise AdaGrad"), FTRL-Proximal (McMahan et al., KDD 2013) and
lazy Adam. Dense parameters keep using ``torch.optim`` as usual.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Protocol, runtime_checkable

import numpy as np

from coadapt.sparse._optim_kernels import fused_apply

__all__ = [
    "SGD",
    "AdaGrad",
    "Adam",
    "Ftrl",
    "RowOptimizer",
    "RowwiseAdaGrad",
    "make_row_optimizer",
    "row_optimizer_names",
]

_F32 = np.float32


@runtime_checkable
class RowOptimizer(Protocol):
    """The contract between the embedding store and a server-side optimizer."""

    @property
    def name(self) -> str:
        """The registry name (``make_row_optimizer``); the fused kernels dispatch on it."""
        ...

    def state_width(self, dim: int) -> int:
        """Number of float32 state columns stored after the ``dim`` weights of each row."""
        ...

    def init_rows(self, rows: np.ndarray, dim: int, rng: np.random.Generator) -> None:
        """Fill freshly created rows (weights and state) in place; ``rows`` is (n, width)."""
        ...

    def apply(self, rows: np.ndarray, grads: np.ndarray, dim: int, step: int) -> None:
        """One update in place on (n, width) rows from (n, dim) gradients of unique ids."""
        ...


def _check(name: str, rows: np.ndarray, grads: np.ndarray | None, dim: int, sw: int) -> None:
    if not isinstance(rows, np.ndarray) or rows.dtype != _F32 or rows.ndim != 2:
        raise TypeError(
            f"{name}: rows must be a float32 (n, dim + state_width) numpy array, got "
            f"{type(rows).__name__} {getattr(rows, 'dtype', '?')} {getattr(rows, 'shape', '?')}"
        )
    if dim <= 0:
        raise ValueError(f"{name}: dim must be positive, got {dim}")
    if rows.shape[1] != dim + sw:
        raise ValueError(
            f"{name}: rows have {rows.shape[1]} columns but dim={dim} needs dim + state_width = "
            f"{dim + sw}; allocate the table with width = dim + opt.state_width(dim)"
        )
    if not rows.flags.writeable:
        raise ValueError(f"{name}: rows must be writeable (the update is in place)")
    if grads is not None and (
        not isinstance(grads, np.ndarray)
        or grads.dtype != _F32
        or grads.shape != (rows.shape[0], dim)
    ):
        raise ValueError(
            f"{name}: grads must be float32 with shape ({rows.shape[0]}, {dim}), got "
            f"{getattr(grads, 'dtype', type(grads).__name__)} {getattr(grads, 'shape', '?')}"
        )


def _fused(opt: Any, rows: np.ndarray, grads: np.ndarray, dim: int, step: int) -> bool:
    """The compiled one-pass update on gathered rows (``_optim_kernels``); False → numpy."""
    if not (rows.flags.c_contiguous and grads.flags.c_contiguous):
        return False
    slots = np.arange(rows.shape[0], dtype=np.int64)  # the gathered rows, one each
    return fused_apply(opt, rows, slots, grads, dim, step, unique=True)


def _positive(owner: str, **values: float) -> None:
    for key, value in values.items():
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ValueError(f"{owner}: {key} must be a finite number > 0, got {value!r}")


def _non_negative(owner: str, **values: float) -> None:
    for key, value in values.items():
        if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{owner}: {key} must be a finite number >= 0, got {value!r}")


def _init_weights(rows: np.ndarray, dim: int, rng: np.random.Generator, scale: float) -> None:
    if scale > 0:
        rows[:, :dim] = rng.uniform(-scale, scale, size=(rows.shape[0], dim)).astype(_F32)
    else:
        rows[:, :dim] = 0.0


@dataclass(frozen=True)
class SGD:
    """Plain SGD: no state. ``w -= lr * g``."""

    lr: float = 0.01
    init_scale: float = 0.01
    name: str = "sgd"

    def __post_init__(self) -> None:
        _positive("sgd", lr=self.lr)
        _non_negative("sgd", init_scale=self.init_scale)

    def state_width(self, dim: int) -> int:
        return 0

    def init_rows(self, rows: np.ndarray, dim: int, rng: np.random.Generator) -> None:
        _check(self.name, rows, None, dim, 0)
        _init_weights(rows, dim, rng, self.init_scale)

    def apply(self, rows: np.ndarray, grads: np.ndarray, dim: int, step: int) -> None:
        _check(self.name, rows, grads, dim, 0)
        if not _fused(self, rows, grads, dim, step):
            self._numpy(rows, grads, dim, step)

    def _numpy(self, rows: np.ndarray, grads: np.ndarray, dim: int, step: int) -> None:
        rows[:, :dim] -= _F32(self.lr) * grads


@dataclass(frozen=True)
class AdaGrad:
    """Element-wise AdaGrad, the update of ``torch.optim.Adagrad`` (lr_decay=0, no decay).

    ``s += g²;  w -= lr * g / (sqrt(s) + eps)`` with one accumulator per weight (state width
    ``dim``): the most accurate, but it doubles the row's memory.
    """

    lr: float = 0.01
    eps: float = 1e-10
    initial_accumulator_value: float = 0.0
    init_scale: float = 0.01
    name: str = "adagrad"

    def __post_init__(self) -> None:
        _positive("adagrad", lr=self.lr, eps=self.eps)
        _non_negative(
            "adagrad",
            initial_accumulator_value=self.initial_accumulator_value,
            init_scale=self.init_scale,
        )

    def state_width(self, dim: int) -> int:
        return dim

    def init_rows(self, rows: np.ndarray, dim: int, rng: np.random.Generator) -> None:
        _check(self.name, rows, None, dim, dim)
        _init_weights(rows, dim, rng, self.init_scale)
        rows[:, dim:] = _F32(self.initial_accumulator_value)

    def apply(self, rows: np.ndarray, grads: np.ndarray, dim: int, step: int) -> None:
        _check(self.name, rows, grads, dim, dim)
        if not _fused(self, rows, grads, dim, step):
            self._numpy(rows, grads, dim, step)

    def _numpy(self, rows: np.ndarray, grads: np.ndarray, dim: int, step: int) -> None:
        acc = rows[:, dim:]
        acc += grads * grads
        denom = np.sqrt(acc)
        denom += _F32(self.eps)
        rows[:, :dim] -= _F32(self.lr) * grads / denom


@dataclass(frozen=True)
class RowwiseAdaGrad:
    """Row-wise AdaGrad: one accumulator per row holding the running mean of ``g²``.

    ``s += mean(g²);  w -= lr * g / (sqrt(s) + eps)`` — FBGEMM/TorchRec's fused row-wise
    AdaGrad. State width 1, so a dim-64 row grows by 1.6 % instead of 100 %.
    """

    lr: float = 0.01
    eps: float = 1e-10
    initial_accumulator_value: float = 0.0
    init_scale: float = 0.01
    name: str = "rowwise_adagrad"

    def __post_init__(self) -> None:
        _positive("rowwise_adagrad", lr=self.lr, eps=self.eps)
        _non_negative(
            "rowwise_adagrad",
            initial_accumulator_value=self.initial_accumulator_value,
            init_scale=self.init_scale,
        )

    def state_width(self, dim: int) -> int:
        return 1

    def init_rows(self, rows: np.ndarray, dim: int, rng: np.random.Generator) -> None:
        _check(self.name, rows, None, dim, 1)
        _init_weights(rows, dim, rng, self.init_scale)
        rows[:, dim] = _F32(self.initial_accumulator_value)

    def apply(self, rows: np.ndarray, grads: np.ndarray, dim: int, step: int) -> None:
        _check(self.name, rows, grads, dim, 1)
        if not _fused(self, rows, grads, dim, step):
            self._numpy(rows, grads, dim, step)

    def _numpy(self, rows: np.ndarray, grads: np.ndarray, dim: int, step: int) -> None:
        acc = rows[:, dim : dim + 1]
        # float32 sum over a fixed-length axis: deterministic (numpy's pairwise order is fixed).
        acc += np.sum(grads * grads, axis=1, dtype=_F32, keepdims=True) / _F32(dim)
        # one (n, 1) step size per row, then one full-size temporary (lr * g / d made two)
        step_size = np.sqrt(acc)
        step_size += _F32(self.eps)
        np.divide(_F32(self.lr), step_size, out=step_size)
        rows[:, :dim] -= np.multiply(grads, step_size)


@dataclass(frozen=True)
class Ftrl:
    """FTRL-Proximal (McMahan et al. 2013, Algorithm 1), per coordinate.

    State per weight: ``z`` and ``n`` (width ``2*dim``). For a gradient ``g``::

        sigma = (sqrt(n + g²) - sqrt(n)) / alpha
        z += g - sigma * w;   n += g²
        w = 0                                           if |z| <= l1
        w = -(z - sign(z) * l1) / ((beta + sqrt(n)) / alpha + l2)   otherwise

    The weights are always recomputed from (z, n) — never updated incrementally — so L1 puts
    exact zeros in weak coordinates: real sparsity the store can exploit.
    ``init_scale > 0`` starts weights uniform random (for embeddings that must break symmetry)
    by choosing ``z`` so the closed form reproduces them; 0 is the classic all-zero start.
    """

    alpha: float = 0.05
    beta: float = 1.0
    l1: float = 0.0
    l2: float = 0.0
    init_scale: float = 0.0
    name: str = "ftrl"

    def __post_init__(self) -> None:
        _positive("ftrl", alpha=self.alpha)
        _non_negative("ftrl", beta=self.beta, l1=self.l1, l2=self.l2, init_scale=self.init_scale)
        if self.beta == 0 and self.l2 == 0:
            raise ValueError(
                "ftrl: beta and l2 are both 0, so the first step divides by zero; use beta > 0 "
                "(McMahan et al. use beta = 1)"
            )

    def state_width(self, dim: int) -> int:
        return 2 * dim

    def init_rows(self, rows: np.ndarray, dim: int, rng: np.random.Generator) -> None:
        _check(self.name, rows, None, dim, 2 * dim)
        _init_weights(rows, dim, rng, self.init_scale)
        w = rows[:, :dim]
        # n = 0 → denominator beta/alpha + l2; invert the closed form for z.
        c = _F32(self.beta / self.alpha + self.l2)
        rows[:, dim : 2 * dim] = -(w * c) - np.sign(w) * _F32(self.l1)
        rows[:, 2 * dim :] = 0.0

    def apply(self, rows: np.ndarray, grads: np.ndarray, dim: int, step: int) -> None:
        _check(self.name, rows, grads, dim, 2 * dim)
        if not _fused(self, rows, grads, dim, step):
            self._numpy(rows, grads, dim, step)

    def _numpy(self, rows: np.ndarray, grads: np.ndarray, dim: int, step: int) -> None:
        w = rows[:, :dim]
        z = rows[:, dim : 2 * dim]
        n = rows[:, 2 * dim :]
        inv_alpha = _F32(1.0 / self.alpha)
        sqrt_n = np.sqrt(n)
        n += grads * grads
        sqrt_new = np.sqrt(n)
        sigma = (sqrt_new - sqrt_n) * inv_alpha
        z += grads - sigma * w
        self._weights(w, z, sqrt_new)

    def _weights(self, w: np.ndarray, z: np.ndarray, sqrt_n: np.ndarray) -> None:
        l1 = _F32(self.l1)
        denom = (_F32(self.beta) + sqrt_n) * _F32(1.0 / self.alpha) + _F32(self.l2)
        shrunk = np.abs(z) - l1
        np.maximum(shrunk, _F32(0.0), out=shrunk)
        w[...] = -np.sign(z) * shrunk / denom


@dataclass(frozen=True)
class Adam:
    """Lazy Adam: moments of a row move only when the row gets a gradient.

    Bias correction uses the global ``step`` (1-based), as TensorFlow's LazyAdam does; rare ids
    therefore get slightly larger corrections than dense Adam would give them. State ``2*dim``.
    """

    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    init_scale: float = 0.01
    name: str = "adam"

    def __post_init__(self) -> None:
        _positive("adam", lr=self.lr, eps=self.eps)
        _non_negative("adam", init_scale=self.init_scale)
        for key in ("beta1", "beta2"):
            value = getattr(self, key)
            if not (isinstance(value, int | float) and 0 <= value < 1):
                raise ValueError(f"adam: {key} must be in [0, 1), got {value!r}")

    def state_width(self, dim: int) -> int:
        return 2 * dim

    def init_rows(self, rows: np.ndarray, dim: int, rng: np.random.Generator) -> None:
        _check(self.name, rows, None, dim, 2 * dim)
        _init_weights(rows, dim, rng, self.init_scale)
        rows[:, dim:] = 0.0

    def apply(self, rows: np.ndarray, grads: np.ndarray, dim: int, step: int) -> None:
        _check(self.name, rows, grads, dim, 2 * dim)
        if step < 1:
            raise ValueError(f"adam: step must be >= 1 (bias correction), got {step}")
        m = rows[:, dim : 2 * dim]
        v = rows[:, 2 * dim :]
        b1, b2 = _F32(self.beta1), _F32(self.beta2)
        m *= b1
        m += (_F32(1.0) - b1) * grads
        v *= b2
        v += (_F32(1.0) - b2) * grads * grads
        c1 = _F32(1.0 - self.beta1**step)
        c2 = _F32(1.0 - self.beta2**step)
        denom = np.sqrt(v / c2)
        denom += _F32(self.eps)
        rows[:, :dim] -= _F32(self.lr) * (m / c1) / denom


_REGISTRY: dict[str, type[Any]] = {
    "sgd": SGD,
    "adagrad": AdaGrad,
    "rowwise_adagrad": RowwiseAdaGrad,
    "ftrl": Ftrl,
    "adam": Adam,
}
_ALIASES = {
    "adagrad_rowwise": "rowwise_adagrad",
    "row_wise_adagrad": "rowwise_adagrad",
    "ftrl_proximal": "ftrl",
    "lazy_adam": "adam",
}


def row_optimizer_names() -> list[str]:
    """The names ``make_row_optimizer`` accepts (aliases excluded)."""
    return sorted(_REGISTRY)


def make_row_optimizer(name: str, **hparams: float) -> RowOptimizer:
    """Build a row optimizer by name, e.g. ``make_row_optimizer("ftrl", alpha=0.1, l1=1.0)``."""
    key = _ALIASES.get(name.lower().replace("-", "_"), name.lower().replace("-", "_"))
    cls = _REGISTRY.get(key)
    if cls is None:
        raise ValueError(
            f"unknown row optimizer {name!r}; choose one of {', '.join(row_optimizer_names())}"
        )
    allowed = [f.name for f in fields(cls) if f.name != "name"]
    unknown = sorted(set(hparams) - set(allowed))
    if unknown:
        raise ValueError(
            f"row optimizer {key!r} has no hyper-parameter(s) {', '.join(unknown)}; "
            f"it accepts {', '.join(allowed)}"
        )
    opt: RowOptimizer = cls(**hparams)
    return opt

"""Compiled kernels for the hot paths (numba), with the same code on numpy as the fallback.

Why: a vectorised numpy probe of the embedding table makes ~20 passes over a batch of IDs and
runs on one core, and the scheduler's batch choice builds ~20 temporaries per candidate grid;
FBGEMM (TorchRec) and Monolith's C++ tables do one pass per key. numba compiles plain Python
loops to machine code with no compiler on the machine (a PyPI wheel, a core dependency); a
platform without it keeps the exact numpy paths. Both paths are tested against each other.

``COADAPT_NO_JIT=1`` forces the numpy path (for comparisons and for debugging a kernel).
Compiled code is cached on disk so only the first process on a machine pays the compile:
``NUMBA_CACHE_DIR`` when set, else ``~/.cache/coadapt/numba`` when writable, else a per-user
directory under the system temp dir (tenant replicas run with no home directory).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

__all__ = ["ENV_NO_JIT", "jit_available", "kernel"]

ENV_NO_JIT = "COADAPT_NO_JIT"

F = TypeVar("F", bound=Callable[..., Any])


def _writable_dir(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK | os.X_OK)


def _cache_dir() -> str:
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    preferred = os.path.join(home, "coadapt", "numba")
    if _writable_dir(preferred):
        return preferred
    return os.path.join(tempfile.gettempdir(), f"coadapt-numba-{os.getuid()}")


@cache
def jit_available() -> bool:
    """True when numba can be imported and ``COADAPT_NO_JIT`` is not set to a true value."""
    if os.environ.get(ENV_NO_JIT, "").strip().lower() in {"1", "true", "yes", "on"}:
        return False
    os.environ.setdefault("NUMBA_CACHE_DIR", _cache_dir())
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def kernel(**options: Any) -> Callable[[F], F | None]:
    """Decorator: ``fn`` compiled with ``numba.njit(nogil=True, cache=True, **options)``, or
    ``None`` when numba is unavailable, so callers write ``if _k is not None: ... else: numpy``.

    Compilation is lazy (first call); call a kernel once on tiny inputs at start-up where the
    first request's latency matters. A cache directory numba cannot use costs a compile per
    process, never an error.
    """

    def wrap(fn: F) -> F | None:
        if not jit_available():
            return None
        import numba

        opts = {"nogil": True, **options}
        try:
            return numba.njit(cache=True, **opts)(fn)  # type: ignore[no-any-return,unused-ignore]
        except RuntimeError:  # no usable cache locator for this file
            return numba.njit(cache=False, **opts)(fn)  # type: ignore[no-any-return,unused-ignore]

    return wrap

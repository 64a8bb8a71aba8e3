"""The optional-kernel shim: compiled when numba is there, None (numpy path) when disabled."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from coadapt import _jit


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    _jit.jit_available.cache_clear()
    yield
    _jit.jit_available.cache_clear()


def _add_one(a):  # type: ignore[no-untyped-def]
    out = np.empty_like(a)
    for i in range(a.size):
        out[i] = a[i] + 1
    return out


def test_disabled_by_env_gives_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_jit.ENV_NO_JIT, "1")
    assert not _jit.jit_available()
    assert _jit.kernel()(_add_one) is None


def test_compiled_kernel_matches_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_jit.ENV_NO_JIT, raising=False)
    assert _jit.jit_available()
    k = _jit.kernel()(_add_one)
    assert k is not None
    a = np.arange(5, dtype=np.int64)
    np.testing.assert_array_equal(k(a), a + 1)


def test_cache_dir_falls_back_to_tmp(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant replica has no writable home: the cache goes to a per-user temp directory."""
    monkeypatch.setattr(_jit, "_writable_dir", lambda path: False)
    monkeypatch.setattr(_jit.tempfile, "gettempdir", lambda: "/tmp-x")
    assert _jit._cache_dir() == f"/tmp-x/coadapt-numba-{_jit.os.getuid()}"

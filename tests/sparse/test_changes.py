"""The change log says exactly which keys changed since a base export, and survives an export
that was never committed."""

from __future__ import annotations

import numpy as np
import pytest

from coadapt.sparse.changes import ChangeLog, UnknownBaseError


def _u(*xs: int) -> np.ndarray:
    return np.array(xs, np.uint64)


def test_nothing_is_recorded_before_the_first_export() -> None:
    log = ChangeLog()
    log.record(_u(1, 2, 3))
    assert log.nbytes() == 0
    with pytest.raises(UnknownBaseError, match="publish a full version"):
        log.since("v1")


def test_delta_carries_the_keys_changed_since_its_base() -> None:
    log = ChangeLog()
    log.seal("v1", None)
    log.record(_u(5, 3, 5))
    log.record(_u(9))
    assert log.since("v1").tolist() == [3, 5, 9]
    log.seal("v2", "v1")
    log.record(_u(1))
    assert log.since("v2").tolist() == [1]
    # v2 was never committed: a delta on v1 again still sees everything after v1
    assert log.since("v1").tolist() == [1, 3, 5, 9]
    log.seal("v3", "v2")  # v2 committed: v1 is forgotten
    assert log.bases() == ["v2", "v3"]
    with pytest.raises(UnknownBaseError):
        log.since("v1")


def test_the_log_stays_deduplicated_when_it_grows() -> None:
    log = ChangeLog()
    log.seal("v1", None)
    rng = np.random.default_rng(0)
    for _ in range(40):  # 40 x 64k pushes of the same 1000 keys
        log.record(rng.integers(0, 1000, 1 << 16).astype(np.uint64))
    assert log.nbytes() <= 8 * ((1 << 16) * 17)  # compacted, not 40 x 64k keys
    assert log.since("v1").size == 1000


def test_forget_makes_the_next_export_full() -> None:
    log = ChangeLog()
    log.seal("v1", None)
    log.record(_u(1))
    log.forget()
    with pytest.raises(UnknownBaseError):
        log.since("v1")

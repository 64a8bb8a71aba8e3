"""Retention and the rollback target, as pure functions of versions and promotions."""

from __future__ import annotations

from coadapt.registry.config import Retention
from coadapt.registry.retention import dependants, rollback_target, to_delete
from coadapt.registry.states import VersionState as S
from coadapt.registry.store import Promotion, Version


def v(n: int, state: S, kind: str = "full", parent: int | None = None) -> Version:
    return Version(
        model_id=1, version=f"{n:08d}", kind=kind,
        parent=f"{parent:08d}" if parent is not None else None, manifest_sha256="0" * 64,
        size_bytes=1, job_id=None, step=None, data_offset=None, created_at=float(n),
        registered_at=float(n), state=state, reason=None, checks=[], validated_at=None,
    )  # fmt: skip


def p(frm: int | None, to: int, action: str = "promote") -> Promotion:
    return Promotion(action, f"{frm:08d}" if frm else None, f"{to:08d}", "alice", float(to))


def names(*ns: int) -> list[str]:
    return [f"{n:08d}" for n in ns]


def test_keeps_the_newest_passed_plus_live_and_previous_live() -> None:
    versions = [
        v(1, S.RETIRED), v(2, S.LIVE), v(3, S.PASSED), v(4, S.FAILED), v(5, S.PASSED),
        v(6, S.FAILED), v(7, S.PASSED), v(8, S.REGISTERED), v(9, S.VALIDATING),
    ]  # fmt: skip
    history = [p(None, 1), p(1, 2)]
    rules = Retention(keep_passed=2, keep_failed=1)
    # kept: 7, 5 (newest passed), 2 (live), 1 (previous live), 6 (newest failed), 8, 9
    assert to_delete(versions, history, rules) == names(4, 3)
    assert to_delete(versions, history, Retention(keep_passed=2, keep_failed=0)) == names(6, 4, 3)


def test_deltas_keep_their_bases_transitively() -> None:
    versions = [
        v(1, S.PASSED), v(2, S.PASSED, "delta", 1), v(3, S.PASSED, "delta", 2),
        v(4, S.PASSED), v(5, S.PASSED, "delta", 4), v(6, S.LIVE, "delta", 3),
    ]  # fmt: skip
    # keep_passed=1 keeps 6 (live, newest); 6 -> 3 -> 2 -> 1 stay as its chain; 4 and 5 go
    assert to_delete(versions, [p(None, 6)], Retention(keep_passed=1)) == names(5, 4)


def test_rollback_walks_back_through_earlier_live_versions() -> None:
    versions = [v(1, S.RETIRED), v(2, S.RETIRED), v(3, S.LIVE)]
    history = [p(None, 1), p(1, 2), p(2, 3)]
    assert rollback_target(history, versions) == "00000002"
    # after rolling back to 2, the next rollback goes to 1, not back to 3
    versions = [v(1, S.RETIRED), v(2, S.LIVE), v(3, S.RETIRED)]
    history.append(p(3, 2, "rollback"))
    assert rollback_target(history, versions) == "00000001"
    versions = [v(1, S.LIVE), v(2, S.RETIRED), v(3, S.RETIRED)]
    history.append(p(2, 1, "rollback"))
    assert rollback_target(history, versions) is None  # nothing was live before 1


def test_no_rollback_target_without_a_live_or_a_surviving_previous() -> None:
    assert rollback_target([], [v(1, S.PASSED)]) is None
    assert rollback_target([p(1, 2)], [v(2, S.LIVE)]) is None  # 1 was deleted
    assert rollback_target([p(1, 2)], [v(1, S.FAILED), v(2, S.LIVE)]) is None


def test_dependants() -> None:
    versions = [v(1, S.PASSED), v(2, S.PASSED, "delta", 1), v(3, S.PASSED, "delta", 1)]
    assert dependants("00000001", versions) == names(2, 3)
    assert dependants("00000002", versions) == []

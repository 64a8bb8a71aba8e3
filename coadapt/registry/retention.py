"""Which versions stay on disk, and which one a rollback returns to: pure functions of the
versions and the promotion history (no I/O; the runner deletes what :func:`to_delete` names).

Kept: the live version, the previous live one (the rollback target), the newest
``keep_passed`` versions that passed their gates, the newest ``keep_failed`` failed ones (to
inspect), every version whose gates have not run yet, and the parents of every kept delta,
transitively (a delta is useless without its base).
"""

from __future__ import annotations

from collections.abc import Sequence

from coadapt.registry.config import Retention
from coadapt.registry.states import VersionState
from coadapt.registry.store import Promotion, Version

ROLLBACK = "rollback"


def rollback_target(promotions: Sequence[Promotion], versions: Sequence[Version]) -> str | None:
    """The version that was live before the live one, if it still exists and passed.

    Rollbacks themselves are skipped in the history, so repeated rollbacks walk back through
    earlier live versions (A → B → C, rollback: B, rollback: A) instead of bouncing."""
    by_name = {v.version: v for v in versions}
    live = next((v.version for v in versions if v.state is VersionState.LIVE), None)
    if live is None:
        return None
    for p in reversed(promotions):
        if p.action == ROLLBACK or p.to_version != live:
            continue
        if p.from_version is None:
            return None
        prev = by_name.get(p.from_version)
        return prev.version if prev is not None and prev.state.promotable else None
    return None


def to_delete(
    versions: Sequence[Version], promotions: Sequence[Promotion], rules: Retention
) -> list[str]:
    """The versions retention removes now, newest first (children before their parents)."""
    keep: set[str] = set()
    live = [v.version for v in versions if v.state is VersionState.LIVE]
    keep.update(live)
    prev = rollback_target(promotions, versions)
    if prev is not None:
        keep.add(prev)
    ordered = sorted(versions, key=lambda v: v.version)
    passed = [v.version for v in ordered if v.state.passed_gates]
    keep.update(passed[-rules.keep_passed :])
    failed = [v.version for v in ordered if v.state is VersionState.FAILED]
    if rules.keep_failed:
        keep.update(failed[-rules.keep_failed :])
    pending = (VersionState.REGISTERED, VersionState.VALIDATING)
    keep.update(v.version for v in ordered if v.state in pending)
    parents = {v.version: v.parent for v in ordered if v.kind == "delta"}
    stack = list(keep)
    while stack:
        parent = parents.get(stack.pop())
        if parent is not None and parent not in keep:
            keep.add(parent)
            stack.append(parent)
    return [v.version for v in reversed(ordered) if v.version not in keep]


def dependants(version: str, versions: Sequence[Version]) -> list[str]:
    """The deltas built directly on ``version`` (it cannot go while they stay)."""
    return [v.version for v in versions if v.kind == "delta" and v.parent == version]

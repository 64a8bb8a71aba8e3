"""The life of a model version, as an explicit state machine.

::

    registered ──> validating ──> passed ──> live <──> retired
         │              │                     (promote / rollback)
         └──────────────┴──> failed (+ reason; never serves)

A passed or retired version whose manifest changes afterwards becomes ``failed`` too.
``validating`` goes back to ``registered`` when the controller restarts in the middle of a
gate run (the run is repeated). Only ``passed`` and ``retired`` versions (both passed their
gates) may become ``live``.
"""

from __future__ import annotations

from enum import Enum

from coadapt.controller.errors import InvalidTransitionError


class VersionState(str, Enum):
    REGISTERED = "registered"  # found complete on disk; gates not run yet
    VALIDATING = "validating"  # its gates run now
    PASSED = "passed"  # every gate passed; may be promoted
    FAILED = "failed"  # a gate failed (reason and checks stored); never serves
    LIVE = "live"  # the version the LIVE pointer names
    RETIRED = "retired"  # was live; passed, so it may be live again (rollback)

    @property
    def promotable(self) -> bool:
        return self in (VersionState.PASSED, VersionState.RETIRED)

    @property
    def passed_gates(self) -> bool:
        return self in (VersionState.PASSED, VersionState.LIVE, VersionState.RETIRED)


_ALLOWED: dict[VersionState, frozenset[VersionState]] = {
    VersionState.REGISTERED: frozenset({VersionState.VALIDATING, VersionState.FAILED}),
    VersionState.VALIDATING: frozenset(
        {VersionState.PASSED, VersionState.FAILED, VersionState.REGISTERED}
    ),
    # passed -> failed, retired -> failed: its files changed after the gates ran (voided)
    VersionState.PASSED: frozenset({VersionState.LIVE, VersionState.FAILED}),
    VersionState.LIVE: frozenset({VersionState.RETIRED}),
    VersionState.RETIRED: frozenset({VersionState.LIVE, VersionState.FAILED}),
    VersionState.FAILED: frozenset(),
}


def check_transition(old: VersionState, new: VersionState, what: str) -> None:
    """Refuse a change the machine does not allow (:class:`InvalidTransitionError`, a 409)."""
    if new not in _ALLOWED[old]:
        raise InvalidTransitionError(f"{what} is {old.value}; it cannot become {new.value}")

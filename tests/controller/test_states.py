"""The job state machine, table-driven."""

from __future__ import annotations

import pytest

from coadapt.controller.errors import InvalidTransitionError
from coadapt.controller.states import TERMINAL, TRANSITIONS, JobState, check_transition

P, R, S = JobState.PENDING, JobState.RUNNING, JobState.RESCALING
OK, FAIL, CAN = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED

LEGAL = [
    (P, R),
    (P, CAN),
    (P, FAIL),
    (R, S),
    (R, P),
    (R, OK),
    (R, FAIL),
    (R, CAN),
    (S, R),
    (S, P),
    (S, OK),
    (S, FAIL),
    (S, CAN),
]


@pytest.mark.parametrize(("old", "new"), LEGAL)
def test_legal(old: JobState, new: JobState) -> None:
    check_transition("j", old, new)


@pytest.mark.parametrize(
    ("old", "new"),
    [(o, n) for o in JobState for n in JobState if (o, n) not in LEGAL],
)
def test_illegal(old: JobState, new: JobState) -> None:
    with pytest.raises(InvalidTransitionError, match=old.value):
        check_transition("j", old, new)


def test_terminal_states_have_no_exit() -> None:
    assert {s for s in JobState if s.is_terminal} == TERMINAL == {OK, FAIL, CAN}
    assert all(not TRANSITIONS[s] for s in TERMINAL)
    assert all(s.is_active for s in (P, R, S))

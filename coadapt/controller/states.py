"""The job state machine, persisted in the database; illegal transitions are rejected.

PENDING ──launch──▶ RUNNING ──all replicas exit 0──▶ SUCCEEDED
   ▲                 │   ▲
   │   new alloc /   ▼   │ restarted at the new allocation
   ├──────────── RESCALING (SIGTERM sent: checkpoint and exit 0)
   │  stopped with 0 GPUs, or a failed replica (retry with backoff)
any non-terminal ──cancel──▶ CANCELLED;  ──too many failures──▶ FAILED
"""

from __future__ import annotations

from enum import Enum

from coadapt.controller.errors import InvalidTransitionError


class JobState(str, Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    RESCALING = "RESCALING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL

    @property
    def is_active(self) -> bool:
        """The job wants (PENDING) or holds (RUNNING, RESCALING) slots."""
        return not self.is_terminal


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
#: The states that want or hold slots, in lifecycle order: the one list the loop, the API's
#: metrics, the dashboard and the tuner filter jobs by (``Store.list_jobs(states=ACTIVE)``).
ACTIVE: tuple[JobState, ...] = (JobState.PENDING, JobState.RUNNING, JobState.RESCALING)

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.RUNNING, JobState.CANCELLED, JobState.FAILED}),
    JobState.RUNNING: frozenset(
        {
            JobState.RESCALING,
            JobState.PENDING,
            JobState.SUCCEEDED,
            JobState.FAILED,
            JobState.CANCELLED,
        }
    ),
    JobState.RESCALING: frozenset(
        {
            JobState.RUNNING,
            JobState.PENDING,
            JobState.SUCCEEDED,
            JobState.FAILED,
            JobState.CANCELLED,
        }
    ),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


def check_transition(job_id: str, old: JobState, new: JobState) -> None:
    """Raise :class:`InvalidTransitionError` unless ``old -> new`` is allowed."""
    if new not in TRANSITIONS[old]:
        allowed = ", ".join(sorted(s.value for s in TRANSITIONS[old])) or "none (terminal)"
        raise InvalidTransitionError(
            f"job {job_id} is {old.value}; cannot become {new.value} (allowed: {allowed})"
        )

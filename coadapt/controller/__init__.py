"""The live cluster: controller service (REST API + scheduling loop) over a real database.

* :mod:`~coadapt.controller.spec` — the job spec (pydantic), :mod:`~.states` — the job state
  machine, :mod:`~.errors` — the exception root and its HTTP statuses;
* :mod:`~.store` — the storage contract on SQLAlchemy (SQLite or PostgreSQL, Alembic
  migrations in :mod:`~.migrations`);
* :mod:`~.reconciler` — the level-triggered loop that runs the policy and the executor;
* :mod:`~.api` — the controller's routes; :mod:`~.dashboard` — the web dashboard;
  :mod:`~.server` — the process's options, admin token and isolation; :mod:`~.demo` — the
  live demo. :mod:`coadapt.service` assembles them into ``coadapt server``, and
  :mod:`coadapt.cli` is the command line (both sit above this package).

This package's import is kept light (no pydantic, FastAPI or NumPy) because every CLI call
pays for it; import the heavier modules directly.
"""

from coadapt.controller.errors import (
    AuthError,
    ConflictError,
    ControllerError,
    ForbiddenError,
    InvalidTransitionError,
    NotFoundError,
    SpecError,
    StorageError,
)
from coadapt.controller.states import JobState

__all__ = [
    "AuthError",
    "ConflictError",
    "ControllerError",
    "ForbiddenError",
    "InvalidTransitionError",
    "JobState",
    "NotFoundError",
    "SpecError",
    "StorageError",
]

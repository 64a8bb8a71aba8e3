"""The tuning tables (SQLAlchemy 2 declarative), on the controller's :class:`Base`.

Tuning owns its tables: they are declared here, beside the code that uses them
(:mod:`coadapt.tune.store`), not among the controller's. They share the controller's
metadata and database (a trial is an ordinary job; ``tenant_id`` references ``tenants``).
The schema is created by tuning's own Alembic branch (``tune``, :mod:`coadapt.tune.migrations`),
whose base depends on the controller's revision 0001 (``tenants``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from coadapt.controller.models import Base


# -- tuning (coadapt.tune; Alembic branch "tune", revision tune_0001). Optuna's own tables
# ("studies", "trials", ...) live in the same database, hence the ``tune_`` prefix on ours.
class ExperimentRow(Base):
    __tablename__ = "tune_experiments"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), index=True)
    study_name: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    best_value: Mapped[float | None] = mapped_column(Float, nullable=True)
    best_trial: Mapped[int | None] = mapped_column(Integer, nullable=True)
    target_reached_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # the cross-tenant policy's per-experiment memory (priority, Algorithm 1's j, G, gaps)
    policy_state: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # [[time, best value], ...]: the best-so-far history shown by `coadapt tune show`
    best_history: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)


class TrialRow(Base):
    __tablename__ = "tune_trials"
    __table_args__ = (UniqueConstraint("experiment_id", "number", name="uq_tune_trials_number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    experiment_id: Mapped[str] = mapped_column(ForeignKey("tune_experiments.id"), index=True)
    number: Mapped[int] = mapped_column(Integer)  # the Optuna trial number
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), index=True)
    job_id: Mapped[str | None] = mapped_column(String(40), nullable=True, index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    value: Mapped[float | None] = mapped_column(Float, nullable=True)
    curve: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)  # [[step, value], ...]
    gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)  # over all attempts
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_progress_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)

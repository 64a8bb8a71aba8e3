"""Database tables (SQLAlchemy 2 declarative). The schema itself is created by the Alembic
migrations in :mod:`coadapt.controller.migrations`; a test checks the two agree.

Times are float seconds on the controller's (injectable) clock, which keeps the schema the
same on SQLite and PostgreSQL and the tests deterministic.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class TenantRow(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[float] = mapped_column(Float)


class TokenRow(Base):
    __tablename__ = "api_tokens"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 hex
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    created_at: Mapped[float] = mapped_column(Float)


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), index=True)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    submit_time: Mapped[float] = mapped_column(Float, index=True)
    updated_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)  # current launch, 0 = never
    replicas: Mapped[int] = mapped_column(Integer, default=0)  # slots held by the attempt
    desired_replicas: Mapped[int] = mapped_column(Integer, default=0)  # the policy's choice
    num_restarts: Mapped[int] = mapped_column(Integer, default=0)  # re-allocations
    failures: Mapped[int] = mapped_column(Integer, default=0)
    not_before: Mapped[float] = mapped_column(Float, default=0.0)  # retry backoff
    attained_service: Mapped[float] = mapped_column(Float, default=0.0)  # slot-seconds
    service_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_gpus_held: Mapped[int] = mapped_column(Integer, default=0)
    stop_requested_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    report: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # node name -> replicas: what the current attempt holds / what the policy chose last
    allocation: Mapped[dict[str, int] | None] = mapped_column(JSON, nullable=True)
    desired_allocation: Mapped[dict[str, int] | None] = mapped_column(JSON, nullable=True)
    # learned after an out-of-memory failure (migration 0004): {"max_local_bsz": cap,
    # "oom_local_bsz": the per-replica batch that failed, "ooms": how many so far}
    memory_limit: Mapped[dict[str, int] | None] = mapped_column(JSON, nullable=True)
    # why a CANCELLED job was cancelled (coadapt.protocol.CancelCause; migration 0005)
    cancel_cause: Mapped[str | None] = mapped_column(String(32), nullable=True)


class ReplicaRow(Base):
    __tablename__ = "replicas"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    slot: Mapped[int] = mapped_column(Integer)  # slot index on its node
    node: Mapped[str] = mapped_column(String(128), server_default="local")
    status: Mapped[str] = mapped_column(String(16), index=True)  # starting, live, exited
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    start_ticks: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    run_dir: Mapped[str] = mapped_column(Text)
    log_path: Mapped[str] = mapped_column(Text)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    started_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    oom: Mapped[bool] = mapped_column(Boolean, server_default=false())  # ended for lack of memory


class EventRow(Base):
    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str | None] = mapped_column(String(40), nullable=True, index=True)
    time: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class MetricRow(Base):
    __tablename__ = "metrics"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    time: Mapped[float] = mapped_column(Float)
    name: Mapped[str] = mapped_column(String(64))
    value: Mapped[float | None] = mapped_column(Float, nullable=True)
    step: Mapped[int | None] = mapped_column(Integer, nullable=True)


class MetaRow(Base):
    __tablename__ = "meta"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)

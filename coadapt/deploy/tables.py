"""The deployments' tables (SQLAlchemy 2 declarative), on the controller's :class:`Base`.

Deployments own their tables: declared here, beside :mod:`coadapt.deploy.store`, created by
their own Alembic branch (``deploy``, :mod:`coadapt.deploy.migrations`), whose base depends on
the controller's revision 0001 (``tenants``), as the registry's does. A deleted deployment's
row stays (history, the dashboard); ``active_name`` is its name while it is not deleted and
NULL after, so the unique constraint allows one live deployment of a name per tenant and any
number of deleted ones (NULLs never collide, on SQLite and PostgreSQL alike).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from coadapt.controller.models import Base


class DeploymentRow(Base):
    """A deployment: a registered model served behind one gateway, owned by one tenant."""

    __tablename__ = "deploy_deployments"
    __table_args__ = (
        UniqueConstraint("tenant_id", "active_name", name="uq_deploy_deployments_active_name"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(40))
    active_name: Mapped[str | None] = mapped_column(String(40), nullable=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # DeploymentSpec as JSON
    state: Mapped[str] = mapped_column(String(16), index=True)
    model_root: Mapped[str] = mapped_column(Text)
    gateway_port: Mapped[int] = mapped_column(Integer)
    gateway_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gateway_start_ticks: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    gateway_run_dir: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    deleted_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class ServingReplicaRow(Base):
    """One serving replica process of a deployment, on one slot (written before it starts)."""

    __tablename__ = "deploy_replicas"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    deployment_id: Mapped[int] = mapped_column(
        ForeignKey("deploy_deployments.id", ondelete="CASCADE"), index=True
    )
    node: Mapped[str] = mapped_column(String(128))
    slot: Mapped[int] = mapped_column(Integer)
    port: Mapped[int] = mapped_column(Integer)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    start_ticks: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    run_dir: Mapped[str] = mapped_column(Text)
    log_path: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), index=True)
    started_at: Mapped[float] = mapped_column(Float)
    ready_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)

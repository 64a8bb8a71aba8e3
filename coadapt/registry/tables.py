"""The registry's tables (SQLAlchemy 2 declarative), on the controller's :class:`Base`.

The registry owns its tables: declared here, beside :mod:`coadapt.registry.store`, created by
its own Alembic branch (``registry``, :mod:`coadapt.registry.migrations`), whose base depends
on the controller's revision 0001 (``tenants``), as tuning's does. The artifacts themselves stay
on disk (``ROOT/<seq>/``, see :mod:`coadapt.serve.artifacts`); a row records what the registry
learnt about a version: its lineage, its gate results and where it is in its life.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from coadapt.controller.models import Base


class ModelRow(Base):
    """A registered model: a version root directory, owned by one tenant."""

    __tablename__ = "registry_models"
    __table_args__ = (UniqueConstraint("tenant_id", "name", name="uq_registry_models_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    root: Mapped[str] = mapped_column(Text)
    gates: Mapped[dict[str, Any]] = mapped_column(JSON)  # GateConfig as JSON
    retention: Mapped[dict[str, Any]] = mapped_column(JSON)  # Retention as JSON
    created_at: Mapped[float] = mapped_column(Float)
    synced_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class VersionRow(Base):
    """One complete version of a model (its directory has a manifest)."""

    __tablename__ = "registry_versions"
    __table_args__ = (UniqueConstraint("model_id", "version", name="uq_registry_versions"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_id: Mapped[int] = mapped_column(
        ForeignKey("registry_models.id", ondelete="CASCADE"), index=True
    )
    version: Mapped[str] = mapped_column(String(32))  # the on-disk sequence number
    kind: Mapped[str] = mapped_column(String(8))  # full | delta
    parent: Mapped[str | None] = mapped_column(String(32), nullable=True)
    manifest_sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    job_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    data_offset: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)  # the manifest's (publish time)
    registered_at: Mapped[float] = mapped_column(Float)
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    checks: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)  # gate results
    validated_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class PromotionRow(Base):
    """One change of a model's live version: who, when, from which version to which."""

    __tablename__ = "registry_promotions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_id: Mapped[int] = mapped_column(
        ForeignKey("registry_models.id", ondelete="CASCADE"), index=True
    )
    action: Mapped[str] = mapped_column(String(16))  # promote | rollback | auto | adopt
    from_version: Mapped[str | None] = mapped_column(String(32), nullable=True)
    to_version: Mapped[str] = mapped_column(String(32))
    who: Mapped[str] = mapped_column(String(64))
    at: Mapped[float] = mapped_column(Float)

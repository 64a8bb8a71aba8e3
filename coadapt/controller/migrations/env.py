"""Alembic environment: migrations run on the connection the controller hands over."""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from coadapt.controller.db import VERSION_TABLE
from coadapt.controller.models import Base

config = context.config
target_metadata = Base.metadata
version_table = VERSION_TABLE  # not "alembic_version": Optuna keeps its revision there


def run_migrations() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=True,
            version_table=version_table,
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = engine_from_config(
        config.get_section(config.config_ini_section) or {},
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    with engine.connect() as conn:
        context.configure(
            connection=conn,
            target_metadata=target_metadata,
            render_as_batch=True,
            version_table=version_table,
        )
        with context.begin_transaction():
            context.run_migrations()


run_migrations()

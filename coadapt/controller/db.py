"""Engines and migrations: SQLite by default, PostgreSQL by URL, schema by Alembic.

SQLite is opened in WAL mode and every transaction starts with ``BEGIN IMMEDIATE``: the
API threads and the scheduling loop write concurrently, and a deferred transaction that
upgrades from read to write can fail at once with "database is locked" instead of waiting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError

from coadapt.controller.errors import SpecError, StorageError

READ_OPTION = "coadapt_read"
MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def normalise_url(url: str) -> str:
    """Map ``postgresql://`` (and ``postgres://``) to the psycopg 3 driver we ship with."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def sqlite_url(path: str | Path) -> str:
    return f"sqlite:///{Path(path).resolve()}"


def make_engine(url: str) -> Engine:
    """An engine for ``url``; raises :class:`SpecError` for a URL we cannot use."""
    url = normalise_url(url)
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise SpecError(
            f"--db: cannot parse database URL: {exc}; accepted: sqlite:///PATH "
            "or postgresql://USER@HOST[:PORT]/DB"
        ) from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, record: Any) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Any) -> None:
            # Reads (execution option ``coadapt_read``) stay deferred: in WAL mode they
            # never block the writers, which is what keeps API latency flat.
            read = conn.get_execution_options().get(READ_OPTION, False)
            conn.exec_driver_sql("BEGIN" if read else "BEGIN IMMEDIATE")

        return engine
    if backend == "postgresql":
        return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
    raise SpecError(f"--db: unsupported database {backend!r}; accepted: sqlite, postgresql")


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def migrate(engine: Engine, revision: str = "head") -> None:
    """Upgrade the schema to ``revision`` (idempotent; safe on every start)."""
    cfg = alembic_config()
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
    except OperationalError as exc:
        raise StorageError(f"cannot migrate the database: {exc.orig}") from exc


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str:
    """The newest migration shipped with this version of coadapt."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise StorageError("no migrations found (is the package installed completely?)")
    return head

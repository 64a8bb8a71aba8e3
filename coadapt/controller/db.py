"""Engines and migrations: SQLite by default, PostgreSQL by URL, schema by Alembic.

SQLite is opened in WAL mode and every transaction starts with ``BEGIN IMMEDIATE``: the
API threads and the scheduling loop write concurrently, and a deferred transaction that
upgrades from read to write can fail at once with "database is locked" instead of waiting.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError

from coadapt.controller.errors import SpecError, StorageError

READ_OPTION = "coadapt_read"
MIGRATIONS = Path(__file__).resolve().parent / "migrations"

#: Where the revisions of the one shared database live, one Alembic branch per owner: the
#: controller's chain (branch ``controller``) and tuning's (branch ``tune``, in the tuning
#: package beside its tables; its base depends on 0001 for ``tenants``). Alembic must know
#: every branch whose head is stamped in the version table, or it refuses to run at all, so
#: every start upgrades them all. This names a directory of revision files, not a module:
#: the controller never imports or runs tuning code.
VERSION_LOCATIONS: tuple[Path, ...] = (
    MIGRATIONS / "versions",
    MIGRATIONS.parents[1] / "tune" / "migrations" / "versions",
    MIGRATIONS.parents[1] / "registry" / "migrations" / "versions",  # coadapt.registry
    MIGRATIONS.parents[1] / "deploy" / "migrations" / "versions",  # coadapt.deploy
)

#: Our Alembic version table. Not Alembic's default ``alembic_version``: Optuna's RDBStorage
#: (tuning's studies, same database) keeps its own schema revision there and reads it with a
#: call that fails once the table holds one head per branch. Releases before the ``tune``
#: branch kept our single revision in ``alembic_version``; :func:`migrate` moves it here.
VERSION_TABLE = "coadapt_alembic_version"
LEGACY_VERSION_TABLE = "alembic_version"


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
    cfg.set_main_option("path_separator", "os")
    locations = os.pathsep.join(str(p) for p in VERSION_LOCATIONS)
    cfg.set_main_option("version_locations", locations.replace("%", "%%"))
    return cfg


def _script() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def _move_legacy_version(conn: Connection, script: ScriptDirectory) -> None:
    """Move our revision from ``alembic_version`` (releases before the ``tune`` branch) to
    :data:`VERSION_TABLE`; Optuna's own revision, if it is there, stays."""
    inspector = sa.inspect(conn)
    if inspector.has_table(VERSION_TABLE) or not inspector.has_table(LEGACY_VERSION_TABLE):
        return
    legacy = sa.table(LEGACY_VERSION_TABLE, sa.column("version_num", sa.String))
    known = {rev.revision for rev in script.walk_revisions()}
    ours = [v for v in conn.execute(sa.select(legacy.c.version_num)).scalars() if v in known]
    if not ours:
        return
    context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
    for rev in ours:
        context.stamp(script, rev)
    conn.execute(legacy.delete().where(legacy.c.version_num.in_(ours)))
    if conn.execute(sa.select(sa.func.count()).select_from(legacy)).scalar_one() == 0:
        # Nothing of Optuna's was there: Optuna creates (and stamps) it when it first opens.
        conn.execute(sa.text(f"DROP TABLE {LEGACY_VERSION_TABLE}"))


def migrate(engine: Engine, revision: str = "heads") -> None:
    """Upgrade the schema to ``revision``: by default the head of every branch (idempotent;
    safe on every start). A database stamped by an older release is adopted first."""
    cfg = alembic_config()
    try:
        with engine.begin() as conn:
            _move_legacy_version(conn, _script())
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
    except OperationalError as exc:
        raise StorageError(f"cannot migrate the database: {exc.orig}") from exc


def current_heads(engine: Engine) -> frozenset[str]:
    """The revisions the database is stamped with (one per branch it has)."""
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return frozenset(context.get_current_heads())


def head_revisions() -> frozenset[str]:
    """The newest migration of each branch shipped with this version of coadapt."""
    heads = frozenset(_script().get_heads())
    if not heads:
        raise StorageError("no migrations found (is the package installed completely?)")
    return heads

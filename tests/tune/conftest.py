"""Fixtures of the tuning tests: the controller tests' database fixtures (SQLite and
PostgreSQL) and fake clock, shared rather than copied."""

from __future__ import annotations

from tests.controller.conftest import FakeClock, db_url, pg_admin_url, sqlite_store, store

__all__ = ["FakeClock", "db_url", "pg_admin_url", "sqlite_store", "store"]

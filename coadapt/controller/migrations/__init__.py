"""Alembic migrations of the controller's database, run programmatically at start."""

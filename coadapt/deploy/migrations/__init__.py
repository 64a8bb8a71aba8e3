"""The deployments' Alembic branch (``deploy``); its revisions are in ``versions/``."""

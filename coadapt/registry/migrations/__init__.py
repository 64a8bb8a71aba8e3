"""The registry's Alembic branch (``registry``); its revisions are in ``versions/``."""

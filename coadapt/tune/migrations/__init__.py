"""Tuning's own Alembic branch (``tune``) of the controller's database.

The revisions in ``versions/`` create and change only the ``tune_*`` tables
(:mod:`coadapt.tune.tables`); the controller's chain (branch ``controller``) never does. They
run in the same Alembic environment as the controller's (one database, one version table,
one head per branch), so a tuning migration is a new file here and nothing in
``coadapt/controller/migrations``.
"""

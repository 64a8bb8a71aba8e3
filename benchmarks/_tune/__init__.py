"""The parts of ``benchmarks/tune_tenants.py`` (seed 003's multi-tenant tuning benchmark), one
job each: :mod:`~_tune.tasks` (the tenants' tasks and banks), :mod:`~_tune.training` (training
one configuration; the ``--live`` trial program), :mod:`~_tune.record` (``--record``),
:mod:`~_tune.workload` (a run's tenants and targets), :mod:`~_tune.simulate` (the replay),
:mod:`~_tune.report` (its table) and :mod:`~_tune.live` (``--live``).

Imported as the top-level package ``_tune``: ``tune_tenants.py`` runs with ``benchmarks/`` on
``sys.path``, as every benchmark script does.
"""

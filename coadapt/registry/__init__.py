"""The model registry (issue 16): versions on disk become rows in the controller's database.

- :mod:`~coadapt.registry.tables`, :mod:`~.store`: models, versions, promotions (tenant-scoped;
  own Alembic branch ``registry``);
- :mod:`~.scan`: complete versions under a registered root and their manifests' lineage;
- :mod:`~.gates` (run as ``python -m coadapt.registry.gates``) and :mod:`~.validate`: the
  validation gates, in a separate process with a clean environment;
- :mod:`~.retention`: what stays on disk, the rollback target;
- :mod:`~.runner`: the background round and the promote / rollback / remove actions;
- :mod:`~.api`: ``/api/v1/models``; the ``coadapt model`` command calls it.

It sits beside tuning on top of the controller and uses :mod:`coadapt.serve.artifacts` for the
format on disk (torch is imported only once a model is registered). See docs/serve.md.
"""

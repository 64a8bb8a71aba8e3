"""Deployments (issue 17): served models with a latency SLO, first-class in the controller.

- :mod:`~coadapt.deploy.spec`: the deployment spec (``coadapt deploy spec.yaml``);
- :mod:`~.tables`, :mod:`~.store`: deployments and their serving replicas (tenant-scoped; own
  Alembic branch ``deploy``);
- :mod:`~.plane`: the :class:`~coadapt.controller.serving.ServingPlane` that runs replica and
  gateway processes;
- :mod:`~.api`: ``/api/v1/deployments``; the ``coadapt deploy`` command calls it;
- :mod:`~.metrics`: the deployments' Prometheus series.

It sits beside the registry (whose models it serves) on top of the controller. See
docs/coschedule.md.
"""

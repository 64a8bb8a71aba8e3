"""The web dashboard: a dependency-free single-page app served by the controller at ``/``.

:mod:`.series` records the time series the pages plot (imported by the API's ingestion path,
so it must not import :mod:`coadapt.controller.api`); :mod:`.routes` holds the read endpoints
under ``/api/v1/ui`` and the static files, mounted by ``create_app``.
"""

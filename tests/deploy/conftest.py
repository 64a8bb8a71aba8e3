"""Fixtures of the deployment tests: the controller tests' database fixtures (SQLite and
PostgreSQL) and fake clock, shared rather than copied; builders of specs and tenants."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from coadapt.controller.store import Store, Tenant
from coadapt.deploy.spec import DeploymentSpec, parse_deployment_spec
from coadapt.serve.routing import STATS_PATH, GatewayStats
from tests.controller.conftest import FakeClock, db_url, pg_admin_url, sqlite_store, store

__all__ = ["FakeClock", "db_url", "pg_admin_url", "sqlite_store", "store"]

DROP: Any = object()  # make_deploy(field=DROP): the field is absent


def make_deploy(**overrides: Any) -> dict[str, Any]:
    """A valid deployment spec mapping; override any field (``DROP`` removes it)."""
    spec: dict[str, Any] = {"name": "web", "model": "mlp", "slo_ms": 50, "max_replicas": 2}
    spec.update(overrides)
    return {k: v for k, v in spec.items() if v is not DROP}


def deploy_spec(**overrides: Any) -> DeploymentSpec:
    return parse_deployment_spec(make_deploy(**overrides))


def tenants(store: Store, now: float = 1.0) -> dict[str, Tenant]:
    """Tenants ``alice`` and ``bob`` and the admin ``root``."""
    return {
        name: store.create_tenant(name, now, is_admin=admin)[0]
        for name, admin in (("root", True), ("alice", False), ("bob", False))
    }


class _StatsHandler(BaseHTTPRequestHandler):
    stats: Callable[[], GatewayStats]

    def do_GET(self) -> None:  # the http.server API names it
        ok = self.path.startswith(STATS_PATH + "?since=")
        body = json.dumps(type(self).stats().to_json()).encode() if ok else b"{}"
        self.send_response(200 if ok else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def fake_gateway(port: int, stats: GatewayStats | Callable[[], GatewayStats]) -> Iterator[None]:
    """A stand-in for a deployment's gateway on ``port`` answering ``GET /-/stats`` with
    ``stats`` (or what ``stats()`` returns at each request): the gateway's side of the
    contract in :mod:`coadapt.serve.routing`."""
    make = stats if callable(stats) else (lambda: stats)
    handler = type("Handler", (_StatsHandler,), {"stats": staticmethod(make)})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join()

"""Fixtures of the registry tests: the controller tests' database fixtures (SQLite and
PostgreSQL) and fake clock, shared rather than copied; a published test MLP; a runner."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from coadapt.controller.store import Store, Tenant  # noqa: E402
from coadapt.registry.config import parse_model_spec  # noqa: E402
from coadapt.registry.runner import RegistryRunner  # noqa: E402
from coadapt.registry.store import Model  # noqa: E402
from coadapt.serve import artifacts  # noqa: E402
from coadapt.serve.models import make_mlp  # noqa: E402
from tests.controller.conftest import FakeClock, db_url, pg_admin_url, sqlite_store, store  # noqa: E402

__all__ = ["FakeClock", "db_url", "pg_admin_url", "sqlite_store", "store"]

FACTORY = "coadapt.serve.models:make_mlp"
KW = {"in_features": 6, "hidden": 16, "out_features": 3, "depth": 2}


def publish(root: Path, seed: int, **extra: Any) -> artifacts.Manifest:
    """Publish the seeded test MLP as a new version, with lineage (job-SEED, step, offset)."""
    return artifacts.publish(
        make_mlp(seed, **KW),
        root,
        factory=FACTORY,
        factory_kwargs={"seed": seed, **KW},
        lineage=artifacts.Lineage(f"job-{seed}", 10 * seed, 1000 * seed),
        **extra,
    )


def predict(root: Path, version: str, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    module, _, _ = artifacts.build_model(root, version)
    with torch.inference_mode():
        out: np.ndarray[Any, Any] = module(torch.from_numpy(x)).numpy()
    return out


@dataclass
class Reg:
    """A runner on a store with tenants ``alice`` and ``bob`` (and the admin ``root``)."""

    store: Store
    runner: RegistryRunner
    clock: FakeClock
    tenants: dict[str, Tenant]

    def create(self, who: str, name: str, root: Path, **spec: Any) -> Model:
        return self.runner.create(
            self.tenants[who], parse_model_spec({"name": name, "root": str(root), **spec})
        )

    def states(self, model: Model) -> dict[str, str]:
        return {v.version: v.state.value for v in self.runner.registry.versions(model.id)}


def make_reg(store: Store, **runner_kw: Any) -> Reg:
    clock = FakeClock()
    tenants = {
        name: store.create_tenant(name, clock(), is_admin=admin)[0]
        for name, admin in (("root", True), ("alice", False), ("bob", False))
    }
    return Reg(store, RegistryRunner(store, clock, **runner_kw), clock, tenants)


@pytest.fixture
def reg(sqlite_store: Store) -> Iterator[Reg]:
    yield make_reg(sqlite_store)


@pytest.fixture(scope="session")
def replay(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Recorded requests for the test MLP: inputs, and labels = version 1's own argmax (so
    version 1 scores accuracy 1.0 and another seed scores far less)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, KW["in_features"])).astype(np.float32)
    with torch.inference_mode():
        y = make_mlp(1, **KW)(torch.from_numpy(x)).argmax(dim=1).numpy()
    path = tmp_path_factory.mktemp("replay") / "requests.npz"
    np.savez(path, inputs=x, labels=y)
    return path

"""A serving replica runs tenant code (its model's factory), so it is confined like a job's
replica: the tenant's run-as user, the state dir hidden, its own job directory under the jobs
root, and only the model it serves bound back (read-only) where the sandbox would hide it."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")

from coadapt.controller.store import Store
from coadapt.deploy.plane import DeploymentPlane
from coadapt.deploy.store import DeploymentStore, ServingReplicaStatus
from coadapt.executors.local import LocalExecutor
from coadapt.executors.sandbox import SandboxError, resolve
from coadapt.ports import free_port
from tests.deploy.conftest import deploy_spec, tenants
from tests.deploy.test_plane import TIMEOUT, _predict, grant, reap
from tests.requirements import unavailable
from tests.serve.conftest import publish_mlp

SYSTEM_PYTHON = "/usr/bin/python3"  # the namespace probe's interpreter: any user can run it


@pytest.fixture
def top() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="coadapt-deploy-iso-"))  # pytest's tmp dirs are 0700
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _uids(port: int) -> set[int]:
    """Real uids of the processes serving on ``port`` (the replica's supervisor and workers)."""
    out: set[int] = set()
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            status = (proc / "status").read_text()
        except OSError:
            continue
        # the serve supervisor itself (not the executor's shim and launcher that start it)
        if cmd[1:3] == [b"-m", b"coadapt.serve"] and str(port).encode() in cmd:
            out.add(int(next(ln for ln in status.splitlines() if ln.startswith("Uid:")).split()[1]))
    return out


def test_a_confined_replica_serves_as_its_tenant_with_the_state_dir_hidden(
    sqlite_store: Store, top: Path
) -> None:
    state = top / "state"
    jobs = state / "jobs"
    root = state / "models" / "mlp"  # inside the hidden state dir: must be bound back
    publish_mlp(root, seed=1)
    state.chmod(0o700)
    try:
        iso = resolve("namespace", hide=(str(state),), jobs_root=str(jobs), python=SYSTEM_PYTHON)
    except SandboxError as exc:
        unavailable(f"namespace isolation unavailable: {exc}")
    deploys = DeploymentStore(sqlite_store)
    executor = LocalExecutor(slots=1, isolation=iso, warm=False)
    plane = DeploymentPlane(deploys, executor, state, stop_grace=5.0, jobs_dir=jobs)
    alice = tenants(sqlite_store)["alice"]
    rec = deploys.create(alice, deploy_spec(), str(root), free_port(), time.time())
    try:
        deadline = time.monotonic() + TIMEOUT
        rows = []
        while time.monotonic() < deadline:
            plane.reconcile({"web": grant(1)}, frozenset(), time.time())
            rows = deploys.replicas(rec.id)
            if [r.status for r in rows] == [ServingReplicaStatus.READY]:
                break
            if any(r.status is ServingReplicaStatus.EXITED for r in rows):
                log = Path(rows[0].log_path)
                raise AssertionError(log.read_text() if log.exists() else "no log")
            time.sleep(0.2)
        assert [r.status for r in rows] == [ServingReplicaStatus.READY], rows
        (row,) = rows
        assert _predict(row.port) == 200
        assert Path(row.run_dir).is_relative_to(jobs / f"deploy-{rec.id}")
        who = iso.identity("alice")  # None when rootless: the controller's own uid
        if who is not None:
            assert _uids(row.port) == {who.uid}  # the tenant's run-as user, not root
    finally:
        reap(deploys, [executor], [plane])

"""Tenant isolation under a real controller loop: a hostile job gets nothing of the
controller's (admin token, database, another tenant's checkpoints, the controller's
environment); file modes; and the refusal to run several tenants unconfined."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coadapt.controller.errors import SpecError
from coadapt.controller.spec import parse_spec
from coadapt.controller.states import JobState
from coadapt.executors import FakeExecutor, LocalExecutor
from coadapt.executors.sandbox import SandboxError, resolve
from coadapt.service import ServerOptions, build
from tests.controller.conftest import make_spec
from tests.controller.test_api import SyncASGI
from tests.requirements import unavailable

pytestmark = pytest.mark.timeout(90)

SYSTEM_PYTHON = "/usr/bin/python3"  # the probe's interpreter: any user can run it
HOSTILE = """
cat "$STATE/admin-token" && echo LEAK-token
cat "$STATE/coadapt.db" > /dev/null && echo LEAK-db
ls "$STATE/jobs/$VICTIM/checkpoints" && echo LEAK-listing
cat "$STATE/jobs/$VICTIM/checkpoints/model.pt" && echo LEAK-checkpoint
env
echo DONE
"""


@pytest.fixture
def state() -> Iterator[Path]:
    top = Path(tempfile.mkdtemp(prefix="coadapt-iso-"))  # pytest's tmp dirs are 0700 root
    yield top / "state"
    shutil.rmtree(top, ignore_errors=True)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_hostile_tenant_job_reads_nothing_of_the_controller_or_other_tenants(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        unavailable(f"{SYSTEM_PYTHON} (the namespace probe's interpreter) is missing")
    monkeypatch.setenv("COADAPT_DB_URL_TEST", "postgresql://admin:hunter2@db/coadapt")
    jobs = state / "jobs"
    try:
        iso = resolve("namespace", hide=(str(state),), jobs_root=str(jobs), python=SYSTEM_PYTHON)
    except SandboxError as exc:
        unavailable(f"namespace isolation unavailable: {exc}")
    options = ServerOptions(state_dir=state, slots=2, interval=0.5, policy="fifo")
    _app, ctl, store = build(options, executor=LocalExecutor(slots=2, isolation=iso))
    try:
        assert _mode(state) == 0o700
        assert _mode(state / "coadapt.db") == 0o600 and _mode(state / "admin-token") == 0o600
        alice, _ = store.create_tenant("alice", time.time())
        bob, _ = store.create_tenant("bob", time.time())
        victim = store.create_job(
            alice,
            parse_spec(
                make_spec(
                    name="victim",
                    script=None,
                    args=None,
                    working_dir=None,
                    max_replicas=1,
                    command=["/bin/sh", "-c", 'echo WEIGHTS > "$COADAPT_CHECKPOINT_DIR/model.pt"'],
                )
            ),
            time.time(),
        )
        hostile = store.create_job(
            bob,
            parse_spec(
                make_spec(
                    name="hostile",
                    script=None,
                    args=None,
                    working_dir=None,
                    max_replicas=1,
                    command=["/bin/sh", "-c", HOSTILE],
                    env={"STATE": str(state), "VICTIM": victim.id},
                )
            ),
            time.time(),
        )
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            ctl.step()
            states = {store.get_job(j.id).state for j in (victim, hostile)}
            if states == {JobState.SUCCEEDED}:
                break
            time.sleep(0.1)
        log = (jobs / hostile.id / "logs" / "attempt-1.rank-0.log").read_text()
        assert states == {JobState.SUCCEEDED}, log
        assert "DONE" in log
        assert "LEAK" not in log, log
        assert (jobs / victim.id / "checkpoints" / "model.pt").read_text() == "WEIGHTS\n"
        token = (state / "admin-token").read_text().strip()
        assert token not in log and "hunter2" not in log  # not even via the environment
        assert store.job_token(victim.id) not in log  # only its own job's token
        assert f"HOME={(jobs / hostile.id).resolve()}" in log
        assert f"PWD={(jobs / hostile.id).resolve()}" in log  # default cwd: its own dir
        assert _mode(jobs / hostile.id) == 0o700
        assert _mode(jobs / hostile.id / "runs") == 0o700
    finally:
        store.close()


def test_several_tenants_without_isolation_are_refused_unless_accepted(state: Path) -> None:
    options = ServerOptions(state_dir=state, slots=1)
    app, _, store = build(options, executor=FakeExecutor(slots=1))  # confines nothing
    token = (state / "admin-token").read_text().strip()
    client = SyncASGI(app)  # no lifespan: the loop does not run
    resp = client.post(
        "/api/v1/tenants", json={"name": "bob"}, headers={"Authorization": f"Bearer {token}"}
    )
    assert resp.status_code == 422, resp.text
    assert "--isolation none" in resp.json()["message"]
    store.create_tenant("bob", time.time())  # e.g. made by an older version
    store.close()
    with pytest.raises(SpecError, match="multi-tenant mode needs isolated replicas"):
        build(options, executor=FakeExecutor(slots=1))
    accepted = ServerOptions(state_dir=state, slots=1, isolation="none")
    app, _, store = build(accepted, executor=FakeExecutor(slots=1))
    try:
        resp = SyncASGI(app).post(
            "/api/v1/tenants", json={"name": "carol"}, headers={"Authorization": f"Bearer {token}"}
        )
        assert resp.status_code == 201, resp.text
    finally:
        store.close()

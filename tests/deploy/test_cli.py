"""``coadapt deploy`` end to end through Typer's entry point against a real ``coadapt server``:
create from a spec file, ls/show (table and JSON), rm, and the exit codes of bad input, a
missing model, a stranger's deployment and an unreachable controller."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from coadapt.cli import main
from coadapt.controller.db import sqlite_url
from coadapt.controller.store import Store
from coadapt.deploy.store import DeploymentState, DeploymentStore
from coadapt.executors._proc import proc_start_ticks
from coadapt.ports import free_port
from tests.controller.livecluster import LiveController

pytestmark = pytest.mark.timeout(180)
ALL = (DeploymentState.ACTIVE, DeploymentState.DELETING, DeploymentState.DELETED)


def _stop_gateways(state_dir: Path) -> None:
    """Gateways outlive their controller by design: stop any this test's server started."""
    store = Store.open(sqlite_url(state_dir / "coadapt.db"))
    try:
        for rec in DeploymentStore(store).list(None, ALL):
            pid = rec.gateway_pid
            if pid is not None and proc_start_ticks(pid) == rec.gateway_start_ticks:
                os.kill(pid, signal.SIGKILL)
    finally:
        store.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveController]:
    ctl = LiveController(tmp_path_factory.mktemp("deploy-cli") / "state", slots=1).start()
    try:
        yield ctl
    finally:
        ctl.stop()
        _stop_gateways(ctl.state_dir)


def run(
    live: LiveController, capsys: pytest.CaptureFixture[str], *args: str, token: str = ""
) -> tuple[int, str, str]:
    code = main(["deploy", *args, "--server", live.url, "--token", token or live.token])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def spec_file(tmp_path: Path, filename: str, **spec: object) -> str:
    path = tmp_path / filename
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_create_ls_show_rm(
    live: LiveController, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    root = tmp_path / "mlp"
    root.mkdir()
    with live.client() as c:
        c.request("POST", "/api/v1/models", json={"name": "mlp", "root": str(root)})
        bob = c.create_tenant("bob")["token"]

    good = spec_file(tmp_path, "web.yaml", name="web", model="mlp", slo_ms=40, max_replicas=2)
    code, out, err = run(live, capsys, good)
    assert code == 0, err
    name, url = out.split()[:2]
    assert name == "web" and url.startswith("http://127.0.0.1:")

    code, out, err = run(live, capsys, "ls", "-o", "json")
    assert code == 0, err
    listed = json.loads(out)
    assert [(d["name"], d["url"], d["slo_s"]) for d in listed] == [("web", url, 0.04)]
    code, out, _ = run(live, capsys, "ls")
    assert code == 0 and out.splitlines()[0].split()[:3] == ["NAME", "TENANT", "MODEL"]
    assert "web" in out and "mlp@live" in out and url in out

    code, out, err = run(live, capsys, "show", "web")
    assert code == 0, err
    assert out.startswith("web  (admin)  active  " + url) and "p99 <= 40 ms" in out
    code, out, _ = run(live, capsys, "show", "web", "--json")
    assert code == 0 and json.loads(out)["deployment"]["spec"]["max_replicas"] == 2

    # a stranger sees nothing and cannot remove it; the same name again is a conflict
    assert run(live, capsys, "ls", "-o", "json", token=bob)[1].strip() == "[]"
    code, _, err = run(live, capsys, "rm", "web", token=bob)
    assert code == 2 and "no deployment 'web'" in err
    code, _, err = run(live, capsys, good)
    assert code == 2 and "exists already" in err

    code, out, err = run(live, capsys, "rm", "web")
    assert code == 0 and out.startswith("web: deleting"), err
    code, out, _ = run(live, capsys, "ls", "-o", "json")
    assert code == 0 and [d["state"] for d in json.loads(out)] in ([], ["deleting"])


def test_bad_input_exits_2_and_names_the_field(
    live: LiveController, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = spec_file(tmp_path, "bad.yaml", name="Web", model="mlp", replicas=3)
    code, out, err = run(live, capsys, bad)
    assert code == 2 and out == ""
    assert "  name: " in err and "  replicas: unknown field" in err
    code, _, err = run(live, capsys, spec_file(tmp_path, "m.yaml", name="x", model="absent"))
    assert code == 2 and "no model 'absent'" in err
    code, _, err = run(live, capsys, str(tmp_path / "missing.yaml"))
    assert code == 2 and "cannot read" in err
    code, _, err = run(live, capsys, "show")
    assert code == 2 and "needs a deployment NAME" in err
    code, _, err = run(live, capsys, "ls", "extra")
    assert code == 2 and "unexpected argument 'extra'" in err
    code, _, err = run(live, capsys, "show", "nope")
    assert code == 2 and "no deployment 'nope'" in err


def test_an_unreachable_controller_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code = main(["deploy", "ls", "--server", url, "--token", "t", "--retry", "0"])
    assert code == 3 and "Traceback" not in capsys.readouterr().err

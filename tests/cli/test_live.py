"""The client commands against a real controller (a ``coadapt server`` child process).

What tests, scripts and users parse: ``--json``/``-o json`` print exactly the API's JSON,
tables are one header line plus one line per row, and each failure has its exit code."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from coadapt.cli import main
from coadapt.ports import free_port
from tests.controller.conftest import TINY_JOB, make_spec
from tests.controller.livecluster import LiveController

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveController]:
    ctl = LiveController(tmp_path_factory.mktemp("cli") / "state", slots=1).start()
    try:
        yield ctl
    finally:
        ctl.stop()
        ctl.kill_replicas()


@pytest.fixture(scope="module")
def done_job(live: LiveController, tmp_path_factory: pytest.TempPathFactory) -> str:
    """One job run to completion, so every read below sees the same, final state."""
    folder = tmp_path_factory.mktemp("spec")
    (folder / TINY_JOB.name).write_text(TINY_JOB.read_text())
    spec = folder / "tiny.yaml"
    spec.write_text(
        yaml.safe_dump(
            make_spec(
                name="tiny",
                script=TINY_JOB.name,
                working_dir=None,
                max_replicas=1,
                args=["--steps", "5", "--step-time", "0.01"],
            )
        )
    )
    sub = live.cli("submit", str(spec))
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip()
    waited = live.cli("wait", job, "--timeout", "60", "--poll", "0.2")
    assert waited.returncode == 0 and waited.stdout == f"{job} SUCCEEDED\n", waited
    return job


def cli(live: LiveController, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main([*args, "--server", live.url, "--token", live.token])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out if code == 0 else err


def api(live: LiveController, path: str) -> Any:
    with live.client() as c:
        return c.request("GET", path)


def test_json_is_the_apis_json_byte_for_byte(
    live: LiveController, done_job: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for args, path in (
        (("ls",), "/api/v1/jobs"),
        (("show", done_job), f"/api/v1/jobs/{done_job}"),
        (("tune", "ls"), None),
    ):
        code, as_flag = cli(live, capsys, *args, "--json")
        assert code == 0
        assert cli(live, capsys, *args, "-o", "json") == (0, as_flag)
        assert cli(live, capsys, *args, "--output", "json") == (0, as_flag)
        if path is not None:
            assert as_flag == json.dumps(api(live, path), indent=2) + "\n"
    code, out = cli(live, capsys, "cluster", "--json")
    assert code == 0 and json.loads(out)["slots"] == 1


def test_tables_are_a_header_and_one_line_per_row(
    live: LiveController, done_job: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = cli(live, capsys, "ls")
    lines = out.splitlines()
    assert code == 0 and "\x1b" not in out
    assert lines[0].split() == ["ID", "NAME", "TENANT", "STATE", "REPLICAS", "BATCH", "STEP",
                                "RESTARTS"]  # fmt: skip
    rows = [line.split() for line in lines[1:]]
    assert [r[:4] for r in rows] == [[done_job, "tiny", "admin", "SUCCEEDED"]]
    code, out = cli(live, capsys, "ls", "--state", "RUNNING", "--state", "PENDING")
    assert code == 0 and out.count("\n") == 1  # the header only
    code, out = cli(live, capsys, "show", done_job, "--events", "2")
    assert code == 0 and "            state: SUCCEEDED" in out
    assert len(out.split("events:\n")[1].splitlines()) == 2
    code, out = cli(live, capsys, "cluster")
    assert code == 0 and out.startswith("policy pollux: 0/1 slots used;")
    assert out.splitlines()[1].split()[:3] == ["ID", "STATE", "REPLICAS"]


def test_logs_and_a_new_tenant_sees_nothing(
    live: LiveController, done_job: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = cli(live, capsys, "logs", done_job)
    assert code == 0 and out
    assert cli(live, capsys, "logs", "-f", done_job) == (0, out)  # ended: -f returns
    code, token = cli(live, capsys, "tenant", "create", "carol")
    assert code == 0 and token.strip()
    assert main(["ls", "--server", live.url, "--token", token.strip()]) == 0
    assert capsys.readouterr().out.count("\n") == 1
    assert main(["show", done_job, "--server", live.url, "--token", token.strip()]) == 2
    assert "404" in capsys.readouterr().err


def test_exit_codes(
    live: LiveController, done_job: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = cli(live, capsys, "show", "job-does-not-exist")
    assert code == 2 and "404" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(make_spec(max_replicas=0)))
    code, err = cli(live, capsys, "submit", str(bad))
    assert code == 2 and "max_replicas" in err
    nobody = f"http://127.0.0.1:{free_port()}"
    assert main(["ls", "--server", nobody, "--token", "t", "--retry", "0"]) == 3
    assert "cannot reach the controller" in capsys.readouterr().err
    assert main(["tune", "ls", "--server", nobody, "--token", "t", "--retry", "0"]) == 3
    capsys.readouterr()
    code, err = cli(live, capsys, "wait", done_job, "job-does-not-exist", "--timeout", "5")
    assert code == 2 and "404" in err

"""Commands that run here, not on a controller: run-local, simulate and demo --simulation."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from coadapt.cli import main
from tests.sim.conftest import SMALL_WORKLOAD

ECHO_ARGV = """import json, os, sys
rank = os.environ["RANK"]
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"argv.{rank}"), "w") as f:
    json.dump({"argv": sys.argv[1:], "world": os.environ["WORLD_SIZE"]}, f)
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""


def test_run_local_passes_everything_after_the_script_to_it(tmp_path: Path) -> None:
    script = tmp_path / "echo.py"
    script.write_text(ECHO_ARGV)
    argv = ["--epochs", "3", "-h", "--help", "-n", "9", "--", "x"]
    assert main(["run-local", "-n", "2", str(script), *argv]) == 0
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"argv.{rank}").read_text())
        assert seen == {"argv": argv, "world": "2"}


def test_run_local_exits_with_the_replicas_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "echo.py"
    script.write_text(ECHO_ARGV)
    monkeypatch.setenv("EXIT_WITH", "5")
    assert main(["run-local", str(script)]) == 5


def test_run_local_elastic_without_a_control_file_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "echo.py"
    script.write_text(ECHO_ARGV)
    assert main(["run-local", "--elastic", str(script)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("coadapt run-local: ") and err.count("\n") == 1
    assert "--checkpoint-dir" in err or "--control-file" in err, err
    assert not list(tmp_path.glob("argv.*"))  # refused before any replica started


@pytest.mark.parametrize(
    ("option", "value", "accepted"),
    [("--interval", "0", "seconds > 0"), ("--interference", "1.5", "[0, 1)")],
)
def test_simulate_bad_config_is_one_line_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    option: str,
    value: str,
    accepted: str,
) -> None:
    workload = tmp_path / "small.csv"
    workload.write_text(SMALL_WORKLOAD)
    assert main(["simulate", "--workload", str(workload), option, value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and option in err and accepted in err


def test_demo_simulation_writes_the_three_policies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = tmp_path / "small.csv"
    workload.write_text(SMALL_WORKLOAD)
    out = tmp_path / "demo"
    argv = ["demo", "--simulation", "--workload", str(workload), "--cluster", "2x2"]
    assert main([*argv, "--out", str(out)]) == 0
    results = json.loads((out / "simulation.json").read_text())
    assert [r["policy"] for r in results] == ["pollux", "tiresias", "optimus"]
    printed = capsys.readouterr().out
    assert f"results: {out / 'simulation.json'}" in printed
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "simulation.png").read_bytes()[:4] == b"\x89PNG"
    else:
        assert "no plot" in printed and "coadapt[train]" in printed


def test_serve_lists_verifies_and_activates_versions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    from tests.serve.conftest import publish_mlp

    first = publish_mlp(tmp_path, seed=1)
    publish_mlp(tmp_path, seed=2)
    assert main(["serve", "activate", str(tmp_path), first.version]) == 0
    assert main(["serve", "ls", str(tmp_path)]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert any(line.startswith(f"* {first.version}") for line in listed)  # the live one
    assert len([line for line in listed if line.strip()]) == 3  # activate's line + 2 versions
    assert main(["serve", "ls", str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert main(["serve", "verify", str(tmp_path), "no-such-version"]) == 1
    assert main(["serve", "run", "--model", "nameless"]) == 2
    assert "must look like NAME=DIR" in capsys.readouterr().err

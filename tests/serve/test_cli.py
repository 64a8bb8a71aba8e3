"""``python -m coadapt.serve`` sub-commands, run in-process through ``main(argv)``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.serve.conftest import publish_mlp

pytest.importorskip("torch")

from coadapt.serve import artifacts
from coadapt.serve.__main__ import main


def test_ls_verify_activate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    publish_mlp(tmp_path, seed=1)
    publish_mlp(tmp_path, seed=2, incremental=True)
    assert main(["ls", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("  00000001  full") and out[1].startswith("* 00000002  delta")
    assert main(["verify", str(tmp_path), "00000002"]) == 0
    assert main(["activate", str(tmp_path), "00000001"]) == 0
    assert artifacts.live_version(tmp_path) == "00000001"


def test_a_refused_version_exits_1_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    m = publish_mlp(tmp_path, seed=1)
    (tmp_path / m.version / artifacts.DENSE_FILE).write_bytes(b"\0" * 8)
    assert main(["activate", str(tmp_path), m.version]) == 1
    assert "bytes, the manifest says" in capsys.readouterr().err
    assert not (tmp_path / artifacts.LIVE_FILE).exists()


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--model", "nodir"], "must look like NAME=DIR"),
        ([], "no model to serve"),
        (["--model", "a/b=/tmp"], "may not be empty or hold"),
    ],
)
def test_bad_usage_exits_2(argv: list[str], match: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert match in capsys.readouterr().err

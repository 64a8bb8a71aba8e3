"""``coadapt model`` end to end: a real ``coadapt server`` (registry loop, gate processes) and
a real ``coadapt serve`` on the same version root, driven through the CLI."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch")

from coadapt.cli import main  # noqa: E402
from coadapt.serve import artifacts  # noqa: E402
from coadapt.serve.models import make_mlp  # noqa: E402
from tests.controller.livecluster import LiveController  # noqa: E402
from tests.registry.conftest import FACTORY, KW, publish  # noqa: E402
from tests.serve.conftest import start_server, stop_server  # noqa: E402

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveController]:
    ctl = LiveController(tmp_path_factory.mktemp("model-cli") / "state", slots=1).start()
    try:
        yield ctl
    finally:
        ctl.stop()


def run(
    live: LiveController, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str, str]:
    code = main(["model", *args, "--server", live.url, "--token", live.token])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def test_register_gate_promote_rollback_rm(
    live: LiveController, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    root = tmp_path / "mlp"
    publish(root, seed=1)  # 00000001
    x = np.random.default_rng(0).normal(size=(64, KW["in_features"])).astype(np.float32)
    with torch.inference_mode():
        labels = make_mlp(1, **KW)(torch.from_numpy(x)).argmax(dim=1).numpy()
    np.savez(tmp_path / "replay.npz", inputs=x, labels=labels)
    gates = {
        "replay": str(tmp_path / "replay.npz"),
        "logits": True,
        "metrics": [{"metric": "accuracy", "min": 0.9}],
        "retention": {"keep_passed": 5},
    }
    (tmp_path / "gates.yaml").write_text(yaml.safe_dump(gates))
    server = start_server(root)
    try:
        code, out, err = run(live, capsys, "create", "mlp", "--root", str(root),
                             "--gates", str(tmp_path / "gates.yaml"))  # fmt: skip
        assert code == 0, err
        code, out, err = run(live, capsys, "sync", "mlp")
        assert code == 0, err
        assert json.loads(main_json(live, capsys, "ls"))[0]["live"] == "00000001"
        rows = x[:3].tolist()
        status, before = server.predict_json(rows)
        assert status == 200 and before["version"] == "00000001"

        nudged = make_mlp(1, **KW)
        last = nudged[-1]
        assert isinstance(last, torch.nn.Linear)
        with torch.no_grad():
            last.bias.add_(0.01)  # same answers, other numbers: passes the gate
        artifacts.publish(nudged, root, factory=FACTORY, factory_kwargs={"seed": 1, **KW})
        publish(root, seed=2)  # 00000003: fails the accuracy gate
        code, out, err = run(live, capsys, "sync", "mlp")
        assert code == 1  # a new version failed its gates
        assert "00000002  passed" in out and "00000003  failed" in out
        assert "accuracy = " in out

        code, out, err = run(live, capsys, "promote", "mlp", "3")
        assert code == 2 and "only a version that passed its gates" in err
        code, out, err = run(live, capsys, "promote", "mlp", "2")
        assert code == 0 and "00000001 -> 00000002" in out, err
        server.wait_all_on("00000002")
        status, during = server.predict_json(rows)
        assert during["version"] == "00000002" and during["predictions"] != before["predictions"]

        code, out, err = run(live, capsys, "rollback", "mlp")
        assert code == 0 and "00000002 -> 00000001" in out, err
        server.wait_all_on("00000001")
        status, after = server.predict_json(rows)
        assert after == before  # the exact predictions of the older version

        code, out, err = run(live, capsys, "show", "mlp@3")
        assert code == 0 and "metric:accuracy" in out and "failed" in out
        code, out, err = run(live, capsys, "show", "mlp")
        assert code == 0 and "rollback" in out and "promote" in out
        code, out, err = run(live, capsys, "rm", "mlp", "1")
        assert code == 2 and "is live" in err
        code, out, err = run(live, capsys, "rm", "mlp", "3")
        assert code == 0 and not (root / "00000003").exists()
        code, out, err = run(live, capsys, "show", "nope")
        assert code == 2 and "no model 'nope'" in err
    finally:
        stop_server(server.proc)


def main_json(live: LiveController, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code, out, err = run(live, capsys, *args, "-o", "json")
    assert code == 0, err
    return out


def test_bad_input_and_an_unreachable_controller(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gates = tmp_path / "gates.yaml"
    gates.write_text(yaml.safe_dump({"metrics": [{"metric": "f1", "min": 0.5}], "oops": 1}))
    nowhere = ["--server", "http://127.0.0.1:9", "--token", "t", "--retry", "0"]
    code = main(["model", "create", "m", "--root", str(tmp_path), "--gates", str(gates), *nowhere])
    err = capsys.readouterr().err
    assert code == 2  # rejected before anything is sent
    assert "gates.metrics.0.metric" in err and "gates.oops: unknown field" in err
    assert main(["model", "ls", *nowhere]) == 3
    assert "cannot reach the controller" in capsys.readouterr().err

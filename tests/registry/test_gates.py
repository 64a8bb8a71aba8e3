"""The gates, run the way the controller runs them: a separate process with a clean
environment and a timeout (and, where the machine allows, the job sandbox)."""

from __future__ import annotations

import os
from pathlib import Path

from coadapt.executors import sandbox
from coadapt.registry.config import parse_gates
from coadapt.registry.validate import gate_confinement, run_gates
from coadapt.serve import artifacts
from coadapt.serve.models import make_mlp
from tests.registry.conftest import KW, publish
from tests.requirements import unavailable


def by_name(checks: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    return {str(c["name"]): c for c in checks}


def test_metric_and_drift_gates_pass_then_block(tmp_path: Path, replay: Path) -> None:
    root = tmp_path / "mlp"
    publish(root, seed=1)
    publish(root, seed=2)
    gates = parse_gates(
        {
            "replay": str(replay),
            "logits": True,
            "metrics": [{"metric": "accuracy", "min": 0.9}, {"metric": "log_loss", "max": 50}],
            "drift": [{"stat": "mean_abs", "max": 1e-3}],
        }
    )
    first = run_gates(str(root), "00000001", None, gates, "alice")
    checks = by_name(first.checks)
    assert first.passed and first.reason is None, first
    assert checks["integrity"]["status"] == "passed"
    assert checks["metric:accuracy"]["value"] == 1.0  # the labels are version 1's answers
    assert checks["metric:accuracy"]["bound"] == ">= 0.9"
    assert checks["drift:mean_abs"]["status"] == "skipped"  # nothing live to compare with
    second = run_gates(str(root), "00000002", "00000001", gates, "alice")
    checks = by_name(second.checks)
    assert not second.passed
    assert checks["metric:accuracy"]["status"] == "failed"
    assert float(checks["metric:accuracy"]["value"]) < 0.9  # type: ignore[arg-type]
    assert checks["metric:log_loss"]["status"] == "passed"
    assert checks["drift:mean_abs"]["status"] == "failed"
    assert "vs live 00000001" in str(checks["drift:mean_abs"]["reason"])
    assert second.reason is not None and second.reason.startswith("metric:accuracy: accuracy = ")


def test_a_corrupt_file_fails_integrity_by_its_checksum(tmp_path: Path) -> None:
    root = tmp_path / "mlp"
    publish(root, seed=1)
    data = root / "00000001" / artifacts.DENSE_FILE
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    data.write_bytes(bytes(raw))
    out = run_gates(str(root), "00000001", None, parse_gates({}), "alice")
    assert not out.passed
    assert out.reason is not None and "sha256" in out.reason and "corrupt" in out.reason
    assert [c["name"] for c in out.checks] == ["integrity"]


def _spy(root: Path, secret: Path) -> None:
    artifacts.publish(
        make_mlp(1, **KW).state_dict(),
        root,
        factory="tests.registry.spy:report_surroundings",
        factory_kwargs={"secret": str(secret)},
        input_shape=(KW["in_features"],),
    )


def test_the_gate_process_gets_no_controller_secrets(tmp_path: Path) -> None:
    secret = tmp_path / "admin-token"
    secret.write_text("s3cret")
    root = tmp_path / "spy"
    _spy(root, secret)
    environ = {
        **os.environ,
        "COADAPT_TOKEN": "s3cret",
        "COADAPT_DB": "postgresql://u:pw@db/x",
    }
    out = run_gates(str(root), "00000001", None, parse_gates({}), "alice", environ=environ)
    assert not out.passed and out.reason is not None
    assert "token=None db=None" in out.reason, out.reason  # the factory ran, without them
    assert f"cwd={os.getcwd()}" not in out.reason


def test_a_hanging_gate_is_killed_at_its_timeout(tmp_path: Path) -> None:
    root = tmp_path / "hang"
    artifacts.publish(
        make_mlp(1, **KW).state_dict(), root, factory="tests.registry.spy:hang",
        input_shape=(KW["in_features"],),
    )  # fmt: skip
    out = run_gates(str(root), "00000001", None, parse_gates({"timeout_s": 1.5}), "alice")
    assert not out.passed and out.reason == "the gates ran longer than timeout_s = 1.5 s"


def test_in_the_sandbox_the_state_dir_is_hidden(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "jobs").mkdir(parents=True)
    secret = state / "admin-token"
    secret.write_text("s3cret")
    secret.chmod(0o600)
    try:
        iso = sandbox.resolve("namespace", hide=(str(state),), jobs_root=str(state / "jobs"))
    except sandbox.SandboxError as exc:
        unavailable(f"no namespace sandbox here: {exc}")
    root = tmp_path / "models" / "spy"
    _spy(root, secret)
    out = run_gates(
        str(root), "00000001", None, parse_gates({}), "alice", confine=gate_confinement(iso)
    )
    assert out.reason is not None and "secret_readable=False" in out.reason, out
    if os.geteuid() == 0:
        assert "uid=65534" in out.reason  # the run-as user (nobody), not root


def test_sparse_versions_integrity_and_drift(tmp_path: Path) -> None:
    """A sparse version (tables in shard files): checked by its files without a replay,
    rebuilt and replayed with one; a corrupt shard fails by its checksum."""
    import numpy as np
    import torch

    from coadapt.serve.models import CtrRanker
    from coadapt.serve.sparse_artifacts import publish_sparse
    from coadapt.sparse.client import LocalStore
    from coadapt.sparse.server import TableSpec

    kw = {"features": 6, "groups": 2, "dim": 4, "hidden": 8}
    store = LocalStore([TableSpec("ctr", 4, "rowwise_adagrad", {"lr": 0.5})])
    torch.manual_seed(0)
    model = CtrRanker(**kw, store=store)  # type: ignore[arg-type]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, (64, kw["features"])).astype(np.uint64)
    root = tmp_path / "ctr"

    def train_and_publish(steps: int) -> None:
        for _ in range(steps):
            x = torch.from_numpy(ids[:16].astype(np.int64))
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), torch.ones(16))
            opt.zero_grad()
            loss.backward()
            opt.step()
        factory = "coadapt.serve.models:CtrRanker"
        inputs = [("ids", "uint64", (kw["features"],))]
        publish_sparse(model, store, root, factory=factory, factory_kwargs=kw, inputs=inputs)

    train_and_publish(2)
    train_and_publish(20)
    np.savez(tmp_path / "ctr.npz", ids=ids, labels=np.ones(len(ids), dtype=np.int64))
    plain = run_gates(str(root), "00000001", None, parse_gates({}), "alice")
    assert plain.passed and "files" in str(plain.checks[0]["reason"]), plain
    gates = parse_gates(
        {"replay": str(tmp_path / "ctr.npz"), "drift": [{"stat": "max_abs", "max": 1e-9}]}
    )
    moved = run_gates(str(root), "00000002", "00000001", gates, "alice")
    checks = by_name(moved.checks)
    assert checks["integrity"]["status"] == "passed"
    assert checks["drift:max_abs"]["status"] == "failed"  # 20 more steps moved the scores
    assert float(checks["drift:max_abs"]["value"]) > 1e-6  # type: ignore[arg-type]
    shard = next(p for p in (root / "00000002").iterdir() if p.name != artifacts.MANIFEST
                 and p.name != artifacts.DENSE_FILE)  # fmt: skip
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    broken = run_gates(str(root), "00000002", None, parse_gates({}), "alice")
    assert not broken.passed and "sha256" in str(broken.reason), broken

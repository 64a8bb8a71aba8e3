"""Version artifacts: visibility, checksums, incremental deltas, lineage, the LIVE pointer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.serve.conftest import FACTORY, KW, publish_mlp

torch = pytest.importorskip("torch")

from coadapt.serve import artifacts  # noqa: E402
from coadapt.serve.models import make_mlp  # noqa: E402


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_full_version_round_trips_exactly_with_lineage(tmp_path: Path) -> None:
    lin = artifacts.Lineage(job_id="job-7", step=120, data_offset=4096)
    m = publish_mlp(tmp_path, seed=3, lineage=lin)
    assert m.version == "00000001" and m.kind == "full" and m.parent is None
    assert artifacts.read_manifest(tmp_path, m.version).lineage == lin
    assert _same(artifacts.load_state(tmp_path, m.version), make_mlp(3, **KW).state_dict())
    module, manifest, _ = artifacts.build_model(tmp_path, m.version)
    assert manifest.inputs == artifacts.InputSpec("float32", (KW["in_features"],))
    x = torch.randn(5, KW["in_features"], generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert torch.equal(module(x), make_mlp(3, **KW).eval()(x))


def test_half_written_version_is_invisible(tmp_path: Path) -> None:
    publish_mlp(tmp_path, seed=1)
    m2 = publish_mlp(tmp_path, seed=2)
    (tmp_path / m2.version / artifacts.MANIFEST).unlink()  # as if the writer died before it
    assert artifacts.list_versions(tmp_path) == ["00000001"]
    assert artifacts.live_version(tmp_path) == "00000001"
    with pytest.raises(artifacts.ArtifactError, match="no complete version '00000002'"):
        artifacts.load_state(tmp_path, m2.version)
    # the abandoned number is never reused: the next publisher takes a fresh directory
    assert publish_mlp(tmp_path, seed=3).version == "00000003"


def test_corrupt_file_is_rejected_by_checksum(tmp_path: Path) -> None:
    m = publish_mlp(tmp_path, seed=1)
    data = tmp_path / m.version / artifacts.DENSE_FILE
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(artifacts.IntegrityError, match="sha256"):
        artifacts.load_state(tmp_path, m.version)
    data.write_bytes(bytes(raw[:-4]))
    with pytest.raises(artifacts.IntegrityError, match="bytes, the manifest says"):
        artifacts.load_state(tmp_path, m.version)


def test_non_finite_weights_are_refused(tmp_path: Path) -> None:
    model = make_mlp(1, **KW)
    with torch.no_grad():
        model[0].weight[0, 0] = float("nan")
    with pytest.raises(artifacts.IntegrityError, match="NaN or Inf"):
        artifacts.publish(model, tmp_path, factory=FACTORY, factory_kwargs={"seed": 1, **KW})
    assert artifacts.list_versions(tmp_path) == []


def test_incremental_holds_only_changed_tensors_and_applies_exactly(tmp_path: Path) -> None:
    base = publish_mlp(tmp_path, seed=1)
    model = make_mlp(1, **KW)
    with torch.no_grad():
        model[2].weight.add_(0.5)  # one tensor changes
    d = artifacts.publish(model, tmp_path, factory=FACTORY, factory_kwargs={"seed": 1, **KW},
                          incremental=True)  # fmt: skip
    assert d.kind == "delta" and d.parent == base.version
    assert [t.name for t in d.tensors] == ["2.weight"]
    assert _same(artifacts.load_state(tmp_path, d.version), model.state_dict())
    # applied on the state already in memory, without reading the parent again
    held = artifacts.load_state(tmp_path, base.version)
    assert _same(artifacts.load_state(tmp_path, d.version, (base.version, held)),
                 model.state_dict())  # fmt: skip


def test_delta_on_the_wrong_base_is_refused(tmp_path: Path) -> None:
    publish_mlp(tmp_path, seed=1)
    model = make_mlp(1, **KW)
    with torch.no_grad():
        model[0].bias.fill_(0.25)
    d = artifacts.publish(model, tmp_path, factory=FACTORY, factory_kwargs={"seed": 1, **KW},
                          incremental=True)  # fmt: skip
    other = artifacts.load_state(tmp_path, "00000001")
    other = {k: v + 1 if k == "2.bias" else v for k, v in other.items()}
    with pytest.raises(artifacts.IntegrityError, match="digest"):
        artifacts.load_state(tmp_path, d.version, ("00000001", other))


def test_incremental_with_a_changed_architecture_asks_for_a_full_version(tmp_path: Path) -> None:
    publish_mlp(tmp_path, seed=1)
    bigger = make_mlp(1, **{**KW, "hidden": 32})
    with pytest.raises(artifacts.ArtifactError, match="publish a full version"):
        artifacts.publish(bigger, tmp_path, factory=FACTORY, factory_kwargs={}, incremental=True)


def test_live_pointer_is_promotion_and_rollback(tmp_path: Path) -> None:
    publish_mlp(tmp_path, seed=1)
    publish_mlp(tmp_path, seed=2)
    assert artifacts.live_version(tmp_path) == "00000002"  # newest without a pointer
    artifacts.set_live(tmp_path, "00000001")
    assert artifacts.live_version(tmp_path) == "00000001"
    with pytest.raises(artifacts.ArtifactError, match="no complete version '00000009'"):
        artifacts.set_live(tmp_path, "00000009")
    assert artifacts.live_version(tmp_path) == "00000001"


def test_script_local_class_needs_an_importable_factory(tmp_path: Path) -> None:
    class Local(torch.nn.Linear):
        pass

    with pytest.raises(artifacts.ArtifactError, match="cannot import it"):
        artifacts.publish(Local(2, 2), tmp_path)


def test_manifest_of_another_format_is_refused(tmp_path: Path) -> None:
    m = publish_mlp(tmp_path, seed=1)
    path = tmp_path / m.version / artifacts.MANIFEST
    doc = json.loads(path.read_text())
    doc["format"] = 99
    path.write_text(json.dumps(doc))
    with pytest.raises(artifacts.ArtifactError, match="format 99"):
        artifacts.read_manifest(tmp_path, m.version)

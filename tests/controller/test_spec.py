"""Job specs: valid ones parse, invalid ones name the field and what it accepts; every
training example ships a spec that validates and matches the script's flags."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from coadapt.controller.errors import SpecError
from coadapt.controller.spec import JobSpec, load_spec_file, parse_spec
from tests.controller.conftest import make_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_valid_spec_defaults() -> None:
    spec = parse_spec(make_spec(max_batch_size=None, max_replicas=3))
    assert isinstance(spec, JobSpec)
    assert spec.effective_max_batch == spec.batch_size == 32
    assert spec.requested_replicas == 3
    assert parse_spec(make_spec(script=None, command="python x.py --a 'b c'")).command == [
        "python",
        "x.py",
        "--a",
        "b c",
    ]


@pytest.mark.parametrize(
    ("overrides", "field", "accepted"),
    [
        ({"name": "bad name!"}, "name", "letters"),
        ({"batch_size": 0}, "batch_size", "integer in [1"),
        ({"batch_size": "many"}, "batch_size", "integer in [1"),
        ({"max_batch_size": 8}, "max_batch_size", ">= batch_size"),
        ({"min_replicas": 3, "max_replicas": 2}, "max_replicas", "min_replicas"),
        ({"replicas": 9}, "replicas", "between"),
        ({"lr": -1}, "lr", "> 0"),
        ({"max_restarts": -1}, "max_restarts", ">= 0"),
        ({"pinned_batch": 0}, "pinned_batch", "[1, 2^31)"),
        ({"working_dir": "relative/dir"}, "working_dir", "absolute"),
        ({"env": {"RANK": "3"}}, "env", "not RANK"),
        ({"env": {"OK": 3}}, "env.OK", "mapping"),
        ({"args": "notalist"}, "args", "list of strings"),
        ({"command": ["python"], "script": "x.py"}, "command", "exactly one"),
        ({"script": None}, "command", "exactly one"),
        ({"gpus": 2}, "gpus", "max_replicas"),
    ],
)
def test_rejections_name_the_field_and_accepted_values(
    overrides: dict[str, Any], field: str, accepted: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(make_spec(**overrides))
    fields = {d["field"]: d for d in info.value.details}
    assert field in fields, info.value.details
    assert accepted in fields[field]["accepted"]
    assert field in info.value.message


def test_non_mapping_is_rejected() -> None:
    with pytest.raises(SpecError, match="mapping"):
        parse_spec(["name", "x"])


def test_load_spec_file_resolves_working_dir(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.yaml").write_text("name: a\nscript: t.py\n")
    (tmp_path / "b.json").write_text(
        json.dumps({"name": "b", "script": "t.py", "working_dir": "sub"})
    )
    assert load_spec_file(tmp_path / "a.yaml")["working_dir"] == str(tmp_path.resolve())
    assert load_spec_file(tmp_path / "b.json")["working_dir"] == str(tmp_path / "sub")
    (tmp_path / "c.yaml").write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec_file(tmp_path / "c.yaml")
    (tmp_path / "d.yaml").write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="mapping"):
        load_spec_file(tmp_path / "d.yaml")
    with pytest.raises(SpecError, match="cannot read"):
        load_spec_file(tmp_path / "missing.yaml")


SCRIPTS = sorted(p for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))


def test_examples_exist() -> None:
    assert SCRIPTS, "no training examples found"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_example_has_a_valid_spec_matching_its_flags(script: Path) -> None:
    spec_path = script.with_suffix(".yaml")
    assert spec_path.exists(), f"{script.name} has no job spec {spec_path.name} beside it"
    raw = load_spec_file(spec_path)
    if "space" in raw:  # a tuning experiment: check the trial a sampled point would run
        from coadapt.tune.spec import load_experiment_file, sample_point, trial_job_spec

        exp = load_experiment_file(spec_path)
        raw = trial_job_spec(exp, sample_point(exp), 0)
    spec = parse_spec(raw)
    assert spec.script is not None
    assert (Path(spec.working_dir or "") / spec.script).resolve() == script.resolve()
    source = script.read_text()
    flags = set(re.findall(r"add_argument\(\s*\"(--[a-z0-9-]+)\"", source))
    used = {a for a in spec.args if a.startswith("--")}
    assert used <= flags, f"{spec_path.name} passes unknown flags {sorted(used - flags)}"
    required = set(re.findall(r"add_argument\(\s*\"(--[a-z0-9-]+)\"[^)]*required=True", source))
    assert required <= used, f"{spec_path.name} misses required flags {required - used}"

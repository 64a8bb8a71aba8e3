"""A deployment spec: defaults, what the scheduler sees, and errors that name the field."""

from __future__ import annotations

from typing import Any

import pytest

from coadapt.controller.errors import SpecError
from coadapt.deploy.spec import LIVE, DeploymentSpec, parse_deployment_spec
from coadapt.policies.autoscale import Deployment
from tests.deploy.conftest import DROP, make_deploy


def test_defaults_follow_the_contract() -> None:
    spec = parse_deployment_spec({"name": "web", "model": "mlp"})
    assert spec.version == LIVE and spec.follows_live
    assert (spec.slo_ms, spec.slo_quantile) == (50.0, 0.99)
    assert (spec.min_replicas, spec.max_replicas, spec.scale_to_zero_s) == (0, 4, 300.0)
    assert (spec.priority, spec.capacity_rps, spec.ready_s) == (0, 50.0, 10.0)
    assert (spec.workers, spec.threads) == (1, 1)


def test_the_scheduler_sees_a_deployment_in_seconds() -> None:
    spec = parse_deployment_spec(
        make_deploy(slo_ms=80, min_replicas=1, max_replicas=3, scale_to_zero_s=None, priority=2)
    )
    assert spec.deployment() == Deployment(
        name="web",
        capacity_rps=50.0,
        slo_s=0.08,
        slo_quantile=0.99,
        priority=2,
        min_replicas=1,
        max_replicas=3,
        ready_s=10.0,
        scale_to_zero_s=None,
    )


def test_an_integer_version_is_a_version_id_and_json_round_trips() -> None:
    spec = parse_deployment_spec(make_deploy(version=3))
    assert spec.version == "3" and not spec.follows_live
    assert DeploymentSpec.model_validate(spec.to_json()) == spec
    assert parse_deployment_spec(spec.to_json()) == spec


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        ({"name": "Web"}, "name", "lowercase"),
        ({"name": "-web"}, "name", "starting and ending"),
        ({"name": "w" * 41}, "name", "1-40"),
        ({"name": DROP}, "name", "required"),
        ({"model": DROP}, "model", "required"),
        ({"model": "no spaces"}, "model", "not a model name"),
        ({"version": "../x"}, "version", "'live' or a version id"),
        ({"slo_ms": 0}, "slo_ms", "greater than 0"),
        ({"slo_ms": "fast"}, "slo_ms", "valid number"),
        ({"slo_ms": float("nan")}, "slo_ms", ""),
        ({"slo_quantile": 1.0}, "slo_quantile", "less than 1"),
        ({"min_replicas": -1}, "min_replicas", "greater than or equal to 0"),
        ({"min_replicas": 3, "max_replicas": 2}, "max_replicas", "min_replicas (3)"),
        ({"min_replicas": 5, "max_replicas": DROP}, "max_replicas", "min_replicas (5)"),
        ({"max_replicas": 0}, "max_replicas", "greater than or equal to 1"),
        ({"max_replicas": True}, "max_replicas", "valid integer"),
        ({"scale_to_zero_s": -1}, "scale_to_zero_s", "greater than or equal to 0"),
        ({"capacity_rps": 0}, "capacity_rps", "greater than 0"),
        ({"ready_s": float("inf")}, "ready_s", ""),
        ({"workers": 0}, "workers", "greater than or equal to 1"),
        ({"threads": 1.5}, "threads", "valid integer"),
        ({"replicas": 3}, "replicas", "unknown field; accepted: name, model"),
    ],
)
def test_a_bad_spec_names_the_field(overrides: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_deployment_spec(make_deploy(**overrides))
    assert [d["field"] for d in err.value.details] == [field]
    assert f"{field}: " in err.value.message
    assert words in err.value.details[0]["message"]


def test_not_a_mapping_is_refused() -> None:
    with pytest.raises(SpecError, match="mapping") as err:
        parse_deployment_spec(["web"])  # type: ignore[arg-type]
    assert err.value.details == [{"field": "spec", "message": "got list"}]


def test_several_errors_are_all_named() -> None:
    with pytest.raises(SpecError) as err:
        parse_deployment_spec({"name": "x", "model": "m", "workers": 0, "slo_ms": -1, "bad": 1})
    assert {d["field"] for d in err.value.details} == {"workers", "slo_ms", "bad"}

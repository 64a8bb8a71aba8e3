"""What a registered model is configured with: its gates and its retention rules.

A model spec (``coadapt model create NAME --root DIR [--gates gates.yaml]``, or the body of
``POST /api/v1/models``) names the version root and, optionally, the user gates every new
version must pass before it may serve and how many old versions to keep::

    replay: /data/ctr/recorded.npz   # arrays "inputs" and (for metrics) "labels"
    logits: true                     # predictions are logits: sigmoid/softmax for metrics
    metrics:                         # each needs labels
      - {metric: auc, min: 0.70}
      - {metric: log_loss, max: 0.6}
    drift:                           # against the live version, on the replayed inputs
      - {stat: mean_abs, max: 0.05}
    auto_promote: false              # true: the newest passed version goes live by itself
    timeout_s: 300                   # the whole gate run, in its own process
    pythonpath: [/src/mypkg]         # where the factory's module lives, if not on PYTHONPATH
    retention: {keep_passed: 5, keep_failed: 1}

Invalid input is a :class:`~coadapt.controller.errors.SpecError` whose details name each field.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from coadapt.controller.errors import SpecError

METRICS = ("accuracy", "auc", "log_loss", "mse")
DRIFT_STATS = ("mean_abs", "max_abs")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MetricGate(_Strict):
    """A metric on the replayed requests that must be at least ``min`` / at most ``max``."""

    metric: Literal["accuracy", "auc", "log_loss", "mse"]
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _a_bound(self) -> MetricGate:
        if self.min is None and self.max is None:
            raise ValueError(f"give min or max for {self.metric}")
        return self


class DriftGate(_Strict):
    """A bound on how far the new version's predictions move from the live version's."""

    stat: Literal["mean_abs", "max_abs"]
    max: float = Field(ge=0)


class Retention(_Strict):
    """How many versions stay on disk beside the live and the previous live one."""

    keep_passed: int = Field(default=5, ge=1, le=10_000)
    keep_failed: int = Field(default=1, ge=0, le=10_000)


class GateConfig(_Strict):
    """The user gates of a model (integrity is always checked, before these)."""

    replay: str | None = None
    logits: bool = False
    metrics: tuple[MetricGate, ...] = ()
    drift: tuple[DriftGate, ...] = ()
    auto_promote: bool = False
    timeout_s: float = Field(default=300.0, gt=0, le=86_400)
    # where the model's factory module lives, if not on the controller's PYTHONPATH
    pythonpath: tuple[str, ...] = ()

    @field_validator("replay")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).is_absolute():
            raise ValueError(f"{v!r} must be an absolute path (the gate runs elsewhere)")
        return v

    @field_validator("pythonpath")
    @classmethod
    def _absolute_dirs(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for d in v:
            if not Path(d).is_absolute():
                raise ValueError(f"{d!r} must be an absolute path")
        return v

    @model_validator(mode="after")
    def _replay_needed(self) -> GateConfig:
        if (self.metrics or self.drift) and self.replay is None:
            raise ValueError("metrics and drift gates replay recorded requests: give replay")
        return self


class ModelSpec(_Strict):
    """A model to register: its name, its version root, gates and retention."""

    name: str
    root: str
    gates: GateConfig = GateConfig()
    retention: Retention = Retention()

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(
                f"{v!r}: 1-64 characters, letters, digits, '_', '.', '-', starting with a "
                "letter or digit"
            )
        return v

    @field_validator("root")
    @classmethod
    def _root(cls, v: str) -> str:
        p = Path(v)
        if not p.is_absolute():
            raise ValueError(f"{v!r} must be an absolute path")
        return str(Path(*p.parts))  # normalised: no trailing slash, no '//'


def _details(exc: ValidationError) -> list[dict[str, Any]]:
    out = []
    for err in exc.errors(include_url=False):
        field = ".".join(str(p) for p in err["loc"]) or "spec"
        if err["type"] == "extra_forbidden":
            message = "unknown field"
        else:
            message = str(err["msg"]).removeprefix("Value error, ")
        out.append({"field": field, "message": message})
    return out


def parse_model_spec(data: Any) -> ModelSpec:
    """Validate a model spec given as a mapping; :class:`SpecError` names each bad field."""
    if not isinstance(data, dict):
        raise SpecError(
            "a model spec must be a mapping of fields",
            [{"field": "spec", "message": f"got {type(data).__name__}"}],
        )
    try:
        return ModelSpec.model_validate(data)
    except ValidationError as exc:
        details = _details(exc)
        raise SpecError(
            "invalid model spec: " + ", ".join(d["field"] for d in details), details
        ) from None


def parse_gates(data: Any, where: str = "gates") -> GateConfig:
    """A gate config alone (``--gates FILE``, ``PUT .../gates``); errors name ``where.FIELD``."""
    try:
        return GateConfig.model_validate(data if data is not None else {})
    except ValidationError as exc:
        details = [{**d, "field": f"{where}.{d['field']}"} for d in _details(exc)]
        raise SpecError(
            "invalid gate config: " + ", ".join(d["field"] for d in details), details
        ) from None

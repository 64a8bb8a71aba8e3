"""What a deployment is configured with: the model it serves, its SLO and its replica bounds.

A deployment spec (``coadapt deploy spec.yaml``, or the body of ``POST /api/v1/deployments``)::

    name: ctr-online          # lowercase DNS label, 1-40 characters
    model: ctr                # a model this tenant registered (``coadapt model create``)
    version: live             # "live" (default: follow the registry's live version) or a
                              # version id that passed its gates
    slo_ms: 50                # the latency SLO: the slo_quantile latency stays <= slo_ms
    slo_quantile: 0.99
    min_replicas: 0
    max_replicas: 4
    scale_to_zero_s: 300      # idle seconds before zero replicas; null = never
    priority: 0               # higher is served first when serving alone exceeds the cluster
    capacity_rps: 50.0        # prior requests/s one replica sustains at the SLO (learned online)
    ready_s: 10.0             # prior cold start of a replica, seconds
    workers: 1                # serve worker processes per replica
    threads: 1                # torch threads per worker

Invalid input is a :class:`~coadapt.controller.errors.SpecError` whose message and details name
each field and what it accepts; unknown keys are refused by name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from coadapt.controller.errors import SpecError
from coadapt.policies.autoscale import Deployment
from coadapt.registry.config import NAME_RE as MODEL_NAME_RE

#: A deployment name is a DNS label (it may become a host name or a Kubernetes object later).
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
#: ``version: live`` follows whatever version the registry has live, as it changes.
LIVE = "live"
VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")


class DeploymentSpec(BaseModel):
    """A served model with a latency SLO, as the user writes it (immutable once parsed)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str
    model: str
    version: str = LIVE
    slo_ms: float = Field(default=50.0, gt=0, le=3_600_000)
    slo_quantile: float = Field(default=0.99, ge=0.5, lt=1.0)
    min_replicas: int = Field(default=0, ge=0, le=1024)
    max_replicas: int = Field(default=4, ge=1, le=1024, validate_default=True)
    scale_to_zero_s: float | None = Field(default=300.0, ge=0)
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000)
    capacity_rps: float = Field(default=50.0, gt=0)
    ready_s: float = Field(default=10.0, ge=0, le=86_400)
    workers: int = Field(default=1, ge=1, le=64)
    threads: int = Field(default=1, ge=1, le=256)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(
                f"{v!r}: 1-40 characters, lowercase letters, digits and '-', starting and "
                "ending with a letter or digit"
            )
        return v

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        if not MODEL_NAME_RE.match(v):
            raise ValueError(f"{v!r} is not a model name (see `coadapt model ls`)")
        return v

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):
            v = str(v)  # `version: 3` in YAML
        if isinstance(v, str) and v != LIVE and not VERSION_RE.match(v):
            raise ValueError(f"{v!r}: give 'live' or a version id from `coadapt model show`")
        return v

    @field_validator("slo_ms", "capacity_rps", "ready_s", "scale_to_zero_s")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError(f"{v!r} must be a finite number")
        return v

    @field_validator("max_replicas")
    @classmethod
    def _bounds(cls, v: int, info: ValidationInfo) -> int:
        low = info.data.get("min_replicas")
        if isinstance(low, int) and v < low:
            raise ValueError(f"{v} must be >= min_replicas ({low})")
        return v

    @property
    def follows_live(self) -> bool:
        """Whether the deployment serves the registry's live version, following it."""
        return self.version == LIVE

    def deployment(self) -> Deployment:
        """The deployment as the scheduler and autoscalers see it."""
        return Deployment(
            name=self.name,
            capacity_rps=self.capacity_rps,
            slo_s=self.slo_ms / 1000.0,
            slo_quantile=self.slo_quantile,
            priority=self.priority,
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
            ready_s=self.ready_s,
            scale_to_zero_s=self.scale_to_zero_s,
        )

    def to_json(self) -> dict[str, Any]:
        """The spec as stored and returned by the API (every field, defaults included)."""
        return self.model_dump(mode="json")


def _details(exc: ValidationError) -> list[dict[str, Any]]:
    out = []
    for err in exc.errors(include_url=False):
        loc = [str(p) for p in err["loc"]]
        field = ".".join(loc) or "spec"
        if err["type"] == "extra_forbidden":
            message = "unknown field; accepted: " + ", ".join(DeploymentSpec.model_fields)
        elif err["type"] == "missing":
            message = "required"
        else:
            message = str(err["msg"]).removeprefix("Value error, ")
        out.append({"field": field, "message": message})
    return out


def parse_deployment_spec(data: Mapping[str, Any]) -> DeploymentSpec:
    """Validate a deployment spec given as a mapping; :class:`SpecError` names each bad field."""
    if not isinstance(data, Mapping):
        raise SpecError(
            "a deployment spec must be a mapping of fields",
            [{"field": "spec", "message": f"got {type(data).__name__}"}],
        )
    try:
        return DeploymentSpec.model_validate(dict(data))
    except ValidationError as exc:
        details = _details(exc)
        raise SpecError(
            "invalid deployment spec: "
            + "; ".join(f"{d['field']}: {d['message']}" for d in details),
            details,
        ) from None

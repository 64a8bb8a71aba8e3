"""The job spec users submit (YAML or JSON), validated with pydantic.

(:func:`load_spec_file` lives in the light :mod:`~coadapt.controller.specfile`, so the CLI
reads specs without importing pydantic; the server owns the validation rules.)

A rejection names every offending field together with the values it accepts, so
``coadapt submit`` can print it and the API can return it as a 422 body.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from coadapt.controller.errors import SpecError
from coadapt.controller.specfile import load_spec_file

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_MAX_INT = 2**31 - 1  # stored in 32-bit columns on every backend
_MAX_REPLICAS = 4096
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Variables the controller sets for every replica; a spec may not override them.
RESERVED_ENV = frozenset(
    {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "COADAPT_JOB_ID",
        "COADAPT_NUM_NODES",
        "COADAPT_CHECKPOINT_DIR",
        "COADAPT_METRICS_URL",
        "COADAPT_RESTARTS",
        "COADAPT_JOB_TOKEN",
    }
)

#: What each field accepts, quoted in every rejection that names it.
ACCEPTED: dict[str, str] = {
    "name": "1-63 characters: letters, digits, '.', '_', '-' (starting with a letter or digit)",
    "command": "a command line (string or list of strings); exactly one of command or script",
    "script": "a Python script path (relative to working_dir); exactly one of command or script",
    "args": "a list of strings",
    "working_dir": "an absolute directory path (the CLI resolves it against the spec's folder)",
    "env": "a mapping of variable names to strings (not RANK, WORLD_SIZE, ... or COADAPT_*)",
    "batch_size": "integer in [1, 2^31) (M0, the batch the learning rate was tuned for)",
    "lr": "number > 0",
    "max_batch_size": "integer >= batch_size and < 2^31",
    "max_local_bsz": "integer >= 1 and < 2^31 (per-replica micro-batch memory limit)",
    "min_replicas": "integer in [0, 4096]",
    "max_replicas": "integer in [max(1, min_replicas), 4096]",
    "replicas": "integer between min_replicas and max_replicas (static policies)",
    "pinned_batch": "integer in [1, 2^31), or null for an adaptive batch",
    "priority": "integer in (-2^31, 2^31) (higher first, where the policy honours priorities)",
    "max_restarts": "integer >= 0 (failed attempts retried with exponential backoff)",
}


class JobSpec(BaseModel):
    """One training job, as submitted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    command: list[str] | None = None
    script: str | None = None
    args: list[str] = Field(default_factory=list)
    working_dir: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    batch_size: int = Field(default=32, ge=1, le=_MAX_INT)
    lr: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    max_batch_size: int | None = Field(default=None, le=_MAX_INT)
    max_local_bsz: int | None = Field(default=None, ge=1, le=_MAX_INT)
    min_replicas: int = Field(default=1, ge=0, le=_MAX_REPLICAS)
    max_replicas: int = Field(default=4, ge=1, le=_MAX_REPLICAS)
    replicas: int | None = Field(default=None, le=_MAX_REPLICAS)
    pinned_batch: int | None = Field(default=None, ge=1, le=_MAX_INT)
    priority: int = Field(default=0, ge=-_MAX_INT, le=_MAX_INT)
    max_restarts: int = Field(default=3, ge=0, le=1000)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"invalid name {v!r}")
        return v

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                return shlex.split(v)
            except ValueError as exc:
                raise ValueError(f"cannot split command line: {exc}") from None
        return v

    @field_validator("working_dir")
    @classmethod
    def _working_dir(cls, v: str | None) -> str | None:
        if v is not None and not os.path.isabs(v):
            raise ValueError(f"working_dir {v!r} is not absolute")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not _ENV_NAME.match(key):
                raise ValueError(f"invalid variable name {key!r}")
            if key in RESERVED_ENV:
                raise ValueError(f"{key} is set by the controller")
        return v

    @field_validator("max_batch_size")
    @classmethod
    def _max_batch(cls, v: int | None, info: Any) -> int | None:
        m0 = info.data.get("batch_size")
        if v is not None and m0 is not None and v < m0:
            raise ValueError(f"max_batch_size {v} is below batch_size {m0}")
        return v

    @field_validator("max_replicas")
    @classmethod
    def _max_replicas(cls, v: int, info: Any) -> int:
        low = info.data.get("min_replicas")
        if low is not None and v < low:
            raise ValueError(f"max_replicas {v} is below min_replicas {low}")
        return v

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, v: int | None, info: Any) -> int | None:
        low, high = info.data.get("min_replicas"), info.data.get("max_replicas")
        if v is not None and (v < max(low or 0, 1) or (high is not None and v > high)):
            raise ValueError(f"replicas {v} is outside [{max(low or 0, 1)}, {high}]")
        return v

    @model_validator(mode="after")
    def _one_entry_point(self) -> JobSpec:
        if (self.command is None) == (self.script is None):
            raise ValueError("give exactly one of command or script")
        if self.command is not None and not self.command:
            raise ValueError("command is empty")
        return self

    # -- derived --------------------------------------------------------------------------
    @property
    def effective_max_batch(self) -> int:
        return self.max_batch_size if self.max_batch_size is not None else self.batch_size

    @property
    def requested_replicas(self) -> int:
        return self.replicas if self.replicas is not None else self.max_replicas


def _field_of(err: ErrorDetails) -> str:
    loc = [str(p) for p in err["loc"]]
    if not loc:
        msg = str(err.get("msg", ""))
        return "command" if "command" in msg else "spec"
    return ".".join(loc)


def _details(exc: ValidationError) -> list[dict[str, Any]]:
    out = []
    for err in exc.errors(include_url=False):
        field = _field_of(err)
        top = field.split(".")[0]
        if err["type"] == "extra_forbidden":
            message = "unknown field"
            accepted = "fields: " + ", ".join(JobSpec.model_fields)
        else:
            message = str(err["msg"]).removeprefix("Value error, ")
            accepted = ACCEPTED.get(top, "")
        out.append({"field": field, "message": message, "accepted": accepted})
    return out


def parse_spec(data: Any) -> JobSpec:
    """Validate a spec given as a mapping; raise :class:`SpecError` naming each bad field."""
    if not isinstance(data, dict):
        raise SpecError(
            "a job spec must be a mapping of fields",
            [
                {
                    "field": "spec",
                    "message": f"got {type(data).__name__}",
                    "accepted": "fields: " + ", ".join(JobSpec.model_fields),
                }
            ],
        )
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        details = _details(exc)
        fields = ", ".join(d["field"] for d in details)
        raise SpecError(f"invalid job spec: {fields}", details) from None


__all__ = ["ACCEPTED", "RESERVED_ENV", "JobSpec", "load_spec_file", "parse_spec"]

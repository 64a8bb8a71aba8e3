"""The job spec users submit (YAML or JSON), validated with pydantic.

(:func:`load_spec_file` lives in the light :mod:`~coadapt.controller.specfile`, so the CLI
reads specs without importing pydantic; the server owns the validation rules.)

A rejection names every offending field together with the values it accepts, so
``coadapt submit`` can print it and the API can return it as a 422 body.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from coadapt import protocol
from coadapt.controller.colocation import KEY_ACCEPTED, KEY_NAME, check_key
from coadapt.controller.errors import SpecError
from coadapt.controller.specfile import load_spec_file
from coadapt.executors.gpu_types import TYPE_ACCEPTED, check_type_name

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_MAX_INT = 2**31 - 1  # stored in 32-bit columns on every backend
_MAX_REPLICAS = 4096
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
#: Size caps: a spec is stored with its job and returned by every job listing, and its
#: strings become a process's argv and environment (Linux caps one argument at 128 KiB).
MAX_ARG_CHARS = 8192  # one command/args element, script, working_dir or env value
MAX_COMMAND_ITEMS = 256
MAX_ARGS_ITEMS = 4096
MAX_ENV_VARS = 256
MAX_SPEC_BYTES = 64 << 10  # the whole spec as JSON
MAX_GPU_TYPES = 32
#: JSON-Schema pattern of a string a process can carry (no NUL); the validator says why.
NO_NUL = r"^[^\x00]*$"
#: Variables the controller sets for every replica; a spec may not override them.
RESERVED_ENV = frozenset(protocol.RESERVED_ENV)

#: What each field accepts, quoted in every rejection that names it.
ACCEPTED: dict[str, str] = {
    "name": "1-63 characters: letters, digits, '.', '_', '-' (starting with a letter or digit)",
    "command": f"a command line (string or list of at most {MAX_COMMAND_ITEMS} strings of at "
    f"most {MAX_ARG_CHARS} characters, no NUL); exactly one of command or script",
    "script": "a Python script path (relative to working_dir; at most "
    f"{MAX_ARG_CHARS} characters, no NUL); exactly one of command or script",
    "args": f"a list of strings (at most {MAX_ARGS_ITEMS}, each at most {MAX_ARG_CHARS} "
    "characters, no NUL)",
    "working_dir": "an absolute directory path (the CLI resolves it against the spec's folder; "
    f"at most {MAX_ARG_CHARS} characters, no NUL)",
    "env": f"a mapping of at most {MAX_ENV_VARS} variable names (letters, digits, '_'; not "
    f"RANK, WORLD_SIZE, ... or COADAPT_*) to strings of at most {MAX_ARG_CHARS} characters "
    "(no NUL)",
    "spec": f"a mapping of job spec fields, at most {MAX_SPEC_BYTES} bytes as JSON",
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
    "gpu_types": f"a list of 1-{MAX_GPU_TYPES} GPU type names the job may run on (e.g. "
    f"[a100, v100]; each {TYPE_ACCEPTED}, case-insensitive) that some node of the cluster "
    "has, or null for any",
    "packing_key": f"the job's application or profile for GPU sharing ({KEY_ACCEPTED}), "
    "a key of the controller's co-location table (coadapt server --colocation FILE), or null "
    "(never shares a GPU)",
    "sparse": "a mapping: servers (integer in 1..64, shard servers kept for the job's "
    "lifetime), model (lr, fm, deepfm or widedeep: the tables follow it), dim (integer in "
    "1..1024), checkpoint_every_s (number > 0)",
}

_SPARSE_MODELS = ("lr", "fm", "deepfm", "widedeep")  # coadapt.sparse.jobs.MODELS (tested)


class SparseSection(BaseModel):
    """A sparse job's parameter servers: started with the job, kept across worker rescales,
    restarted from the last checkpoint when one dies, stopped when the job ends."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    servers: int
    model: str = "lr"
    dim: int = 8
    checkpoint_every_s: float = 30.0

    @field_validator("servers", mode="before")
    @classmethod
    def _servers(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 64:
            raise ValueError(f"sparse.servers must be an integer in 1..64, got {v!r}")
        return v

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, v: Any) -> Any:
        if v not in _SPARSE_MODELS:
            raise ValueError(f"sparse.model must be one of {', '.join(_SPARSE_MODELS)}, got {v!r}")
        return v

    @field_validator("dim", mode="before")
    @classmethod
    def _dim(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1024:
            raise ValueError(f"sparse.dim must be an integer in 1..1024, got {v!r}")
        return v

    @field_validator("checkpoint_every_s", mode="before")
    @classmethod
    def _every(cls, v: Any) -> Any:
        ok = isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < float("inf")
        if not ok:
            raise ValueError(f"sparse.checkpoint_every_s must be a number > 0, got {v!r}")
        return v


def exec_safe(value: str) -> str:
    """``value`` if a process can carry it as an argument, path or environment value.

    A NUL ends a C string (``execve`` refuses it) and a lone surrogate (JSON ``"\\ud800"``)
    has no UTF-8 form: either would pass validation and fail at launch, so both are refused
    here, naming the character.
    """
    if "\x00" in value:
        raise ValueError(
            f"contains a NUL character (\\x00) at position {value.index(chr(0))}, which no "
            "command line, path or environment variable can carry"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"contains {value[exc.start]!r} at position {exc.start}, which has no UTF-8 form"
        ) from None
    return value


#: One argv element (or path, or env value) as the schema shows it; the validators enforce it.
Arg = Annotated[
    str,
    Field(max_length=MAX_ARG_CHARS),
    WithJsonSchema({"type": "string", "maxLength": MAX_ARG_CHARS, "pattern": NO_NUL}),
]
_ARGV_SCHEMA = {
    "type": "array",
    "items": {"type": "string", "maxLength": MAX_ARG_CHARS, "pattern": NO_NUL},
}


_SPARSE_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {
            "type": "object",
            "properties": {
                "servers": {"type": "integer", "minimum": 1, "maximum": 64},
                "model": {"enum": list(_SPARSE_MODELS), "default": "lr"},
                "dim": {"type": "integer", "minimum": 1, "maximum": 1024, "default": 8},
                "checkpoint_every_s": {"type": "number", "exclusiveMinimum": 0, "default": 30},
            },
            "required": ["servers"],
            "additionalProperties": False,
        },
        {"type": "null"},
    ]
}


def _schema_extra(schema: dict[str, Any]) -> None:
    """Describe each field with the text rejections quote; say "exactly one entry point"."""
    for name, prop in schema.get("properties", {}).items():
        if name in ACCEPTED:
            prop["description"] = ACCEPTED[name]
    schema["oneOf"] = [{"required": ["command"]}, {"required": ["script"]}]


class JobSpec(BaseModel):
    """One training job, as submitted.

    This model is the validator (through :func:`parse_spec`) and the API's OpenAPI schema of
    a job spec; the few rules JSON Schema cannot say (``max_batch_size >= batch_size``, ...)
    are only in the validators and quoted in the field descriptions.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra=_schema_extra)

    name: str = Field(json_schema_extra={"pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"})
    command: Annotated[
        list[Arg] | None,
        Field(max_length=MAX_COMMAND_ITEMS),
        WithJsonSchema(
            {
                "anyOf": [
                    {**_ARGV_SCHEMA, "minItems": 1, "maxItems": MAX_COMMAND_ITEMS},
                    {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": MAX_ARG_CHARS,
                        "pattern": NO_NUL,
                    },
                ]
            }
        ),
    ] = None
    script: Arg | None = None
    args: list[Arg] = Field(default_factory=list, max_length=MAX_ARGS_ITEMS)
    working_dir: Annotated[
        str | None,
        Field(max_length=MAX_ARG_CHARS),
        WithJsonSchema(
            {
                "anyOf": [
                    {"type": "string", "maxLength": MAX_ARG_CHARS, "pattern": r"^/[^\x00]*$"},
                    {"type": "null"},
                ]
            }
        ),
    ] = None
    env: dict[str, Arg] = Field(
        default_factory=dict,
        max_length=MAX_ENV_VARS,
        json_schema_extra={
            "propertyNames": {
                "pattern": _ENV_NAME.pattern,
                "not": {"enum": list[JsonValue](sorted(RESERVED_ENV))},
            }
        },
    )
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
    # The GPU types the job may run on (one at a time); None: any. Checked against the
    # cluster's types at submit (coadapt.controller.api).
    gpu_types: Annotated[
        list[str] | None,
        WithJsonSchema(
            {
                "anyOf": [
                    {
                        "type": "array",
                        "items": {"type": "string", "pattern": r"^[A-Za-z][A-Za-z0-9_-]{0,31}$"},
                        "minItems": 1,
                        "maxItems": MAX_GPU_TYPES,
                        "uniqueItems": True,
                    },
                    {"type": "null"},
                ]
            }
        ),
    ] = None
    # GPU sharing: the key of the job's class in the co-location table (docs/hetero.md);
    # None: never packed with another job. A key the table lacks is accepted (an event says
    # the job never packs).
    packing_key: Annotated[
        str | None,
        WithJsonSchema(
            {"anyOf": [{"type": "string", "pattern": KEY_NAME.pattern}, {"type": "null"}]}
        ),
    ] = None
    # Inline schema (no $ref): the tuning API embeds this model's schema in its own.
    sparse: Annotated[SparseSection | None, WithJsonSchema(_SPARSE_SCHEMA)] = None

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
            if len(v) > MAX_ARG_CHARS * 8:  # shlex is slow on huge lines: refuse them first
                raise ValueError(f"command line longer than {MAX_ARG_CHARS * 8} characters")
            try:
                return shlex.split(v)
            except ValueError as exc:
                raise ValueError(f"cannot split command line: {exc}") from None
        return v

    @field_validator("command", "args")
    @classmethod
    def _argv(cls, v: list[str] | None) -> list[str] | None:
        for i, arg in enumerate(v or ()):
            try:
                exec_safe(arg)
            except ValueError as exc:
                raise ValueError(f"element {i} {exc}") from None
        return v

    @field_validator("script")
    @classmethod
    def _script(cls, v: str | None) -> str | None:
        return None if v is None else exec_safe(v)

    @field_validator("working_dir")
    @classmethod
    def _working_dir(cls, v: str | None) -> str | None:
        if v is not None and not os.path.isabs(v):
            raise ValueError(f"working_dir {v!r} is not absolute")
        return None if v is None else exec_safe(v)

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not _ENV_NAME.match(key):
                raise ValueError(f"invalid variable name {key!r}")
            if key in RESERVED_ENV:
                raise ValueError(f"{key} is set by the controller")
        for key, value in v.items():
            try:
                exec_safe(value)
            except ValueError as exc:
                raise ValueError(f"{key}: value {exc}") from None
        return v

    @field_validator("gpu_types", mode="before")
    @classmethod
    def _gpu_types(cls, v: Any) -> Any:
        if v is None:
            return v
        if not isinstance(v, list):
            raise ValueError(f"gpu_types must be a list of GPU type names, got {v!r}")
        if not 1 <= len(v) <= MAX_GPU_TYPES:
            raise ValueError(f"gpu_types needs 1 to {MAX_GPU_TYPES} names, got {len(v)}")
        v = [n.lower() if isinstance(n, str) else n for n in v]  # A100 is a100
        for name in v:
            check_type_name(name)
        dup = sorted({n for n in v if v.count(n) > 1})
        if dup:
            raise ValueError(f"gpu_types names {', '.join(dup)} more than once")
        return v

    @field_validator("packing_key", mode="before")
    @classmethod
    def _packing_key(cls, v: Any) -> Any:
        return None if v is None else check_key(v)

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
        size = len(json.dumps(self.model_dump(), ensure_ascii=False).encode())
        if size > MAX_SPEC_BYTES:
            raise ValueError(
                f"the spec takes {size} bytes as JSON, over the limit of {MAX_SPEC_BYTES} "
                f"({MAX_SPEC_BYTES >> 10} KiB): keep long argument lists and data in a file "
                "the job reads"
            )
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
            model = SparseSection if top == "sparse" else JobSpec
            accepted = "fields: " + ", ".join(model.model_fields)
        else:
            message = str(err["msg"]).removeprefix("Value error, ")
            accepted = ACCEPTED.get(top, "")
        out.append({"field": field, "message": message, "accepted": accepted})
    return out


def check_cluster_types(spec: JobSpec, cluster_types: Sequence[str]) -> None:
    """Refuse a spec whose ``gpu_types`` names a type no node of the cluster has (it could
    never run there), with a :class:`SpecError` listing the cluster's types."""
    if not spec.gpu_types:
        return
    have = sorted(set(cluster_types))
    missing = [t for t in spec.gpu_types if t not in have]
    if missing:
        raise SpecError(
            f"invalid job spec: gpu_types: no node of the cluster has {', '.join(missing)}",
            [
                {
                    "field": "gpu_types",
                    "message": f"no node of the cluster has GPU type {', '.join(missing)}; "
                    f"the cluster has {', '.join(have) or 'no nodes'}",
                    "accepted": f"a list of the cluster's GPU types: {', '.join(have)}",
                }
            ],
        )


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


__all__ = [
    "ACCEPTED",
    "MAX_ARGS_ITEMS",
    "MAX_ARG_CHARS",
    "MAX_COMMAND_ITEMS",
    "MAX_ENV_VARS",
    "MAX_GPU_TYPES",
    "MAX_SPEC_BYTES",
    "RESERVED_ENV",
    "JobSpec",
    "SparseSection",
    "check_cluster_types",
    "exec_safe",
    "load_spec_file",
    "parse_spec",
]

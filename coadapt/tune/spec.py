"""The experiment spec of ``coadapt.tune`` (YAML or JSON), validated with pydantic.

An experiment is a search space, an objective, a sampler, budgets, an early-stopping rule and
a *trial template*: a job spec (:mod:`coadapt.controller.spec`) that every trial runs with its
parameters appended as CLI flags and/or environment variables. Rejections mirror the job
spec's: a :class:`~coadapt.controller.errors.SpecError` whose ``details`` name each offending
field by its path (``space.lr.low``, ``early_stopping.theta``, ``trial.script``) together with
what the field accepts, so the CLI can print it and the API can return it as a 422 body.

Semantic rules (``low <= high``, conditions without cycles, a budget, ...) are
checked after the types, in one pass that reports every broken rule at once.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from coadapt.controller.errors import SpecError
from coadapt.controller.spec import MAX_ARG_CHARS, JobSpec, exec_safe, parse_spec
from coadapt.controller.specfile import read_spec_mapping
from coadapt.protocol import ENV_TRIAL, param_env_name

#: An experiment name leaves room for the trial suffix ``-t<number>`` within a job name's 63.
_EXP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,47}$")
#: Parameter names become ``--<name>`` flags and environment variables (``param_env_name``).
_PARAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
#: The largest grid the ``grid`` sampler enumerates (each point is one trial).
MAX_GRID_POINTS = 100_000
#: Size caps (the spec is stored with the experiment; choices become argv/env values).
MAX_PARAMS = 256
MAX_CHOICES = 10_000
MAX_METRIC_CHARS = 256

#: What each field accepts, quoted in every rejection that names it (keyed by the path's
#: last component for parameter and early-stopping fields).
ACCEPTED: dict[str, str] = {
    "name": "1-48 characters: letters, digits, '.', '_', '-' (starting with a letter or digit)",
    "space": f"a non-empty mapping of at most {MAX_PARAMS} parameter names (letters, digits, "
    "'_', '.', '-', starting with a letter or '_') to parameter specs",
    "type": "one of: float, int, categorical",
    "low": "a finite number <= high (> 0 with log: true; an integer for int parameters)",
    "high": "a finite number >= low (an integer for int parameters)",
    "log": "true or false (float/int only; needs low > 0; not with step)",
    "step": "a number > 0 that is not combined with log (an integer >= 1 for int parameters)",
    "grid_points": f"integer in [2, {MAX_GRID_POINTS}]: how many points the grid sampler takes "
    "over a float range without step (geometric with log: true)",
    "choices": f"a non-empty list of at most {MAX_CHOICES} distinct strings (at most "
    f"{MAX_ARG_CHARS} characters, no NUL), integers, floats or booleans (categorical only)",
    "when": "a mapping of other categorical/int parameter names (no cycles) to non-empty lists "
    "of their values; the parameter exists only while every named parent takes one of them",
    "objective": "a mapping with metric (a reported metric name) and direction",
    "metric": "the name of a metric the trial reports with coadapt.train.report (at most "
    f"{MAX_METRIC_CHARS} characters, no NUL)",
    "direction": "one of: maximize, minimize",
    "sampler": "one of: random, grid, tpe, gp-ei",
    "seed": "an integer in [0, 2^32), or null for a random seed",
    "parallelism": "integer >= 1 (trials running at once)",
    "max_trials": "integer >= 1, or null; give at least one of max_trials, max_time_s or target",
    "max_time_s": "number > 0 (seconds), or null; give at least one of max_trials, max_time_s "
    "or target",
    "target": "a number: the experiment ends once a trial's objective reaches it, or null",
    "max_steps": "integer >= 1: a trial's budget in reported steps (required by asha and curve)",
    "early_stopping": "a mapping with rule (none, asha, median, curve) and its settings",
    "rule": "one of: none, asha, median, curve",
    "grace_steps": "integer >= 0: steps every trial runs before it may be stopped",
    "reduction_factor": "integer >= 2 (asha: rungs grow and survivors shrink by this factor)",
    "theta": "a number in (0, 1): the fraction of max_steps after which curve checks start",
    "min_peers": "integer >= 1: other trials' values needed before a trial may be stopped",
    "min_points": "integer >= 3: reported points needed before curve extrapolates",
    "max_retries": "integer in [0, 100] (a failed trial is re-run up to this many times)",
    "dead_after_s": "number > 0: seconds without a report after which a running trial is failed",
    "trial": "a job spec mapping (see the job spec fields); its name is set per trial",
    "params_as": "one of: args, env, both",
}


class ParamSpec(BaseModel):
    """One dimension of the search space.

    ``float``/``int`` take ``low``/``high`` (inclusive), optional ``log`` or ``step``;
    ``categorical`` takes ``choices``. ``when`` makes the parameter conditional: it exists
    only in trials where each named parent parameter takes one of the listed values.
    """

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={
            # What the semantic pass requires of each type (low <= high, distinct choices and
            # the parents of ``when`` are checked there, not expressible here).
            "anyOf": [
                {
                    "properties": {"type": {"const": "categorical"}, "choices": {"minItems": 1}},
                    "required": ["type", "choices"],
                },
                {
                    "properties": {"type": {"enum": ["float", "int"]}},
                    "required": ["type", "low", "high"],
                },
            ]
        },
    )

    type: Literal["float", "int", "categorical"]
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    grid_points: int | None = Field(default=None, le=MAX_GRID_POINTS)
    choices: list[str | bool | int | float] | None = Field(default=None, max_length=MAX_CHOICES)
    when: dict[str, list[str | bool | int | float]] | None = Field(
        default=None, max_length=MAX_PARAMS
    )

    @field_validator("choices")
    @classmethod
    def _choices(cls, v: list[Any] | None) -> list[Any] | None:
        # String choices are appended to the trial's argv and environment.
        for i, c in enumerate(v or ()):
            if isinstance(c, str):
                if len(c) > MAX_ARG_CHARS:
                    raise ValueError(f"choice {i} is longer than {MAX_ARG_CHARS} characters")
                try:
                    exec_safe(c)
                except ValueError as exc:
                    raise ValueError(f"choice {i} {exc}") from None
        return v

    def grid_size(self) -> int:
        """How many values :meth:`grid_values` yields, computed without listing them."""
        if self.type == "categorical":
            return len(self.choices or [])
        assert self.low is not None and self.high is not None
        if self.step is None and self.grid_points is not None:
            return self.grid_points
        if self.type == "int":
            return max(0, (int(self.high) - int(self.low)) // int(self.step or 1) + 1)
        if self.step is None:
            return 0
        n = (self.high - self.low) / self.step
        return math.floor(n + 1e-9) + 1 if n <= MAX_GRID_POINTS else MAX_GRID_POINTS + 1

    def grid_values(self) -> list[Any]:
        """The values the ``grid`` sampler enumerates (validated specs only)."""
        if self.type == "categorical":
            return list(self.choices or [])
        assert self.low is not None and self.high is not None
        if self.type == "int":
            lo, hi = int(self.low), int(self.high)
            if self.step is None and self.grid_points is not None:
                pts = _spaced(lo, hi, self.grid_points, self.log)
                return sorted({round(v) for v in pts})
            step = int(self.step or 1)
            return list(range(lo, hi + 1, step))
        if self.step is not None:
            n = math.floor((self.high - self.low) / self.step + 1e-9)
            return [_round_step(self.low + i * self.step, self.step) for i in range(n + 1)]
        assert self.grid_points is not None
        return _spaced(self.low, self.high, self.grid_points, self.log)


def _spaced(low: float, high: float, n: int, log: bool) -> list[float]:
    if low == high:
        return [float(low)]
    if log:
        pts = [low * (high / low) ** (i / (n - 1)) for i in range(n)]
    else:
        pts = [low + (high - low) * i / (n - 1) for i in range(n)]
    # 12 significant digits: 1e-4 stays 1e-4 instead of 0.00010000000000000009.
    inner = [float(f"{v:.12g}") for v in pts[1:-1]]
    return [float(low), *inner, float(high)]


def _round_step(v: float, step: float) -> float:
    """Undo float drift on a stepped grid (0.1 * 3 -> 0.3), keeping the step's precision."""
    decimals = max(0, -math.floor(math.log10(step)) + 6)
    return round(v, decimals)


class Objective(BaseModel):
    """The metric a trial's value is read from (its last reported value) and its direction."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: str = Field(min_length=1, max_length=MAX_METRIC_CHARS)

    @field_validator("metric")
    @classmethod
    def _metric(cls, v: str) -> str:
        return exec_safe(v)

    direction: Literal["maximize", "minimize"] = "maximize"


class EarlyStopping(BaseModel):
    """How running trials are stopped early (see :func:`coadapt.tune.pruning.decide`).

    * ``none``: never.
    * ``asha``: asynchronous successive halving; rungs at ``grace_steps * reduction_factor**k``
      (below ``max_steps``); at its highest rung a trial continues only while it is in the top
      ``1/reduction_factor`` of the values recorded there (once ``min_peers`` others have one).
    * ``median``: after ``grace_steps``, stop a trial whose best value so far is worse than the
      median of ``min_peers`` or more peers' best values up to the same step.
    * ``curve``: SpotTune's EarlyCurve; once ``theta * max_steps`` steps are spent (and at
      least ``min_points`` points are reported), extrapolate the curve to ``max_steps`` and stop
      it if even the optimistic end of the prediction cannot beat the best final value.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    rule: Literal["none", "asha", "median", "curve"] = "none"
    grace_steps: int = Field(default=1, ge=0)
    reduction_factor: int = Field(default=3, ge=2)
    theta: float = Field(default=0.3, gt=0.0, lt=1.0)
    min_peers: int = Field(default=3, ge=1)
    min_points: int = Field(default=3, ge=3)


def _trial_schema() -> dict[str, Any]:
    """The trial template's JSON Schema: a job spec whose ``name`` is optional (set per trial).

    Derived from :class:`~coadapt.controller.spec.JobSpec`, which validates the template.
    """
    schema = copy.deepcopy(JobSpec.model_json_schema())
    schema["required"] = [f for f in schema.get("required", []) if f != "name"]
    schema["title"] = "TrialTemplate"
    schema["description"] = ACCEPTED["trial"]
    return schema


class ExperimentSpec(BaseModel):
    """One tuning experiment, as submitted (see ``docs/tune.md``).

    Also the OpenAPI schema of ``POST /api/v1/experiments``; rules across fields are checked
    after the types (:func:`_semantic_errors`) and quoted in :data:`ACCEPTED`.
    """

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={
            "anyOf": [
                {"required": [k], "properties": {k: {"not": {"type": "null"}}}}
                for k in ("max_trials", "max_time_s", "target")
            ]
        },
    )

    name: str = Field(json_schema_extra={"pattern": _EXP_NAME.pattern})
    space: dict[str, ParamSpec] = Field(
        max_length=MAX_PARAMS,
        json_schema_extra={"minProperties": 1, "propertyNames": {"pattern": _PARAM_NAME.pattern}},
    )
    objective: Objective
    sampler: Literal["random", "grid", "tpe", "gp-ei"] = "tpe"
    seed: int | None = Field(default=None, ge=0, le=2**32 - 1)
    parallelism: int = Field(default=1, ge=1, le=4096)
    max_trials: int | None = Field(default=None, ge=1)
    max_time_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    target: float | None = Field(default=None, allow_inf_nan=False)
    max_steps: int | None = Field(default=None, ge=1)
    early_stopping: EarlyStopping = Field(default_factory=EarlyStopping)
    max_retries: int = Field(default=2, ge=0, le=100)
    dead_after_s: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    trial: Annotated[dict[str, Any], WithJsonSchema(_trial_schema())]
    params_as: Literal["args", "env", "both"] = "args"

    @model_validator(mode="after")
    def _semantics(self) -> ExperimentSpec:
        # SpecError is not a ValueError, so pydantic lets it through with our field paths.
        details = _semantic_errors(self)
        if details:
            raise SpecError(
                "invalid experiment spec: " + ", ".join(d["field"] for d in details), details
            )
        return self

    def active(self, name: str, params: Mapping[str, Any]) -> bool:
        """Whether parameter ``name`` exists given its parents' values in ``params``."""
        when = self.space[name].when
        if not when:
            return True
        return all(p in params and _member(params[p], vals) for p, vals in when.items())

    def order(self) -> list[str]:
        """Parameter names with every parent before its children (else as declared)."""
        done: list[str] = []
        pending = list(self.space)
        while pending:
            ready = next(
                (n for n in pending if all(p in done for p in self.space[n].when or {})), pending[0]
            )
            done.append(ready)
            pending.remove(ready)
        return done

    def is_conditional(self) -> bool:
        return any(p.when for p in self.space.values())

    def grid(self) -> list[dict[str, Any]]:
        """Every distinct *active* configuration, in a deterministic order (``grid`` sampler).

        Conditional parameters are enumerated only under parent values that activate them, so
        no two grid points differ only in inactive parameters.
        """
        points: list[dict[str, Any]] = [{}]
        for name in self.order():
            p = self.space[name]
            if len(points) * p.grid_size() > MAX_GRID_POINTS:
                raise _grid_too_large(name)
            values = p.grid_values()
            nxt: list[dict[str, Any]] = []
            for point in points:
                if self.active(name, point):
                    nxt.extend({**point, name: v} for v in values)
                else:
                    nxt.append(point)
            points = nxt
            if len(points) > MAX_GRID_POINTS:
                raise _grid_too_large(name)
        return points


def _grid_too_large(name: str) -> SpecError:
    return SpecError(
        f"the grid has more than {MAX_GRID_POINTS} points",
        [
            {
                "field": f"space.{name}",
                "message": "grid too large",
                "accepted": f"at most {MAX_GRID_POINTS} grid points in all",
            }
        ],
    )


def _member(value: Any, values: list[Any]) -> bool:
    # bool is an int in Python: keep True from matching 1 in a condition.
    return any(type(value) is type(v) and value == v for v in values) or (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and any(
            not isinstance(v, bool) and isinstance(v, int | float) and v == value for v in values
        )
    )


def _err(field: str, message: str) -> dict[str, Any]:
    key = field.rsplit(".", 1)[-1]
    return {"field": field, "message": message, "accepted": ACCEPTED.get(key, "")}


def _param_errors(
    name: str, p: ParamSpec, every: Mapping[str, ParamSpec], sampler: str
) -> list[dict[str, Any]]:
    f = f"space.{name}"
    out: list[dict[str, Any]] = []
    if not _PARAM_NAME.match(name):
        out.append(_err(f, f"invalid parameter name {name!r}") | {"accepted": ACCEPTED["space"]})
    if p.type == "categorical":
        for key in ("low", "high", "step", "grid_points"):
            if getattr(p, key) is not None:
                out.append(_err(f"{f}.{key}", f"{key} does not apply to categorical"))
        if p.log:
            out.append(_err(f"{f}.log", "log does not apply to categorical"))
        if not p.choices:
            out.append(_err(f"{f}.choices", "categorical needs a non-empty choices list"))
        elif len({(type(c), c) for c in p.choices}) != len(p.choices):
            out.append(_err(f"{f}.choices", "choices repeat a value"))
    else:
        if p.choices is not None:
            out.append(_err(f"{f}.choices", f"choices do not apply to {p.type}"))
        for key in ("low", "high"):
            v = getattr(p, key)
            if v is None:
                out.append(_err(f"{f}.{key}", f"{p.type} needs {key}"))
            elif not math.isfinite(v):
                out.append(_err(f"{f}.{key}", f"{key} is not finite"))
            elif p.type == "int" and not float(v).is_integer():
                out.append(_err(f"{f}.{key}", f"{key} {v} is not an integer"))
        if p.low is not None and p.high is not None and p.low > p.high:
            out.append(_err(f"{f}.low", f"low {p.low:g} is above high {p.high:g}"))
        if p.log and p.low is not None and p.low <= 0:
            out.append(_err(f"{f}.low", f"log scale needs low > 0, got {p.low:g}"))
        if p.step is not None:
            if p.log:
                out.append(_err(f"{f}.step", "step cannot be combined with log"))
            if not p.step > 0 or not math.isfinite(p.step):
                out.append(_err(f"{f}.step", f"step must be > 0, got {p.step:g}"))
            elif p.type == "int" and not float(p.step).is_integer():
                out.append(_err(f"{f}.step", f"step {p.step:g} is not an integer"))
        if p.grid_points is not None:
            if p.grid_points < 2:
                out.append(
                    _err(f"{f}.grid_points", f"grid_points must be >= 2, got {p.grid_points}")
                )
            if p.step is not None:
                out.append(_err(f"{f}.grid_points", "give step or grid_points, not both"))
        if sampler == "grid" and p.type == "float" and p.step is None and p.grid_points is None:
            out.append(
                _err(
                    f"{f}.step", "the grid sampler needs step or grid_points for a float parameter"
                )
            )
    for parent, values in (p.when or {}).items():
        wf = f"{f}.when.{parent}"
        acc = ACCEPTED["when"]
        if parent == name:
            out.append(
                {"field": wf, "message": "a parameter cannot depend on itself", "accepted": acc}
            )
            continue
        if parent not in every:
            out.append(
                {
                    "field": wf,
                    "message": f"unknown parameter {parent!r} (conditions "
                    "must name another parameter of space)",
                    "accepted": acc,
                }
            )
            continue
        pp = every[parent]
        if pp.type == "float":
            out.append(
                {
                    "field": wf,
                    "message": f"{parent!r} is a float parameter; conditions "
                    "need a categorical or int parent",
                    "accepted": acc,
                }
            )
            continue
        if not values:
            out.append({"field": wf, "message": "empty list of values", "accepted": acc})
        for v in values:
            if pp.type == "categorical" and not _member(v, list(pp.choices or [])):
                out.append(
                    {
                        "field": wf,
                        "message": f"{v!r} is not one of {parent}'s choices {pp.choices}",
                        "accepted": acc,
                    }
                )
            elif pp.type == "int" and (
                isinstance(v, bool)
                or not isinstance(v, int | float)
                or not float(v).is_integer()
                or (pp.low is not None and pp.high is not None and not pp.low <= v <= pp.high)
            ):
                out.append(
                    {
                        "field": wf,
                        "message": f"{v!r} is not an integer in {parent}'s range",
                        "accepted": acc,
                    }
                )
    return out


def _find_cycle(space: Mapping[str, ParamSpec]) -> list[str] | None:
    """A cycle of ``when`` references (``[a, b, a]``: a needs b, which needs a), or None."""
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> list[str] | None:
        if name in path:
            return [*path[path.index(name) :], name]
        if name in done:
            return None
        for parent in space[name].when or {}:
            if parent in space and parent != name:  # self-reference is reported on its own
                found = visit(parent, [*path, name])
                if found:
                    return found
        done.add(name)
        return None

    for name in space:
        found = visit(name, [])
        if found:
            return found
    return None


def _semantic_errors(exp: ExperimentSpec) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not _EXP_NAME.match(exp.name):
        out.append(_err("name", f"invalid name {exp.name!r}"))
    if not exp.space:
        out.append(_err("space", "the search space is empty"))
    for name, p in exp.space.items():
        out.extend(_param_errors(name, p, exp.space, exp.sampler))
    cycle = _find_cycle(exp.space)
    if cycle:
        out.append(
            {
                "field": f"space.{cycle[0]}.when.{cycle[1]}",
                "message": "conditions form a cycle: " + " -> ".join(cycle),
                "accepted": ACCEPTED["when"],
            }
        )
    env_names: dict[str, str] = {}
    for name in exp.space:
        env = param_env_name(name)
        if env in env_names:
            out.append(
                _err(
                    f"space.{name}",
                    f"{name!r} and {env_names[env]!r} map to the same variable {env}",
                )
                | {"accepted": ACCEPTED["space"]}
            )
        env_names[env] = name
    if exp.max_trials is None and exp.max_time_s is None and exp.target is None:
        out.append(
            _err("max_trials", "no budget: give at least one of max_trials, max_time_s or target")
        )
    rule = exp.early_stopping.rule
    if rule in ("asha", "curve") and exp.max_steps is None:
        out.append(
            _err(
                "max_steps",
                f"early_stopping rule {rule!r} needs max_steps (a trial's "
                "budget in reported steps)",
            )
        )
    if exp.sampler == "grid" and not out:
        try:
            exp.grid()
        except SpecError as exc:
            out.extend(exc.details)
    if not out:
        out.extend(_template_errors(exp))
    return out


def sample_point(exp: ExperimentSpec) -> dict[str, Any]:
    """One valid configuration (every range's low end, every first choice)."""
    point: dict[str, Any] = {}
    for name in exp.order():
        p = exp.space[name]
        if not exp.active(name, point):
            continue
        if p.type == "categorical":
            point[name] = p.choices[0] if p.choices else None
        elif p.type == "int":
            point[name] = int(p.low or 0)
        else:
            point[name] = float(p.low or 0.0)
    return point


def _template_errors(exp: ExperimentSpec) -> list[dict[str, Any]]:
    try:
        parse_spec(trial_job_spec(exp, sample_point(exp), 0))
    except SpecError as exc:
        return [
            {**d, "field": f"trial.{d['field']}" if d["field"] != "spec" else "trial"}
            for d in exc.details
        ] or [_err("trial", exc.message)]
    return []


def format_value(value: Any) -> str:
    """How a parameter value is written on a command line or in the environment."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # the shortest string that reads back as the same float
    return str(value)


def trial_job_spec(
    exp: ExperimentSpec, params: Mapping[str, Any], trial_number: int
) -> dict[str, Any]:
    """The job spec (a mapping for :func:`~coadapt.controller.spec.parse_spec`) of one trial.

    The template is copied; its name becomes ``<experiment>-t<number>``; with ``params_as``
    ``args``/``both`` each parameter appends ``--<name> <value>`` to ``args`` (in space order),
    with ``env``/``both`` it sets :func:`~coadapt.protocol.param_env_name`; ``ENV_TRIAL`` (the
    trial number) is always set.
    """
    job = copy.deepcopy(dict(exp.trial))
    job["name"] = f"{exp.name}-t{trial_number}"
    ordered = [(n, params[n]) for n in exp.space if n in params]
    ordered += [(n, v) for n, v in params.items() if n not in exp.space]
    if exp.params_as in ("args", "both"):
        args = job.get("args")
        args = list(args) if isinstance(args, list | tuple) else ([] if args is None else args)
        if isinstance(args, list):
            for n, v in ordered:
                args += [f"--{n}", format_value(v)]
        job["args"] = args
    env = job.get("env")
    env = dict(env) if isinstance(env, Mapping) else ({} if env is None else env)
    if isinstance(env, dict):
        if exp.params_as in ("env", "both"):
            for n, v in ordered:
                env[param_env_name(n)] = format_value(v)
        env[ENV_TRIAL] = str(trial_number)
    job["env"] = env
    return job


# -- parsing ------------------------------------------------------------------------------------
def _field_of(err: ErrorDetails) -> str:
    loc = [str(p) for p in err["loc"]]
    # pydantic adds the union member's type name to the path (choices.0.str): drop it.
    loc = [p for p in loc if p not in ("str", "bool", "int", "float")]
    return ".".join(loc) if loc else "spec"


_MODEL_AT: dict[str, type[BaseModel]] = {
    "objective": Objective,
    "early_stopping": EarlyStopping,
}


def _fields_of(path: str) -> str:
    parts = path.split(".")
    if parts[0] == "space" and len(parts) >= 3:
        model: type[BaseModel] = ParamSpec
    elif len(parts) >= 2 and parts[0] in _MODEL_AT:
        model = _MODEL_AT[parts[0]]
    else:
        model = ExperimentSpec
    return "fields: " + ", ".join(model.model_fields)


def _details(exc: ValidationError) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for err in exc.errors(include_url=False):
        field = _field_of(err)
        if err["type"] == "extra_forbidden":
            message, accepted = "unknown field", _fields_of(field)
        else:
            message = str(err["msg"]).removeprefix("Value error, ")
            key = field.rsplit(".", 1)[-1]
            if key.isdigit():  # an element of a list (choices.0): quote the list's rules
                key = field.rsplit(".", 2)[-2]
            accepted = ACCEPTED.get(key, "")
        if field in seen:  # a union reports each member's failure: keep the first
            continue
        seen.add(field)
        out.append({"field": field, "message": message, "accepted": accepted})
    return out


def parse_experiment(data: Any) -> ExperimentSpec:
    """Validate an experiment given as a mapping; raise :class:`SpecError` naming bad fields."""
    if not isinstance(data, Mapping):
        raise SpecError(
            "an experiment spec must be a mapping of fields",
            [
                {
                    "field": "spec",
                    "message": f"got {type(data).__name__}",
                    "accepted": "fields: " + ", ".join(ExperimentSpec.model_fields),
                }
            ],
        )
    try:
        return ExperimentSpec.model_validate(dict(data))
    except ValidationError as exc:
        details = _details(exc)
        raise SpecError(
            "invalid experiment spec: " + ", ".join(d["field"] for d in details), details
        ) from None


def load_experiment_file(path: str | Path) -> ExperimentSpec:
    """Read and validate a YAML/JSON experiment file.

    The trial template runs in the file's folder unless it names a ``working_dir`` (resolved
    against that folder when relative), as with ``coadapt submit``'s job specs.
    """
    p = Path(path)
    data = read_spec_mapping(p, "an experiment spec")
    trial = data.get("trial")
    if isinstance(trial, dict):
        base = p.resolve().parent
        wd = trial.get("working_dir")
        if wd is None:
            trial["working_dir"] = str(base)
        elif isinstance(wd, str) and not Path(wd).is_absolute():
            trial["working_dir"] = str((base / wd).resolve())
    try:
        return parse_experiment(data)
    except SpecError as exc:
        raise SpecError(f"{p}: {exc.message}", exc.details) from None


__all__ = [
    "ACCEPTED",
    "MAX_GRID_POINTS",
    "EarlyStopping",
    "ExperimentSpec",
    "Objective",
    "ParamSpec",
    "format_value",
    "load_experiment_file",
    "param_env_name",
    "parse_experiment",
    "sample_point",
    "trial_job_spec",
]

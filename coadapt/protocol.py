"""coadapt's wire contract: what crosses a process or storage boundary, typed, in one place.

The controller, the launchers and executors write a replica's environment and the training
library reads it; the library writes metric records and the controller (API ingestion,
dashboard series) reads them; the reconciler and the tuning loop write replica statuses, job
events and cancel causes that are read back after a restart. Each side used to spell these as
bare strings, so a rename on one side silently broke the other. Here each is defined once:

* :class:`ReplicaEnv`: a replica's environment, with :meth:`~ReplicaEnv.to_env` /
  :meth:`~ReplicaEnv.from_env` and validation;
* :data:`MetricRecord`: one dataclass per record kind, with ``to_json`` and :func:`parse_record`;
* :class:`ReplicaStatus`, :class:`EventKind`, :class:`CancelCause`;

This module imports neither torch, numpy nor Optuna, nor the controller (the training library
and the light launcher load it in every replica) and keeps the wire format of the records and
events already persisted.
"""

from __future__ import annotations

import math
import os
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any, ClassVar

# -- replica environment ------------------------------------------------------------------------
ENV_RANK = "RANK"
ENV_WORLD_SIZE = "WORLD_SIZE"
ENV_LOCAL_RANK = "LOCAL_RANK"
ENV_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
ENV_GROUP_RANK = "GROUP_RANK"
ENV_MASTER_ADDR = "MASTER_ADDR"
ENV_MASTER_PORT = "MASTER_PORT"
ENV_JOB_ID = "COADAPT_JOB_ID"
ENV_NUM_NODES = "COADAPT_NUM_NODES"
ENV_NODE = "COADAPT_NODE"
ENV_TENANT = "COADAPT_TENANT"
ENV_CHECKPOINT_DIR = "COADAPT_CHECKPOINT_DIR"
ENV_METRICS_URL = "COADAPT_METRICS_URL"
ENV_METRICS_FILE = "COADAPT_METRICS_FILE"
ENV_JOB_TOKEN = "COADAPT_JOB_TOKEN"
ENV_RESTARTS = "COADAPT_RESTARTS"
ENV_ATTEMPT = "COADAPT_ATTEMPT"
ENV_BATCH_MODE = "COADAPT_BATCH_MODE"
ENV_CHECKPOINT_EVERY = "COADAPT_CHECKPOINT_EVERY"
ENV_CHECKPOINT_INTERVAL = "COADAPT_CHECKPOINT_INTERVAL"
ENV_MAX_LOCAL_BSZ = "COADAPT_MAX_LOCAL_BSZ"
# A sparse job's shard servers: their directory (coadapt.sparse.jobs.JobLayout) and count.
ENV_SPARSE_DIR = "COADAPT_SPARSE_DIR"
ENV_SPARSE_SERVERS = "COADAPT_SPARSE_SERVERS"
#: ``0`` in a job's env: the local executor starts its replicas cold (no warm zygote).
ENV_WARM = "COADAPT_WARM"
#: Set on every tuning trial's job: ``<experiment>/<number>/<attempt>`` (found after a crash).
ENV_TUNE_TRIAL = "COADAPT_TUNE_TRIAL"
#: A tuning trial's number, and the prefix of its parameters' variables (``params_as: env``).
ENV_TRIAL = "COADAPT_TRIAL"
ENV_PARAM_PREFIX = "COADAPT_PARAM_"

# -- the controller's own settings from the environment (not set on replicas)
#: Where the controller keeps its state when ``--state-dir`` is not given.
ENV_STATE_DIR = "COADAPT_STATE_DIR"
#: A directory of ``coadapt simulate --json`` results the dashboard lists.
ENV_DASHBOARD_SIM_DIR = "COADAPT_DASHBOARD_SIM_DIR"

#: Variables only the controller sets: a job spec may not (it would lie about who it is).
RESERVED_ENV = (
    ENV_RANK,
    ENV_WORLD_SIZE,
    ENV_LOCAL_RANK,
    ENV_LOCAL_WORLD_SIZE,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_JOB_ID,
    ENV_NUM_NODES,
    ENV_CHECKPOINT_DIR,
    ENV_METRICS_URL,
    ENV_RESTARTS,
    ENV_JOB_TOKEN,
)

#: How the scheduler's policy treats the batch (``coadapt.policies.BatchMode`` values).
BATCH_MODES = ("adaptive", "fixed_batch", "fixed")


class ReplicaEnvError(ValueError):
    """A replica's environment is malformed (the message names the variable and the fix)."""


def param_env_name(name: str) -> str:
    """``COADAPT_PARAM_<NAME>``: upper case, every other character than A-Z/0-9 as ``_``."""
    return ENV_PARAM_PREFIX + re.sub(r"[^A-Z0-9]", "_", name.upper())


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ReplicaEnvError(f"environment variable {name}={raw!r} is not an integer") from None


def _float(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return float(raw)
    except ValueError:
        raise ReplicaEnvError(f"environment variable {name}={raw!r} is not a number") from None


def _str(env: Mapping[str, str], name: str) -> str | None:
    return env.get(name) or None


@dataclass(frozen=True, kw_only=True)
class ReplicaEnv:
    """Everything the controller (or ``coadapt.train.launch``) tells one replica.

    ``None`` means "not set": :meth:`to_env` leaves the variable out and the reader applies its
    default. The torchrun-compatible part (RANK, WORLD_SIZE, LOCAL_*, MASTER_*) is always set.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int | None = None  # None: ``rank`` (one node)
    local_world_size: int | None = None
    group_rank: int | None = None  # the node's index among the attempt's nodes
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    job_id: str = ""
    num_nodes: int = 1
    node: str | None = None
    tenant: str | None = None  # the executor maps it to a run-as user
    checkpoint_dir: str | None = None
    metrics_url: str | None = None
    metrics_file: str | None = None
    job_token: str | None = None
    restarts: int = 0
    attempt: int | None = None
    batch_mode: str | None = None  # one of BATCH_MODES; None: "adaptive"
    checkpoint_every: int | None = None  # also checkpoint every N steps
    checkpoint_interval: float | None = None  # seconds between periodic checkpoints
    max_local_bsz: int | None = None  # the controller's learned per-replica cap (after an OOM)
    sparse_dir: str | None = None  # a sparse job's servers and checkpoints (JobLayout root)
    sparse_servers: int | None = None  # how many shard servers the job runs

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ReplicaEnvError(
                f"need 0 <= RANK < WORLD_SIZE, got RANK={self.rank} WORLD_SIZE={self.world_size}"
            )
        if not 1 <= self.num_nodes <= self.world_size:
            raise ReplicaEnvError(f"need 1 <= {ENV_NUM_NODES} <= WORLD_SIZE, got {self.num_nodes}")
        if self.local_rank is not None and self.local_rank < 0:
            raise ReplicaEnvError(f"LOCAL_RANK must be >= 0, got {self.local_rank}")
        if not 0 <= self.master_port <= 65535:
            raise ReplicaEnvError(
                f"MASTER_PORT must be a TCP port (0-65535), got {self.master_port}"
            )
        if self.batch_mode is not None and self.batch_mode not in BATCH_MODES:
            raise ReplicaEnvError(
                f"{ENV_BATCH_MODE}={self.batch_mode!r} is not one of {', '.join(BATCH_MODES)}"
            )
        if self.max_local_bsz is not None and self.max_local_bsz < 1:
            raise ReplicaEnvError(f"{ENV_MAX_LOCAL_BSZ} must be >= 1, got {self.max_local_bsz}")
        if (self.sparse_servers is None) != (self.sparse_dir is None):
            raise ReplicaEnvError(f"set both {ENV_SPARSE_DIR} and {ENV_SPARSE_SERVERS}, or neither")
        if self.sparse_servers is not None and self.sparse_servers < 1:
            raise ReplicaEnvError(f"{ENV_SPARSE_SERVERS} must be >= 1, got {self.sparse_servers}")
        if self.checkpoint_every is not None and self.checkpoint_every < 0:
            raise ReplicaEnvError(
                f"{ENV_CHECKPOINT_EVERY} must be >= 0 (0: never), got {self.checkpoint_every}"
            )
        interval = self.checkpoint_interval
        if interval is not None and not (interval >= 0 and math.isfinite(interval)):
            raise ReplicaEnvError(
                f"environment variable {ENV_CHECKPOINT_INTERVAL}={interval!r} "
                "must be a finite number >= 0"
            )

    def to_env(self) -> dict[str, str]:
        """The variables to set (the rest of a replica's environment is the caller's)."""
        env = {
            ENV_RANK: str(self.rank),
            ENV_WORLD_SIZE: str(self.world_size),
            ENV_LOCAL_RANK: str(self.rank if self.local_rank is None else self.local_rank),
            ENV_MASTER_ADDR: self.master_addr,
            ENV_MASTER_PORT: str(self.master_port),
            ENV_JOB_ID: self.job_id,
            ENV_NUM_NODES: str(self.num_nodes),
            ENV_RESTARTS: str(self.restarts),
        }
        optional: dict[str, object | None] = {
            ENV_LOCAL_WORLD_SIZE: self.local_world_size,
            ENV_GROUP_RANK: self.group_rank,
            ENV_NODE: self.node,
            ENV_TENANT: self.tenant,
            ENV_CHECKPOINT_DIR: self.checkpoint_dir,
            ENV_METRICS_URL: self.metrics_url,
            ENV_METRICS_FILE: self.metrics_file,
            ENV_JOB_TOKEN: self.job_token,
            ENV_ATTEMPT: self.attempt,
            ENV_BATCH_MODE: self.batch_mode,
            ENV_CHECKPOINT_EVERY: self.checkpoint_every,
            ENV_CHECKPOINT_INTERVAL: self.checkpoint_interval,
            ENV_MAX_LOCAL_BSZ: self.max_local_bsz,
            ENV_SPARSE_DIR: self.sparse_dir,
            ENV_SPARSE_SERVERS: self.sparse_servers,
        }
        env.update({k: str(v) for k, v in optional.items() if v is not None})
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ReplicaEnv:
        """Read (and validate) the variables; absent or empty ones take their defaults."""
        env = os.environ if environ is None else environ
        rank = _int(env, ENV_RANK) or 0
        port = _int(env, ENV_MASTER_PORT)
        return cls(
            rank=rank,
            world_size=_or(_int(env, ENV_WORLD_SIZE), 1),
            local_rank=_int(env, ENV_LOCAL_RANK),
            local_world_size=_int(env, ENV_LOCAL_WORLD_SIZE),
            group_rank=_int(env, ENV_GROUP_RANK),
            master_addr=env.get(ENV_MASTER_ADDR) or "127.0.0.1",
            master_port=29500 if port is None else port,
            job_id=env.get(ENV_JOB_ID, ""),
            num_nodes=_or(_int(env, ENV_NUM_NODES), 1),
            node=_str(env, ENV_NODE),
            tenant=_str(env, ENV_TENANT),
            checkpoint_dir=_str(env, ENV_CHECKPOINT_DIR),
            metrics_url=_str(env, ENV_METRICS_URL),
            metrics_file=_str(env, ENV_METRICS_FILE),
            job_token=_str(env, ENV_JOB_TOKEN),
            restarts=_int(env, ENV_RESTARTS) or 0,
            attempt=_int(env, ENV_ATTEMPT),
            batch_mode=_str(env, ENV_BATCH_MODE),
            checkpoint_every=_int(env, ENV_CHECKPOINT_EVERY),
            checkpoint_interval=_float(env, ENV_CHECKPOINT_INTERVAL),
            # 0 reads as "no cap" (what an unset variable means), as it always has.
            max_local_bsz=_int(env, ENV_MAX_LOCAL_BSZ) or None,
            sparse_dir=_str(env, ENV_SPARSE_DIR),
            sparse_servers=_int(env, ENV_SPARSE_SERVERS),
        )


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


# -- metric records -----------------------------------------------------------------------------
class RecordKind(StrEnum):
    """The ``kind`` of a metrics record (its JSON discriminator)."""

    PROGRESS = "progress"
    GOODPUT = "goodput"
    CHECKPOINT = "checkpoint"
    FIRST_STEP = "first_step"
    BATCH = "batch"
    METRIC = "metric"
    STOPPED = "stopped"
    OOM = "oom"


class RecordError(ValueError):
    """A metrics record is not a JSON object with a string ``kind``."""


@dataclass(frozen=True, kw_only=True)
class _Record:
    """Fields every record carries (the sink fills them in; ``None`` when a sender omits them)."""

    kind: ClassVar[RecordKind]
    #: State records only matter as the newest of their kind (the sink coalesces them).
    state: ClassVar[bool] = False
    time: float | None = None
    job_id: str | None = None
    rank: int | None = None
    restarts: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON object (envelope fields that are ``None`` are left out)."""
        out: dict[str, Any] = {"kind": self.kind.value}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in _ENVELOPE:
                continue
            out[f.name] = value
        return out


_ENVELOPE = frozenset(("time", "job_id", "rank", "restarts"))


@dataclass(frozen=True, kw_only=True)
class ProgressRecord(_Record):
    """The job's latest step (every step; coalesced)."""

    kind: ClassVar[RecordKind] = RecordKind.PROGRESS
    state: ClassVar[bool] = True
    step: int | None = None
    epoch: int | None = None
    position: int | None = None
    batch_size: int | None = None
    local_bsz: int | None = None
    accum_steps: int | None = None
    replicas: int | None = None
    lr_scale: float | None = None
    pgns: float | None = None
    loss: float | None = None
    # Fraction of the declared epochs done, in [0, 1] (None: the script declared none).
    fraction: float | None = None


@dataclass(frozen=True, kw_only=True)
class GoodputRecord(_Record):
    """The fitted goodput model and the (m, s) it prefers (coalesced)."""

    kind: ClassVar[RecordKind] = RecordKind.GOODPUT
    state: ClassVar[bool] = True
    step: int | None = None
    pgns: float | None = None
    perf: dict[str, Any] | None = None
    grad: dict[str, Any] | None = None
    profile: Any = None  # the profile table (a list of rows)
    current: list[Any] | None = None
    current_goodput: float | None = None
    best: list[Any] | None = None
    best_goodput: float | None = None


@dataclass(frozen=True, kw_only=True)
class CheckpointRecord(_Record):
    """A periodic checkpoint was written (coalesced)."""

    kind: ClassVar[RecordKind] = RecordKind.CHECKPOINT
    state: ClassVar[bool] = True
    step: int | None = None
    seconds: float | None = None


@dataclass(frozen=True, kw_only=True)
class FirstStepRecord(_Record):
    """The attempt's first step (the controller times a rescale by it)."""

    kind: ClassVar[RecordKind] = RecordKind.FIRST_STEP
    step: int | None = None
    replicas: int | None = None
    batch_size: int | None = None


@dataclass(frozen=True, kw_only=True)
class BatchRecord(_Record):
    """The job adopted a new (m, s)."""

    kind: ClassVar[RecordKind] = RecordKind.BATCH
    step: int | None = None
    local_bsz: int | None = None
    accum_steps: int | None = None
    batch_size: int | None = None


@dataclass(frozen=True, kw_only=True)
class MetricReport(_Record):
    """A user metric (``ctx.report(name, value, step)``)."""

    kind: ClassVar[RecordKind] = RecordKind.METRIC
    name: str = "metric"
    value: float | None = None
    step: int | None = None


@dataclass(frozen=True, kw_only=True)
class StoppedRecord(_Record):
    """The replica checkpointed and is exiting at the scheduler's request."""

    kind: ClassVar[RecordKind] = RecordKind.STOPPED
    checkpoint: str | None = None


@dataclass(frozen=True, kw_only=True)
class OomRecord(_Record):
    """The replica ran out of memory at ``local_bsz`` and learned a cap."""

    kind: ClassVar[RecordKind] = RecordKind.OOM
    local_bsz: int | None = None
    max_local_bsz: int | None = None
    error: str | None = None


MetricRecord = (
    ProgressRecord
    | GoodputRecord
    | CheckpointRecord
    | FirstStepRecord
    | BatchRecord
    | MetricReport
    | StoppedRecord
    | OomRecord
)
_RECORDS: dict[str, type[_Record]] = {
    cls.kind.value: cls
    for cls in (
        ProgressRecord,
        GoodputRecord,
        CheckpointRecord,
        FirstStepRecord,
        BatchRecord,
        MetricReport,
        StoppedRecord,
        OomRecord,
    )
}
STATE_KINDS = frozenset(k for k, cls in _RECORDS.items() if cls.state)


def _coerce(value: Any, hint: str) -> Any:
    """``value`` if it fits the field's declared type, else ``None`` (senders are untrusted:
    a record with one odd field still counts, minus that field)."""
    if value is None or hint == "Any":
        return value
    if hint.startswith("int"):
        ok = isinstance(value, int) and not isinstance(value, bool)
        return value if ok else None
    if hint.startswith("float"):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return float(value) if ok and math.isfinite(value) else None
    if hint.startswith("str"):
        return value if isinstance(value, str) else None
    if hint.startswith("dict"):
        return value if isinstance(value, dict) else None
    if hint.startswith("list"):
        return value if isinstance(value, list) else None
    raise TypeError(f"no coercion for field type {hint!r}")  # a new field type: add it above


def parse_record(obj: Any) -> MetricRecord | None:
    """The typed record of a decoded JSON object; ``None`` for a kind this version does not
    know (a newer library's record is ignored, not an error). Raises :class:`RecordError` when
    ``obj`` is not an object with a string ``kind``."""
    if not isinstance(obj, Mapping):
        raise RecordError("a metrics record must be a JSON object")
    kind = obj.get("kind")
    if not isinstance(kind, str):
        raise RecordError('a metrics record needs a string "kind" (e.g. "progress", "metric")')
    cls = _RECORDS.get(kind)
    if cls is None:
        return None
    values: dict[str, Any] = {}
    for f in fields(cls):
        if f.name in obj:
            values[f.name] = _coerce(obj[f.name], str(f.type))
    if cls is MetricReport and values.get("name") is None:
        values.pop("name", None)
    return typing.cast("MetricRecord", cls(**values))


# -- statuses, events, causes ---------------------------------------------------------------------
class ReplicaStatus(StrEnum):
    """A replica row's ``status`` column."""

    STARTING = "starting"  # row written, process not (yet) seen
    LIVE = "live"
    EXITED = "exited"
    LOST = "lost"  # its node left the cluster

    @property
    def is_live(self) -> bool:
        return self in (ReplicaStatus.STARTING, ReplicaStatus.LIVE)


class EventKind(StrEnum):
    """The ``kind`` of a job event (the ``events`` table; the API and dashboard show it)."""

    SUBMITTED = "submitted"
    CONTROLLER = "controller"
    NODES = "nodes"
    ALLOC = "alloc"
    DESIRED = "desired"
    RESCALE = "rescale"
    STOP = "stop"
    REPLICA_EXIT = "replica-exit"
    BATCH = "batch"
    CHECKPOINTED = "checkpointed"
    CANCELLED = "cancelled"
    LAUNCH_ERROR = "launch-error"
    SERVERS = "servers"  # a sparse job's shard servers started, restarted or stopped
    POLICY_ERROR = "policy-error"
    TUNE_PRUNED = "tune-pruned"
    TUNE_PREEMPTED = "tune-preempted"
    TUNE_RETRY = "tune-retry"
    DEPLOY = "deploy"  # a deployment's gateway or replicas started, ready, drained, stopped


class CancelCause(StrEnum):
    """Why a job was cancelled (the ``jobs.cancel_cause`` column), read back after a crash
    instead of matching prefixes of the human-readable ``reason``."""

    USER = "user"
    TUNE_PRUNED = "tune-pruned"
    TUNE_PREEMPTED = "tune-preempted"
    TUNE_DEAD = "tune-dead"
    TUNE_ENDED = "tune-ended"


#: The reason texts the tuning loop wrote before ``cancel_cause`` existed (migration 0005
#: derives the cause of old rows from them).
LEGACY_REASON_PREFIXES: Mapping[CancelCause, str] = {
    CancelCause.TUNE_PRUNED: "tune: pruned",
    CancelCause.TUNE_PREEMPTED: "tune: preempted",
    CancelCause.TUNE_DEAD: "tune: dead",
    CancelCause.TUNE_ENDED: "tune: experiment ended",
}


__all__ = [
    "BATCH_MODES",
    "RESERVED_ENV",
    "STATE_KINDS",
    "BatchRecord",
    "CancelCause",
    "CheckpointRecord",
    "EventKind",
    "FirstStepRecord",
    "GoodputRecord",
    "MetricRecord",
    "MetricReport",
    "OomRecord",
    "ProgressRecord",
    "RecordError",
    "RecordKind",
    "ReplicaEnv",
    "ReplicaEnvError",
    "ReplicaStatus",
    "StoppedRecord",
    "param_env_name",
    "parse_record",
]

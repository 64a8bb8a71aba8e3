"""The launch plan of one attempt: placement → each rank's coordinates, environment and spec.

Pure (no store, no executor, no clock): the reconciler decides *when* to launch and writes the
rows; this module decides *what* each replica gets, so the torchrun coordinates, the allowlist
of inherited variables and the :class:`~coadapt.protocol.ReplicaEnv` contract are testable on
their own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from coadapt.executors import ReplicaSpec
from coadapt.protocol import ReplicaEnv

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# What a replica inherits from the controller's environment; nothing else (it may hold a
# database password or the admin token).
_INHERIT = frozenset(("PATH", "LANG", "TZ", "PYTHONPATH", "LD_LIBRARY_PATH", "TMPDIR"))
_INHERIT_PREFIXES = ("LC_", "CUDA_", "NCCL_", "GLOO_", "OMP_", "MKL_", "NVIDIA_", "TORCH_")


def inherited(name: str) -> bool:
    """Whether a replica inherits the controller's variable ``name``."""
    return name in _INHERIT or name.startswith(_INHERIT_PREFIXES)


def expand(argv: Sequence[str], env: Mapping[str, str]) -> tuple[str, ...]:
    """``${NAME}`` in a command or its args expands from the replica's environment
    (e.g. ``--out ${<ENV_CHECKPOINT_DIR>}/result.json``); unknown names stay as written."""
    return tuple(_VAR.sub(lambda m: env.get(m.group(1), m.group(0)), a) for a in argv)


@dataclass(frozen=True)
class Place:
    """Where one rank of an attempt runs, and its coordinates in the torchrun convention."""

    node: str
    slot: int
    local_rank: int
    local_world: int
    node_rank: int
    node_slots: tuple[int, ...]  # the attempt's slots on this node (CUDA_VISIBLE_DEVICES)


def places(place: Sequence[tuple[str, int]]) -> list[Place]:
    """Each rank's :class:`Place`, ranks in the order of ``place`` (nodes numbered by first
    appearance, so rank 0's node is node 0)."""
    node_order = list(dict.fromkeys(node for node, _ in place))
    out = []
    for rank, (node, slot) in enumerate(place):
        on_node = [s for n, s in place if n == node]
        out.append(
            Place(
                node=node,
                slot=slot,
                local_rank=sum(1 for n, _ in place[:rank] if n == node),
                local_world=len(on_node),
                node_rank=node_order.index(node),
                node_slots=tuple(on_node),
            )
        )
    return out


@dataclass(frozen=True)
class AttemptPlan:
    """What the reconciler knows about an attempt, as plain values."""

    job_id: str
    attempt: int
    argv: tuple[str, ...]
    cwd: str
    job_dir: Path
    tenant: str
    batch_mode: str
    port: int
    spec_env: Mapping[str, str]
    uses_gpus: bool
    metrics_url: str | None = None
    job_token: str | None = None
    max_local_bsz: int | None = None
    sparse_dir: str | None = None  # a sparse job: its servers' JobLayout root
    sparse_servers: int | None = None
    checkpoint_interval: float | None = None  # seconds between periodic checkpoints

    @property
    def run_dir(self) -> Path:
        return self.job_dir / "runs" / str(self.attempt)

    def log_path(self, rank: int) -> Path:
        return self.job_dir / "logs" / f"attempt-{self.attempt}.rank-{rank}.log"


def replica_env(
    plan: AttemptPlan,
    rank: int,
    world: int,
    where: Place,
    num_nodes: int,
    controller_env: Mapping[str, str],
) -> dict[str, str]:
    """One replica's whole environment: an allowlist of ``controller_env``, the spec's own,
    then the :class:`ReplicaEnv` contract (which the spec cannot override)."""
    env = {k: v for k, v in controller_env.items() if inherited(k)}
    env.update(plan.spec_env)
    wire = ReplicaEnv(
        rank=rank,
        world_size=world,
        local_rank=where.local_rank,
        local_world_size=where.local_world,
        group_rank=where.node_rank,
        # A cluster executor replaces these with rank 0's node and a port free there.
        master_addr="127.0.0.1",
        master_port=plan.port,
        job_id=plan.job_id,
        num_nodes=num_nodes,
        node=where.node,
        tenant=plan.tenant,
        checkpoint_dir=str((plan.job_dir / "checkpoints").resolve()),
        restarts=plan.attempt - 1,
        attempt=plan.attempt,
        batch_mode=plan.batch_mode,
        metrics_url=plan.metrics_url,
        job_token=plan.job_token,
        max_local_bsz=plan.max_local_bsz,
        sparse_dir=plan.sparse_dir,
        sparse_servers=plan.sparse_servers,
        checkpoint_interval=plan.checkpoint_interval,
    )
    env["HOME"] = str(plan.job_dir.resolve())
    env.update(wire.to_env())
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if plan.uses_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(s) for s in where.node_slots)
    else:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def replica_specs(
    plan: AttemptPlan, place: Sequence[tuple[str, int]], controller_env: Mapping[str, str]
) -> list[ReplicaSpec]:
    """One :class:`ReplicaSpec` per (node, slot) of ``place``, rank = position."""
    where = places(place)
    num_nodes = len({p.node for p in where})
    specs = []
    for rank, at in enumerate(where):
        env = replica_env(plan, rank, len(place), at, num_nodes, controller_env)
        specs.append(
            ReplicaSpec(
                job_id=plan.job_id,
                attempt=plan.attempt,
                rank=rank,
                world_size=len(place),
                argv=expand(plan.argv, env),
                cwd=plan.cwd,
                run_dir=str(plan.run_dir),
                log_path=str(plan.log_path(rank)),
                slot=at.slot,
                env=env,
                node=at.node,
            )
        )
    return specs


def server_spec(
    plan: AttemptPlan,
    shard: int,
    num_shards: int,
    argv: Sequence[str],
    run_dir: str,
    controller_env: Mapping[str, str],
) -> ReplicaSpec:
    """A sparse job's shard server as the executor starts it: like a replica (same sandbox,
    run-as user and inherited variables) but outside every attempt (``attempt`` 0), in no
    slot of the scheduler's, and without the torchrun variables (it is no rank of a world)."""
    env = {k: v for k, v in controller_env.items() if inherited(k)}
    env.update(plan.spec_env)
    env["HOME"] = str(plan.job_dir.resolve())
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    return ReplicaSpec(
        job_id=plan.job_id,
        attempt=0,
        rank=shard,
        world_size=num_shards,
        argv=tuple(argv),
        cwd=plan.cwd,
        run_dir=run_dir,
        log_path=str(plan.job_dir / "logs" / f"server-{shard}.log"),
        slot=0,
        env=env,
    )

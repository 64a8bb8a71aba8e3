"""The one interface every scheduling policy implements, and the snapshot it decides on.

A policy is a function ``optimize(snapshot, state, rng) -> Decision``: it does no I/O and
holds no handle on an executor, so the simulator, the live controller and the tests run the
very same objects (STYLE §1). Memory across rounds (the GA's population, Tiresias' queues)
lives in ``state``, a JSON-serialisable dict the caller hands back next round, never on the
policy object: the controller persists it, so a restart keeps it, and feeding a policy the
same snapshots, states and seeds gives the same decisions. Fitness and other figures come back
in :attr:`Decision.diagnostics`.

An allocation is a tuple with the number of GPUs a job gets on each node, in the snapshot's node
order; all zeros means the job is not running.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, runtime_checkable

import numpy as np

from coadapt.goodput import BatchLimits, GoodputModel

Allocation = tuple[int, ...]
#: A policy's memory across rounds: plain JSON data (str keys; lists, numbers, strings).
PolicyState = dict[str, Any]


class BatchMode(str, Enum):
    """How a policy expects jobs to choose their batch size and GPU count.

    The mechanism (simulator, controller) configures jobs from this declaration instead of
    branching on the policy's type.
    """

    ADAPTIVE = "adaptive"  # the policy picks GPUs; each job picks its batch by goodput (Pollux)
    FIXED_BATCH = "fixed_batch"  # the policy picks GPUs; the batch stays as submitted (Optimus)
    FIXED = "fixed"  # GPUs and batch stay as submitted; the policy picks when/where (Tiresias)


#: The type of every GPU (or slot) of a cluster that declares none.
DEFAULT_GPU_TYPE = "gpu"


class PolicyError(ValueError):
    """A policy was asked for by a name that does not exist, or given an invalid snapshot."""


@dataclass(frozen=True)
class NodeInfo:
    """A node of the cluster as the scheduler sees it.

    Every GPU of a node has the same ``gpu_type`` (a lower-case name such as ``v100``); a
    cluster without declared types is one type, :data:`DEFAULT_GPU_TYPE`.
    """

    name: str
    gpus: int  # schedulable GPU (or CPU-slot) count
    gpu_type: str = DEFAULT_GPU_TYPE


@dataclass(frozen=True)
class JobInfo:
    """What a policy may know about one running or pending job.

    Each policy reads the fields it needs (STYLE: a policy declares what it needs through its
    interface, the mechanism never branches on the policy's type).
    """

    name: str
    submit_time: float  # seconds, on the snapshot's clock
    attained_service: float = 0.0  # GPU-seconds received so far (Tiresias' 2D-LAS)
    num_restarts: int = 0  # re-allocations so far (Pollux's re-allocation factor)
    min_replicas: int = 0
    max_replicas: int = 64  # the user's (or the model's) upper bound on GPUs
    max_gpus_held: int = 0  # most GPUs the job ever held (Pollux's 2x exploration cap)
    # Goodput-aware policies (Pollux): the job's fitted model and batch limits. None = no
    # model yet (a job that never ran); policies then assume perfect scaling.
    goodput: GoodputModel | None = None
    limits: BatchLimits | None = None
    # Static-configuration policies (Tiresias, FIFO): the GPUs the user asked for.
    requested_replicas: int | None = None
    # Remaining-time policies (Optimus): seconds per iteration with k GPUs at the job's batch,
    # and the iterations it has left. From the fitted model live, from the trace ("oracle")
    # in the simulator.
    step_time: Callable[[int], float] | None = None
    remaining_iterations: float | None = None
    priority: int = 0
    # Heterogeneous clusters: the GPU types the job may run on (None: any type; a job runs
    # on one type at a time) and, per type, its goodput model where one is known (a type
    # missing here falls back to ``goodput``).
    gpu_types: tuple[str, ...] | None = None
    goodput_by_type: Mapping[str, GoodputModel] | None = None
    # GPU sharing: the job's class for co-location figures (e.g. its model's name); None = the
    # job is never packed with another.
    packing_key: str | None = None
    # Fraction of the job's declared work done, in [0, 1]: epochs done (with the position in
    # the current one) over the epochs the user declared. Live from the training library's
    # reports, in the simulator from its job model; None = not declared or not yet reported
    # (policies must then treat the job's length as unknown).
    progress: float | None = None

    def allows(self, gpu_type: str) -> bool:
        """Whether the job may run on GPUs of ``gpu_type``."""
        return self.gpu_types is None or gpu_type in self.gpu_types

    def goodput_on(self, gpu_type: str) -> GoodputModel | None:
        """The job's goodput model on ``gpu_type`` (its type-less model if none is known)."""
        if self.goodput_by_type is not None and gpu_type in self.goodput_by_type:
            return self.goodput_by_type[gpu_type]
        return self.goodput

    def age(self, now: float) -> float:
        return max(now - self.submit_time, 0.0)


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything a policy may look at in one scheduling round."""

    now: float
    nodes: tuple[NodeInfo, ...]
    jobs: Mapping[str, JobInfo]  # running and pending jobs, in submission order
    current: Mapping[str, Allocation] = field(default_factory=dict)
    restart_delay: float = 30.0  # δ: seconds a re-allocation costs a job
    # GPU sharing (Gandiva's packing): (key_a, key_b) -> (fraction of a's isolated throughput,
    # fraction of b's) when a job of class a and one of class b share the same GPUs. A pair
    # missing here is never packed.
    colocation: Mapping[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """The GPU types present, sorted (one, :data:`DEFAULT_GPU_TYPE`, if none declared)."""
        return tuple(sorted({n.gpu_type for n in self.nodes}))

    def current_of(self, job: str) -> Allocation:
        alloc = self.current.get(job)
        if alloc is None:
            return (0,) * len(self.nodes)
        return alloc


@dataclass(frozen=True)
class Decision:
    """What one round decided: allocations, the state for the next round, and diagnostics.

    ``state`` is what the caller passes back as ``state`` next round (the controller stores
    it); ``diagnostics`` holds figures for benchmarks and dashboards (e.g. ``fitness``).
    """

    allocations: dict[str, Allocation]
    state: PolicyState = field(default_factory=dict)
    diagnostics: dict[str, float] = field(default_factory=dict)
    # GPU sharing: guest job -> host job. A guest runs on exactly its host's GPUs (its
    # allocation equals the host's) and does not count against the nodes' capacity.
    packed: dict[str, str] = field(default_factory=dict)


def state_to_json(state: Mapping[str, Any]) -> str:
    """Serialise a policy state, failing loudly if a policy put non-JSON data in it."""
    try:
        return json.dumps(state, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"policy state is not JSON-serialisable: {exc}") from exc


def state_from_json(text: str | None) -> PolicyState:
    """The inverse of :func:`state_to_json` (no text: a fresh, empty state)."""
    if not text:
        return {}
    data = json.loads(text)
    if not isinstance(data, dict):
        raise PolicyError(f"stored policy state must be a JSON object, got {type(data).__name__}")
    return data


@runtime_checkable
class Policy(Protocol):
    """A scheduling policy: decide every job's allocation for the next round."""

    name: str
    batch_mode: BatchMode

    def optimize(
        self, snapshot: ClusterSnapshot, state: PolicyState, rng: np.random.Generator
    ) -> Decision:
        """Decide an allocation for each job of the snapshot (jobs left out get nothing).

        ``state`` is the previous decision's state (``{}`` on the first round); it is not
        modified, the new state comes back in the decision.
        """
        ...


def validate_allocations(
    snapshot: ClusterSnapshot,
    allocations: Mapping[str, Allocation],
    packed: Mapping[str, str] | None = None,
) -> None:
    """Raise :class:`PolicyError` if ``allocations`` over-commits a node or names a stranger,
    or if a packed guest (``packed``: guest -> host) does not sit exactly on a running host."""
    width = len(snapshot.nodes)
    guests = dict(packed or {})
    for guest, host in guests.items():
        if host in guests:
            raise PolicyError(f"packed job {guest!r} is hosted by {host!r}, itself a guest")
        host_alloc = allocations.get(host)
        if host_alloc is None or not any(host_alloc):
            raise PolicyError(f"packed job {guest!r} names host {host!r}, which is not running")
        if tuple(allocations.get(guest, ())) != tuple(host_alloc):
            raise PolicyError(f"packed job {guest!r} must have exactly its host {host!r}'s GPUs")
    used = np.zeros(width, dtype=np.int64)
    for job, alloc in allocations.items():
        if job not in snapshot.jobs:
            raise PolicyError(f"allocation for unknown job {job!r}")
        if len(alloc) != width or any(int(x) < 0 for x in alloc):
            raise PolicyError(f"allocation {alloc!r} of {job!r} must be {width} counts >= 0")
        if job in guests:
            continue
        used += np.asarray(alloc, dtype=np.int64)
    cap = np.array([n.gpus for n in snapshot.nodes], dtype=np.int64)
    if np.any(used > cap):
        over = [snapshot.nodes[i].name for i in np.flatnonzero(used > cap)]
        raise PolicyError(f"nodes over-committed: {', '.join(over)}")


def placement_of(alloc: Allocation) -> tuple[int, int]:
    """(nodes, GPUs) of an allocation."""
    return sum(1 for x in alloc if x > 0), sum(alloc)

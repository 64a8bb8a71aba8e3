"""Cluster specs: ``16x4`` (identical untyped nodes) or ``v100:4x4,p100:4x4,k80:8x4`` (groups
of identical nodes, one GPU type per group; types from :mod:`coadapt.sim.gpu_types`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from coadapt.policies.base import DEFAULT_GPU_TYPE, NodeInfo
from coadapt.sim.errors import SimInputError
from coadapt.sim.gpu_types import GPU_TYPES

_GROUP = re.compile(r"^\s*(?:([A-Za-z0-9_-]+)\s*:)?\s*(\d+)\s*[xX]\s*(\d+)\s*$")
#: The throughput traces were measured on 4-GPU nodes; placements beyond that are unknown.
MAX_GPUS_PER_NODE = 4
_ACCEPTED = (
    f"NODESxGPUS with GPUS in 1..{MAX_GPUS_PER_NODE}, e.g. 16x4, or comma-separated "
    f"TYPE:NODESxGPUS groups, each type once, e.g. v100:4x4,p100:4x4,k80:8x4 "
    f"(types: {', '.join(t for t in GPU_TYPES if t != DEFAULT_GPU_TYPE)})"
)


@dataclass(frozen=True)
class NodeGroup:
    """``num_nodes`` identical nodes with ``gpus_per_node`` GPUs of ``gpu_type`` each."""

    num_nodes: int
    gpus_per_node: int
    gpu_type: str = DEFAULT_GPU_TYPE

    def __str__(self) -> str:
        shape = f"{self.num_nodes}x{self.gpus_per_node}"
        return shape if self.gpu_type == DEFAULT_GPU_TYPE else f"{self.gpu_type}:{shape}"


@dataclass(frozen=True)
class ClusterSpec:
    """A first group of ``num_nodes`` x ``gpus_per_node`` GPUs of ``gpu_type``, then ``more``
    groups of other types (``ClusterSpec(16, 4)`` is the homogeneous, untyped 16x4)."""

    num_nodes: int
    gpus_per_node: int
    gpu_type: str = DEFAULT_GPU_TYPE
    more: tuple[NodeGroup, ...] = ()

    @property
    def groups(self) -> tuple[NodeGroup, ...]:
        return (NodeGroup(self.num_nodes, self.gpus_per_node, self.gpu_type), *self.more)

    @property
    def total_gpus(self) -> int:
        return sum(g.num_nodes * g.gpus_per_node for g in self.groups)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(g.gpu_type for g in self.groups)

    def gpus_per_node_of(self, gpu_type: str) -> int:
        """GPUs per node of the group of ``gpu_type`` (KeyError if the cluster has none)."""
        for g in self.groups:
            if g.gpu_type == gpu_type:
                return g.gpus_per_node
        raise KeyError(gpu_type)

    def nodes(self) -> tuple[NodeInfo, ...]:
        kinds = [(g.gpus_per_node, g.gpu_type) for g in self.groups for _ in range(g.num_nodes)]
        return tuple(NodeInfo(f"node-{i}", gpus, kind) for i, (gpus, kind) in enumerate(kinds))

    def __str__(self) -> str:
        return ",".join(str(g) for g in self.groups)


def parse_cluster(spec: str) -> ClusterSpec:
    """Parse a cluster spec; raise :class:`SimInputError` naming the value and the forms."""
    groups: list[NodeGroup] = []
    for part in spec.split(","):
        match = _GROUP.match(part)
        if match is None:
            raise SimInputError(f"--cluster: invalid cluster spec {spec!r}; accepted: {_ACCEPTED}")
        gpu_type = (match.group(1) or DEFAULT_GPU_TYPE).lower()
        nodes, gpus = int(match.group(2)), int(match.group(3))
        if gpu_type not in GPU_TYPES:
            raise SimInputError(
                f"--cluster: unknown GPU type {match.group(1)!r} in {spec!r}; accepted: {_ACCEPTED}"
            )
        if nodes < 1 or not 1 <= gpus <= MAX_GPUS_PER_NODE:
            raise SimInputError(f"--cluster: invalid cluster spec {spec!r}; accepted: {_ACCEPTED}")
        if any(g.gpu_type == gpu_type for g in groups):
            raise SimInputError(
                f"--cluster: GPU type {gpu_type!r} appears twice in {spec!r}; accepted: {_ACCEPTED}"
            )
        groups.append(NodeGroup(nodes, gpus, gpu_type))
    if len(groups) > 1 and any(g.gpu_type == DEFAULT_GPU_TYPE for g in groups):
        raise SimInputError(
            f"--cluster: every group of {spec!r} needs a TYPE: prefix; accepted: {_ACCEPTED}"
        )
    first = groups[0]
    return ClusterSpec(first.num_nodes, first.gpus_per_node, first.gpu_type, tuple(groups[1:]))

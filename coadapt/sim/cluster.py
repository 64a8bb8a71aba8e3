"""Cluster specs such as ``16x4``: identical nodes with a fixed number of GPUs each."""

from __future__ import annotations

import re
from dataclasses import dataclass

from coadapt.policies.base import NodeInfo
from coadapt.sim.errors import SimInputError

_SPEC = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")
#: The throughput traces were measured on 4-GPU nodes; placements beyond that are unknown.
MAX_GPUS_PER_NODE = 4
_ACCEPTED = f"NODESxGPUS with GPUS in 1..{MAX_GPUS_PER_NODE}, e.g. 16x4"


@dataclass(frozen=True)
class ClusterSpec:
    """``num_nodes`` identical nodes with ``gpus_per_node`` GPUs each."""

    num_nodes: int
    gpus_per_node: int

    @property
    def total_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def nodes(self) -> tuple[NodeInfo, ...]:
        return tuple(NodeInfo(f"node-{i}", self.gpus_per_node) for i in range(self.num_nodes))

    def __str__(self) -> str:
        return f"{self.num_nodes}x{self.gpus_per_node}"


def parse_cluster(spec: str) -> ClusterSpec:
    """Parse ``NODESxGPUS``; raise :class:`SimInputError` naming the value and the form."""
    match = _SPEC.match(spec)
    if match is None:
        raise SimInputError(f"--cluster: invalid cluster spec {spec!r}; accepted: {_ACCEPTED}")
    nodes, gpus = int(match.group(1)), int(match.group(2))
    if nodes < 1 or not 1 <= gpus <= MAX_GPUS_PER_NODE:
        raise SimInputError(f"--cluster: invalid cluster spec {spec!r}; accepted: {_ACCEPTED}")
    return ClusterSpec(nodes, gpus)

"""A deterministic, trace-driven discrete-event simulator of a GPU cluster (Pollux, OSDI'21).

``simulate(load_workload("pollux-6"), parse_cluster("16x4"), make_policy("tiresias"))``
replays the artifact's workload 6; :func:`summarise` reduces the result to JCT statistics.
Clusters may mix GPU types (``parse_cluster("v100:4x4,p100:4x4,k80:8x4")``, step times from
Gavel's measurements) and policies may pack two small jobs on one GPU (docs/hetero.md).
"""

from coadapt.sim.applications import APPLICATION_NAMES, Application, get_application
from coadapt.sim.cluster import ClusterSpec, NodeGroup, parse_cluster
from coadapt.sim.engine import JobRecord, SimConfig, SimResult, Simulator, simulate
from coadapt.sim.errors import SimInputError, SimulationError
from coadapt.sim.gpu_types import GPU_TYPES
from coadapt.sim.metrics import PolicySummary, summarise
from coadapt.sim.synthetic import packing_workload
from coadapt.sim.workload import BUNDLED_WORKLOADS, Workload, WorkloadJob, load_workload

__all__ = [
    "APPLICATION_NAMES",
    "BUNDLED_WORKLOADS",
    "GPU_TYPES",
    "Application",
    "ClusterSpec",
    "JobRecord",
    "NodeGroup",
    "PolicySummary",
    "SimConfig",
    "SimInputError",
    "SimResult",
    "SimulationError",
    "Simulator",
    "Workload",
    "WorkloadJob",
    "get_application",
    "load_workload",
    "packing_workload",
    "parse_cluster",
    "simulate",
    "summarise",
]

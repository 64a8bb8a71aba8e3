"""A deterministic, trace-driven discrete-event simulator of a GPU cluster (Pollux, OSDI'21).

``simulate(load_workload("pollux-6"), parse_cluster("16x4"), make_policy("tiresias"))``
replays the artifact's workload 6; :func:`summarise` reduces the result to JCT statistics.
"""

from coadapt.sim.applications import APPLICATION_NAMES, Application, get_application
from coadapt.sim.cluster import ClusterSpec, parse_cluster
from coadapt.sim.engine import JobRecord, SimConfig, SimResult, Simulator, simulate
from coadapt.sim.errors import SimInputError, SimulationError
from coadapt.sim.metrics import PolicySummary, summarise
from coadapt.sim.workload import BUNDLED_WORKLOADS, Workload, WorkloadJob, load_workload

__all__ = [
    "APPLICATION_NAMES",
    "BUNDLED_WORKLOADS",
    "Application",
    "ClusterSpec",
    "JobRecord",
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
    "parse_cluster",
    "simulate",
    "summarise",
]

"""Scheduling policies: one interface (:class:`Policy`), pure given a snapshot and a seed."""

from __future__ import annotations

from typing import Any

from coadapt.policies.base import (
    DEFAULT_GPU_TYPE,
    Allocation,
    BatchMode,
    ClusterSnapshot,
    Decision,
    JobInfo,
    NodeInfo,
    Policy,
    PolicyError,
    PolicyState,
    placement_of,
    state_from_json,
    state_to_json,
    validate_allocations,
)

#: Policy names accepted by :func:`make_policy`, the CLI and the controller.
POLICY_NAMES = ("pollux", "pollux-unaware", "pollux-ga", "tiresias", "optimus", "fifo", "gavel")


def make_policy(name: str, **options: Any) -> Policy:
    """Build a fresh policy object by name (each simulation or controller gets its own)."""
    if name == "pollux":
        from coadapt.policies.pollux import PolluxPolicy

        return PolluxPolicy(**options)
    if name == "pollux-unaware":
        from coadapt.policies.pollux import PolluxUnawarePolicy

        return PolluxUnawarePolicy(**options)
    if name == "pollux-ga":
        from coadapt.policies.pollux_ga import PolluxGAPolicy

        return PolluxGAPolicy(**options)
    if name == "tiresias":
        from coadapt.policies.tiresias import TiresiasPolicy

        return TiresiasPolicy(**options)
    if name == "optimus":
        from coadapt.policies.optimus import OptimusPolicy

        return OptimusPolicy(**options)
    if name == "gavel":
        from coadapt.policies.gavel import GavelPolicy

        return GavelPolicy(**options)
    if name == "fifo":
        from coadapt.policies.fifo import FifoPolicy

        return FifoPolicy(**options)
    raise PolicyError(f"unknown policy {name!r}; accepted: {', '.join(POLICY_NAMES)}")


__all__ = [
    "DEFAULT_GPU_TYPE",
    "POLICY_NAMES",
    "Allocation",
    "BatchMode",
    "ClusterSnapshot",
    "Decision",
    "JobInfo",
    "NodeInfo",
    "Policy",
    "PolicyError",
    "PolicyState",
    "make_policy",
    "placement_of",
    "state_from_json",
    "state_to_json",
    "validate_allocations",
]

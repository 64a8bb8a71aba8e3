"""Executors: where replicas run (``local`` processes, Ray actors, or the in-memory ``fake``).

The Ray executor lives in :mod:`coadapt.executors.ray_executor` and is not imported here, so
the default install never needs Ray.
"""

from collections.abc import Mapping

from coadapt.executors.base import (
    OOM_EXIT_CODE,
    Executor,
    ExecutorError,
    NodeInventory,
    ReplicaHandle,
    ReplicaPhase,
    ReplicaSpec,
    ReplicaStatus,
)
from coadapt.executors.fake import FakeExecutor
from coadapt.executors.gpu_types import parse_slots
from coadapt.executors.local import LocalExecutor, detect_gpu_types, detect_gpus
from coadapt.executors.sandbox import Isolation

__all__ = [
    "OOM_EXIT_CODE",
    "Executor",
    "ExecutorError",
    "FakeExecutor",
    "Isolation",
    "LocalExecutor",
    "NodeInventory",
    "ReplicaHandle",
    "ReplicaPhase",
    "ReplicaSpec",
    "ReplicaStatus",
    "create_executor",
    "detect_gpu_types",
    "detect_gpus",
    "parse_slots",
]


def create_executor(
    kind: str,
    *,
    slots: int | Mapping[str, int] | None = None,
    ray_address: str | None = None,
    ray_slot_resource: str | None = None,
    ray_namespace: str = "coadapt",
    placement_timeout: float = 60.0,
    isolation: Isolation | None = None,
) -> Executor:
    """The executor ``coadapt server --executor KIND`` runs on; :class:`ExecutorError` names
    the offending flag. Ray is imported only here and only for ``ray``."""
    if kind == "local":
        for flag, value in (
            ("--ray-address", ray_address),
            ("--ray-slot-resource", ray_slot_resource),
        ):
            if value is not None:
                raise ExecutorError(f"{flag} needs --executor ray")
        return LocalExecutor(slots=slots, isolation=isolation)
    if kind != "ray":
        raise ExecutorError(f"--executor: unknown executor {kind!r}; accepted: local, ray")
    if slots is not None:
        raise ExecutorError("--slots is for --executor local (Ray nodes declare their slots)")
    if isolation is not None and isolation.active:
        raise ExecutorError(
            "--isolation/--memory-per-slot confine local replicas only; Ray replicas run as "
            "the Ray workers' user (see docs/security.md): pass --isolation none"
        )
    if placement_timeout <= 0:
        raise ExecutorError(f"--placement-timeout: {placement_timeout} is invalid; accepted: > 0")
    try:
        from coadapt.executors.ray_executor import RayExecutor
    except ImportError as exc:
        raise ExecutorError(
            f"--executor ray needs Ray (pip install 'coadapt[ray]'): {exc}"
        ) from exc
    return RayExecutor(
        address=ray_address,
        slot_resource=ray_slot_resource,
        namespace=ray_namespace,
        placement_timeout=placement_timeout,
    )

"""Executors: where replicas run (``local`` processes, or the in-memory ``fake``)."""

from coadapt.executors.base import (
    Executor,
    ExecutorError,
    ReplicaHandle,
    ReplicaPhase,
    ReplicaSpec,
    ReplicaStatus,
)
from coadapt.executors.fake import FakeExecutor
from coadapt.executors.local import LocalExecutor, detect_gpus

__all__ = [
    "Executor",
    "ExecutorError",
    "FakeExecutor",
    "LocalExecutor",
    "ReplicaHandle",
    "ReplicaPhase",
    "ReplicaSpec",
    "ReplicaStatus",
    "detect_gpus",
]

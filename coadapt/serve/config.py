"""How a server runs: one frozen value, passed from the CLI to the supervisor to each worker
(as JSON on the worker's command line). Light on purpose: the supervisor never imports torch."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ServeConfig:
    """How to serve: which models (name -> directory), where, how many workers, the SLO."""

    models: dict[str, str]
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 0  # 0: one per usable core
    threads: int = 0  # torch threads per worker; 0: usable cores / workers, at least 1
    slo_ms: float = 50.0
    max_body: int = 8 * 1024 * 1024
    max_rows: int = 4096  # rows in one request
    poll_s: float = 0.2
    accept: str = "reuseport"  # "reuseport": a socket per worker; "shared": one accept queue
    forward_thread: bool = False  # run forwards on a thread beside the event loop
    # sparse models: tables held by this many table-shard processes (0: in every worker)
    table_shards: int = 0
    shard_timeout_ms: float = 1000.0  # one batch's look-ups on the table shards, all together
    shard_socket_dir: str = ""  # set by the supervisor: where the table shards listen

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("no model to serve: give at least one NAME=DIR")
        for name in self.models:
            if not name or any(c in name for c in "/:?# "):
                raise ValueError(f"model name {name!r} may not be empty or hold / : ? # space")
        if self.accept not in ("reuseport", "shared"):
            raise ValueError(f"accept must be 'reuseport' or 'shared', not {self.accept!r}")
        if self.slo_ms <= 0 or self.max_body <= 0 or self.max_rows <= 0 or self.poll_s <= 0:
            raise ValueError("slo_ms, max_body, max_rows and poll_s must be positive")
        if not 0 <= self.table_shards <= 255:
            raise ValueError(
                f"table_shards must be 0 (tables in each worker) to 255, not {self.table_shards}"
            )
        if self.shard_timeout_ms <= 0:
            raise ValueError(f"shard_timeout_ms must be positive, not {self.shard_timeout_ms}")

    def worker_count(self) -> int:
        return self.workers or len(os.sched_getaffinity(0))

    def thread_count(self) -> int:
        return self.threads or max(1, len(os.sched_getaffinity(0)) // self.worker_count())

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ServeConfig:
        return cls(**json.loads(text))

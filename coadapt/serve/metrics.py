"""The serving metrics, summed over worker processes for ``/metrics``.

Each worker records into prometheus_client's multiprocess files (the supervisor sets
``PROMETHEUS_MULTIPROC_DIR`` before it starts them), so whichever worker answers a scrape
reports the whole server. Without that variable (one process) the private registry is used.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client import multiprocess as _mp

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
CONTENT_TYPE = CONTENT_TYPE_LATEST
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class ServeMetrics:
    """Request rate and outcome, latency, batch sizes, swaps and the live version."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "coadapt_serve_requests",
            "Prediction requests by model and HTTP status",
            ["model", "code"],
            registry=r,
        )
        self.errors = Counter(
            "coadapt_serve_errors",
            "Failed prediction requests: client (4xx) or server (5xx)",
            ["model", "kind"],
            registry=r,
        )
        self.latency = Histogram(
            "coadapt_serve_request_seconds",
            "Server-side latency of a prediction request (parse to response)",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_rows = Histogram(
            "coadapt_serve_batch_rows",
            "Rows per model forward (dynamic batching)",
            ["model"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.forward = Histogram(
            "coadapt_serve_forward_seconds",
            "Time of one batched forward",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.max_batch = Gauge(
            "coadapt_serve_max_batch_rows",
            "The adaptive batch limit of each worker",
            ["model"],
            multiprocess_mode="liveall",
            registry=r,
        )
        self.version = Gauge(
            "coadapt_serve_model_version",
            "The version number each worker serves",
            ["model"],
            multiprocess_mode="liveall",
            registry=r,
        )
        self.swaps = Counter(
            "coadapt_serve_swaps", "Hot swaps to a new version", ["model"], registry=r
        )
        self.load_failures = Counter(
            "coadapt_serve_load_failures",
            "Versions refused at load (checksum, shape, NaN/Inf, import); the live one stays",
            ["model"],
            registry=r,
        )

    def exposition(self) -> bytes:
        """The text format of every worker's metrics (or this process's alone)."""
        if os.environ.get(MULTIPROC_ENV):
            reg = CollectorRegistry()
            _mp.MultiProcessCollector(reg)
            return generate_latest(reg)
        return generate_latest(self.registry)


def mark_process_dead(pid: int) -> None:
    """Drop a dead worker's live gauges (the supervisor calls it)."""
    if os.environ.get(MULTIPROC_ENV):
        _mp.mark_process_dead(pid)

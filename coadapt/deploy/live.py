"""A deployment's live figures, read from its gateway: what the API, the dashboard and
``/metrics`` show beside the stored record.

The gateway (:mod:`coadapt.serve.gateway`) keeps per-second figures and answers them on
``GET /-/stats?since=T`` (:class:`~coadapt.serve.routing.GatewayStats`). Here they become one
summary per deployment: the offered load over the last :data:`WINDOW_S` seconds, the worst
per-second SLO quantile of latency in that window, and the gateway's running totals. A gateway
that does not answer within the timeout (starting, stopped, or busy) gives ``None``: the views
show the record without figures rather than wait.
"""

from __future__ import annotations

import http.client
import json
import math
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from coadapt.serve.routing import STATS_PATH, GatewayStats, RouteError

HOST = "127.0.0.1"  # gateways run on the controller's machine
WINDOW_S = 10  # seconds the load and latency figures are taken over
STATS_TIMEOUT_S = 0.5  # one gateway's answer; a slower gateway shows no figures


@dataclass(frozen=True)
class LiveFigures:
    """One deployment's figures now, as its gateway measured them."""

    generation: int  # of the route table the gateway serves with
    backends: int  # ready replicas the gateway routes to now
    held_now: int  # requests waiting in the activator for a first replica
    requests_per_s: float  # offered load, mean over the last WINDOW_S complete seconds
    latency_q_s: float | None  # worst per-second SLO-quantile latency in the window
    slo_attainment: float | None  # served within the SLO / served, in the window
    offered_total: int  # since the gateway started (counters)
    served_total: int
    shed_total: int  # answered 503 + Retry-After
    errors_total: int  # a replica failed or answered 5xx
    cold_starts_s: tuple[float, ...]  # zero -> ready: first held arrival -> answered
    at: float  # the gateway's clock when it answered

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(stats: GatewayStats, window_s: int = WINDOW_S) -> LiveFigures:
    """The figures of the last ``window_s`` complete seconds before ``stats.now``."""
    end = math.floor(stats.now)
    recent = [s for s in stats.seconds if end - window_s <= s.t < end]
    served = sum(s.served for s in recent)
    quantiles = [s.latency_q_s for s in recent if s.served > 0 and s.latency_q_s is not None]
    totals = stats.totals
    return LiveFigures(
        generation=stats.generation,
        backends=stats.backends,
        held_now=stats.held_now,
        requests_per_s=sum(s.offered for s in recent) / window_s,
        latency_q_s=max(quantiles) if quantiles else None,
        slo_attainment=sum(s.within_slo for s in recent) / served if served else None,
        offered_total=totals.get("offered", 0),
        served_total=totals.get("served", 0),
        shed_total=totals.get("shed", 0),
        errors_total=totals.get("errors", 0),
        cold_starts_s=stats.cold_starts_s,
        at=stats.now,
    )


def fetch_stats(port: int, since: int, timeout: float = STATS_TIMEOUT_S) -> GatewayStats | None:
    """The gateway's figures for seconds ``>= since``; None if it does not answer in time or
    answers something that is not its stats document."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", f"{STATS_PATH}?since={since}")
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            return None
        return GatewayStats.from_json(json.loads(body))
    except (OSError, http.client.HTTPException, ValueError, RouteError):
        return None  # down, starting, or not our gateway: the views show no figures
    finally:
        conn.close()


def live_figures(
    ports: Mapping[int, int], timeout: float = STATS_TIMEOUT_S, window_s: int = WINDOW_S
) -> dict[int, LiveFigures | None]:
    """Deployment id -> its gateway's figures (None: no answer), gateways asked at once so
    the whole call takes at most about ``timeout``."""
    if not ports:
        return {}
    since = math.floor(time.time()) - window_s - 2  # the gateway's clock is the wall clock
    with ThreadPoolExecutor(max_workers=min(16, len(ports))) as pool:
        futures = {
            dep: pool.submit(fetch_stats, port, since, timeout) for dep, port in ports.items()
        }
        out: dict[int, LiveFigures | None] = {}
        for dep, fut in futures.items():
            stats = fut.result()
            out[dep] = summarize(stats, window_s) if stats is not None else None
        return out

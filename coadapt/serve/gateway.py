"""A deployment's front door: one stable address in front of its replicas (issue 17).

    python -m coadapt.serve.gateway --run-dir DIR --port PORT [--host 127.0.0.1]

What it does for each ``POST /v1/models/{name}:predict`` (and ``GET /v1/models...``), where
``name`` is the model's or the deployment's (rewritten to the model's for the replicas):

* **route**: to the ready replica with the fewest requests outstanding (ties in turn), over
  persistent keep-alive connections; body, ``Content-Type`` and the replica's answer headers
  (``X-Coadapt-Version`` ...) pass through unchanged, so JSON and the binary codec both work.
  A replica that refuses the connection or dies mid-request: the request (predict is
  idempotent) is retried once on another replica, else answered 503 + ``Retry-After``. A
  replica's 4xx is passed back (the client's fault); a 5xx counts as an error.
* **hold** (the activator): while no replica is ready, requests wait in arrival order up to
  the table's ``hold_s``, then get 503 + ``Retry-After`` (counted as shed). Each zero -> ready
  episode records its cold start: first held arrival -> first held request answered.
* **shed**: with ``admit_rps`` set, a token bucket (that rate, about a second of burst) admits;
  the rest get 503 + ``Retry-After: ceil(retry_after_s)`` and a body saying why, at once.
* **measure**: per arrival second what :class:`~coadapt.serve.routing.SecondStats` defines
  (``GET /-/stats?since=T``), ``GET /-/healthz``, ``GET /metrics`` (Prometheus text).

The controller steers it only through ``DIR/routes.json`` (:class:`RouteTable`), re-read when
its mtime changes; an unreadable table is logged and the last good one kept; before the first
table every request is held. SIGTERM/SIGINT: stop accepting, answer held requests 503, let
in-flight ones finish (bounded), exit 0. Started, it prints one JSON line (``port``, ``pid``).

Why its own small client over asyncio streams rather than httpx/aiohttp: a forward is a few
hundred bytes of framing each way, replicas always send ``Content-Length``, and a generic
client's per-request machinery would cost more than the replica's model time.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from coadapt.serve.http import HttpProtocol, Request, Response, error
from coadapt.serve.metrics import CONTENT_TYPE, LATENCY_BUCKETS
from coadapt.serve.routing import (
    HEALTH_PATH,
    KEEP_SECONDS,
    ROUTES_FILE,
    STATS_PATH,
    Backend,
    GatewayStats,
    RouteError,
    RouteTable,
    SecondStats,
)

MODELS_PREFIX = "/v1/models"
REPLICA_HEADER = "X-Coadapt-Replica"  # which replica answered (logs, tests)
POLL_S = 0.15  # how often routes.json's mtime is checked
BURST_S = 1.0  # the token bucket holds this many seconds of admit_rps
EJECT_S = 1.0  # a replica that failed a connection is skipped this long (unless all are)
FAILURE_RETRY_AFTER_S = 1  # Retry-After when no replica could answer (transient)
DEFAULT_HOLD_S: float = RouteTable.hold_s  # how long requests wait before the first table
MAX_HELD = 10_000  # held beyond this are shed at once (memory bound)
MAX_IDLE = 256  # idle keep-alive connections kept per replica
COLD_STARTS_KEPT = 100
CONNECT_TIMEOUT_S = 2.0
DEFAULT_TIMEOUT_S = 30.0  # a replica that takes longer is answered 504 (an error)
STOP_GRACE_S = 30.0  # SIGTERM: how long in-flight requests may still take
MAX_BODY = 64 * 1024 * 1024
# hop-by-hop and framing headers: never copied from one connection to the other
_HOP = frozenset(("host", "content-length", "connection", "keep-alive", "transfer-encoding",
                  "expect", "te", "upgrade", "proxy-connection", "content-type"))  # fmt: skip


class Outcome(str, Enum):
    """How the gateway answered one predict request (the ``outcome`` label in /metrics)."""

    SERVED = "served"  # a replica answered 2xx
    REJECTED = "rejected"  # a replica answered 4xx: passed back, not an error
    SHED = "shed"  # the gateway answered 503 (over admit_rps, or held past hold_s)
    ERROR = "error"  # a replica failed, timed out or answered 5xx


# ------------------------------------------------------------------------------ accounting


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (a value that was observed; p99 of 50 = the largest)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass
class _Second:
    offered: int = 0
    served: int = 0
    within_slo: int = 0
    shed: int = 0
    errors: int = 0
    held: int = 0
    backends: int = 0
    latencies: list[float] = field(default_factory=list)


class StatsWindow:
    """Per-second figures keyed by *arrival* second, kept ``keep`` seconds (clock-free: every
    call takes the time, so tests drive it with any clock)."""

    def __init__(self, keep: int = KEEP_SECONDS) -> None:
        self.keep = keep
        self._seconds: dict[int, _Second] = {}
        self.totals: dict[str, int] = {
            "offered": 0, "served": 0, "within_slo": 0, "shed": 0, "errors": 0, "rejected": 0,
            "held": 0, "retries": 0,
        }  # fmt: skip

    def _at(self, t: int) -> _Second:
        s = self._seconds.get(t)
        if s is None:
            s = self._seconds[t] = _Second()
            for old in [k for k in self._seconds if k <= t - self.keep]:  # once a second
                del self._seconds[old]
        return s

    def arrive(self, now: float, backends: int, held: bool) -> _Second:
        """Count one arrival; the answer is recorded on the returned second (see ``finish``)."""
        s = self._at(int(now))
        s.offered += 1
        s.backends = max(s.backends, backends)
        self.totals["offered"] += 1
        if held:
            s.held += 1
            self.totals["held"] += 1
        return s

    def note_backends(self, now: float, backends: int) -> None:
        """A route table took effect: the second it happened in saw ``backends`` replicas."""
        s = self._seconds.get(int(now))
        if s is not None:
            s.backends = max(s.backends, backends)

    def finish(self, second: _Second, outcome: Outcome, latency_s: float, slo_s: float) -> None:
        """Record the answer to a request counted by ``arrive`` (in its arrival second)."""
        if outcome is Outcome.SERVED:
            second.served += 1
            second.latencies.append(latency_s)
            self.totals["served"] += 1
            if latency_s <= slo_s:
                second.within_slo += 1
                self.totals["within_slo"] += 1
        elif outcome is Outcome.SHED:
            second.shed += 1
            self.totals["shed"] += 1
        elif outcome is Outcome.ERROR:
            second.errors += 1
            self.totals["errors"] += 1
        else:
            self.totals["rejected"] += 1

    def seconds(self, since: float, now: float, q: float) -> tuple[SecondStats, ...]:
        """Complete seconds ``since <= t < floor(now)`` with an arrival, oldest first."""
        first, end = math.ceil(since), math.floor(now)
        out = []
        for t, s in sorted(self._seconds.items()):
            if first <= t < end:
                out.append(SecondStats(
                    t=t, offered=s.offered, served=s.served, within_slo=s.within_slo,
                    shed=s.shed, errors=s.errors, held=s.held, backends=s.backends,
                    latency_q_s=quantile(s.latencies, q) if s.latencies else None,
                ))  # fmt: skip
        return tuple(out)


class TokenBucket:
    """Admit at ``rate`` per second on average with ``BURST_S`` seconds of burst (rate 0:
    nothing). Clock-free like :class:`StatsWindow`."""

    def __init__(self, rate: float, now: float) -> None:
        self.rate = rate
        self.burst = max(1.0, rate * BURST_S) if rate > 0 else 0.0
        self.tokens = self.burst
        self.stamp = now

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


# ------------------------------------------------------------------------------ the client


class BackendFailed(Exception):
    """A replica refused the connection, closed it or broke the framing: try another."""


@dataclass
class Reply:
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes


async def read_reply(reader: asyncio.StreamReader) -> Reply:
    """One HTTP/1.1 answer with a ``Content-Length`` body (what ``coadapt serve`` sends)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head[:-4].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise BackendFailed(f"malformed status line {lines[0]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise BackendFailed("chunked answers are not supported")
    length = headers.get("content-length", "0")
    if not length.isdigit():
        raise BackendFailed(f"bad Content-Length {length!r}")
    return Reply(int(parts[1]), headers, await reader.readexactly(int(length)))


def request_bytes(
    method: str, target: str, host: str, body: bytes, content_type: str | None,
    headers: dict[str, str] | None = None,
) -> bytes:  # fmt: skip
    """The request head and body, framed with ``Content-Length`` (keep-alive)."""
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items() if k not in _HOP)
    ctype = f"Content-Type: {content_type}\r\n" if content_type else ""
    head = (
        f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n{ctype}"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode("latin-1") + body


async def _within(reading: Coroutine[Any, Any, Reply], timeout_s: float) -> Reply:
    """``reading`` bounded by ``timeout_s`` (asyncio.TimeoutError past it). asyncio.timeout
    where there is one (3.11+): wait_for wraps each call in a task, measured 35 us more."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout_s):
            return await reading
    return await asyncio.wait_for(reading, timeout_s)


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def close(self) -> None:
        self.writer.close()


@dataclass(eq=False)  # hashed by identity (the draining set)
class _Replica:
    """A backend of the table in force (or of an earlier one, still finishing requests)."""

    backend: Backend
    outstanding: int = 0
    idle: list[_Conn] = field(default_factory=list)
    down_until: float = 0.0
    routed: bool = True  # in the table in force; else its connections close once idle

    async def exchange(self, payload: bytes, timeout_s: float) -> Reply:
        """Send one request on a pooled connection (a stale one is replaced once by a fresh
        one) and read the answer. Raises BackendFailed, or TimeoutError past ``timeout_s``."""
        while True:
            reused = bool(self.idle)
            if reused:
                conn = self.idle.pop()
            else:
                try:
                    r, w = await asyncio.wait_for(
                        asyncio.open_connection(self.backend.host, self.backend.port),
                        CONNECT_TIMEOUT_S,
                    )
                except (OSError, asyncio.TimeoutError) as exc:
                    raise BackendFailed(f"cannot connect: {exc!r}") from exc
                conn = _Conn(r, w)
            try:
                conn.writer.write(payload)
                await conn.writer.drain()
                reply = await _within(read_reply(conn.reader), timeout_s)
            except asyncio.TimeoutError:
                conn.close()
                raise
            except (OSError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                    BackendFailed) as exc:  # fmt: skip
                conn.close()
                if reused:
                    continue  # the replica closed an idle connection: one fresh try
                raise BackendFailed(f"{type(exc).__name__}: {exc}") from exc
            if (self.routed and len(self.idle) < MAX_IDLE
                    and reply.headers.get("connection", "").lower() != "close"):  # fmt: skip
                self.idle.append(conn)
            else:
                conn.close()
            return reply

    def close_idle(self) -> None:
        while self.idle:
            self.idle.pop().close()


# ------------------------------------------------------------------------------ the gateway


def _json(status: int, doc: object, headers: dict[str, str] | None = None) -> Response:
    return Response(status, json.dumps(doc).encode(), headers=headers or {})


class GatewayMetrics:
    """``/metrics``: requests by outcome, served latency, held now, backends, generation."""

    def __init__(self, gw: Gateway) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "coadapt_gateway_requests", "Predict requests by outcome", ["outcome"], registry=r
        )
        self.outcomes = {o: self.requests.labels(o.value) for o in Outcome}
        self.latency = Histogram(
            "coadapt_gateway_request_seconds",
            "End-to-end latency of served predict requests at the gateway (hold included)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "coadapt_gateway_retries", "Requests retried on another replica", registry=r
        )
        held = Gauge("coadapt_gateway_held", "Requests waiting for a ready replica", registry=r)
        held.set_function(lambda: gw.held_now)
        backends = Gauge("coadapt_gateway_backends", "Ready replicas in the table", registry=r)
        backends.set_function(lambda: len(gw.replicas))
        gen = Gauge("coadapt_gateway_generation", "Route table generation (-1: none)", registry=r)
        gen.set_function(lambda: gw.generation)
        self.cold = Histogram(
            "coadapt_gateway_cold_start_seconds",
            "Zero -> ready: first held arrival to its answer",
            buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300),
            registry=r,
        )


class Gateway:
    """The routes and state of one gateway process (see the module docstring)."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.timeout_s = timeout_s
        self.clock = clock  # wall time: the stats' seconds
        self.timer = timer  # latencies
        self.table: RouteTable | None = None
        self.replicas: list[_Replica] = []  # of the table in force, in its order
        self.window = StatsWindow()
        self.bucket: TokenBucket | None = None
        self.held_now = 0
        self.inflight = 0
        self.cold_starts: deque[float] = deque(maxlen=COLD_STARTS_KEPT)
        self.draining: set[_Replica] = set()  # out of the table, requests still in flight
        self.stopping = False
        self.metrics = GatewayMetrics(self)
        self._ready = asyncio.Event()  # set while a replica is routed (or when stopping)
        self._cold_since: float | None = None  # first held arrival of this zero episode
        self._stamp: tuple[int, int, int] | None = None  # routes.json (mtime, size, inode)
        self._bad_stamp: tuple[int, int, int] | None = None
        self._rr = 0

    @property
    def generation(self) -> int:
        return -1 if self.table is None else self.table.generation

    # -------------------------------------------------------------------- route table

    def reload(self) -> bool:
        """Read routes.json if it changed since the last look; True if a new table applies.
        An unreadable one is logged once and the last good table stays in force."""
        path = self.run_dir / ROUTES_FILE
        try:
            st = path.stat()
        except OSError:  # not written yet (or its directory is going away): keep what we have
            return False
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp in (self._stamp, self._bad_stamp):
            return False
        try:
            table = RouteTable.read(self.run_dir)
        except (RouteError, TypeError, ValueError, AttributeError) as exc:  # e.g. "backends": [5]
            self._bad_stamp = stamp
            kept = "none yet" if self.table is None else f"generation {self.table.generation}"
            _log(f"ignored an unreadable route table (keeping {kept}): {exc}")
            return False
        self._stamp, self._bad_stamp = stamp, None
        self.apply(table)
        return True

    def apply(self, table: RouteTable) -> None:
        """Put ``table`` in force: new replicas join, dropped ones drain (their requests in
        flight finish; their connections close)."""
        old = {r.backend: r for r in self.replicas}
        self.replicas = [old.pop(b) if b in old else _Replica(b) for b in table.backends]
        for gone in old.values():
            gone.routed = False
            gone.close_idle()
            if gone.outstanding:
                self.draining.add(gone)
        if old and not self.replicas and not self.held_now:
            self._cold_since = None  # a new zero episode: its cold start starts afresh
        if self.table is None or self.table.admit_rps != table.admit_rps:
            self.bucket = (
                None if table.admit_rps is None else TokenBucket(table.admit_rps, self.timer())
            )
        self.table = table
        self.window.note_backends(self.clock(), len(self.replicas))
        if self.replicas:
            self._ready.set()
        elif not self.stopping:
            self._ready.clear()

    async def watch(self) -> None:
        while True:
            self.reload()
            await asyncio.sleep(POLL_S)

    # -------------------------------------------------------------------- routes

    async def handle(self, req: Request) -> Response:
        path = req.path
        if path.startswith(MODELS_PREFIX):
            if path.endswith(":predict"):
                if req.method != "POST":
                    return error(405, f"{path} takes POST")
                return await self.predict(req)
            if req.method != "GET":
                return error(405, f"{path} takes GET")
            if self.stopping or not self.replicas:
                return self._unavailable("no replica is ready", FAILURE_RETRY_AFTER_S)
            return await self.forward(req)
        if req.method != "GET":
            return error(405, f"{path} takes GET")
        if path == STATS_PATH:
            return self.stats(req.query)
        if path == HEALTH_PATH:
            # draining: requests still in flight on replicas the table in force dropped (the
            # controller may stop such a replica once this is 0 at the new generation)
            return _json(200, {"status": "stopping" if self.stopping else "ok",
                               "pid": os.getpid(), "generation": self.generation,
                               "backends": len(self.replicas),
                               "draining": sum(r.outstanding for r in self.draining)})  # fmt: skip
        if path == "/metrics":
            return Response(200, generate_latest(self.metrics.registry), CONTENT_TYPE)
        return error(404, f"unknown path {path}: the gateway serves {MODELS_PREFIX}/..., "
                     f"{STATS_PATH}, {HEALTH_PATH} and /metrics")  # fmt: skip

    def stats(self, query: str) -> Response:
        args = parse_qs(query)
        try:
            since = float(args.get("since", ["0"])[-1])
            if not math.isfinite(since):
                raise ValueError
        except ValueError:
            return error(400, f"query field 'since' = {args.get('since')} must be a number "
                         "(Unix seconds), e.g. ?since=1700000000")  # fmt: skip
        table = self.table
        now = self.clock()
        q = table.slo_quantile if table is not None else RouteTable.slo_quantile
        doc = GatewayStats(
            deployment="" if table is None else table.deployment,
            generation=self.generation,
            now=now,
            seconds=self.window.seconds(since, now, q),
            backends=len(self.replicas),
            held_now=self.held_now,
            cold_starts_s=tuple(self.cold_starts),
            totals=dict(self.window.totals),
        )
        return _json(200, doc.to_json())

    def _unavailable(self, why: str, retry_after_s: float, **extra: object) -> Response:
        retry = max(1, math.ceil(retry_after_s))
        body = {"error": f"{why}: retry after {retry} s", "retry_after_s": retry, **extra}
        return _json(503, body, {"Retry-After": str(retry)})

    async def predict(self, req: Request) -> Response:
        """Admit (or shed), hold while no replica is ready, forward, and count the answer."""
        t0 = self.timer()
        table = self.table
        slo_s = table.slo_s if table is not None else RouteTable.slo_s
        shed: Response | None = None
        if self.stopping:
            shed = self._unavailable("the gateway is stopping", FAILURE_RETRY_AFTER_S)
        elif table is not None and self.bucket is not None and not self.bucket.take(t0):
            shed = self._unavailable(
                f"deployment {table.deployment!r} is over its granted capacity "
                f"({table.admit_rps:g} requests/s admitted)",
                table.retry_after_s,
                deployment=table.deployment,
                admit_rps=table.admit_rps,
            )
        elif not self.replicas and self.held_now >= MAX_HELD:
            shed = self._unavailable(
                f"{MAX_HELD} requests are already waiting for a replica to start",
                table.retry_after_s if table is not None else FAILURE_RETRY_AFTER_S,
            )
        held = shed is None and not self.replicas
        second = self.window.arrive(self.clock(), len(self.replicas), held)
        if shed is not None:
            return self._count(second, Outcome.SHED, shed, t0, slo_s)
        if held:
            why = await self._hold(t0)
            if why is not None:
                retry = self.table.retry_after_s if self.table is not None else 1.0
                if not self.held_now and not self.replicas:
                    self._cold_since = None  # nobody left waiting: this episode never ended
                return self._count(second, Outcome.SHED, self._unavailable(why, retry), t0, slo_s)
        resp = await self.forward(req)
        outcome = (
            Outcome.SERVED if 200 <= resp.status < 300
            else Outcome.REJECTED if resp.status < 500 and REPLICA_HEADER in resp.headers
            else Outcome.ERROR
        )  # fmt: skip
        if held and outcome is Outcome.SERVED and self._cold_since is not None:
            cold = self.timer() - self._cold_since
            self._cold_since = None
            self.cold_starts.append(cold)
            self.metrics.cold.observe(cold)
            _log(f"cold start: first held request answered after {cold:.3f} s")
        return self._count(second, outcome, resp, t0, self.table.slo_s if self.table else slo_s)

    def _count(
        self, second: _Second, outcome: Outcome, resp: Response, t0: float, slo_s: float
    ) -> Response:
        took = self.timer() - t0
        self.window.finish(second, outcome, took, slo_s)
        self.metrics.outcomes[outcome].inc()
        if outcome is Outcome.SERVED:
            self.metrics.latency.observe(took)
        return resp

    async def _hold(self, t0: float) -> str | None:
        """Wait for a ready replica (FIFO: the event wakes waiters in arrival order); None
        when one is, else why not."""
        if self._cold_since is None:
            self._cold_since = t0
        self.held_now += 1
        try:
            while True:
                table = self.table
                hold_s = DEFAULT_HOLD_S if table is None else table.hold_s
                left = t0 + hold_s - self.timer()
                if left <= 0:
                    return f"no replica became ready within {hold_s:g} s (hold_s)"
                try:
                    await asyncio.wait_for(self._ready.wait(), left)
                except asyncio.TimeoutError:
                    continue  # re-read hold_s: a new table may have changed it
                if self.stopping:
                    return "the gateway is stopping"
                if self.replicas:
                    return None
        finally:
            self.held_now -= 1

    def _pick(self, tried: set[Backend]) -> _Replica | None:
        """Fewest outstanding among untried replicas, ejected ones last, ties in turn."""
        reps = self.replicas
        n = len(reps)
        if not n:
            return None
        now = self.timer()
        start = self._rr = (self._rr + 1) % n
        best: _Replica | None = None
        key = (True, 0)
        for i in range(n):
            r = reps[(start + i) % n]
            if r.backend in tried:
                continue
            k = (r.down_until > now, r.outstanding)
            if best is None or k < key:
                best, key = r, k
        return best

    def _on_replica(self, path: str) -> str:
        """Clients may name the deployment or the model; replicas know only the model."""
        table = self.table
        if table is None or table.deployment == table.model:
            return path
        ours = f"{MODELS_PREFIX}/{table.deployment}"
        if path == ours or path.startswith(ours + ":"):
            return f"{MODELS_PREFIX}/{table.model}{path[len(ours) :]}"
        return path

    async def forward(self, req: Request) -> Response:
        """Send ``req`` to a replica; retry once on another if the first failed to answer."""
        target = self._on_replica(req.path) + (f"?{req.query}" if req.query else "")
        ctype = req.headers.get("content-type")
        tried: set[Backend] = set()
        why = "no replica is ready"
        self.inflight += 1
        try:
            for attempt in range(2):
                rep = self._pick(tried)
                if rep is None:
                    break
                if attempt:
                    self.window.totals["retries"] += 1
                    self.metrics.retries.inc()
                tried.add(rep.backend)
                b = rep.backend
                payload = request_bytes(req.method, target, f"{b.host}:{b.port}", req.body, ctype,
                                        req.headers)  # fmt: skip
                rep.outstanding += 1
                try:
                    reply = await rep.exchange(payload, self.timeout_s)
                except BackendFailed as exc:
                    rep.down_until = self.timer() + EJECT_S
                    why = f"replica {b.replica} failed ({exc})"
                    _log(f"{why}; {'giving up' if attempt else 'retrying'}")
                    continue
                except asyncio.TimeoutError:
                    return error(504, f"replica {b.replica} did not answer within "
                                 f"{self.timeout_s:g} s")  # fmt: skip
                finally:
                    rep.outstanding -= 1
                    if not rep.routed and not rep.outstanding:
                        rep.close_idle()
                        self.draining.discard(rep)
                headers = {k: v for k, v in reply.headers.items() if k not in _HOP}
                headers[REPLICA_HEADER] = b.replica
                ctype_out = reply.headers.get("content-type", "application/octet-stream")
                return Response(reply.status, reply.body, ctype_out, headers)
            return self._unavailable(why, FAILURE_RETRY_AFTER_S)
        finally:
            self.inflight -= 1

    # -------------------------------------------------------------------- lifecycle

    async def run(self, host: str, port: int, max_body: int = MAX_BODY) -> int:
        """Serve until SIGTERM/SIGINT, then stop gracefully; the exit code."""
        loop = asyncio.get_running_loop()
        self.reload()
        try:
            server = await loop.create_server(
                lambda: HttpProtocol(self.handle, max_body), host, port, backlog=1024
            )
        except OSError as exc:
            _log(f"cannot listen on {host}:{port}: {exc}")
            return 1
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        watcher = loop.create_task(self.watch())
        gc.collect()
        gc.freeze()  # imports live as long as the process: keep them out of every collection
        bound = server.sockets[0].getsockname()
        print(json.dumps({"gateway": str(self.run_dir), "host": bound[0], "port": bound[1],
                          "pid": os.getpid()}), flush=True)  # fmt: skip
        await stop.wait()
        _log("stopping: no new connections, held requests answered 503")
        server.close()
        self.stopping = True
        self._ready.set()  # wake the held: they answer 503
        watcher.cancel()
        deadline = self.timer() + STOP_GRACE_S
        while (self.inflight or self.held_now) and self.timer() < deadline:
            await asyncio.sleep(0.02)
        for rep in self.replicas:
            rep.close_idle()
        return 0


def _log(message: str) -> None:
    print(f"gateway: {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m coadapt.serve.gateway",
                                description=__doc__.split("\n")[0])  # fmt: skip
    p.add_argument("--run-dir", required=True, help=f"the directory holding {ROUTES_FILE}")
    p.add_argument("--port", type=int, required=True, help="0 picks a free port")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S,
                   help="a replica slower than this is answered 504")  # fmt: skip
    p.add_argument("--max-body", type=int, default=MAX_BODY, help="bytes")
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    if not Path(args.run_dir).is_dir():
        print(f"error: --run-dir {args.run_dir} is not a directory (create it; the controller "
              f"writes {ROUTES_FILE} there)", file=sys.stderr)  # fmt: skip
        return 2
    if not 0 <= args.port < 65536:
        print(f"error: --port {args.port} is not a TCP port (0-65535; 0 picks a free one)",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.max_body < 1:
        print(f"error: --max-body {args.max_body} must be >= 1 byte", file=sys.stderr)
        return 2
    if not (math.isfinite(args.timeout_s) and args.timeout_s > 0):
        print(f"error: --timeout-s {args.timeout_s} must be > 0 seconds", file=sys.stderr)
        return 2

    async def serve() -> int:
        return await Gateway(args.run_dir, timeout_s=args.timeout_s).run(
            args.host, args.port, args.max_body
        )

    return asyncio.run(serve())


if __name__ == "__main__":
    sys.exit(main())

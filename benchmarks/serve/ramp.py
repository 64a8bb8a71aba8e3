"""An open-loop load ramp against a served model (a deployment's gateway or one replica).

Requests are *sent on schedule* whether or not earlier ones were answered (open loop), at a
rate that follows a piecewise-linear schedule (``base`` -> ``factor x base`` over ``up_s`` and
back, by default), evenly spaced or Poisson; each request's latency is measured from its
scheduled send time, so a server that falls behind shows it (no coordinated omission). Every
run is bounded: in requests (``max_requests``), in time (the schedule, at most
``MAX_SCHEDULE_S``, plus one request timeout to drain) and in connections; loopback only.

Per request it records (scheduled send time, latency, status); every ``every_s`` seconds a row:
offered rate, p50 and p99 of the answered-2xx latencies, errors (no answer, or a status other
than 2xx and 503) and 503s (shed by the gateway: over capacity, or held past ``hold_s``).

    python benchmarks/serve/ramp.py --url http://127.0.0.1:8000 --model mlp --features 6 \\
        --base 20 --factor 5 --up-s 60 --json out/ramp.json

The live co-scheduling bench imports :func:`run_ramp` and reads :class:`RampResult`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from coadapt.serve.gateway import BackendFailed, read_reply, request_bytes  # noqa: E402

MAX_SCHEDULE_S = 1800.0
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class Phase:
    """``seconds`` during which the rate goes linearly from ``start_rps`` to ``end_rps``."""

    seconds: float
    start_rps: float
    end_rps: float


@dataclass(frozen=True)
class Schedule:
    """A piecewise-linear arrival rate."""

    phases: tuple[Phase, ...]

    def __post_init__(self) -> None:
        if not self.phases:
            raise ValueError("a schedule needs at least one phase")
        for i, p in enumerate(self.phases):
            if not (math.isfinite(p.seconds) and p.seconds > 0):
                raise ValueError(f"phase {i}: seconds = {p.seconds} must be > 0")
            for name in ("start_rps", "end_rps"):
                v = getattr(p, name)
                if not (math.isfinite(v) and v >= 0):
                    raise ValueError(f"phase {i}: {name} = {v} must be >= 0 requests/s")
        if self.duration > MAX_SCHEDULE_S:
            raise ValueError(f"the schedule lasts {self.duration:g} s; at most {MAX_SCHEDULE_S:g}")

    @property
    def duration(self) -> float:
        return sum(p.seconds for p in self.phases)

    def rate_at(self, t: float) -> float:
        """Requests per second at ``t`` seconds from the start (0 outside the schedule)."""
        if t < 0:
            return 0.0
        for p in self.phases:
            if t < p.seconds:
                return p.start_rps + (p.end_rps - p.start_rps) * t / p.seconds
            t -= p.seconds
        return 0.0

    def expected(self) -> float:
        """Requests the schedule asks for (the integral of the rate)."""
        return sum(p.seconds * (p.start_rps + p.end_rps) / 2 for p in self.phases)

    @classmethod
    def ramp(
        cls, base: float, factor: float = 5.0, warm_s: float = 10.0, up_s: float = 60.0,
        peak_s: float = 20.0, down_s: float = 60.0, cool_s: float = 10.0,
    ) -> Schedule:  # fmt: skip
        """``base`` for ``warm_s``, up to ``factor x base`` over ``up_s``, held ``peak_s``,
        back down over ``down_s``, ``base`` for ``cool_s`` (zero-length phases left out)."""
        peak = base * factor
        parts = [(warm_s, base, base), (up_s, base, peak), (peak_s, peak, peak),
                 (down_s, peak, base), (cool_s, base, base)]  # fmt: skip
        return cls(tuple(Phase(s, a, b) for s, a, b in parts if s > 0))

    @classmethod
    def parse(cls, text: str) -> Schedule:
        """``"RATE[-RATE]:SECONDS,..."``, e.g. ``"20:10,20-100:60,100-20:60"``."""
        phases = []
        for part in text.split(","):
            rates, sep, secs = part.strip().partition(":")
            a, _, b = rates.partition("-")
            try:
                phases.append(Phase(float(secs), float(a), float(b or a)))
            except ValueError as exc:
                raise ValueError(f"--schedule phase {part!r} is not RATE[-RATE]:SECONDS") from exc
            if not sep:
                raise ValueError(f"--schedule phase {part!r} is not RATE[-RATE]:SECONDS")
        return cls(tuple(phases))


def arrivals(schedule: Schedule, poisson: bool = False, seed: int = 0,
             limit: int = 100_000) -> list[float]:  # fmt: skip
    """Send times (seconds from the start) following the schedule: evenly spaced (the n-th
    where the rate's integral reaches n - 1/2) or a Poisson process (thinning); at most
    ``limit``."""
    out: list[float] = []
    end = schedule.duration
    if poisson:
        peak = max(max(p.start_rps, p.end_rps) for p in schedule.phases)
        if peak <= 0:
            return out
        rng = random.Random(seed)
        t = 0.0
        while len(out) < limit:
            t += rng.expovariate(peak)
            if t >= end:
                break
            if rng.random() * peak < schedule.rate_at(t):
                out.append(t)
        return out
    due, before, offset = 0.5, 0.0, 0.0  # next n - 1/2; requests before this phase; its start
    for p in schedule.phases:
        a, k = p.start_rps, (p.end_rps - p.start_rps) / p.seconds
        count = p.seconds * (p.start_rps + p.end_rps) / 2
        while due < before + count and len(out) < limit:
            n = due - before  # solve a t + k t^2 / 2 = n (this form is stable for any k)
            out.append(offset + 2 * n / (a + math.sqrt(max(0.0, a * a + 2 * k * n))))
            due += 1.0
        before += count
        offset += p.seconds
    return out


@dataclass(frozen=True)
class Sample:
    """One request: scheduled send time (s from the start), latency from then, HTTP status
    (0: no answer: refused, reset or timed out)."""

    t: float
    latency_s: float
    status: int


@dataclass
class RampResult:
    schedule: Schedule
    started: float  # Unix time of t = 0 (the gateway's stats are in Unix seconds)
    samples: list[Sample] = field(default_factory=list)

    def _window(self, lo: float, hi: float) -> list[Sample]:
        return [s for s in self.samples if lo <= s.t < hi]

    @property
    def errors(self) -> int:
        return sum(1 for s in self.samples if not (200 <= s.status < 300 or s.status == 503))

    @property
    def shed(self) -> int:
        return sum(1 for s in self.samples if s.status == 503)

    def slo_attainment(self, slo_s: float) -> float:
        """Fraction of all requests answered 2xx within ``slo_s`` (1.0 for no request)."""
        if not self.samples:
            return 1.0
        ok = sum(1 for s in self.samples if 200 <= s.status < 300 and s.latency_s <= slo_s)
        return ok / len(self.samples)

    def rows(self, every_s: float = 5.0) -> list[dict[str, Any]]:
        """One row per ``every_s`` of the schedule (see the module docstring)."""
        out = []
        n = math.ceil(self.schedule.duration / every_s - 1e-9)
        for i in range(n):
            lo, hi = i * every_s, min((i + 1) * every_s, self.schedule.duration)
            got = self._window(lo, hi)
            lat = np.array([s.latency_s for s in got if 200 <= s.status < 300])
            out.append({
                "t0": lo, "t1": hi,
                "target_rps": float(np.mean([self.schedule.rate_at(x)
                                             for x in np.linspace(lo, hi, 11)[:-1]])),
                "rate": len(got) / (hi - lo),
                "ok": int(lat.size),
                "p50_ms": float(np.percentile(lat, 50) * 1e3) if lat.size else None,
                "p99_ms": float(np.percentile(lat, 99) * 1e3) if lat.size else None,
                "errors": sum(1 for s in got if not (200 <= s.status < 300 or s.status == 503)),
                "shed_503": sum(1 for s in got if s.status == 503),
            })  # fmt: skip
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "schedule": [asdict(p) for p in self.schedule.phases],
            "started": self.started,
            "requests": len(self.samples),
            "errors": self.errors,
            "shed_503": self.shed,
            "samples": [[round(s.t, 6), round(s.latency_s, 6), s.status] for s in self.samples],
        }


class _Pool:
    """Keep-alive connections to one address, at most ``size`` open (open loop: a request
    waits for a connection only when ``size`` are busy, and that wait counts in its latency)."""

    def __init__(self, host: str, port: int, size: int) -> None:
        self.host, self.port = host, port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.slots = asyncio.Semaphore(size)

    async def exchange(self, payload: bytes) -> int:
        async with self.slots:
            conn = self.idle.pop() if self.idle else None
            while True:
                reused = conn is not None
                if conn is None:
                    conn = await asyncio.open_connection(self.host, self.port)
                r, w = conn
                try:
                    w.write(payload)
                    await w.drain()
                    reply = await read_reply(r)
                except (OSError, EOFError, asyncio.IncompleteReadError, BackendFailed):
                    w.close()
                    if not reused:
                        raise
                    conn = None  # the server closed an idle connection: one fresh try
                    continue
                except asyncio.CancelledError:  # timed out: the connection is mid-request
                    w.close()
                    raise
                if reply.headers.get("connection", "").lower() == "close":
                    w.close()
                else:
                    self.idle.append(conn)
                return reply.status

    def close(self) -> None:
        while self.idle:
            self.idle.pop()[1].close()


async def ramp_async(
    url: str, model: str, body: bytes, schedule: Schedule, *,
    content_type: str = "application/json", poisson: bool = False, seed: int = 0,
    max_requests: int = 100_000, timeout_s: float = 10.0, connections: int = 256,
) -> RampResult:  # fmt: skip
    """:func:`run_ramp` inside a running event loop."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in LOOPBACK or parts.port is None:
        raise ValueError(f"url {url!r}: give http://127.0.0.1:PORT (loopback only)")
    if not 1 <= connections <= 4096:
        raise ValueError(f"connections = {connections}: give 1 to 4096")
    times = arrivals(schedule, poisson, seed, max_requests)
    pool = _Pool(parts.hostname, parts.port, connections)
    payload = request_bytes("POST", f"/v1/models/{model}:predict",
                            f"{parts.hostname}:{parts.port}", body, content_type)  # fmt: skip
    loop = asyncio.get_running_loop()
    result = RampResult(schedule, time.time())
    t0 = loop.time()

    async def one(at: float) -> None:
        try:  # the timeout runs from the send time: a wait for a connection counts too
            status = await asyncio.wait_for(pool.exchange(payload), timeout_s)
        except (OSError, EOFError, asyncio.IncompleteReadError, asyncio.TimeoutError,
                BackendFailed):  # fmt: skip
            status = 0
        result.samples.append(Sample(at, loop.time() - t0 - at, status))

    tasks = []
    for at in times:
        delay = t0 + at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(loop.create_task(one(at)))
    if tasks:
        await asyncio.wait(tasks, timeout=timeout_s + 5.0)
    for t in tasks:
        t.cancel()
    pool.close()
    result.samples.sort(key=lambda s: s.t)
    return result


def run_ramp(url: str, model: str, body: bytes, schedule: Schedule, **options: Any) -> RampResult:
    """Send the schedule's requests to ``url``'s ``/v1/models/{model}:predict`` (``body`` as
    is; ``content_type``, ``poisson``, ``seed``, ``max_requests``, ``timeout_s``,
    ``connections`` as in :func:`ramp_async`) and record every answer. Blocks for the
    schedule's duration (plus at most one timeout to drain)."""
    return asyncio.run(ramp_async(url, model, body, schedule, **options))


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    lines = [f"{'t':>9} {'target':>7} {'rate':>7} {'ok':>6} {'p50_ms':>7} {'p99_ms':>7} "
             f"{'errors':>6} {'503s':>6}"]  # fmt: skip
    for r in rows:
        lines.append(f"{r['t0']:4.0f}-{r['t1']:<4.0f} {r['target_rps']:7.1f} {r['rate']:7.1f} "
                     f"{r['ok']:6d} {ms(r['p50_ms']):>7} {ms(r['p99_ms']):>7} {r['errors']:6d} "
                     f"{r['shed_503']:6d}")  # fmt: skip
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True, help="http://127.0.0.1:PORT (a gateway or replica)")
    p.add_argument("--model", required=True)
    p.add_argument("--base", type=float, default=20.0, help="requests/s at the start and end")
    p.add_argument("--factor", type=float, default=5.0, help="peak = factor x base")
    for name, default in (("warm", 10), ("up", 60), ("peak", 20), ("down", 60), ("cool", 10)):
        p.add_argument(f"--{name}-s", type=float, default=float(default))
    p.add_argument("--schedule", help='instead of the ramp: "RATE[-RATE]:SECONDS,..."')
    p.add_argument("--features", type=int, default=6, help="JSON body: one row of N floats")
    p.add_argument("--rows", type=int, default=1, help="JSON body: rows per request")
    p.add_argument("--body-file", help="send this file as the body instead")
    p.add_argument("--content-type", default="application/json")
    p.add_argument("--poisson", action="store_true", help="Poisson arrivals (default: even)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-requests", type=int, default=100_000)
    p.add_argument("--timeout-s", type=float, default=10.0)
    p.add_argument("--connections", type=int, default=256)
    p.add_argument("--every-s", type=float, default=5.0)
    p.add_argument("--json", help="write the result (rows and samples) here")
    args = p.parse_args(argv)
    try:
        schedule = (
            Schedule.parse(args.schedule) if args.schedule
            else Schedule.ramp(args.base, args.factor, args.warm_s, args.up_s, args.peak_s,
                               args.down_s, args.cool_s)
        )  # fmt: skip
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.body_file:
        body = Path(args.body_file).read_bytes()
    else:
        body = json.dumps({"instances": [[0.1] * args.features] * args.rows}).encode()
    print(f"{schedule.expected():.0f} requests over {schedule.duration:g} s to {args.url}",
          flush=True)  # fmt: skip
    try:
        result = run_ramp(args.url, args.model, body, schedule, content_type=args.content_type,
                          poisson=args.poisson, seed=args.seed, max_requests=args.max_requests,
                          timeout_s=args.timeout_s, connections=args.connections)  # fmt: skip
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = result.rows(args.every_s)
    print(format_rows(rows))
    print(f"requests {len(result.samples)}  errors {result.errors}  503s {result.shed}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"rows": rows, **result.to_json()}))
    return 0 if result.errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

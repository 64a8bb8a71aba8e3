"""The deployment gateway: real ``coadapt serve`` replicas behind a real gateway process
(forwarding, the activator, shedding, a replica killed under load, table swaps, SIGTERM), and
the per-second accounting, routing choice and table reloads in-process with an injected clock."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from coadapt.serve import codec
from coadapt.serve.gateway import (
    REPLICA_HEADER,
    Gateway,
    Outcome,
    StatsWindow,
    TokenBucket,
    quantile,
)
from coadapt.serve.http import HttpProtocol, Request, Response
from coadapt.serve.routing import (
    HEALTH_PATH,
    ROUTES_FILE,
    STATS_PATH,
    Backend,
    GatewayStats,
    RouteTable,
)
from tests.serve.conftest import KW, ROOT, Server, publish_mlp, start_server, stop_server

PREDICT = "/v1/models/mlp:predict"
JSON_H = {"Content-Type": "application/json"}
BODY = json.dumps({"instances": [[0.1] * KW["in_features"]]}).encode()


@dataclass
class Gw:
    """A gateway process and its run directory."""

    proc: subprocess.Popen[bytes]
    port: int
    run_dir: Path

    def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()

    def stats(self, since: float = 0) -> GatewayStats:
        status, _, raw = self.request("GET", f"{STATS_PATH}?since={since}")
        assert status == 200, raw
        return GatewayStats.from_json(json.loads(raw))

    def route(self, generation: int, *backends: Server, **options: Any) -> None:
        ours = tuple(Backend(f"r{s.port}", "127.0.0.1", s.port) for s in backends)
        RouteTable("demo", "mlp", generation, ours, **options).write(self.run_dir)

    def wait_generation(self, generation: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            _, _, raw = self.request("GET", HEALTH_PATH)
            if json.loads(raw)["generation"] == generation:
                return
            time.sleep(0.05)
        raise AssertionError(f"the gateway did not take generation {generation}: {raw!r}")


def start_gateway(run_dir: Path) -> Gw:
    """``python -m coadapt.serve.gateway`` on a free loopback port; ready when it says so."""
    run_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "coadapt.serve.gateway", "--run-dir", str(run_dir), "--port", "0"],
        stdout=subprocess.PIPE, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline() if ready else b""
    if not line:
        stop_server(proc)
        raise AssertionError("the gateway did not print its ready line")
    return Gw(proc, int(json.loads(line)["port"]), run_dir)


@pytest.fixture(scope="module")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gw-models") / "mlp"
    publish_mlp(root, seed=1)
    return root


@pytest.fixture(scope="module")
def three(model_root: Path) -> Iterator[list[Server]]:
    """Three one-worker replicas, started side by side (the third is killed by one test)."""
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(start_server, model_root, "--workers", "1") for _ in range(3)]
    started = [f.result() for f in futures if f.exception() is None]
    try:
        if len(started) < 3:
            raise AssertionError(f"only {len(started)} of 3 replicas started")
        yield started
    finally:
        for s in started:
            stop_server(s.proc)


@pytest.fixture
def replicas(three: list[Server]) -> tuple[Server, Server]:
    return three[0], three[1]


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Gw]:
    g = start_gateway(tmp_path / "gateway")
    try:
        yield g
    finally:
        stop_server(g.proc)


def _load(port: int, seconds: float, threads: int = 4) -> list[tuple[int, str]]:
    """Closed-loop keep-alive clients for ``seconds``: (status, answering replica) each."""
    out: list[tuple[int, str]] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client() -> None:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine: list[tuple[int, str]] = []
        try:
            while time.monotonic() < stop:
                try:
                    c.request("POST", PREDICT, body=BODY, headers=JSON_H)
                    r = c.getresponse()
                    r.read()
                    mine.append((r.status, r.getheader(REPLICA_HEADER) or ""))
                except (OSError, http.client.HTTPException) as exc:
                    mine.append((0, repr(exc)))
                    c.close()
                    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        finally:
            c.close()
            with lock:
                out.extend(mine)

    ts = [threading.Thread(target=client) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


# ------------------------------------------------------------------------- live processes


def test_forwards_json_binary_and_metadata_unchanged(replicas: tuple[Server, Server], gw: Gw
                                                     ) -> None:  # fmt: skip
    a, b = replicas
    gw.route(1, a, b)
    gw.wait_generation(1)
    status, headers, raw = gw.request("POST", PREDICT, BODY, JSON_H)
    _, direct_headers, direct = a.request("POST", PREDICT, BODY, JSON_H)
    assert status == 200 and headers["content-type"] == codec.JSON
    assert json.loads(raw) == json.loads(direct)
    assert headers["x-coadapt-version"] == direct_headers["x-coadapt-version"]
    assert headers[REPLICA_HEADER.lower()] in (f"r{a.port}", f"r{b.port}")

    x = np.random.default_rng(0).standard_normal((3, KW["in_features"])).astype(np.float32)
    body = codec.encode_arrays([x])
    status, headers, raw = gw.request("POST", PREDICT, body, {"Content-Type": codec.BINARY})
    _, _, direct = a.request("POST", PREDICT, body, {"Content-Type": codec.BINARY})
    assert status == 200 and headers["content-type"] == codec.BINARY
    assert raw == direct  # byte for byte

    status, _, raw = gw.request("GET", "/v1/models/mlp")
    assert status == 200 and json.loads(raw)["name"] == "mlp"
    # clients may name the deployment ("demo") instead of the model
    status, _, raw = gw.request("POST", "/v1/models/demo:predict", BODY, JSON_H)
    assert status == 200 and json.loads(raw)["model"] == "mlp"
    # a replica's 4xx is passed back and counted as rejected, not as an error
    status, _, raw = gw.request("POST", PREDICT, json.dumps({"instances": [[1.0]]}).encode(),
                                JSON_H)  # fmt: skip
    assert status == 422 and "expected [rows, 6]" in json.loads(raw)["error"]
    # both replicas take a share of concurrent load
    answers = _load(gw.port, 1.0)
    assert {s for s, _ in answers} == {200}
    assert set(Counter(r for _, r in answers)) == {f"r{a.port}", f"r{b.port}"}
    totals = gw.stats().totals
    assert totals["rejected"] == 1 and totals["errors"] == 0
    assert totals["served"] == len(answers) + 3
    status, _, raw = gw.request("GET", "/metrics")
    text = raw.decode()
    assert status == 200 and 'coadapt_gateway_requests_total{outcome="served"}' in text
    assert "coadapt_gateway_generation 1.0" in text and "coadapt_gateway_backends 2.0" in text


def test_activator_holds_until_a_replica_is_routed(replicas: tuple[Server, Server], gw: Gw
                                                   ) -> None:  # fmt: skip
    assert gw.stats().generation == -1  # no table yet: every request is held
    answer: list[tuple[int, dict[str, str], bytes]] = []
    t = threading.Thread(target=lambda: answer.append(gw.request("POST", PREDICT, BODY, JSON_H)))
    t0 = time.monotonic()
    t.start()
    deadline = time.monotonic() + 10
    while gw.stats().held_now != 1:
        assert time.monotonic() < deadline, "the request was not held"
        time.sleep(0.02)
    time.sleep(0.3)
    gw.route(1, replicas[0])
    t.join(30)
    waited = time.monotonic() - t0
    assert answer and answer[0][0] == 200, answer
    stats = gw.stats()
    assert stats.held_now == 0 and stats.totals["held"] == 1 and stats.totals["served"] == 1
    (cold,) = stats.cold_starts_s
    assert 0.3 <= cold <= waited
    time.sleep(max(0.0, 1.05 - (time.time() % 1)))  # let the arrival second complete
    (second,) = gw.stats().seconds
    assert (second.offered, second.held, second.served) == (1, 1, 1)
    assert second.latency_q_s is not None and second.latency_q_s >= 0.3


def test_sheds_with_503_and_retry_after(replicas: tuple[Server, Server], gw: Gw) -> None:
    gw.route(1, replicas[0], admit_rps=0.0, retry_after_s=7.5)
    gw.wait_generation(1)
    status, headers, raw = gw.request("POST", PREDICT, BODY, JSON_H)
    assert status == 503 and headers["retry-after"] == "8"
    doc = json.loads(raw)
    assert "over its granted capacity" in doc["error"] and doc["admit_rps"] == 0.0
    # no replica and a short hold: answered 503 once hold_s passes, never a silent timeout
    gw.route(2, hold_s=0.3, retry_after_s=2.0)
    gw.wait_generation(2)
    t0 = time.monotonic()
    status, headers, raw = gw.request("POST", PREDICT, BODY, JSON_H)
    assert status == 503 and headers["retry-after"] == "2"
    assert time.monotonic() - t0 >= 0.3 and "hold_s" in json.loads(raw)["error"]
    totals = gw.stats().totals
    assert (totals["shed"], totals["served"], totals["held"]) == (2, 0, 1)


def test_a_replica_killed_under_load_loses_no_request(
    three: list[Server], replicas: tuple[Server, Server], gw: Gw
) -> None:
    victim = three[2]
    try:
        _, _, raw = victim.request("GET", "/v1/models/mlp")
        worker = int(json.loads(raw)["pid"])
        gw.route(1, victim, replicas[0])
        gw.wait_generation(1)

        def kill() -> None:
            time.sleep(0.8)
            os.kill(victim.proc.pid, signal.SIGKILL)  # the supervisor first: no restart
            os.kill(worker, signal.SIGKILL)

        killer = threading.Thread(target=kill)
        killer.start()
        answers = _load(gw.port, 2.5)
        killer.join()
    finally:
        stop_server(victim.proc)
    statuses = Counter(s for s, _ in answers)
    assert statuses == {200: len(answers)}, statuses
    replicas_seen = Counter(r for _, r in answers)
    assert replicas_seen[f"r{victim.port}"] > 0 and replicas_seen[f"r{replicas[0].port}"] > 0
    totals = gw.stats().totals
    assert totals["errors"] == 0 and totals["retries"] >= 1


def test_table_swaps_under_load_lose_no_request(replicas: tuple[Server, Server], gw: Gw) -> None:
    a, b = replicas
    gw.route(1, a)
    gw.wait_generation(1)

    def swaps() -> None:
        for gen, backends in ((2, (b,)), (3, (a, b)), (4, (b,)), (5, (a,))):
            time.sleep(0.35)
            gw.route(gen, *backends)
        time.sleep(0.35)
        (gw.run_dir / ROUTES_FILE).write_text('{"deployment": "demo", "generation": ')

    swapper = threading.Thread(target=swaps)
    swapper.start()
    answers = _load(gw.port, 2.5)
    swapper.join()
    assert Counter(s for s, _ in answers) == {200: len(answers)}
    assert {r for _, r in answers} == {f"r{a.port}", f"r{b.port}"}
    _, _, raw = gw.request("GET", HEALTH_PATH)
    assert json.loads(raw)["generation"] == 5  # the malformed table was ignored
    status, headers, _ = gw.request("POST", PREDICT, BODY, JSON_H)
    assert status == 200 and headers[REPLICA_HEADER.lower()] == f"r{a.port}"


def test_sigterm_answers_held_requests_and_exits_0(tmp_path: Path) -> None:
    g = start_gateway(tmp_path / "gateway")
    try:
        answer: list[tuple[int, dict[str, str], bytes]] = []
        t = threading.Thread(target=lambda: answer.append(g.request("POST", PREDICT, BODY,
                                                                    JSON_H)))  # fmt: skip
        t.start()
        deadline = time.monotonic() + 10
        while g.stats().held_now != 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(g.proc.pid, signal.SIGTERM)
        t.join(15)
        assert g.proc.wait(15) == 0
    finally:
        stop_server(g.proc)
    assert answer[0][0] == 503 and "stopping" in json.loads(answer[0][2])["error"]


def test_bad_usage_names_the_option(tmp_path: Path) -> None:
    from coadapt.serve.gateway import main

    assert main(["--run-dir", str(tmp_path / "missing"), "--port", "0"]) == 2
    assert main(["--run-dir", str(tmp_path), "--port", "70000"]) == 2
    assert main(["--run-dir", str(tmp_path)]) == 2  # --port is required


# ------------------------------------------------------------------------- in-process


def test_stats_window_counts_by_arrival_second() -> None:
    w = StatsWindow(keep=5)
    first = w.arrive(100.2, backends=0, held=True)  # held, answered in a later second
    w.note_backends(100.9, 2)
    for i, lat in enumerate((0.01, 0.02, 0.03, 0.2)):
        w.finish(w.arrive(101.1 + i * 0.1, backends=2, held=False), Outcome.SERVED, lat, 0.05)
    w.finish(w.arrive(101.5, 2, False), Outcome.SHED, 0.0, 0.05)
    w.finish(w.arrive(101.6, 2, False), Outcome.ERROR, 0.1, 0.05)
    w.finish(w.arrive(101.7, 2, False), Outcome.REJECTED, 0.001, 0.05)
    pending = w.arrive(102.5, 1, False)
    assert w.seconds(0, 102.9, 0.99)[0].served == 0  # second 100: the held one not answered
    w.finish(first, Outcome.SERVED, 1.9, 0.05)  # counts in its arrival second
    s100, s101 = w.seconds(100, 102.9, 0.5)  # 102 is not complete yet
    assert (s100.t, s100.offered, s100.held, s100.served, s100.within_slo) == (100, 1, 1, 1, 0)
    assert s100.backends == 2 and s100.latency_q_s == 1.9
    assert (s101.offered, s101.served, s101.within_slo, s101.shed, s101.errors) == (7, 4, 3, 1, 1)
    assert s101.latency_q_s == 0.02  # nearest rank: the 2nd of 4
    assert w.seconds(100, 102.9, 0.99)[1].latency_q_s == 0.2
    assert [s.t for s in w.seconds(100.5, 103.0, 0.99)] == [101, 102]  # since rounds up
    w.finish(pending, Outcome.SERVED, 0.01, 0.05)
    w.arrive(110.0, 1, False)  # older than keep=5 seconds is dropped
    assert [s.t for s in w.seconds(0, 111, 0.99)] == [110]
    assert w.totals == {"offered": 10, "served": 6, "within_slo": 4, "shed": 1, "errors": 1,
                        "rejected": 1, "held": 1, "retries": 0}  # fmt: skip
    assert quantile([3.0], 0.99) == 3.0 and quantile(list(range(1, 101)), 0.99) == 99


def test_token_bucket_admits_rate_with_a_second_of_burst() -> None:
    b = TokenBucket(10.0, now=0.0)
    assert sum(b.take(0.0) for _ in range(20)) == 10  # the burst
    assert sum(b.take(0.5) for _ in range(20)) == 5  # half a second of refill
    assert not any(TokenBucket(0.0, 0.0).take(t) for t in (0.0, 5.0, 100.0))
    slow = TokenBucket(0.5, now=0.0)  # below 1/s: still one at a time, never stuck
    assert slow.take(0.0) and not slow.take(1.0) and slow.take(2.0)


class _Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_gateway_stats_with_an_injected_clock(tmp_path: Path) -> None:
    clock = _Clock(1000.25)
    RouteTable("demo", "mlp", 3, admit_rps=0.0, retry_after_s=3.2).write(tmp_path)

    async def scenario() -> list[Response]:
        gw = Gateway(tmp_path, clock=clock, timer=clock)
        assert gw.reload() and gw.generation == 3
        out = []
        for t in (1000.25, 1000.5, 1001.0, 1002.75):
            clock.t = t
            out.append(await gw.handle(Request("POST", PREDICT, JSON_H, BODY)))
        clock.t = 1003.1
        out.append(await gw.handle(Request("GET", STATS_PATH, {}, b"", "since=1000.5")))
        out.append(await gw.handle(Request("GET", STATS_PATH, {}, b"", "since=yesterday")))
        return out

    *shed, stats, bad = asyncio.run(scenario())
    assert {r.status for r in shed} == {503} and shed[0].headers["Retry-After"] == "4"
    doc = GatewayStats.from_json(json.loads(stats.body))
    assert doc.generation == 3 and doc.now == 1003.1 and doc.deployment == "demo"
    assert [(s.t, s.offered, s.shed) for s in doc.seconds] == [(1001, 1, 1), (1002, 1, 1)]
    assert doc.totals["offered"] == 4 and doc.totals["shed"] == 4
    assert doc.totals["held"] == 0  # shed at once, none waited in the activator
    assert bad.status == 400 and "'since'" in json.loads(bad.body)["error"]


def test_a_malformed_route_table_keeps_the_last_good_one(tmp_path: Path) -> None:
    good = RouteTable("demo", "mlp", 1, (Backend("r1", "127.0.0.1", 9001),))
    path = tmp_path / ROUTES_FILE

    async def scenario() -> None:
        gw = Gateway(tmp_path)
        assert not gw.reload() and gw.table is None  # no table yet: requests are held
        good.write(tmp_path)
        assert gw.reload() and gw.generation == 1
        assert not gw.reload()  # unchanged: not re-read
        for bad in ("{not json", '{"deployment": "demo"}', '[1]',
                    json.dumps({**good.to_json(), "backends": [5]}), json.dumps(
            {**good.to_json(), "generation": 2, "backends": [{"replica": "r", "host": "h",
                                                             "port": 70000}]})):  # fmt: skip
            path.write_text(bad)
            os.utime(path, ns=(time.time_ns(), time.time_ns() + 1_000_000))
            assert not gw.reload()
            assert gw.generation == 1 and [r.backend.port for r in gw.replicas] == [9001]
        replace(good, generation=2, backends=()).write(tmp_path)
        assert gw.reload() and gw.generation == 2 and gw.replicas == []

    asyncio.run(scenario())


def test_least_outstanding_routes_around_a_hung_replica(tmp_path: Path) -> None:
    """Two in-loop replicas; one hangs until released. Fewest-outstanding sends it a request
    only while the other has as many in flight, so 4 clients leave at most 3 requests hanging
    there and the other answers the rest (round robin would hang every client in a few)."""
    release = asyncio.Event()
    hung: list[int] = []

    def replica(hang: bool) -> HttpProtocol:
        async def answer(req: Request) -> Response:
            if hang:
                hung.append(1)
                await release.wait()
            return Response(200, b'{"predictions": [[0.0]]}')

        return HttpProtocol(answer, 1 << 20)

    async def scenario() -> Counter[str]:
        loop = asyncio.get_running_loop()
        ok = await loop.create_server(lambda: replica(False), "127.0.0.1", 0)
        bad = await loop.create_server(lambda: replica(True), "127.0.0.1", 0)
        ports = {"ok": ok.sockets[0].getsockname()[1], "hung": bad.sockets[0].getsockname()[1]}
        RouteTable("demo", "mlp", 1, tuple(Backend(n, "127.0.0.1", p) for n, p in ports.items())
                   ).write(tmp_path)  # fmt: skip
        gw = Gateway(tmp_path)
        gw.reload()
        seen: Counter[str] = Counter()

        async def client() -> None:
            while seen["ok"] < 90:
                resp = await gw.handle(Request("POST", PREDICT, JSON_H, BODY))
                assert resp.status == 200
                seen[resp.headers[REPLICA_HEADER]] += 1

        clients = [loop.create_task(client()) for _ in range(4)]
        deadline = loop.time() + 20
        while seen["ok"] < 90 and loop.time() < deadline:
            await asyncio.sleep(0.01)
        answered_while_hung = seen["ok"]
        release.set()
        await asyncio.gather(*clients)
        for rep in gw.replicas:
            rep.close_idle()
        ok.close()
        bad.close()
        return Counter(ok=answered_while_hung, hung=len(hung))

    seen = asyncio.run(scenario())
    assert seen["ok"] >= 90 and 1 <= seen["hung"] <= 3, seen


def test_a_dropped_replica_finishes_its_requests_and_reports_draining(tmp_path: Path) -> None:
    async def answer(req: Request) -> Response:
        await asyncio.sleep(0.3)
        return Response(200, b'{"predictions": [[1.0]]}')

    async def scenario() -> tuple[Response, list[int]]:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: HttpProtocol(answer, 1 << 20), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        old = RouteTable("demo", "mlp", 1, (Backend("old", "127.0.0.1", port),))
        gw = Gateway(tmp_path)
        gw.apply(old)
        health = Request("GET", HEALTH_PATH, {}, b"")
        pending = loop.create_task(gw.handle(Request("POST", PREDICT, JSON_H, BODY)))
        await asyncio.sleep(0.1)
        gw.apply(replace(old, generation=2, backends=()))  # scale to zero while in flight
        during = json.loads((await gw.handle(health)).body)
        resp = await pending
        after = json.loads((await gw.handle(health)).body)
        server.close()
        return resp, [during["generation"], during["draining"], after["draining"]]

    resp, figures = asyncio.run(scenario())
    assert resp.status == 200 and resp.headers[REPLICA_HEADER] == "old"
    assert figures == [2, 1, 0]


def test_a_replica_past_the_timeout_is_a_504_counted_as_an_error(tmp_path: Path) -> None:
    async def hang(req: Request) -> Response:
        await asyncio.sleep(30)
        return Response(200)

    async def scenario() -> tuple[Response, dict[str, int]]:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: HttpProtocol(hang, 1 << 20), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        gw = Gateway(tmp_path, timeout_s=0.2)
        gw.apply(RouteTable("demo", "mlp", 1, (Backend("slow", "127.0.0.1", port),)))
        resp = await gw.handle(Request("POST", PREDICT, JSON_H, BODY))
        server.close()
        return resp, gw.window.totals

    resp, totals = asyncio.run(scenario())
    assert resp.status == 504 and "within 0.2 s" in json.loads(resp.body)["error"]
    assert totals["errors"] == 1 and totals["served"] == 0

"""State records (progress, goodput) are coalesced, so the last one always gets through."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from coadapt.protocol import GoodputRecord, MetricReport, ProgressRecord
from coadapt.train import MetricsSink


def test_file_sink_keeps_the_last_state_and_every_event_in_order(tmp_path: Path) -> None:
    sink = MetricsSink(path=tmp_path / "m.jsonl", state_interval=0.05)
    for step in range(1, 20_001):
        sink.emit(ProgressRecord(step=step, epoch=step // 100))
        if step % 5000 == 0:
            sink.emit(MetricReport(name="acc", value=step / 20_000, step=step))
    sink.close()
    rows = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    progress = [r["step"] for r in rows if r["kind"] == "progress"]
    assert progress[-1] == 20_000 and len(progress) < 200 and progress == sorted(progress)
    assert [r["step"] for r in rows if r["kind"] == "metric"] == [5000, 10_000, 15_000, 20_000]
    assert [(r["kind"], r["step"]) for r in rows[-2:]] == [("progress", 20_000), ("metric", 20_000)]
    assert sink.dropped == 0 and sink.failed == 0


class _Slow(BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []  # noqa: RUF012 - one server per test

    def do_POST(self) -> None:
        time.sleep(0.02)  # a busy controller: 50 records/s at most
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def slow_server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    _Slow.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/m", _Slow.received
    finally:
        server.shutdown()
        server.server_close()


def test_a_slow_controller_still_gets_the_final_step(
    slow_server: tuple[str, list[dict[str, Any]]],
) -> None:
    url, received = slow_server
    sink = MetricsSink(url=url, state_interval=0.1)
    deadline = time.monotonic() + 1.0
    step = 0
    while time.monotonic() < deadline:  # far faster than the endpoint drains
        step += 1
        sink.emit(ProgressRecord(step=step))
        sink.emit(GoodputRecord(step=step, profile=[{"m": step}]))
    sink.close(timeout_s=5)
    last = [r["step"] for r in received if r["kind"] == "progress"][-1]
    assert step > 1000 and last == step
    assert [r for r in received if r["kind"] == "goodput"][-1]["step"] == step

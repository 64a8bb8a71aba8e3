"""The CTR benchmark's load generator (``benchmarks/serve/ctr.py``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks.serve.ctr import open_loop


@pytest.fixture
def recording_server() -> Iterator[tuple[int, list[bytes]]]:
    """A loopback server that keeps every request body and answers 200."""
    seen: list[bytes] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with lock:
                seen.append(body)
            self.send_response(200)
            self.send_header("X-Coadapt-Server-Ms", "1.0")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_open_loop_cycles_through_every_body(recording_server: tuple[int, list[bytes]]) -> None:
    # One body sent again and again keeps its rows in the CPU caches; the load must vary.
    port, seen = recording_server
    bodies = [b"a" * 10, b"b" * 20, b"c" * 30]
    recs = open_loop(port, bodies, "application/octet-stream", rate=60.0, duration=0.5, conns=2)
    assert len(recs) == 30
    assert all(r[3] == 200 for r in recs)
    assert sorted(seen) == sorted(bodies * 10)


def test_open_loop_without_a_body_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one request body"):
        open_loop(1, [], "application/octet-stream", rate=1.0, duration=1.0)

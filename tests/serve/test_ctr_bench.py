"""The CTR benchmark (``benchmarks/serve/ctr.py``): its load generator and its in-process
overlay A/B."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from benchmarks.serve.ctr import main, open_loop


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


def test_the_overlay_ab_scores_both_merge_paths_alike_and_writes_its_rows(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from coadapt.sparse import _serve_lookup

    if _serve_lookup.probe_rows is None:
        pytest.skip("numba absent or COADAPT_NO_JIT set: no kernels")
    out = tmp_path / "overlay.json"
    # raises when the compiled look-up through the overlays scores differently from take's
    assert main(["_overlay", "--rows", "20000", "--iters", "3", "--bodies", "2",
                 "--json", str(out)]) == 0  # fmt: skip
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    ab = rows["ctr-overlay-ab"]
    assert ab["delta_rows"] == 220 and ab["deleted"] > 0
    assert ab["compiled_over_no_overlay_p50"] > 0 and ab["take_over_no_overlay_p50"] > 0
    assert {"ctr-overlay-forward-no-overlay", "ctr-overlay-forward-overlay-compiled",
            "ctr-overlay-forward-overlay-take"} <= set(rows)  # fmt: skip

"""The real server process: bad input gets a 4xx that says what is wrong; the binary path,
health, readiness and metrics work across worker processes."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest

from coadapt.serve import codec
from tests.serve.conftest import KW, Server

PREDICT = "/v1/models/mlp:predict"
JSON_H = {"Content-Type": "application/json"}
ROW = [0.1] * KW["in_features"]


def _json(rows: object) -> bytes:
    return json.dumps({"instances": rows}).encode()


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status", "match"),
    [
        ("POST", PREDICT, _json([[1.0, 2.0]]), JSON_H, 422, "expected [rows, 6]"),
        ("POST", PREDICT, _json([ROW[:3], ROW]), JSON_H, 400, "rectangular"),
        ("POST", PREDICT, b"a,b", {"Content-Type": "text/csv"}, 415, "unsupported Content-Type"),
        ("POST", PREDICT, _json([ROW]), {}, 415, "unsupported Content-Type '(none)'"),
        ("POST", PREDICT, b'{"instances": [[NaN,0,0,0,0,0]]}', JSON_H, 400, "NaN or Inf"),
        ("POST", PREDICT, b'{"instances": [[1e39,0,0,0,0,0]]}', JSON_H, 400, "too large"),
        ("POST", PREDICT, b"{oops", JSON_H, 400, "not valid JSON"),
        ("POST", PREDICT, b"CXB1junk", {"Content-Type": codec.BINARY}, 400, "format version"),
        ("POST", PREDICT, _json([ROW] * 5000), JSON_H, 413, "1 to 4096 rows"),
        ("POST", PREDICT, b"x" * (9 * 1024 * 1024), JSON_H, 413, "exceeds the limit"),
        ("POST", "/v1/models/nope:predict", _json([ROW]), JSON_H, 404, "no model 'nope'"),
        ("GET", PREDICT, b"", {}, 405, "takes POST"),
        ("GET", "/v2/else", b"", {}, 404, "unknown path"),
    ],
)
def test_bad_input_gets_a_4xx_that_says_what_is_wrong(
    server: Server,
    method: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
    status: int,
    match: str,
) -> None:
    got, _, raw = server.request(method, path, body, headers)
    assert got == status, raw
    assert match in json.loads(raw)["error"]


def test_chunked_upload_is_411_and_a_bad_int_wrong_dtype_is_400(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"POST " + PREDICT.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.1 411") and b"Content-Length" in reply
    ints = codec.encode_arrays([np.ones((1, KW["in_features"]), np.int64)])
    got, _, _ = server.request("POST", PREDICT, ints, {"Content-Type": codec.BINARY})
    assert got == 200  # integer features are accepted for a float model (converted)


def test_binary_and_json_give_the_same_predictions(server: Server) -> None:
    x = np.random.default_rng(0).standard_normal((3, KW["in_features"])).astype(np.float32)
    status, headers, raw = server.request(
        "POST", PREDICT, codec.encode_arrays([x]), {"Content-Type": codec.BINARY}
    )
    assert status == 200 and headers["content-type"] == codec.BINARY
    (out,) = codec.decode_arrays(raw)
    assert out.shape == (3, KW["out_features"]) and out.dtype == np.float32
    status, doc = server.predict_json(x.tolist())
    assert status == 200 and doc["version"] == headers["x-coadapt-version"]
    np.testing.assert_allclose(np.array(doc["predictions"]), out, rtol=1e-6)


def test_health_readiness_status_and_metrics(server: Server) -> None:
    assert server.request("GET", "/healthz")[0] == 200
    assert server.request("GET", "/readyz")[0] == 200
    status, _, raw = server.request("GET", "/v1/models/mlp")
    doc = json.loads(raw)
    assert status == 200 and doc["inputs"] == {"dtype": "float32", "shape": [6]}
    server.predict_json([ROW])
    server.request("POST", PREDICT, b"{oops", JSON_H)
    _, headers, metrics = server.request("GET", "/metrics")
    assert headers["content-type"].startswith("text/plain")
    for name in (
        b'coadapt_serve_requests_total{code="200",model="mlp"}',
        b'coadapt_serve_requests_total{code="400",model="mlp"}',
        b'coadapt_serve_errors_total{kind="client",model="mlp"}',
        b"coadapt_serve_request_seconds_bucket",
        b"coadapt_serve_batch_rows_bucket",
        b"coadapt_serve_model_version",
    ):
        assert name in metrics, name
    assert len(server.worker_versions()) == 2  # both worker processes report


def test_expect_100_continue_gets_its_interim_answer(server: Server) -> None:
    body = _json([ROW])
    head = (f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n").encode()  # fmt: skip
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(head)
        assert s.recv(4096) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(body)
        assert s.recv(4096).startswith(b"HTTP/1.1 200 OK")

"""A real server (2 worker processes) serving a sparse CTR model: binary and JSON requests
score each item exactly as the trainer does; bad requests get a 4xx naming the problem;
incremental versions go live under load with no lost or mixed answer; a corrupt delta is
refused while the live version keeps serving."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from coadapt.serve import codec  # noqa: E402
from coadapt.serve.artifacts import set_live  # noqa: E402
from tests.serve.conftest import ROOT, Server, stop_server  # noqa: E402
from tests.serve.test_sparse_artifacts import KW, Trainer, _local  # noqa: E402

PATH = "/v1/models/ctr:predict"
MAX_BODY = 200_000


def _start(root: Path) -> Server:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "coadapt.serve", "--model", f"ctr={root}", "--port", "0",
         "--workers", "2", "--poll-s", "0.05", "--max-body", str(MAX_BODY)],
        stdout=subprocess.PIPE, cwd=ROOT, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    r, _, _ = select.select([proc.stdout], [], [], 90)
    line = proc.stdout.readline() if r else b""
    if not line:
        stop_server(proc)
        raise AssertionError("the server did not print its ready line")
    return Server(proc, int(json.loads(line)["port"]), root)


class Ctx:
    """The trainer, the predictions each published version must give, the server."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.trainer = Trainer(_local(), seed=3)
        self.trainer.train(3)
        self.probe = self.trainer.ids(6)
        self.expected: dict[str, np.ndarray] = {}
        first = self.publish()
        self.server = _start(root)
        self.wait_on(first)

    def publish(self, incremental: bool = False) -> str:
        pred = self.trainer.predict(self.probe)  # before publishing: its rows go out too
        m = self.trainer.publish(self.root, incremental=incremental)
        self.expected[m.version] = pred
        return m.version

    def binary(self, ids: np.ndarray) -> tuple[int, dict[str, str], bytes]:
        return self.server.request(
            "POST", PATH, codec.encode_arrays([ids]), {"Content-Type": codec.BINARY}
        )

    def versions(self) -> list[int]:
        _, _, body = self.server.request("GET", "/metrics")
        found = re.findall(rb'coadapt_serve_model_version\{model="ctr",pid="\d+"\} (\S+)', body)
        return [int(float(v)) for v in found]

    def wait_on(self, version: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            vs = self.versions()
            if len(vs) == 2 and all(v == int(version) for v in vs):
                return
            time.sleep(0.05)
        raise AssertionError(f"workers did not reach {version}: {self.versions()}")


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ctx]:
    c = Ctx(tmp_path_factory.mktemp("sparse") / "ctr")
    try:
        yield c
    finally:
        stop_server(c.server.proc)


def _probe_ids(ctx: Ctx) -> np.ndarray:
    return ctx.probe.numpy().view(np.uint64)


def test_binary_and_json_requests_score_each_item_like_the_trainer(ctx: Ctx) -> None:
    status, headers, body = ctx.binary(_probe_ids(ctx))
    assert status == 200, body
    (scores,) = codec.decode_arrays(body)
    version = headers["x-coadapt-version"]
    assert scores.shape == (6,) and np.array_equal(scores, ctx.expected[version])
    doc = {"inputs": {"ids": _probe_ids(ctx).tolist()}}  # big uint64 IDs: parsed exactly
    status, _, body = ctx.server.request(
        "POST", PATH, json.dumps(doc).encode(), {"Content-Type": codec.JSON}
    )
    out = json.loads(body)
    assert status == 200 and out["version"] == version
    assert np.array_equal(np.float32(out["predictions"]), ctx.expected[version])
    info = json.loads(ctx.server.request("GET", "/v1/models/ctr")[2])
    assert info["sparse"]["inputs"][0]["name"] == "ids" and info["sparse"]["rows"]["ctr"] > 0


@pytest.mark.parametrize(
    ("body", "ctype", "status", "words"),
    [
        (codec.encode_arrays([np.zeros((2, KW["features"]), np.float32)]), codec.BINARY, 400,
         "feature IDs"),
        (codec.encode_arrays([np.zeros((2, KW["features"] - 1), np.uint64)]), codec.BINARY, 422,
         f"expects [rows, {KW['features']}]"),
        (codec.encode_arrays([np.zeros((2, KW["features"]), np.uint64)] * 2), codec.BINARY, 400,
         "takes 1 array"),
        (codec.encode_arrays([np.zeros((2, KW["features"]), np.uint64)])[:-3], codec.BINARY, 400,
         "needs"),
        (json.dumps({"inputs": {"ids": [["a"] * KW["features"]]}}).encode(), codec.JSON, 400,
         "must be a JSON integer"),
        (json.dumps({"inputs": {"idz": [[1] * KW["features"]]}}).encode(), codec.JSON, 400,
         "missing ['ids']"),
        (json.dumps({"instances": [[-1, 2**64 - 1] * (KW["features"] // 2)]}).encode(),
         codec.JSON, 400, "must lie in [-2**63, 2**64)"),
        (json.dumps({"instances": [[1.5] * KW["features"]]}).encode(), codec.JSON, 400,
         "must be a JSON integer"),
        (b"\0" * (MAX_BODY + 1), codec.BINARY, 413, "exceeds the limit"),
    ],
)  # fmt: skip
def test_bad_ctr_requests_get_a_4xx_that_says_what_is_wrong(
    ctx: Ctx, body: bytes, ctype: str, status: int, words: str
) -> None:
    got, _, answer = ctx.server.request("POST", PATH, body, {"Content-Type": ctype})
    assert got == status, answer
    assert words in json.loads(answer)["error"]


def test_incremental_versions_go_live_under_load_with_no_lost_request(ctx: Ctx) -> None:
    stop = threading.Event()
    answers: list[tuple[int, str, np.ndarray | bytes]] = []
    lock = threading.Lock()

    def client() -> None:
        ids = _probe_ids(ctx)
        while not stop.is_set():
            status, headers, body = ctx.binary(ids)
            got: np.ndarray | bytes = codec.decode_arrays(body)[0] if status == 200 else body
            with lock:
                answers.append((status, headers.get("x-coadapt-version", ""), got))

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for _ in range(3):
            time.sleep(0.3)
            ctx.trainer.train(2, high=600)  # new IDs too: rows are added, not only changed
            version = ctx.publish(incremental=True)
            ctx.wait_on(version)
        time.sleep(0.3)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert len(answers) > 20
    bad = [a for a in answers if a[0] != 200]
    assert not bad, bad[:3]
    seen = {v for _, v, _ in answers}
    assert len(seen) >= 3  # the load really spanned the swaps
    for _, v, scores in answers:  # every answer is exactly one version's, never a mix
        assert np.array_equal(scores, ctx.expected[v]), v


def test_a_corrupt_delta_is_refused_and_the_live_version_keeps_serving(ctx: Ctx) -> None:
    live = max(ctx.expected)
    ctx.wait_on(live)
    set_live(ctx.root, live)  # pin: the servers must not see the delta before it is damaged
    ctx.trainer.train(1)
    bad = ctx.publish(incremental=True)
    m = json.loads((ctx.root / bad / "manifest.json").read_text())
    shard = ctx.root / bad / m["sparse"]["shards"][0]["file"]
    raw = bytearray(shard.read_bytes())
    raw[-20] ^= 0x01
    shard.write_bytes(bytes(raw))
    set_live(ctx.root, bad)
    deadline = time.monotonic() + 30
    refused: dict[str, str] = {}
    while time.monotonic() < deadline and bad not in refused:
        refused = json.loads(ctx.server.request("GET", "/v1/models/ctr")[2])["refused"]
        time.sleep(0.05)
    assert "sha256" in refused[bad]
    for _ in range(4):  # both workers answer on the live version, exactly
        status, headers, body = ctx.binary(_probe_ids(ctx))
        assert status == 200 and headers["x-coadapt-version"] == live
        assert np.array_equal(codec.decode_arrays(body)[0], ctx.expected[live])
    (ctx.root / "LIVE").unlink()  # a new full version goes live past the refused delta
    ctx.trainer.train(1)
    fresh = ctx.publish()
    ctx.wait_on(fresh)
    status, headers, body = ctx.binary(_probe_ids(ctx))
    assert headers["x-coadapt-version"] == fresh
    assert np.array_equal(codec.decode_arrays(body)[0], ctx.expected[fresh])

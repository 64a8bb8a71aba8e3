"""Hot swap under load loses no request; a corrupt version is refused while the live one
serves on; rollback restores the exact predictions; an incremental version goes live."""

from __future__ import annotations

import http.client
import json
import threading

import numpy as np
import pytest

from coadapt.serve import artifacts
from tests.serve.conftest import KW, Server, publish_mlp

torch = pytest.importorskip("torch")

from coadapt.serve.models import make_mlp  # noqa: E402

X = np.random.default_rng(1).standard_normal((2, KW["in_features"])).astype(np.float32)


def _expected(seed: int) -> np.ndarray:
    with torch.inference_mode():
        return make_mlp(seed, **KW).eval()(torch.from_numpy(X)).numpy()


def _activate(server: Server, version: str) -> None:
    artifacts.set_live(server.root, version)
    server.wait_all_on(version)


def test_rollback_restores_the_exact_predictions(server: Server) -> None:
    _activate(server, "00000001")
    status, before = server.predict_json(X.tolist())
    assert status == 200 and before["version"] == "00000001"
    np.testing.assert_allclose(np.array(before["predictions"]), _expected(1), rtol=1e-6)
    new = publish_mlp(server.root, seed=2)
    _activate(server, new.version)
    _, mid = server.predict_json(X.tolist())
    assert mid["version"] == new.version and mid["predictions"] != before["predictions"]
    _activate(server, "00000001")  # rollback
    _, after = server.predict_json(X.tolist())
    assert after == before  # the same bytes: exact


def test_corrupt_version_is_refused_and_the_live_one_keeps_serving(server: Server) -> None:
    _activate(server, "00000001")
    bad = publish_mlp(server.root, seed=5)
    data = server.root / bad.version / artifacts.DENSE_FILE
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0x01
    data.write_bytes(bytes(raw))
    artifacts.atomic_write(server.root / artifacts.LIVE_FILE, f"{bad.version}\n".encode())
    # every worker tries it and refuses it (counted), and answers on version 1 meanwhile
    for _ in range(600):
        _, _, metrics = server.request("GET", "/metrics")
        line = [ln for ln in metrics.splitlines() if ln.startswith(b"coadapt_serve_load_fail")]
        if line and float(line[0].split()[-1]) >= 2:
            break
        threading.Event().wait(0.05)
    else:
        raise AssertionError("the corrupt version was not refused by both workers")
    status, doc = server.predict_json(X.tolist())
    assert status == 200 and doc["version"] == "00000001"
    info = json.loads(server.request("GET", "/v1/models/mlp")[2])
    assert "sha256" in info["refused"][bad.version]
    assert server.worker_versions() == [1, 1]


def test_hot_swap_under_load_loses_no_request(server: Server) -> None:
    _activate(server, "00000001")
    v_full = publish_mlp(server.root, seed=3)
    model = make_mlp(3, **KW)
    with torch.no_grad():
        model[4].bias.add_(1.0)
    v_delta = artifacts.publish(model, server.root, factory="coadapt.serve.models:make_mlp",
                                factory_kwargs={"seed": 3, **KW}, parent=v_full.version,
                                incremental=True)  # fmt: skip
    assert v_delta.kind == "delta"
    with torch.inference_mode():
        want_delta = model.eval()(torch.from_numpy(X)).numpy()
    want = {"00000001": _expected(1), v_full.version: _expected(3), v_delta.version: want_delta}

    stop = threading.Event()
    results: list[tuple[int, str, list[list[float]]]] = []
    failures: list[str] = []
    body = json.dumps({"instances": X.tolist()}).encode()

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        try:
            for _ in range(400):  # bounded in count, and stopped once the swaps are done
                if stop.is_set():
                    break
                conn.request("POST", "/v1/models/mlp:predict", body,
                             {"Content-Type": "application/json"})  # fmt: skip
                r = conn.getresponse()
                doc = json.loads(r.read())
                results.append((r.status, doc.get("version", ""), doc.get("predictions", [])))
        except (OSError, http.client.HTTPException) as exc:
            failures.append(repr(exc))
        finally:
            conn.close()

    def answered_by(version: str) -> None:  # the load saw this version before we move on
        for _ in range(400):
            if any(v == version for _, v, _ in results[-50:]) or failures:
                return
            threading.Event().wait(0.025)

    threads = [threading.Thread(target=client) for _ in range(6)]
    for t in threads:
        t.start()
    for version in (v_full.version, v_delta.version, "00000001"):  # the delta: applied live
        _activate(server, version)
        answered_by(version)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert not failures
    assert results and all(status == 200 for status, _, _ in results)
    assert {v for _, v, _ in results} == set(want)
    for _, version, preds in results:  # each answer is exactly its version's model
        np.testing.assert_allclose(np.array(preds), want[version], rtol=1e-5, atol=1e-6)

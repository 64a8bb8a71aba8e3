"""A sparse job through a real controller: its shard servers start with it (through the
executor), a killed one is restarted from the checkpoint, the worker finds them through its
ReplicaEnv, every sample lands in the counters once, and the servers are gone at the end."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from coadapt.controller.spec import SparseSection
from coadapt.sparse.datasets import PlantedConfig, format_criteo, iter_planted
from coadapt.sparse.jobs import MODELS
from tests.controller.livecluster import LiveController, wait_for

_SPARSE = {"servers": 2, "model": "lr", "checkpoint_every_s": 0.5}


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveController]:
    root = tmp_path_factory.mktemp("sparse-job")
    ctl = LiveController(root / "state", slots=2).start()
    try:
        yield ctl
    finally:
        ctl.stop()
        ctl.kill_replicas()
        for pid in _server_pids(ctl.state_dir):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


def _server_pids(state_dir: Path, job_id: str = "*") -> list[int]:
    out = []
    for pid_file in state_dir.glob(f"jobs/{job_id}/sparse/servers/run-*/rank*.pid"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            out.append(int(json.loads(pid_file.read_text())["pid"]))
    return out


def _group_alive(pgid: int) -> bool:
    """Whether any live (not zombie) process is in process group ``pgid`` (shim + server)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(") ", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def _submit(ctl: LiveController, spec: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{ctl.url}/api/v1/jobs",
        json=spec,
        headers={"Authorization": f"Bearer {ctl.token}"},
        timeout=30,
    )


def _spec(**kw: Any) -> dict[str, Any]:
    return {"name": "ctr-online", "command": ["python", "-c", "pass"], **kw}


@pytest.mark.parametrize(
    ("sparse", "field", "message"),
    [
        ({"servers": 0}, "sparse.servers", "sparse.servers must be an integer in 1..64"),
        ({"servers": 65}, "sparse.servers", "sparse.servers must be an integer in 1..64"),
        ({"servers": "2"}, "sparse.servers", "must be an integer in 1..64"),
        ({}, "sparse.servers", "Field required"),
        ({"servers": 2, "model": "gbdt"}, "sparse.model", "must be one of lr, fm"),
        ({"servers": 2, "dim": 0}, "sparse.dim", "must be an integer in 1..1024"),
        ({"servers": 2, "checkpoint_every_s": -1}, "sparse.checkpoint_every_s", "> 0"),
        ({"servers": 2, "shards": 2}, "sparse.shards", "unknown field"),
        ("two", "sparse", "valid dictionary"),
    ],
)
def test_a_bad_sparse_section_is_a_422_naming_the_field(
    controller: LiveController, sparse: Any, field: str, message: str
) -> None:
    resp = _submit(controller, _spec(sparse=sparse))
    assert resp.status_code == 422, resp.text
    details = {d["field"]: d for d in resp.json()["details"]}
    assert set(details) == {field}
    assert message in details[field]["message"]
    if field == "sparse.shards":
        assert "servers" in details[field]["accepted"]


def test_the_spec_knows_the_same_models_as_the_trainer() -> None:
    for model in MODELS:
        assert SparseSection(servers=1, model=model).model == model


def test_a_sparse_job_succeeds_survives_a_server_kill_and_stops_its_servers(
    controller: LiveController, tmp_path: Path
) -> None:
    cfg = PlantedConfig(rows=1500, seed=5, vocab=500, zipf_min=1.2, zipf_max=1.6)
    lines = [
        ln
        for ch in iter_planted(cfg)
        for ln in format_criteo(ch.labels, ch.dense, ch.cats, ch.cat_missing).splitlines()
    ]
    src = tmp_path / "samples.tsv"
    src.write_bytes(b"\n".join(lines[:700]) + b"\n")
    out = tmp_path / "result.json"
    resp = _submit(
        controller,
        _spec(
            command=[
                "python",
                "-m",
                "coadapt.sparse.online",
                "--source",
                f"file:{src}",
                "--model",
                "lr",
                "--batch-size",
                "50",
                "--idle-exit-s",
                "4",
                "--json",
                str(out),
            ],
            working_dir=str(tmp_path),
            sparse=_SPARSE,
            min_replicas=1,
            max_replicas=1,
            max_restarts=0,
        ),
    )
    assert resp.status_code in (200, 201), resp.text
    job_id = resp.json()["id"]
    with contextlib.closing(controller.client()) as c:
        _follow(controller, c, job_id, src, lines, out)


def _follow(
    controller: LiveController,
    c: Any,
    job_id: str,
    src: Path,
    lines: list[bytes],
    out: Path,
) -> None:
    state_dir = controller.state_dir
    ckpt = state_dir / "jobs" / job_id / "sparse" / "ckpt"

    def committed() -> int:
        try:
            return int(json.loads((ckpt / "MANIFEST.json").read_text())["samples"])
        except (OSError, ValueError):
            return -1

    wait_for(lambda: committed() >= 300, 90, "the worker to commit a checkpoint")
    first = _server_pids(state_dir, job_id)
    assert len(first) == 2
    os.killpg(first[1], signal.SIGKILL)  # shard 1 dies mid-stream: the controller restarts it
    with open(src, "ab") as f:
        f.write(b"\n".join(lines[700:]) + b"\n")
    job = wait_for(
        lambda: (j := c.job(job_id))["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") and j,
        180,
        "the sparse job to finish",
    )
    log = (state_dir / "jobs" / job_id / "logs").glob("attempt-*.rank-0.log")
    assert job["state"] == "SUCCEEDED", "\n".join(p.read_text()[-3000:] for p in log)
    res = json.loads(out.read_text())
    assert res["samples"] == len(lines)
    clicks = sum(int(ln.split(b"\t", 1)[0]) for ln in lines)
    assert len(res["counters"]) == 26
    assert all(v == [len(lines), clicks] for v in res["counters"].values()), res["counters"]
    names = {m["name"] for m in c.metrics(job_id)}  # progress reached the controller
    assert {"samples_per_s", "window_auc"} <= names, names
    msgs = [e["message"] for e in c.events(job_id)]
    assert any("shard server 1/2 restarted from the last checkpoint" in m for m in msgs), msgs
    wait_for(
        lambda: any("shard servers stopped" in e["message"] for e in c.events(job_id)),
        60,
        "the servers to be stopped",
    )
    assert not [p for p in [*first, *_server_pids(state_dir, job_id)] if _group_alive(p)]

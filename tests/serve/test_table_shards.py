"""A sparse model's tables on table-shard processes (``--table-shards 2``), with real processes:
the sharded server scores exactly like the unsharded one, each shard process holds only its
part, versions switch under load with no lost or mixed answer, a killed shard gives a clear 503
(never a hang) and is restarted, and a stopped (slow) shard fails a batch at the deadline."""

from __future__ import annotations

import asyncio
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from coadapt.executors._proc import proc_state  # noqa: E402
from coadapt.serve import codec  # noqa: E402
from coadapt.serve.__main__ import main as serve_main  # noqa: E402
from coadapt.serve.artifacts import (  # noqa: E402
    ArtifactError,
    IntegrityError,
    list_versions,
    read_manifest,
    set_live,
)
from coadapt.serve.config import ServeConfig  # noqa: E402
from coadapt.serve.runtime import ModelSlot, Worker  # noqa: E402
from coadapt.serve.sparse_artifacts import load_tables, read_delta  # noqa: E402
from coadapt.serve.table_shards import (  # noqa: E402
    ShardUnavailableError,
    common_version,
    export_shards_of,
)
from coadapt.sparse.client import PSClient  # noqa: E402
from coadapt.sparse.server import TableSpec, running_servers  # noqa: E402
from tests.serve.conftest import ROOT, Server, stop_server  # noqa: E402
from tests.serve.test_sparse_artifacts import Trainer  # noqa: E402

PATH = "/v1/models/ctr:predict"
TIMEOUT_MS = 2000


def _start(root: Path, *extra: str) -> tuple[Server, dict[str, object]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "coadapt.serve", "--model", f"ctr={root}", "--port", "0",
         "--poll-s", "0.05", *extra],
        stdout=subprocess.PIPE, cwd=ROOT, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    r, _, _ = select.select([proc.stdout], [], [], 120)
    line = proc.stdout.readline() if r else b""
    if not line:
        stop_server(proc)
        raise AssertionError("the server did not print its ready line")
    doc = json.loads(line)
    return Server(proc, int(doc["port"]), root), doc


class Ctx:
    """Two parameter-server shards and their trainer, the scores each version must give, and
    a server whose tables live on two table-shard processes."""

    def __init__(self, root: Path, ps: list[tuple[str, int]]) -> None:
        self.root = root
        self.trainer = Trainer(PSClient(ps), seed=5)
        self.trainer.train(3)
        self.probe = self.trainer.ids(6)
        self.expected: dict[str, np.ndarray] = {}
        first = self.publish()
        self.server, ready = _start(
            root, "--workers", "2", "--table-shards", "2", "--shard-timeout-ms", str(TIMEOUT_MS)
        )
        self.shard_pids: list[int] = list(ready["table_shards"])  # type: ignore[call-overload]
        self.wait_on(first)

    def publish(self, incremental: bool = False) -> str:
        pred = self.trainer.predict(self.probe)
        m = self.trainer.publish(self.root, incremental=incremental)
        self.expected[m.version] = pred
        return m.version

    def binary(self, srv: Server | None = None) -> tuple[int, dict[str, str], bytes]:
        ids = self.probe.numpy().view(np.uint64)
        return (srv or self.server).request(
            "POST", PATH, codec.encode_arrays([ids]), {"Content-Type": codec.BINARY}
        )

    def info(self) -> dict[str, object]:
        return dict(json.loads(self.server.request("GET", "/v1/models/ctr")[2]))

    def wait_on(self, version: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, headers, _ = self.binary()
            if status == 200 and headers["x-coadapt-version"] == version:
                seen = {self.binary()[1].get("x-coadapt-version") for _ in range(4)}
                if seen == {version}:  # both workers (connections spread over them)
                    return
            time.sleep(0.05)
        raise AssertionError(f"the server did not reach version {version}")


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ctx]:
    work = tmp_path_factory.mktemp("tshards")
    specs = [TableSpec("ctr", 4, "rowwise_adagrad", {"lr": 0.1})]
    with running_servers(specs, 2, work / "ps") as procs:
        c = Ctx(work / "ctr", [p.address for p in procs])
        try:
            yield c
        finally:
            stop_server(c.server.proc)
            c.trainer.store.close()  # type: ignore[union-attr]


def test_sharded_server_scores_exactly_like_the_unsharded_one(ctx: Ctx) -> None:
    status, headers, body = ctx.binary()
    assert status == 200, body
    version = headers["x-coadapt-version"]
    sharded = codec.decode_arrays(body)[0]
    assert np.array_equal(sharded, ctx.expected[version])
    plain, _ = _start(ctx.root, "--workers", "1")
    try:
        status, headers, body = ctx.binary(plain)
        assert status == 200 and headers["x-coadapt-version"] == version
        assert np.array_equal(codec.decode_arrays(body)[0], sharded)
    finally:
        stop_server(plain.proc)
    # each process holds only its export shard's rows; together, all of them
    sparse = ctx.info()["sparse"]
    assert isinstance(sparse, dict)
    shards = sparse["table_shards"]
    assert [s["export_shards"] for s in shards] == [[0], [1]]
    assert [s["pid"] for s in shards] == ctx.shard_pids
    total = sparse["rows"]["ctr"]
    assert total == sum(s["rows"]["ctr"] for s in shards)
    assert all(0 < s["rows"]["ctr"] < total for s in shards)


def test_versions_switch_under_load_with_no_lost_or_mixed_answer(ctx: Ctx) -> None:
    stop = threading.Event()
    answers: list[tuple[int, str, np.ndarray | bytes]] = []
    lock = threading.Lock()

    def client() -> None:
        while not stop.is_set():
            status, headers, body = ctx.binary()
            got: np.ndarray | bytes = codec.decode_arrays(body)[0] if status == 200 else body
            with lock:
                answers.append((status, headers.get("x-coadapt-version", ""), got))

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for incremental in (True, True, False, True):
            time.sleep(0.3)
            ctx.trainer.train(2, high=600)  # new IDs too: rows are added, not only changed
            ctx.wait_on(ctx.publish(incremental=incremental))
        time.sleep(0.3)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    bad = [a for a in answers if a[0] != 200]
    assert not bad, bad[:3]
    assert len({v for _, v, _ in answers}) >= 4  # the load spanned the switches
    for _, v, scores in answers:  # every answer exactly one version's, never a mix
        assert np.array_equal(scores, ctx.expected[v]), v
    info = ctx.info()
    assert info["version"] == max(ctx.expected)
    assert all(len(s["held"]) <= 2 for s in info["sparse"]["table_shards"])  # type: ignore[index]


def test_a_killed_shard_gives_a_clear_503_and_is_restarted(ctx: Ctx) -> None:
    live = max(ctx.expected)
    victim = ctx.shard_pids[1]
    os.kill(victim, signal.SIGKILL)
    status, _, body = ctx.binary()  # the restart takes seconds (imports, loading): 503 now
    assert status == 503, body
    assert "table shard 1" in json.loads(body)["error"]
    deadline = time.monotonic() + 90
    status = 0
    while time.monotonic() < deadline and status != 200:
        status, headers, body = ctx.binary()
        assert status in (200, 503), body
        time.sleep(0.1)
    assert status == 200 and headers["x-coadapt-version"] == live
    assert np.array_equal(codec.decode_arrays(body)[0], ctx.expected[live])
    pids = [s["pid"] for s in ctx.info()["sparse"]["table_shards"]]  # type: ignore[index]
    assert pids[0] == ctx.shard_pids[0] and pids[1] != victim
    ctx.shard_pids = pids
    for _ in range(2):  # the reconnected workers' pins let both shards move on, delta by delta
        ctx.trainer.train(1)
        ctx.wait_on(ctx.publish(incremental=True))


def _thread_states(pid: int) -> dict[int, str | None]:
    """The state letter of each thread of ``pid`` (empty when it does not exist)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return {}
    return {tid: proc_state(tid) for tid in tids}


def test_a_stopped_shard_fails_the_batch_at_the_deadline_not_never(ctx: Ctx) -> None:
    before = ctx.info().get("sparse")
    pid = ctx.shard_pids[0]
    # the PID must still be shard 0's: a shard restarted unseen would leave a PID that another
    # process may take (pid_max is 32768 on many hosts, and every thread spends one)
    shown = [s["pid"] for s in before["table_shards"]]  # type: ignore[index]
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert shown[0] == pid and b"_table_shard" in cmdline, (pid, shown, cmdline)
    assert cmdline[cmdline.index(b"--index") + 1] == b"0", cmdline
    os.kill(pid, signal.SIGSTOP)  # alive but silent: the slow-shard case
    try:
        # A group stop reaches each thread when it next leaves the kernel: wait until every
        # thread of the shard is stopped, so the request cannot race the signal.
        threads = _thread_states(pid)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and set(threads.values()) - {"T", "t"}:
            time.sleep(0.01)
            threads = _thread_states(pid)
        assert threads and not set(threads.values()) - {"T", "t"}, f"not stopped: {threads}"
        state = proc_state(pid)  # T: stopped
        status, headers, body = ctx.binary()
    finally:
        os.kill(pid, signal.SIGCONT)
    if status != 503:
        # Seen twice in full parallel runs (never alone or under load): a 200 in ~2 ms. Say
        # everything (pytest shortens an assertion's message): whether the answer was the
        # right one, the stopped process's state, and the shards before and after.
        version = headers.get("x-coadapt-version", "")
        right = (
            status == 200
            and version in ctx.expected
            and np.array_equal(codec.decode_arrays(body)[0], ctx.expected[version])
        )
        print(f"status {status} version {version} right answer {right}; pid {pid} was in "
              f"state {state!r}; shards before {before}; after {ctx.info().get('sparse')}; "
              f"headers {headers}")  # fmt: skip
    assert status == 503, body[:200]
    assert f"did not answer within {TIMEOUT_MS} ms" in json.loads(body)["error"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and ctx.binary()[0] != 200:
        time.sleep(0.05)
    status, headers, body = ctx.binary()
    assert status == 200
    assert np.array_equal(codec.decode_arrays(body)[0], ctx.expected[headers["x-coadapt-version"]])


def test_a_corrupt_delta_is_refused_by_a_shard_and_the_live_version_keeps_serving(
    ctx: Ctx,
) -> None:
    live = max(ctx.expected)
    set_live(ctx.root, live)  # pin: the shards must not see the delta before it is damaged
    ctx.trainer.train(1)
    bad = ctx.publish(incremental=True)
    m = json.loads((ctx.root / bad / "manifest.json").read_text())
    shard = ctx.root / bad / m["sparse"]["shards"][1]["file"]
    raw = bytearray(shard.read_bytes())
    raw[-20] ^= 0x01
    shard.write_bytes(bytes(raw))
    set_live(ctx.root, bad)
    deadline = time.monotonic() + 30
    refused: dict[str, str] = {}
    while time.monotonic() < deadline and bad not in refused:
        refused = dict(ctx.info()["refused"])  # type: ignore[call-overload]
        time.sleep(0.05)
    assert "sha256" in refused[bad]
    for _ in range(4):  # the workers answer on the live version, exactly
        status, headers, body = ctx.binary()
        assert status == 200 and headers["x-coadapt-version"] == live
        assert np.array_equal(codec.decode_arrays(body)[0], ctx.expected[live])
    del ctx.expected[bad]
    (ctx.root / "LIVE").unlink()  # a new full version goes live past the refused delta
    ctx.trainer.train(1)
    ctx.wait_on(ctx.publish())


def test_a_worker_never_loads_a_sharded_models_tables_itself(
    ctx: Ctx, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``remote_target()`` says no when it cannot read the live manifest (an EMFILE, say): the
    ordinary path must then neither load the whole table into the worker nor refuse the
    version; the next poll takes it from the shards."""
    config = ServeConfig(
        models={"ctr": str(ctx.root)}, table_shards=2, shard_socket_dir=str(tmp_path)
    )
    worker = Worker(config)
    slot = worker.slots["ctr"]
    monkeypatch.setattr(ModelSlot, "remote_target", lambda self: False)
    asyncio.run(worker.refresh())
    assert slot.live is None and slot.refused == {}
    with pytest.raises(ShardUnavailableError, match="served from the table shards"):
        slot.load(max(ctx.expected))


def test_versions_each_shard_holds_and_the_partition() -> None:
    assert common_version([["00000002", "00000003"], ["00000002", "00000003"]]) == "00000003"
    assert common_version([["00000002", "00000003"], ["00000002"]]) == "00000002"
    assert common_version([["00000002"], ["00000004"]]) is None
    assert common_version([["00000005", "00000003"], ["00000005", "00000003"]]) == "00000003"
    assert common_version([]) is None
    assert [export_shards_of(p, 2, 4) for p in (0, 1)] == [[0, 2], [1, 3]]
    assert export_shards_of(2, 3, 2) == []  # more processes than files: one idles
    with pytest.raises(ValueError, match="table_shards must be"):
        ServeConfig(models={"m": "d"}, table_shards=-1)
    with pytest.raises(ValueError, match="shard_timeout_ms must be positive"):
        ServeConfig(models={"m": "d"}, shard_timeout_ms=0)


def test_a_shard_process_reads_only_its_files_and_they_hold_every_row(
    ctx: Ctx, tmp_path: Path
) -> None:
    root = tmp_path / "m"
    shutil.copytree(ctx.root, root)  # the server's versions: two export shards each
    ms = [read_manifest(root, v) for v in list_versions(root)]
    v1 = next(m for m in ms if m.kind == "full")
    v2 = next(m for m in ms if m.kind == "delta" and m.parent == v1.version)
    whole = load_tables(root, v1.version)
    parts = [load_tables(root, v1.version, [s]) for s in (0, 1)]
    assert [p.num_shards for p in parts] == [2, 2]
    assert [len(p.shards["ctr"][0]) for p in parts] == [len(t) for t in whole.shards["ctr"]]
    (shard_file,) = (e for e in v2.files if e.path.startswith("shard-001"))
    (root / v2.version / shard_file.path).write_bytes(b"damaged")  # shard 0 never reads it
    assert read_delta(root, v2.version, [0]).parts["ctr"][0].keys.size > 0
    with pytest.raises(IntegrityError, match="shard-001"):
        read_delta(root, v2.version, [1])
    with pytest.raises(ArtifactError, match="no shard 2"):
        load_tables(root, v1.version, [2])


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--model", "m=/tmp", "--table-shards", "256"], "table_shards must be 0"),
        (["--model", "m=/tmp", "--table-shards", "2", "--shard-timeout-ms", "0"],
         "shard_timeout_ms must be positive"),
    ],
)  # fmt: skip
def test_bad_table_shard_options_exit_2_naming_the_option(
    argv: list[str], match: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert serve_main(argv) == 2
    assert match in capsys.readouterr().err

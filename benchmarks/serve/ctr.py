"""CTR ranking on a sparse model: latency, version publish/gate/load, live deltas, freshness.

What it does (every process bound to 127.0.0.1, every load bounded in count and time, every
process stopped by PID):

1. Starts ``--ctr-shards`` parameter-server shard processes holding one ``--ctr-dim`` table
   (SGD rows, random init) and fills it with ``--ctr-rows`` rows through the ordinary pull path.
2. **Full version**: publishes :class:`coadapt.serve.models.CtrRanker` (500 feature IDs per
   item, sum-pooled in 10 groups, MLP 80-64-1) from those shards (one file each, written in
   parallel), runs the integrity gate (:func:`verify_version`: sizes, sha256, dense part), then
   points ``LIVE`` at it and times until every worker of a running ``coadapt serve`` serves it.
3. **Latency**: open-loop load of 200 items x 500 features (binary body, ~800 KB; 10 % of IDs
   unknown) at each rate of ``--ctr-rates``; server-side times come from each answer's
   ``X-Coadapt-Server-Ms`` (body parsed to answer ready, queueing included), client-side from
   the scheduled send time (no coordinated omission).
4. **Incremental version**: changes 1 % of the rows on the shards (half updated by a push,
   half new), publishes a delta, gates it and times until it is live; then the same again
   under a steady load, comparing server-side p99 during the apply with the steady p99.
5. **Table shards** (``--ctr-table-shards N``, default 2; 0 skips): the same root served by a
   server whose tables live on N table-shard processes (:mod:`coadapt.serve.table_shards`):
   time until served from the files, RSS of every worker and shard process vs the unsharded
   worker's, latency at each rate, p99 while a delta goes live (rows ``ctr-sharded<N>-...``).
6. **Freshness**: an online-training job (``coadapt.sparse.online``: FM, dim 8, two shard
   servers) tails a growing Criteo file and publishes an incremental version every
   ``--fresh-publish-s``; a server serves them. A feature value never seen before is planted
   (lines appended at T0); a probe request carries it in one item and an unseen control value
   in another, identical otherwise; the delay is the first time the two scores differ, minus T0.

Rows (``name`` starts with ``ctr``): ``rps``, ``p50_ms``, ``p99_ms`` (server side), ``errors``,
``peer`` (null), plus per-row details. Memory: ``ctr-memory`` has bytes held by the served
tables per raw byte (8-byte key + 4 x dim) and each worker's RSS.

7. **Profile** (``_profile``, in process, no server): one request through a worker's predict
   path stage by stage, and an interleaved A/B/C/D of the look-up paths (:func:`profile_main`).
   ``_probe``: ns per key of one table's probe, numpy path vs compiled (:func:`probe_main`).
   ``_stages``: the request's stages before and after ``ShardedTable.pool_sum`` and an
   interleaved old/new A/B of the whole request (:func:`stages_main`).
   ``_overlay``: the forward while a delta is merged, compiled look-up vs ``take``'s path
   (:func:`overlay_main`).
   Both take ``--huge-pages off,inside,...`` (``_profile`` also ``packed``): a twin table per
   further mode, read by its own interleaved arm (the huge-page A/B of ``docs/serve.md``).

    python benchmarks/serve/ctr.py --ctr-rows 2000000 --json out/ctr.json
    python benchmarks/serve/ctr.py _profile --rows 5000000 --iters 150 [--shared 0.3]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.client
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
PATH = "/v1/models/ctr:predict"
FEATURES, GROUPS, HIDDEN = 500, 10, 64
ITEMS = 200
GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # odd: i -> (i + 1) * GOLDEN is a bijection on uint64
FM_INPUTS = [("dense", "float32", (13,)), ("cats", "uint64", (26,))]


def key_of(i: np.ndarray) -> np.ndarray:
    """The feature ID of row ``i`` (distinct for distinct i)."""
    with np.errstate(over="ignore"):
        return (i.astype(np.uint64) + np.uint64(1)) * GOLDEN


# ----------------------------------------------------------------------------- server


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    port: int
    workers: list[int]
    shards: list[int]  # table-shard processes (--table-shards), else empty

    def get(self, path: str) -> tuple[int, bytes]:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def versions(self) -> list[int]:
        _, body = self.get("/metrics")
        found = re.findall(rb'coadapt_serve_model_version\{model="ctr",pid="\d+"\} (\S+)', body)
        return [int(float(v)) for v in found]

    def wait_version(self, version: str, timeout: float = 600.0) -> float:
        """Seconds until every worker serves ``version``."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            vs = self.versions()
            if len(vs) == len(self.workers) and all(v == int(version) for v in vs):
                return time.perf_counter() - t0
            if self.proc.poll() is not None:
                raise RuntimeError("the server exited")
            time.sleep(0.02)
        raise TimeoutError(f"workers did not reach version {version}: {self.versions()}")

    def rss(self, pids: list[int] | None = None) -> list[int]:
        out = []
        for pid in self.workers if pids is None else pids:
            try:
                text = Path(f"/proc/{pid}/status").read_text()
                out.append(int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) * 1024)  # type: ignore[union-attr]
            except (OSError, AttributeError):
                out.append(0)
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def start_server(
    root: Path,
    workers: int,
    log: Path,
    poll_s: float = 0.05,
    table_shards: int = 0,
    threads: int = 1,
) -> Served:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "coadapt.serve",
        "--model",
        f"ctr={root}",
        "--port",
        "0",
        "--workers",
        str(workers),
        "--threads",
        str(threads),
        "--poll-s",
        str(poll_s),
        "--max-body",
        str(8 << 20),
        "--slo-ms",
        "20",
        "--table-shards",
        str(table_shards),
    ]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=open(log, "ab"))  # noqa: SIM115
    assert proc.stdout is not None
    r, _, _ = select.select([proc.stdout], [], [], 600)
    line = proc.stdout.readline() if r else b""
    if not line:
        os.kill(proc.pid, signal.SIGTERM)
        raise RuntimeError(f"coadapt serve did not start; see {log}")
    doc = json.loads(line)
    return Served(proc, int(doc["port"]), list(doc["workers"]), list(doc.get("table_shards", [])))


# ----------------------------------------------------------------------------- load


def open_loop(
    port: int,
    bodies: Sequence[bytes],
    ctype: str,
    rate: float,
    duration: float,
    conns: int = 8,
) -> list[tuple[float, float, float, int, str]]:
    """Send ``rate`` requests/s for ``duration`` s on ``conns`` keep-alive connections,
    request ``i`` carrying ``bodies[i % len(bodies)]``; per request (scheduled time, client
    latency s, server ms, status, version).

    Why several bodies: one body sent over and over keeps its 100k IDs' hash slots and rows in
    the CPU caches, so the server would answer from cache what a real stream of users makes it
    fetch from DRAM (``--ctr-bodies``)."""
    if not bodies:
        raise ValueError("open_loop needs at least one request body")
    n = max(1, int(rate * duration))
    start = time.perf_counter() + 0.05
    sched = [start + i / rate for i in range(n)]
    lock = threading.Lock()
    nxt = [0]
    out: list[tuple[float, float, float, int, str]] = []

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while True:
            with lock:
                if nxt[0] >= n:
                    break
                i = nxt[0]
                t = sched[i]
                nxt[0] += 1
            body = bodies[i % len(bodies)]
            wait = t - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            try:
                conn.request("POST", PATH, body, {"Content-Type": ctype})
                r = conn.getresponse()
                r.read()
                took = float(r.getheader("X-Coadapt-Server-Ms") or "nan")
                rec = (
                    t,
                    time.perf_counter() - t,
                    took,
                    r.status,
                    r.getheader("X-Coadapt-Version") or "",
                )
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                rec = (t, time.perf_counter() - t, float("nan"), 0, "")
            with lock:
                out.append(rec)
        conn.close()

    threads = [threading.Thread(target=worker) for _ in range(conns)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return sorted(out)


def summarize(recs: list[tuple[float, float, float, int, str]], name: str) -> dict[str, Any]:
    ok = [r for r in recs if r[3] == 200]
    srv = np.array([r[2] for r in ok]) if ok else np.array([np.nan])
    cli = np.array([r[1] * 1e3 for r in ok]) if ok else np.array([np.nan])
    span = (max(r[0] + r[1] for r in recs) - recs[0][0]) if recs else 1.0
    return {
        "name": name,
        "peer": None,
        "rps": round(len(ok) / max(span, 1e-9), 1),
        "p50_ms": round(float(np.percentile(srv, 50)), 3),
        "p99_ms": round(float(np.percentile(srv, 99)), 3),
        "client_p50_ms": round(float(np.percentile(cli, 50)), 3),
        "client_p99_ms": round(float(np.percentile(cli, 99)), 3),
        "errors": len(recs) - len(ok),
        "requests": len(recs),
    }


def ctr_body(
    rows: int, rng: np.random.Generator, unknown: float = 0.1, shared: float = 0.0
) -> bytes:
    """200 x 500 IDs drawn uniformly from the table's rows, ``unknown`` of them without a row;
    the first ``shared`` of each item's features are the same IDs in every item (the user's and
    the context's features of a real ranking request; 0: every ID drawn independently)."""
    from coadapt.serve import codec

    idx = rng.integers(0, rows, (ITEMS, FEATURES))
    ids = key_of(idx)
    miss = rng.random((ITEMS, FEATURES)) < unknown
    ids[miss] = key_of(idx[miss] + rows + 10**9)  # never rows
    k = round(shared * FEATURES)
    ids[:, :k] = ids[0, :k]
    return codec.encode_arrays([ids])


# ----------------------------------------------------------------------------- the big model


def fill(client: Any, rows: int, log: Callable[[str], None]) -> float:
    """Create ``rows`` rows on the shards through pulls (rows are created and initialised by the
    shards' optimizer, as in training); the rate in rows/s."""
    t0 = time.perf_counter()
    step = 1 << 20
    for i in range(0, rows, step):
        client.pull({"ctr": key_of(np.arange(i, min(rows, i + step)))})
        if (i // step) % 8 == 0:
            log(f"fill {i + step}/{rows} rows, {(i + step) / (time.perf_counter() - t0):.0f}/s")
    return rows / (time.perf_counter() - t0)


def mutate(client: Any, rows: int, frac: float, rng: np.random.Generator, new_from: int) -> int:
    """Change ``frac`` of the rows: half updated by a push, half created; the next new index."""
    n = int(rows * frac)
    upd = np.unique(key_of(rng.integers(0, rows, n // 2)))
    dim = client.dim("ctr")
    for i in range(0, upd.size, 1 << 18):
        k = upd[i : i + (1 << 18)]
        client.push({"ctr": (k, rng.standard_normal((k.size, dim)).astype(np.float32) * 0.01)})
    client.pull({"ctr": key_of(np.arange(new_from, new_from + n - n // 2))})
    client.wait()
    return new_from + n - n // 2


def run_big(
    args: argparse.Namespace, work: Path, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    import torch

    from coadapt.serve.artifacts import Lineage, set_live
    from coadapt.serve.models import CtrRanker
    from coadapt.serve.sparse_artifacts import publish_sparse, verify_version
    from coadapt.sparse.client import PSClient
    from coadapt.sparse.server import TableSpec, running_servers
    from coadapt.sparse.table import huge_page_bytes

    rows_total, dim = args.ctr_rows, args.ctr_dim
    spec = TableSpec(
        "ctr",
        dim,
        "sgd",
        {"lr": 0.05, "init_scale": 0.05},
        max_rows=int(rows_total / args.ctr_shards * 1.1) + (1 << 16),
    )
    root = work / "ctr-model"
    root.mkdir()
    (root / "LIVE").write_text("\n")  # nothing live until the gate passed
    kw = {"features": FEATURES, "groups": GROUPS, "dim": dim, "hidden": HIDDEN}
    ins = [("ids", "uint64", (FEATURES,))]
    out: list[dict[str, Any]] = []
    rng = np.random.default_rng(0)
    with running_servers([spec], args.ctr_shards, work / "ps") as procs:
        client = PSClient([p.address for p in procs], timeout=600)
        try:
            rate = fill(client, rows_total, log)
            log(f"filled {rows_total} rows at {rate:.0f} rows/s")
            torch.manual_seed(0)
            model = CtrRanker(**kw, store=client)

            def publish(incremental: bool, step: int) -> tuple[Any, float, float]:
                t0 = time.perf_counter()
                m = publish_sparse(
                    model,
                    client,
                    root,
                    factory="coadapt.serve.models:CtrRanker",
                    factory_kwargs=kw,
                    inputs=ins,
                    incremental=incremental,
                    lineage=Lineage("ctr-bench", step, step),
                )
                t1 = time.perf_counter()
                verify_version(root, m.version)
                return m, t1 - t0, time.perf_counter() - t1

            srv = start_server(root, args.ctr_workers, work / "serve.log", threads=args.ctr_threads)
            try:
                m, pub_s, gate_s = publish(False, 0)
                t0 = time.perf_counter()
                set_live(root, m.version)
                load_s = srv.wait_version(m.version)
                size = sum(f.size for f in m.files)
                out.append(
                    {
                        "name": "ctr-version-full",
                        "peer": None,
                        "rps": None,
                        "p50_ms": None,
                        "p99_ms": None,
                        "errors": 0,
                        "rows": rows_total,
                        "dim": dim,
                        "shards": args.ctr_shards,
                        "bytes": size,
                        "publish_s": round(pub_s, 2),
                        "gate_s": round(gate_s, 2),
                        "load_s": round(load_s, 2),
                        "total_s": round(pub_s + gate_s + load_s, 2),
                        "workers": args.ctr_workers,
                    }
                )
                log(json.dumps(out[-1]))
                info = json.loads(srv.get("/v1/models/ctr")[1])["sparse"]
                rss = srv.rss()
                out.append(
                    {
                        "name": "ctr-memory",
                        "peer": None,
                        "rps": None,
                        "p50_ms": None,
                        "p99_ms": None,
                        "errors": 0,
                        "rows": rows_total,
                        "dim": dim,
                        "table_bytes": info["nbytes"],
                        "raw_bytes": info["raw_bytes"],
                        "table_ratio": round(info["ratio"], 4),
                        "worker_rss": rss,
                        "rss_ratio": round(max(rss) / info["raw_bytes"], 4),
                        # AnonHugePages: the served tables' transparent huge pages in use
                        "worker_huge_page_bytes": [huge_page_bytes(p) for p in srv.workers],
                    }
                )
                log(json.dumps(out[-1]))

                body = [
                    ctr_body(rows_total, rng, shared=args.ctr_shared)
                    for _ in range(args.ctr_bodies)
                ]
                rate_rows, best = sweep(srv, body, args, "ctr-200x500", log)
                out += rate_rows
                # an incremental version: 1 % of the rows, then live
                nxt = rows_total + 1
                t0 = time.perf_counter()
                nxt = mutate(client, rows_total, args.ctr_delta_frac, rng, nxt)
                change_s = time.perf_counter() - t0
                md, pub_s, gate_s = publish(True, 1)
                assert md.kind == "delta", md.kind
                set_live(root, md.version)
                live_s = srv.wait_version(md.version)
                out.append(
                    {
                        "name": "ctr-version-delta",
                        "peer": None,
                        "rps": None,
                        "p50_ms": None,
                        "p99_ms": None,
                        "errors": 0,
                        "changed_rows": int(rows_total * args.ctr_delta_frac),
                        "bytes": sum(f.size for f in md.files),
                        "train_change_s": round(change_s, 2),
                        "publish_s": round(pub_s, 2),
                        "gate_s": round(gate_s, 2),
                        "load_s": round(live_s, 2),
                        "total_s": round(pub_s + gate_s + live_s, 2),
                        "change_log_bytes": md.sparse["change_log_bytes"],
                    }
                )
                log(json.dumps(out[-1]))
                # p99 during an incremental apply vs steady, same rate, one run
                # half the highest rate that held the SLO, else half the throughput reached
                served = max(
                    float(r["rps"]) for r in out if str(r["name"]).startswith("ctr-200x500-r")
                )
                swap_rate = args.ctr_swap_rate or max(2.0, (best["rate"] if best else served) / 2)
                swaps = []
                for step in range(2, 2 + args.ctr_swaps):
                    nxt = mutate(client, rows_total, args.ctr_delta_frac, rng, nxt)
                    swaps.append(str(publish(True, step)[0].version))
                out.append(
                    during_delta(srv, root, swaps, body, swap_rate, args,
                                 "ctr-200x500-during-delta", log)
                )  # fmt: skip
                unsharded_rss = srv.rss()
            finally:
                srv.stop()
            if args.ctr_table_shards:

                def next_delta(step: int) -> str:
                    nonlocal nxt
                    nxt = mutate(client, rows_total, args.ctr_delta_frac, rng, nxt)
                    return str(publish(True, step)[0].version)

                out += run_sharded(
                    args, work, root, body, rows_total, unsharded_rss, swap_rate, log, next_delta
                )
        finally:
            client.close()
    return out


def sweep(
    srv: Served,
    body: Sequence[bytes],
    args: argparse.Namespace,
    prefix: str,
    log: Callable[[str], None],
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Open-loop load at each of ``--ctr-rates``: a row per rate (``PREFIX-r<rate>``) and a
    summary row (``PREFIX``: the highest rate whose server-side p99 <= 10 ms)."""
    from coadapt.serve import codec

    open_loop(srv.port, body, codec.BINARY, 20, 2.0)  # warm up
    out: list[dict[str, Any]] = []
    best = None
    for r in args.ctr_rates:
        row = summarize(
            open_loop(srv.port, body, codec.BINARY, r, args.ctr_duration), f"{prefix}-r{r:g}"
        )
        row.update(
            rate=r,
            rows=args.ctr_rows,
            dim=args.ctr_dim,
            workers=args.ctr_workers,
            threads=args.ctr_threads,
            table_shards=len(srv.shards),
            load_avg=round(os.getloadavg()[0], 2),
        )
        row["slo_met"] = row["p99_ms"] <= 10.0 and row["errors"] == 0
        out.append(row)
        log(json.dumps(row))
        if row["slo_met"]:
            best = row
    out.append(
        {**(best or out[-1]), "name": prefix, "qps_at_p99_10ms": best["rate"] if best else None}
    )
    return out, best


def during_delta(
    srv: Served, root: Path, versions: Sequence[str], body: Sequence[bytes], rate: float,
    args: argparse.Namespace, name: str, log: Callable[[str], None],
) -> dict[str, Any]:  # fmt: skip
    """Server-side p99 while each of ``versions`` (deltas, in order) goes live vs the steady
    p99 before the first, in one open-loop run at ``rate``: a window per delta is LIVE moved
    until every worker serves it, plus 1 s of merging; the windows are pooled, 1 s apart.
    Why several: one window at 20-40 req/s holds 30-60 requests, so its p99 is its slowest
    request; three give the percentile some requests to stand on."""
    from coadapt.serve import codec
    from coadapt.serve.artifacts import set_live

    marks: list[tuple[float, float]] = []

    def swap() -> None:
        time.sleep(args.ctr_duration)
        for v in versions:
            t0 = time.perf_counter()
            set_live(root, v)
            srv.wait_version(v)
            marks.append((t0, time.perf_counter()))
            time.sleep(2.0)  # the window's 1 s of merging, then 1 s of quiet

    # Warm up first, as the rate rows do: the worker sat idle while the delta was trained and
    # published (seconds), so the window's first requests ran on cold caches, and with ~30
    # requests in the window the "steady" p99 was that cold request (19-37 ms at 50M rows
    # against 7-12 ms in the rate rows).
    open_loop(srv.port, body, codec.BINARY, rate, 2.0)
    th = threading.Thread(target=swap)
    th.start()
    recs = open_loop(
        srv.port, body, codec.BINARY, rate, 2 * args.ctr_duration + 4.0 * len(versions)
    )
    th.join()
    if len(marks) != len(versions):
        raise RuntimeError(f"{len(marks)} of {len(versions)} deltas went live during the load")
    windows = [(lo, hi + 1.0) for lo, hi in marks]
    during = [r for r in recs if any(lo <= r[0] + r[1] and r[0] <= hi for lo, hi in windows)]
    steady = [r for r in recs if r[0] + r[1] < windows[0][0]]
    d, s = summarize(during, name), summarize(steady, "steady")
    d.update(
        rate=rate,
        swaps=len(versions),
        steady_p99_ms=s["p99_ms"],
        steady_p50_ms=s["p50_ms"],
        steady_requests=len(steady),
        during_requests=len(during),
        p99_ratio=round(d["p99_ms"] / s["p99_ms"], 2) if s["p99_ms"] else None,
        errors_total=summarize(recs, "all")["errors"],
        apply_s=[round(hi - lo, 2) for lo, hi in marks],
        versions=sorted({r[4] for r in recs}),
        table_shards=len(srv.shards),
        load_avg=round(os.getloadavg()[0], 2),
    )
    log(json.dumps(d))
    return d


def run_sharded(
    args: argparse.Namespace, work: Path, root: Path, body: Sequence[bytes], rows_total: int,
    unsharded_rss: list[int], swap_rate: float, log: Callable[[str], None],
    next_delta: Callable[[int], str],
) -> list[dict[str, Any]]:  # fmt: skip
    """The same model served with ``--table-shards N`` (same run, after the unsharded rows):
    time until served (from files: the full version and every delta since), RSS per process
    vs the unsharded worker, latency per rate, p99 while a delta goes live."""
    n = args.ctr_table_shards
    t0 = time.perf_counter()
    srv = start_server(
        root, args.ctr_workers, work / "serve-sharded.log", table_shards=n, threads=args.ctr_threads
    )
    out: list[dict[str, Any]] = []
    try:
        live = (root / "LIVE").read_text().strip()
        srv.wait_version(live)
        start_s = time.perf_counter() - t0
        info = json.loads(srv.get("/v1/models/ctr")[1])["sparse"]
        worker_rss, shard_rss = srv.rss(), srv.rss(srv.shards)
        out.append(
            {
                "name": f"ctr-sharded{n}-memory",
                "peer": None,
                "rps": None,
                "p50_ms": None,
                "p99_ms": None,
                "errors": 0,
                "rows": rows_total,
                "table_shards": n,
                "start_until_served_s": round(start_s, 2),
                "shard_rows": [s["rows"].get("ctr") for s in info["table_shards"]],
                "shard_table_bytes": [s["nbytes"] for s in info["table_shards"]],
                "shard_rss": shard_rss,
                "worker_rss": worker_rss,
                "unsharded_worker_rss": unsharded_rss,
                "max_rss_vs_unsharded": round(
                    max(shard_rss + worker_rss) / max(max(unsharded_rss), 1), 3
                ),
                "load_avg": round(os.getloadavg()[0], 2),
            }
        )
        log(json.dumps(out[-1]))
        rate_rows, _ = sweep(srv, body, args, f"ctr-sharded{n}-200x500", log)
        out += rate_rows
        step = 2 + args.ctr_swaps
        versions = [next_delta(step + i) for i in range(args.ctr_swaps)]
        out.append(
            during_delta(srv, root, versions, body, swap_rate, args,
                         f"ctr-sharded{n}-200x500-during-delta", log)
        )  # fmt: skip
    finally:
        srv.stop()
    return out


# ----------------------------------------------------------------------------- freshness


def _criteo_line(label: int, c1: str, rest: list[str]) -> bytes:
    return ("\t".join([str(label), *[""] * 13, c1, *rest]) + "\n").encode()


def trainer_main(argv: list[str]) -> int:
    """The online-training job of the freshness test (its own process)."""
    p = argparse.ArgumentParser()
    p.add_argument("--stream", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--publish-every-s", type=float, default=2.0)
    p.add_argument("--log", required=True)
    a = p.parse_args(argv)
    from coadapt.serve.artifacts import Lineage
    from coadapt.serve.sparse_artifacts import publish_sparse
    from coadapt.sparse.jobs import model_tables
    from coadapt.sparse.online import ManagedServers, OnlineConfig, OnlineTrainer, source_factory

    cfg = OnlineConfig(
        ckpt_dir=a.ckpt,
        model="fm",
        dim=8,
        batch_size=256,
        checkpoint_every=10**9,
        checkpoint_every_s=10**6,
        read_timeout_s=0.05,
        progress_every_s=10**6,
    )
    servers = None
    if a.servers:
        specs, _ = model_tables("fm", 8)
        servers = ManagedServers(specs, a.servers, str(Path(a.ckpt) / "servers"), a.ckpt)
    last = [0.0]
    logf = open(a.log, "a")  # noqa: SIM115

    def on_batch(tr: Any) -> None:
        now = time.time()
        if now - last[0] < a.publish_every_s or tr.model is None:
            return
        last[0] = now
        t0 = time.perf_counter()
        m = publish_sparse(
            tr.model,
            tr.store,
            a.root,
            factory="coadapt.sparse.online:build_model",
            factory_kwargs={"model": "fm", "dim": 8},
            inputs=FM_INPUTS,
            incremental=True,
            lineage=Lineage("ctr-fresh", tr.batches, tr.samples),
        )
        logf.write(
            json.dumps(
                {
                    "version": m.version,
                    "kind": m.kind,
                    "at": time.time(),
                    "publish_s": time.perf_counter() - t0,
                    "offset": tr.offset,
                    "samples": tr.samples,
                }
            )
            + "\n"
        )
        logf.flush()

    trainer = OnlineTrainer(
        cfg, source_factory("file:" + a.stream), servers, on_batch=on_batch, stderr=logf
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: trainer.request_stop())
    try:
        trainer.run()
    finally:
        if servers is not None:
            servers.stop()
    return 0


def run_freshness(
    args: argparse.Namespace, work: Path, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    from coadapt.serve import codec
    from coadapt.sparse.datasets import PlantedConfig, format_criteo, iter_planted
    from coadapt.sparse.formats import parse_criteo

    fw = work / "fresh"
    fw.mkdir()
    stream, root = fw / "stream.tsv", fw / "model"
    pool = b"".join(
        format_criteo(c.labels, c.dense, c.cats, c.cat_missing)
        for c in iter_planted(PlantedConfig(rows=60_000, seed=1))
    )
    lines = pool.splitlines(keepends=True)
    stream.write_bytes(b"".join(lines[:5000]))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    trainer = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "_trainer",
            "--stream",
            str(stream),
            "--root",
            str(root),
            "--ckpt",
            str(fw / "ckpt"),
            "--servers",
            str(args.fresh_servers),
            "--publish-every-s",
            str(args.fresh_publish_s),
            "--log",
            str(fw / "trainer.log"),
        ],
        env=env,
        cwd=ROOT,
        stderr=open(fw / "trainer.err", "ab"),  # noqa: SIM115
    )
    stop = threading.Event()
    pos = [5000]

    def writer() -> None:  # the stream keeps flowing: args.fresh_rate lines/s
        with open(stream, "ab") as f:
            while not stop.wait(0.05):
                n = int(args.fresh_rate * 0.05)
                i = pos[0] % (len(lines) - n)
                f.write(b"".join(lines[i : i + n]))
                f.flush()
                pos[0] += n

    bg = threading.Thread(target=writer)
    bg.start()
    srv: Served | None = None
    out: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 300
        while not (root / "00000001" / "manifest.json").exists():
            if trainer.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the trainer published nothing; see {fw}/trainer.err")
            time.sleep(0.1)
        srv = start_server(root, 1, fw / "serve.log", poll_s=0.05)
        rng = np.random.default_rng(7)
        delays = []
        for k in range(args.fresh_plants):
            planted = f"{0xF0000000 + 1000 * k + int(rng.integers(0, 999)):08x}"
            control = f"{0xE0000000 + 1000 * k:08x}"
            rest = [f"{0xD0000000 + j:08x}" for j in range(25)]  # never in the stream either
            probe = parse_criteo(_criteo_line(0, planted, rest) + _criteo_line(0, control, rest))
            body = codec.encode_arrays([probe.dense, probe.cats])

            def scores(body: bytes = body, port: int = srv.port) -> tuple[np.ndarray, str]:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                c.request("POST", PATH, body, {"Content-Type": codec.BINARY})
                r = c.getresponse()
                data = r.read()
                c.close()
                if r.status != 200:
                    raise RuntimeError(f"probe got {r.status}: {data[:200]!r}")
                return codec.decode_arrays(data)[0], r.getheader("X-Coadapt-Version") or ""

            s, v0 = scores()
            if s[0] != s[1]:
                raise RuntimeError("planted and control items differ before the plant")
            plant = b"".join(
                _criteo_line(1, planted, [f"{int(x):08x}" for x in rng.integers(0, 2**32, 25)])
                for _ in range(64)
            )
            t0 = time.time()
            with open(stream, "ab") as f:
                f.write(plant)
                f.flush()
            while time.time() - t0 < 60:
                s, v = scores()
                if s[0] != s[1]:
                    delays.append(time.time() - t0)
                    log(f"plant {k}: seen after {delays[-1]:.2f} s (version {v}, was {v0})")
                    break
                time.sleep(0.02)
            else:
                log(f"plant {k}: not reflected within 60 s")
                delays.append(float("nan"))
            time.sleep(0.5)
        pubs = [
            json.loads(x)
            for x in (fw / "trainer.log").read_text().splitlines()
            if x.startswith("{")
        ]
        gaps = np.diff([p["at"] for p in pubs]) if len(pubs) > 1 else np.array([np.nan])
        d = np.array(delays)
        seen = d[~np.isnan(d)]
        pub_s = [p["publish_s"] for p in pubs]
        out.append(
            {
                "name": "ctr-freshness",
                "peer": None,
                "rps": None,
                "p50_ms": None,
                "p99_ms": None,
                "errors": int(np.isnan(d).sum()),
                "delay_s": [round(float(x), 2) for x in d],
                "delay_median_s": round(float(np.median(seen)), 2) if seen.size else None,
                "delay_max_s": round(float(seen.max()), 2) if seen.size else None,
                "publish_every_s": args.fresh_publish_s,
                "versions": len(pubs),
                "publish_gap_s_median": round(float(np.nanmedian(gaps)), 2),
                "publish_s_median": round(float(np.median(pub_s)), 3) if pub_s else None,
                "stream_lines_per_s": args.fresh_rate,
                "model": "fm dim 8",
                "servers": args.fresh_servers,
            }
        )
        log(json.dumps(out[-1]))
    finally:
        stop.set()
        bg.join()
        if srv is not None:
            srv.stop()
        if trainer.poll() is None:
            os.kill(trainer.pid, signal.SIGTERM)
            try:
                trainer.wait(60)
            except subprocess.TimeoutExpired:
                os.kill(trainer.pid, signal.SIGKILL)
                trainer.wait()
    return out


# ----------------------------------------------------------------------------- entry points


# ----------------------------------------------------------------------------- profile


def _served_tables(
    rows: int, dim: int, shards: int, log: Callable[[str], None], huge_pages: str = "inside"
) -> Any:
    """A :class:`ShardedTable` of ``rows`` rows split as the trainer splits them (``shard_of``),
    built in this process: what a worker holds once a full version is loaded."""
    from coadapt.serve.sparse_model import ShardedTable
    from coadapt.sparse.server import shard_of
    from coadapt.sparse.table import EmbeddingTable, huge_page_bytes

    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    keys = key_of(np.arange(rows))
    sh = shard_of(keys, shards)
    bases = []
    packed = huge_pages == "packed"  # as a server loads a version (load_tables(packed=True))
    for s in range(shards):
        k = keys[sh == s]
        t = EmbeddingTable(
            dim, dim, max_rows=int(k.size * 1.1) + (1 << 16), initial_rows=k.size,
            huge_pages="off" if packed else huge_pages,
        )  # fmt: skip
        for a in range(0, k.size, 1 << 20):
            kk = k[a : a + (1 << 20)]
            t.assign(kk, (rng.standard_normal((kk.size, dim)) * 0.05).astype(np.float32))
        bases.append(t.packed() if packed else t)
        del t
    log(
        f"built {rows} rows in {shards} shard tables (huge pages {huge_pages}) in "
        f"{time.perf_counter() - t0:.1f} s; {huge_page_bytes() / 2**20:.0f} MiB of the process "
        "in huge pages"
    )
    return ShardedTable("ctr", dim, bases)


def _gather_in_order(table: Any, keys: np.ndarray) -> np.ndarray:
    """The served look-up before ``ShardedTable.take`` (the A/B's baseline, kept here only):
    rows zero-filled in request order, found rows written through a mask, each shard's block
    scattered back to its keys' positions."""
    from coadapt.sparse.server import shard_of

    out = np.empty((keys.size, table.dim), np.float32)
    row = np.dtype((np.void, 4 * table.dim))
    flat = out.view(row).reshape(-1)
    sh = shard_of(keys, len(table.bases))
    for s, base in enumerate(table.bases):
        sel = np.flatnonzero(sh == s)
        k = keys[sel]
        part = np.zeros((k.size, table.dim), np.float32)
        idx = base.lookup(k)
        ok = idx >= 0
        part[ok] = base.weights(idx[ok])
        flat[sel] = part.view(row).reshape(-1)
    return out


def emit_rows(rows: list[dict[str, Any]], path: Path | None) -> None:
    """Each row as a JSON line on stdout, and all of them to ``path`` (``{"rows": [...]}``)."""
    for r in rows:
        print(json.dumps(r))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"rows": rows}, indent=1))


def in_process_parser(prog: str, iters_help: str) -> argparse.ArgumentParser:
    """The arguments every in-process mode shares: the table and the requests."""
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--rows", type=int, default=5_000_000)
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--iters", type=int, default=200, help=iters_help)
    p.add_argument("--bodies", type=int, default=20, help="distinct requests cycled through")
    p.add_argument("--shared", type=float, default=0.0, help="as --ctr-shared")
    return p


def profile_main(argv: list[str]) -> int:
    """One 200 x 500 request through a worker's predict path, in process, stage by stage
    (decode, shard split, look-up, row copy, pooling, MLP, encode), and an interleaved A/B/C/D
    of the whole forward: the previous look-up (rows zero-filled, masked and scattered back in
    request order, then ``embedding_bag`` over ``arange``), ``ShardedTable.take`` (rows
    addressed by position), the served module (``take`` after looking the IDs every item
    repeats up once: ``--shared``) and ``take`` with the compiled probe kernels switched off
    (``numpy``: the same run's numpy path); all must score bit for bit alike.

        python benchmarks/serve/ctr.py _profile --rows 5000000 --iters 200
    """
    import torch
    import torch.nn.functional as F

    from coadapt._jit import jit_available
    from coadapt.serve import codec
    from coadapt.serve.models import CtrRanker
    from coadapt.serve.sparse_model import (
        ShardedTable,
        SparseView,
        TableStore,
        _by_shard,
        _swap_embeddings,
    )
    from coadapt.sparse.embedding import ids_to_numpy
    from coadapt.sparse.table import HUGE_PAGE_MODES

    p = in_process_parser("ctr.py _profile", "requests per arm")
    p.add_argument(
        "--huge-pages", default="inside",
        help="comma-separated EmbeddingTable huge_pages modes, or 'packed' (segments end to end "
        "in huge pages, as a server loads a version): the first builds the table every arm "
        "reads; each further one a twin table, read by a 'positions-huge-MODE' arm",
    )  # fmt: skip
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    modes = [m for m in a.huge_pages.split(",") if m]
    for m in modes:
        if m not in (*HUGE_PAGE_MODES, "packed"):
            p.error(f"--huge-pages: {m!r} is not one of {', '.join(HUGE_PAGE_MODES)}, packed")

    def log(msg: str) -> None:
        print(f"[ctr-profile {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    torch.set_num_threads(1)  # as a worker runs (--threads 1)
    table = _served_tables(a.rows, a.dim, a.shards, log, modes[0])
    twins = {
        m: (
            ShardedTable("ctr", a.dim, [b.packed() for b in table.bases])  # same rows, a copy
            if m == "packed"
            else _served_tables(a.rows, a.dim, a.shards, log, m)
        )
        for m in modes[1:]
    }
    view = SparseView({"ctr": table})
    model = CtrRanker(FEATURES, GROUPS, a.dim, HIDDEN, store=TableStore(view))
    _swap_embeddings(model, view)
    model.eval()
    rng = np.random.default_rng(1)
    bodies = [ctr_body(a.rows, rng, shared=a.shared) for _ in range(a.bodies)]
    stages: dict[str, list[float]] = {}
    ab: dict[str, list[float]] = {"ordered": [], "positions": [], "served": []}

    def ordered(x: torch.Tensor) -> torch.Tensor:
        flat = ids_to_numpy(x).reshape(-1)
        rows = torch.from_numpy(_gather_in_order(table, flat))
        pos = torch.arange(flat.size).view(x.shape[0] * GROUPS, FEATURES // GROUPS)
        pooled = F.embedding_bag(pos, rows, mode="sum")
        return model.mlp(pooled.reshape(x.shape[0], GROUPS * a.dim)).squeeze(1)

    def positions(x: torch.Tensor, t: Any = table) -> torch.Tensor:  # take, no shared-ID dedup
        buf, pos = t.take(ids_to_numpy(x).reshape(-1))
        pooled = F.embedding_bag(
            torch.from_numpy(pos).view(-1, FEATURES // GROUPS), torch.from_numpy(buf), mode="sum"
        )
        return model.mlp(pooled.reshape(x.shape[0], GROUPS * a.dim)).squeeze(1)

    def numpy_path(x: torch.Tensor) -> torch.Tensor:  # positions, compiled kernels off
        with kernels_off():
            return positions(x)

    arms: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "ordered": ordered,
        "positions": positions,
        "served": model,
        "numpy": numpy_path,
    }
    ab["numpy"] = []
    for m, twin in twins.items():
        arms[f"positions-huge-{m}"] = functools.partial(positions, t=twin)
        ab[f"positions-huge-{m}"] = []

    load0 = os.getloadavg()[0]
    with torch.inference_mode():
        for it in range(a.iters + 5):
            body = bodies[it % len(bodies)]
            t = [time.perf_counter()]
            ids = codec.decode_arrays(body)[0].view(np.int64)
            x = torch.from_numpy(np.concatenate([ids]))  # the batcher's concatenation
            t.append(time.perf_counter())
            flat = ids_to_numpy(x).reshape(-1)
            sel = _by_shard(flat, a.shards)  # as ShardedTable.take splits (compiled or not)
            keys = [flat[s] for s in sel]
            t.append(time.perf_counter())
            idx = [table.bases[s].lookup(keys[s]) for s in range(a.shards)]
            t.append(time.perf_counter())
            buf, pos = table.take(flat)  # look-up again + row copy: the row copy is the rest
            t.append(time.perf_counter())
            bag = F.embedding_bag(
                torch.from_numpy(pos).view(-1, FEATURES // GROUPS),
                torch.from_numpy(buf),
                mode="sum",
            )
            t.append(time.perf_counter())
            out = model.mlp(bag.reshape(x.shape[0], GROUPS * a.dim)).squeeze(1)
            t.append(time.perf_counter())
            codec.encode_arrays([np.ascontiguousarray(out.numpy(), dtype=np.float32)])
            t.append(time.perf_counter())
            del idx
            d = np.diff(t) * 1e3
            if it >= 5:
                for name, v in zip(
                    ["decode", "shard split", "look-up", "look-up + row copy", "pooling", "mlp",
                     "encode"], d, strict=True,
                ):  # fmt: skip
                    stages.setdefault(name, []).append(float(v))
            names = list(arms)
            order = names[it % len(names) :] + names[: it % len(names)]
            got = {}
            for k in order:  # interleaved, rotating: every arm sees the same load
                t0 = time.perf_counter()
                got[k] = arms[k](x)
                if it >= 5:
                    ab[k].append((time.perf_counter() - t0) * 1e3)
            if not all(torch.equal(got["ordered"], v) for v in got.values()):
                raise AssertionError("the paths scored differently")

    def summary(v: list[float]) -> dict[str, float]:
        arr = np.array(v)
        return {
            "min_ms": round(float(arr.min()), 3),
            "p50_ms": round(float(np.percentile(arr, 50)), 3),
            "p99_ms": round(float(np.percentile(arr, 99)), 3),
        }

    rows: list[dict[str, Any]] = [
        {"name": f"ctr-profile-{k.replace(' ', '-').replace('+', 'and')}", **summary(v)}
        for k, v in stages.items()
    ]
    for k, v in ab.items():
        rows.append({"name": f"ctr-profile-forward-{k}", **summary(v)})
    o, n, d = (np.array(ab[k]) for k in ("ordered", "positions", "served"))
    rows.append(
        {
            "name": "ctr-profile-ab",
            "ordered_over_positions_p50": round(float(np.median(o) / np.median(n)), 3),
            "ordered_over_positions_pairs": round(float(np.median(o / n)), 3),
            "positions_over_served_p50": round(float(np.median(n) / np.median(d)), 3),
            "positions_over_served_pairs": round(float(np.median(n / d)), 3),
            "numpy_over_positions_p50": round(float(np.median(ab["numpy"]) / np.median(n)), 3),
            "numpy_over_positions_pairs": round(float(np.median(np.array(ab["numpy"]) / n)), 3),
            **{
                f"huge_{m}_over_{modes[0]}_{how}": round(
                    float(
                        np.median(ab[f"positions-huge-{m}"]) / np.median(n)
                        if how == "p50"
                        else np.median(np.array(ab[f"positions-huge-{m}"]) / n)
                    ),
                    3,
                )
                for m in twins
                for how in ("p50", "pairs")
            },
            "huge_pages": modes,
            "kernels": jit_available(),
            "shared": a.shared,
            "rows": a.rows,
            "iters": a.iters,
            "load_avg": [round(load0, 2), round(os.getloadavg()[0], 2)],
        }
    )
    emit_rows(rows, a.json)
    return 0


def stages_main(argv: list[str]) -> int:
    """One 200 x 500 request through the worker's path, stage by stage, the serving look-up
    before and after ``ShardedTable.pool_sum`` (median / p99 / min ms per stage), then an
    interleaved A/B of the whole request (decode, forward, encode): ``old`` = the served module
    as it ran before (``take``: split by shard, probe + row copy, ``embedding_bag``), ``new`` =
    the served module (probe + pooling compiled, no row copy). Blocks of ``--iters`` requests
    alternate (old first in even pairs), scores compared bit for bit; the load average is in
    the last row.

        python benchmarks/serve/ctr.py _stages --rows 50000000 --iters 200 --pairs 4
    """
    import torch
    import torch.nn.functional as F

    from coadapt.serve import codec
    from coadapt.serve.models import CtrRanker
    from coadapt.serve.sparse_model import (
        ShardedTable,
        SparseView,
        TableStore,
        _by_shard,
        _item_blocks,
        _swap_embeddings,
    )
    from coadapt.sparse import _serve_lookup
    from coadapt.sparse.embedding import ids_to_numpy
    from coadapt.sparse.server import SHARD_SALT

    p = in_process_parser("ctr.py _stages", "requests per stage run and A/B block")
    p.add_argument("--pairs", type=int, default=4, help="old/new blocks of the A/B")
    p.add_argument("--huge-pages", default="packed", help="as _profile's first mode")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    if _serve_lookup.probe_rows is None or _serve_lookup.pool_rows is None:
        p.error("the compiled kernels are unavailable (numba absent or COADAPT_NO_JIT set)")

    def log(msg: str) -> None:
        print(f"[ctr-stages {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    torch.set_num_threads(1)  # as a worker runs (--threads 1)
    table: ShardedTable = _served_tables(a.rows, a.dim, a.shards, log, a.huge_pages)
    view = SparseView({"ctr": table})
    model = CtrRanker(FEATURES, GROUPS, a.dim, HIDDEN, store=TableStore(view))
    _swap_embeddings(model, view)
    model.eval()
    table.pool_sum(np.zeros(1, np.uint64), np.empty(0, np.int64), 1)  # compile before timing
    rng = np.random.default_rng(1)
    bodies = [ctr_body(a.rows, rng, shared=a.shared) for _ in range(a.bodies)]
    bag = FEATURES // GROUPS

    def decode(body: bytes) -> torch.Tensor:
        ids = codec.decode_arrays(body)[0].view(np.int64)
        return torch.from_numpy(np.concatenate([ids]))  # the batcher's concatenation

    def encode(out: torch.Tensor) -> bytes:
        return codec.encode_arrays([np.ascontiguousarray(out.numpy(), dtype=np.float32)])

    def old_forward(x: torch.Tensor) -> torch.Tensor:  # ServingEmbedding before pool_sum
        arr = ids_to_numpy(x.reshape(-1, bag))
        found = _item_blocks(arr)
        if found is None:
            buf, at = table.take(arr.reshape(-1))
        else:
            buf, at = table.take(found[0])
            at = at[found[1]]
        pooled = F.embedding_bag(
            torch.from_numpy(at).view(-1, bag), torch.from_numpy(buf), mode="sum"
        )
        return model.mlp(pooled.reshape(x.shape[0], GROUPS * a.dim)).squeeze(1)

    stages: dict[str, list[float]] = {}
    ab: dict[str, list[list[float]]] = {"old": [], "new": []}
    load0 = os.getloadavg()[0]
    with torch.inference_mode():
        for it in range(a.iters + 5):
            t = [time.perf_counter()]
            x = decode(bodies[it % len(bodies)])
            t.append(time.perf_counter())
            arr = ids_to_numpy(x.reshape(-1, bag))
            flat = arr.reshape(-1)
            found = _item_blocks(arr)
            keys, back = (flat, np.empty(0, np.int64)) if found is None else found
            t.append(time.perf_counter())
            sel = _by_shard(keys, a.shards)
            t.append(time.perf_counter())
            for s, ix in enumerate(sel):
                table.bases[s].lookup(keys[ix])
            t.append(time.perf_counter())
            buf, at = table.take(keys)  # split + probe + row copy
            t.append(time.perf_counter())
            F.embedding_bag(torch.from_numpy(at if found is None else at[back]).view(-1, bag),
                            torch.from_numpy(buf))  # fmt: skip
            t.append(time.perf_counter())
            refs = np.empty(keys.size, np.int64)
            _serve_lookup.probe_rows(keys, SHARD_SALT, a.shards, *table._geometry(), refs)
            t.append(time.perf_counter())
            pooled = np.empty((flat.size // bag, a.dim), np.float32)
            _serve_lookup.pool_rows(refs, back, bag, a.dim, pooled)
            t.append(time.perf_counter())
            out = model.mlp(torch.from_numpy(pooled).reshape(x.shape[0], -1)).squeeze(1)
            t.append(time.perf_counter())
            encode(out)
            t.append(time.perf_counter())
            if it < 5:
                continue
            names = [
                "decode + concatenation", "IDs + shared-ID search", "old: split by shard",
                "old: probe (probe_keys per shard)", "old: split + probe + row copy (take)",
                "old: embedding_bag", "new: probe of every shard (probe_rows)",
                "new: pooling from the tables (pool_rows)", "mlp", "encode",
            ]  # fmt: skip
            for name, v in zip(names, np.diff(t) * 1e3, strict=True):
                stages.setdefault(name, []).append(float(v))
        for b in bodies:
            if not torch.equal(old_forward(decode(b)), model(decode(b))):
                raise AssertionError("old and new paths scored differently")
        for pair in range(a.pairs):
            for arm in ("old", "new") if pair % 2 == 0 else ("new", "old"):
                fn = old_forward if arm == "old" else model
                times = []
                for it in range(a.iters):
                    t0 = time.perf_counter()
                    encode(fn(decode(bodies[it % len(bodies)])))
                    times.append((time.perf_counter() - t0) * 1e3)
                ab[arm].append(times)
            log(f"pair {pair}: old p50 {np.median(ab['old'][-1]):.2f} ms, new p50 "
                f"{np.median(ab['new'][-1]):.2f} ms, load {os.getloadavg()[0]:.2f}")  # fmt: skip

    def summary(v: list[float]) -> dict[str, float]:
        arr = np.array(v)
        return {
            "p50_ms": round(float(np.median(arr)), 3),
            "p99_ms": round(float(np.percentile(arr, 99)), 3),
            "min_ms": round(float(arr.min()), 3),
        }

    rows: list[dict[str, Any]] = [
        {"name": f"ctr-stage {k}", **summary(v)} for k, v in stages.items()
    ]
    old = np.concatenate(ab["old"])
    new = np.concatenate(ab["new"])
    rows += [
        {"name": f"ctr-request-{k}", **summary(list(v))} for k, v in (("old", old), ("new", new))
    ]
    rows.append(
        {
            "name": "ctr-stages-ab",
            "old_over_new_p50": round(float(np.median(old) / np.median(new)), 3),
            "old_over_new_p99": round(float(np.percentile(old, 99) / np.percentile(new, 99)), 3),
            "pair_p50_ratios": [
                round(float(np.median(o) / np.median(n)), 3)
                for o, n in zip(ab["old"], ab["new"], strict=True)
            ],
            "rows": a.rows,
            "shared": a.shared,
            "iters": a.iters,
            "pairs": a.pairs,
            "load_avg": [round(load0, 2), round(os.getloadavg()[0], 2)],
        }
    )
    emit_rows(rows, a.json)
    return 0


def overlay_main(argv: list[str]) -> int:
    """The served forward while a delta is merged, in process: the same requests alternated
    between the version without the delta, the version with its overlays through the compiled
    look-up (``pool_sum``, what a worker runs) and the same overlays through ``take``'s numpy
    path (what a worker ran during every merge until the overlays took the compiled pass).

        python benchmarks/serve/ctr.py _overlay --rows 5000000 --iters 100
    """
    import torch
    import torch.nn.functional as F

    from coadapt.serve import codec
    from coadapt.serve.models import CtrRanker
    from coadapt.serve.sparse_model import SparseView, TableStore, _swap_embeddings, prepare_delta
    from coadapt.sparse import _serve_lookup
    from coadapt.sparse.embedding import ids_to_numpy
    from coadapt.sparse.export import DeltaTable
    from coadapt.sparse.server import shard_of

    p = in_process_parser("ctr.py _overlay", "requests per arm")
    p.add_argument("--delta-frac", type=float, default=0.01, help="rows updated by the delta")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    if _serve_lookup.probe_rows is None:
        p.error("the compiled kernels are unavailable (numba absent or COADAPT_NO_JIT set)")
    if not 0 < a.delta_frac <= 0.5:
        p.error(f"--delta-frac: {a.delta_frac} is not in (0, 0.5]")

    def log(msg: str) -> None:
        print(f"[ctr-overlay {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    torch.set_num_threads(1)  # as a worker runs (--threads 1)
    table = _served_tables(a.rows, a.dim, a.shards, log, "packed")
    view = SparseView({"ctr": table})
    rng = np.random.default_rng(0)
    # the delta: --delta-frac of the rows updated, a tenth as many added, a twentieth deleted
    upd = key_of(rng.choice(a.rows, int(a.rows * a.delta_frac), replace=False))
    new = key_of(np.arange(a.rows, a.rows + int(a.rows * a.delta_frac / 10)))
    gone = np.setdiff1d(key_of(rng.choice(a.rows, int(a.rows * a.delta_frac / 20))), upd)
    changed = np.concatenate([upd, new])
    parts = []
    for s in range(a.shards):
        k, g = changed[shard_of(changed, a.shards) == s], gone[shard_of(gone, a.shards) == s]
        added = int(np.count_nonzero(shard_of(new, a.shards) == s))
        vals = (rng.standard_normal((k.size, a.dim)) * 0.05).astype(np.float32)
        parts.append(DeltaTable("ctr", a.dim, table.rows(s) + added - g.size, k, vals, g))
    t0 = time.perf_counter()
    pending = prepare_delta(view, {"ctr": parts}, "2")
    log(f"delta of {changed.size} rows and {gone.size} deletions prepared in "
        f"{time.perf_counter() - t0:.2f} s")  # fmt: skip
    models = []
    for v in (view, pending.view):
        torch.manual_seed(0)  # the same dense weights
        m = CtrRanker(FEATURES, GROUPS, a.dim, HIDDEN, store=TableStore(v))
        _swap_embeddings(m, v)
        models.append(m.eval())
    without, with_overlay = models
    merged = pending.view.tables["ctr"]

    def through_take(x: torch.Tensor) -> torch.Tensor:  # the overlays on take's path
        buf, pos = merged.take(ids_to_numpy(x).reshape(-1))
        pooled = F.embedding_bag(
            torch.from_numpy(pos).view(-1, FEATURES // GROUPS), torch.from_numpy(buf), mode="sum"
        )
        return with_overlay.mlp(pooled.reshape(x.shape[0], GROUPS * a.dim)).squeeze(1)

    arms: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "no-overlay": without,
        "overlay-compiled": with_overlay,
        "overlay-take": through_take,
    }
    times: dict[str, list[float]] = {k: [] for k in arms}
    bodies = [ctr_body(a.rows, rng, shared=a.shared) for _ in range(a.bodies)]
    load0 = os.getloadavg()[0]
    with torch.inference_mode():
        for it in range(a.iters + 3):
            ids = codec.decode_arrays(bodies[it % len(bodies)])[0].view(np.int64)
            x = torch.from_numpy(ids.copy())
            names = list(arms)
            got = {}
            for k in names[it % 3 :] + names[: it % 3]:  # rotating: every arm sees the load
                t = time.perf_counter()
                got[k] = arms[k](x)
                if it >= 3:  # the first calls compile and fault pages in
                    times[k].append((time.perf_counter() - t) * 1e3)
            if not torch.equal(got["overlay-compiled"], got["overlay-take"]):
                raise AssertionError("the two overlay paths scored differently")
    p50 = {k: float(np.percentile(v, 50)) for k, v in times.items()}
    rows: list[dict[str, Any]] = [
        {
            "name": f"ctr-overlay-forward-{k}",
            "p50_ms": round(p50[k], 3),
            "p99_ms": round(float(np.percentile(v, 99)), 3),
        }
        for k, v in times.items()
    ]
    rows.append(
        {
            "name": "ctr-overlay-ab",
            "compiled_over_no_overlay_p50": round(p50["overlay-compiled"] / p50["no-overlay"], 3),
            "take_over_no_overlay_p50": round(p50["overlay-take"] / p50["no-overlay"], 3),
            "delta_rows": int(changed.size),
            "deleted": int(gone.size),
            "rows": a.rows,
            "iters": a.iters,
            "load_avg": [round(load0, 2), round(os.getloadavg()[0], 2)],
        }
    )
    emit_rows(rows, a.json)
    return 0


@contextlib.contextmanager
def kernels_off() -> Iterator[None]:
    """The numpy path of the table and the shard split inside the block (same process, for
    interleaved A/B rounds; ``COADAPT_NO_JIT=1`` switches them off for a whole process)."""
    from coadapt.sparse import _probe
    from coadapt.sparse import table as table_mod

    saved = (table_mod.probe_keys, table_mod.probe_stored, table_mod._take_found)
    split = _probe.split_shards
    table_mod.probe_keys = table_mod.probe_stored = table_mod._take_found = None
    _probe.split_shards = None
    try:
        yield
    finally:
        table_mod.probe_keys, table_mod.probe_stored, table_mod._take_found = saved
        _probe.split_shards = split


def probe_main(argv: list[str]) -> int:
    """ns per key of one table's probe, numpy path vs compiled kernels, interleaved rounds:
    look-up only (``_prepare`` + ``_find_chunk`` vs ``probe_keys``) and look-up + copy of the
    found rows (``lookup`` + ``weights`` vs ``take_found``); both paths' answers compared.

        python benchmarks/serve/ctr.py _probe --rows 5000000 --keys 100000
    """
    from coadapt.sparse import _probe
    from coadapt.sparse.table import HUGE_PAGE_MODES, EmbeddingTable, huge_page_bytes

    p = argparse.ArgumentParser(prog="ctr.py _probe")
    p.add_argument("--rows", type=int, default=5_000_000)
    p.add_argument("--keys", type=int, default=100_000, help="IDs per probe (10 %% unknown)")
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument(
        "--huge-pages", default="inside",
        help="comma-separated huge_pages modes: the first builds the table every arm reads; "
        "each further one a twin, read by a 'compiled-probe-and-copy-huge-MODE' arm",
    )  # fmt: skip
    a = p.parse_args(argv)
    modes = [m for m in a.huge_pages.split(",") if m]
    for m in modes:
        if m not in HUGE_PAGE_MODES:
            p.error(f"--huge-pages: {m!r} is not one of {', '.join(HUGE_PAGE_MODES)}")
    if not _probe.warm():
        raise SystemExit("no compiled kernels (numba absent or COADAPT_NO_JIT set)")
    keys = key_of(np.arange(a.rows))

    def build(mode: str) -> EmbeddingTable:
        rng = np.random.default_rng(0)
        h0 = huge_page_bytes()
        t = EmbeddingTable(
            a.dim, a.dim, max_rows=int(a.rows * 1.1) + (1 << 16), initial_rows=a.rows,
            huge_pages=mode,
        )  # fmt: skip
        for s in range(0, a.rows, 1 << 20):
            kk = keys[s : s + (1 << 20)]
            t.assign(kk, rng.standard_normal((kk.size, a.dim)).astype(np.float32))
        print(
            json.dumps(
                {"name": f"probe-table-{mode}", "nbytes": t.nbytes(),
                 "huge_page_bytes": huge_page_bytes() - h0}
            ), flush=True,
        )  # fmt: skip
        return t

    t = build(modes[0])
    twins = {m: build(m) for m in modes[1:]}
    rng = np.random.default_rng(0)
    q = keys[rng.integers(0, a.rows, a.keys)]
    q[::10] = rng.integers(0, 2**64 - 1, q[::10].size, dtype=np.uint64, endpoint=True)
    buf = np.empty((q.size + 1, a.dim), np.float32)
    pos = np.empty(q.size, np.int64)

    def numpy_probe() -> np.ndarray:
        stored, seg = t._prepare(q)
        out = np.empty(q.size, np.int64)
        for s in range(0, q.size, 8192):
            out[s : s + 8192] = t._find_chunk(stored[s : s + 8192], seg[s : s + 8192])
        return out

    def take(on: bool, tab: EmbeddingTable = t) -> tuple[np.ndarray, np.ndarray]:
        with contextlib.nullcontext() if on else kernels_off():
            end, _ = tab.take_found(q, buf, pos)
            return buf[:end].copy(), pos.copy()

    arms: dict[str, Callable[[], Any]] = {
        "numpy-probe": numpy_probe,
        "compiled-probe": lambda: t.lookup(q),
        "numpy-probe-and-copy": lambda: take(False),
        "compiled-probe-and-copy": lambda: take(True),
    }
    for m, twin in twins.items():
        arms[f"compiled-probe-and-copy-huge-{m}"] = functools.partial(take, True, twin)
    if not np.array_equal(numpy_probe(), t.lookup(q)):
        raise AssertionError("compiled probe differs from the numpy path")
    b0, p0 = take(False)
    b1, p1 = take(True)
    if not (np.array_equal(b0, b1) and np.array_equal(p0, p1)):
        raise AssertionError("compiled take_found differs from the numpy path")
    for twin in twins.values():
        b2, p2 = take(True, twin)
        if not (np.array_equal(b0, b2) and np.array_equal(p0, p2)):
            raise AssertionError("a huge-page twin's take_found differs")
    times: dict[str, list[float]] = {k: [] for k in arms}
    load0 = os.getloadavg()[0]
    names = list(arms)
    for r in range(a.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotating order
            t0 = time.perf_counter()
            arms[name]()
            times[name].append((time.perf_counter() - t0) / q.size * 1e9)
    load = [round(load0, 2), round(os.getloadavg()[0], 2)]
    base = np.array(times["compiled-probe-and-copy"])
    for name, v in times.items():
        row: dict[str, Any] = {
            "name": f"probe-{name}",
            "ns_per_key_median": round(float(np.median(v)), 1),
            "ns_per_key_min": round(min(v), 1),
            "rows": a.rows,
            "keys": a.keys,
            "huge_pages": modes[0] if "-huge-" not in name else name.rsplit("-", 1)[1],
            "load_avg": load,
        }
        if "-huge-" in name:
            row[f"over_{modes[0]}_pairs"] = round(float(np.median(np.array(v) / base)), 3)
        print(json.dumps(row))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The CTR options (also on ``benchmarks/serve_bench.py``)."""
    p.add_argument("--ctr-rows", type=int, default=50_000_000, help="rows of the big table")
    p.add_argument("--ctr-dim", type=int, default=8)
    p.add_argument("--ctr-shards", type=int, default=2, help="parameter-server shards")
    p.add_argument("--ctr-workers", type=int, default=1, help="serving worker processes")
    p.add_argument(
        "--ctr-threads",
        type=int,
        default=1,
        help="threads per worker (torch and the look-up: 2 splits one request over 2 cores)",
    )
    p.add_argument(
        "--ctr-table-shards",
        type=int,
        default=2,
        help="also serve the model from N table-shard processes (ctr-sharded rows; 0: skip)",
    )
    p.add_argument(
        "--ctr-rates",
        type=lambda s: [float(x) for x in s.split(",")],
        default=[10.0, 25.0, 50.0, 100.0],
        help="requests/s of the latency runs",
    )
    p.add_argument("--ctr-duration", type=float, default=5.0, help="seconds per rate")
    p.add_argument("--ctr-delta-frac", type=float, default=0.01, help="rows changed per delta")
    p.add_argument(
        "--ctr-shared",
        type=float,
        default=0.0,
        help="share of each item's features that are the same IDs in every item (user, context)",
    )
    p.add_argument(
        "--ctr-bodies",
        type=int,
        default=32,
        help="distinct requests the load cycles through (one keeps its rows in the CPU caches)",
    )
    p.add_argument("--ctr-swap-rate", type=float, default=0.0, help="rate while applying (0: auto)")
    p.add_argument(
        "--ctr-swaps", type=int, default=3, help="deltas applied under load (windows pooled)"
    )
    p.add_argument("--fresh-plants", type=int, default=3)
    p.add_argument("--fresh-publish-s", type=float, default=2.0)
    p.add_argument(
        "--fresh-rate", type=float, default=100.0, help="stream lines/s (below the trainer's rate)"
    )
    p.add_argument("--fresh-servers", type=int, default=2)
    p.add_argument("--ctr-skip", default="", help="comma-separated: big, freshness")
    p.add_argument("--ctr-keep", action="store_true", help="keep the work directory (logs)")


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.ctr_threads < 1:
        raise SystemExit(f"--ctr-threads: {args.ctr_threads} is invalid; give 1 or more")
    if args.ctr_swaps < 1:
        raise SystemExit(f"--ctr-swaps: {args.ctr_swaps} is invalid; give 1 or more deltas")
    if args.ctr_bodies < 1:
        raise SystemExit(f"--ctr-bodies: {args.ctr_bodies} is invalid; give 1 or more requests")
    work = Path(tempfile.mkdtemp(prefix="coadapt-ctr-bench-"))
    skip = set(filter(None, args.ctr_skip.split(",")))

    def log(msg: str) -> None:
        print(f"[ctr {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    log(f"work dir {work}, load {os.getloadavg()}")
    rows: list[dict[str, Any]] = []
    try:
        if "big" not in skip:
            rows += run_big(args, work, log)
        if "freshness" not in skip:
            rows += run_freshness(args, work, log)
    finally:
        if not args.ctr_keep:
            shutil.rmtree(work, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_trainer"]:
        return trainer_main(argv[1:])
    if argv[:1] == ["_profile"]:
        return profile_main(argv[1:])
    if argv[:1] == ["_stages"]:
        return stages_main(argv[1:])
    if argv[:1] == ["_probe"]:
        return probe_main(argv[1:])
    if argv[:1] == ["_overlay"]:
        return overlay_main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(p)
    p.add_argument("--json", type=Path, help="write the rows here")
    args = p.parse_args(argv)
    rows = run(args)
    emit_rows(rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Sparse-package benchmarks. Memory section: EmbeddingTable bytes per row vs raw bytes.

For each (row count, row layout) a fresh subprocess grows a table from empty by inserting
random 64-bit IDs in batches and reports:

* ``bytes_per_row_ratio`` — ``table.nbytes() / (rows * raw)`` at the end, where raw is the
  8-byte key + ``width`` float32 (no counters in these runs);
* ``peak_nbytes_ratio`` — the worst such ratio seen after any batch once the table holds
  >= 10 % of the final rows (i.e. including right after segments grow);
* ``peak_rss_ratio`` — (process RSS high-water mark - RSS before the table existed, after the
  table's compiled kernels were loaded by a 4k-row warm-up table) / raw bytes of the final rows:
  the honest cross-check, transient batch/rehash copies included.

It also measures lookup and lookup-or-insert throughput for a DLRM-sized batch of 2048 x 26 IDs.

Speed section (``--speed``): samples/s of the DLRM-like model (26 tables x dim 64 x 100k rows,
batch 2048 per worker, 13 dense features, bottom MLP 13-512-256-64, dot interactions, top MLP
415-512-256-1, row-wise AdaGrad on the embeddings, SGD on the dense part, CPU) for

* ``speed/coadapt/<W>x<S>``: W worker processes (dense gradients all-reduced with gloo) and S
  shard server processes on 127.0.0.1, plus one pull + push round trip of a 2048 x 26 batch;
* ``speed/coadapt/<W>x<S>+prefetch``: the same, the worker announcing batch t + 1's IDs
  (``SparseEmbeddingCollection.prefetch``) so their pull follows batch t's push at once;
* ``speed/coadapt/local``: one process, in-process store (no sockets), interleaved with W = 1;
* ``speed/nn_embeddingbag/<W>``: 26 plain ``nn.EmbeddingBag`` (sparse grads,
  ``torch.optim.Adagrad``);
* ``speed/torchrec/<W>``: TorchRec ``DistributedModelParallel`` with fused row-wise AdaGrad, when
  the optional ``bench-sparse`` extra is installed (``torchrec_samples_per_s`` also goes on the
  coadapt row with the same number of worker processes).

Tables are prefilled (every row exists) so all systems run in steady state, as TorchRec's
fixed-size tables do. Every configuration runs in fresh processes.

Training sections (``benchmarks/sparse/training.py``): ``--compression`` (pushed bytes and
AUC with push compression off/on), ``--staleness`` (AUC at checkpoints and samples/s for SSP
bounds), ``--freshness`` (online vs frozen model on a drifting stream). ``--scaling``
(``benchmarks/sparse/scaling.py``): the DLRM for W workers x S servers plus a 2-node Ray run
in a loopback-only namespace. ``--hotpath``: one shard's pull + push CPU ms per batch.
``--all`` runs every section with small defaults. Rows go to ``--json OUT`` as
``{"rows": [...]}``.

    .venv/bin/python benchmarks/sparse_bench.py [--sizes 1000000,10000000] [--json OUT]
    .venv/bin/python benchmarks/sparse_bench.py --speed [--steps 20] [--workers 1,2] [--json OUT]
    .venv/bin/python benchmarks/sparse_bench.py --all --json OUT
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from coadapt.ports import free_port

LAYOUTS = {
    # name: (dim, width) — width = dim + optimizer state columns
    "lr_ftrl": (1, 3),  # FTRL-Proximal: w, z, n
    "emb16_rowwise_adagrad": (16, 17),
    "emb16_adagrad": (16, 32),
}
BATCH = 1 << 16
"""Keys per insert call while growing: about one DLRM request (2048 x 26 = 53k IDs)."""
DLRM_BATCH = 2048 * 26


def _vm(field: str) -> int:
    """A /proc/self/status field in bytes (Linux); falls back to ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - non-Linux
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child(layout: str, rows: int, throughput: bool) -> dict[str, object]:
    import numpy as np

    from coadapt.sparse import EmbeddingTable

    dim, width = LAYOUTS[layout]
    rng = np.random.default_rng(rows)
    probe = rng.integers(0, 2**64 - 1, DLRM_BATCH, dtype=np.uint64)
    # Load the table's compiled kernels first: numba's code and LLVM's heap (~3 MB here, cached
    # kernels) are held once per process, whatever the rows, and would count as the table's.
    warm = EmbeddingTable(dim, width, ttl=1000)
    warm.lookup_or_insert(np.arange(1, 4097, dtype=np.uint64), now=0)
    warm.lookup(probe[:16])
    del warm
    base_rss = _vm("VmRSS")
    table = EmbeddingTable(dim, width, ttl=1000)
    raw = 8 + 4 * width
    peak = 0.0
    t0 = time.perf_counter()
    done = 0
    while done < rows:
        n = min(BATCH, rows - done)
        table.lookup_or_insert(rng.integers(0, 2**64 - 1, n, dtype=np.uint64), now=0)
        done += n
        if done >= rows // 10:
            peak = max(peak, table.nbytes() / (len(table) * raw))
    secs = time.perf_counter() - t0
    hwm = _vm("VmHWM")
    out: dict[str, object] = {
        "name": f"memory/{layout}/{rows}",
        "layout": layout,
        "dim": dim,
        "width": width,
        "rows": len(table),
        "raw_bytes_per_row": raw,
        "bytes_per_row": table.nbytes() / len(table),
        "bytes_per_row_ratio": table.nbytes() / (len(table) * raw),
        "peak_nbytes_ratio": peak,
        "peak_rss_ratio": (hwm - base_rss) / (len(table) * raw),
        "rss_ratio": (_vm("VmRSS") - base_rss) / (len(table) * raw),
        "load_factor": table.load_factor,
        "build_seconds": secs,
        "build_keys_per_s": rows / secs,
    }
    if throughput:
        table.lookup_or_insert(probe)
        reps = 10
        t0 = time.perf_counter()
        for _ in range(reps):
            table.lookup(probe)
        out["lookup_keys_per_s"] = reps * probe.size / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(reps):  # half the batch is new IDs each time
            fresh = rng.integers(0, 2**64 - 1, probe.size // 2, dtype=np.uint64)
            table.lookup_or_insert(np.concatenate([probe[: probe.size // 2], fresh]), now=1)
        out["insert_half_new_keys_per_s"] = reps * probe.size / (time.perf_counter() - t0)
        idx = table.lookup(probe)
        t0 = time.perf_counter()
        for _ in range(reps):
            table.write_rows(idx, table.rows(idx))
        out["gather_scatter_rows_per_s"] = reps * probe.size / (time.perf_counter() - t0)
    return out


# ---------------------------------------------------------------------- speed section
N_TABLES, DIM, SPEED_BATCH, LR = 26, 64, 2048, 0.01
# Rows per table (prefilled); the environment override lets the smoke test use tiny tables.
ROWS_PER_TABLE = int(os.environ.get("SPARSE_BENCH_ROWS_PER_TABLE", "100000"))


def _batches(rank: int, n: int) -> list[tuple[Any, Any, Any]]:
    import numpy as np
    import torch

    rng = np.random.default_rng(1000 + rank)
    out = []
    for _ in range(n):
        dense = torch.from_numpy(rng.random((SPEED_BATCH, 13), np.float32))
        cats = torch.from_numpy(rng.integers(0, ROWS_PER_TABLE, (SPEED_BATCH, N_TABLES)))
        y = torch.from_numpy((rng.random(SPEED_BATCH) < 0.25).astype(np.float32))
        out.append((dense, cats, y))
    return out


def _dist_init(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    if world > 1 or port:
        dist.init_process_group(
            "gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}"
        )


def _allreduce_grads(params: list[Any], world: int) -> None:
    """Dense parameters: one flat all-reduce per step (the dense part stays on the workers)."""
    import torch
    import torch.distributed as dist

    if world == 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    off = 0
    for g in grads:
        g.copy_(flat[off : off + g.numel()].view_as(g))
        off += g.numel()


def _time_steps(step: Any, batches: list[Any], warmup: int) -> float:
    for b in batches[:warmup]:
        step(*b)
    t0 = time.perf_counter()
    for b in batches[warmup:]:
        step(*b)
    return time.perf_counter() - t0


def speed_child(
    kind: str, rank: int, world: int, port: int, steps: int, extra: str
) -> dict[str, Any]:
    import numpy as np
    import torch
    from torch import nn

    from coadapt.sparse.models import DLRM

    torch.manual_seed(0)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    warmup = 3
    batches = _batches(rank, steps + warmup)
    loss_fn = nn.BCEWithLogitsLoss()
    info: dict[str, Any] = {}
    if kind == "coadapt":
        from coadapt.sparse.client import LocalStore, PSClient, SparseStore
        from coadapt.sparse.embedding import SparseEmbeddingCollection
        from coadapt.sparse.server import TableSpec

        names = [f"t{i}" for i in range(N_TABLES)]
        extra, _, variant = extra.partition("+")  # "+prefetch": pull batch t+1 after t's push
        store: SparseStore
        if extra == "local":
            store = LocalStore([TableSpec(n, DIM, "rowwise_adagrad", {"lr": LR}) for n in names])
        else:
            store = PSClient([("127.0.0.1", int(p)) for p in extra.split(",")])
        if rank == 0:  # prefill: every row exists, as in a fixed-size table
            for a in range(0, ROWS_PER_TABLE, 10_000):
                chunk = np.arange(a, min(a + 10_000, ROWS_PER_TABLE), dtype=np.uint64)
                store.pull({n: chunk for n in names})
        _dist_init(rank, world, port)
        if world > 1:
            import torch.distributed as dist

            dist.barrier()
        emb = SparseEmbeddingCollection(names, DIM, store=store)
        model = DLRM(emb, DIM)
        params = list(model.parameters())
        opt = torch.optim.SGD(params, lr=LR)
        # the batch after each one (what a pipelined data loader knows a step ahead)
        following = {id(a[1]): b[1] for a, b in itertools.pairwise(batches)}

        def step(dense: Any, cats: Any, y: Any) -> None:
            opt.zero_grad()
            logits = model(dense, cats)
            nxt = following.get(id(cats))
            if variant == "prefetch" and nxt is not None:
                emb.prefetch(nxt)  # sent right after this batch's push: s = 0 stays exact
            loss_fn(logits, y).backward()
            _allreduce_grads(params, world)
            opt.step()

        if isinstance(store, PSClient):  # one pull + push round trip of a 2048 x 26 batch
            ids = {
                n: np.unique(batches[0][1][:, i].numpy().view(np.uint64))
                for i, n in enumerate(names)
            }
            store.pull(ids)
            t0 = time.perf_counter()
            rows = store.pull(ids)
            t1 = time.perf_counter()
            store.push({n: (ids[n], rows[n] * 0) for n in names})
            store.wait()  # the push is asynchronous: time it until the servers applied it
            t2 = time.perf_counter()
            info = {"pull_ms": 1e3 * (t1 - t0), "push_ms": 1e3 * (t2 - t1)}
    elif kind == "embeddingbag":
        _dist_init(rank, world, port)

        class Bags(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.bags = nn.ModuleList(
                    nn.EmbeddingBag(ROWS_PER_TABLE, DIM, mode="sum", sparse=True)
                    for _ in range(N_TABLES)
                )

            def forward(self, cats: torch.Tensor) -> torch.Tensor:
                return torch.stack([b(cats[:, i : i + 1]) for i, b in enumerate(self.bags)], dim=1)

        model = DLRM(Bags(), DIM)
        sparse_p = list(model.embeddings.parameters())
        dense_p = [p for n, p in model.named_parameters() if not n.startswith("embeddings")]
        sopt = torch.optim.Adagrad(sparse_p, lr=LR)
        dopt = torch.optim.SGD(dense_p, lr=LR)

        def step(dense: Any, cats: Any, y: Any) -> None:
            sopt.zero_grad()
            dopt.zero_grad()
            loss_fn(model(dense, cats), y).backward()
            _allreduce_grads(dense_p, world)  # embeddings replicated per worker (no sync)
            sopt.step()
            dopt.step()

    elif kind == "torchrec":
        _dist_init(rank, world, port or free_port())
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
        from torchrec.distributed import DistributedModelParallel
        from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
        from torchrec.optim.keyed import KeyedOptimizerWrapper
        from torchrec.optim.optimizers import in_backward_optimizer_filter
        from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

        keys = [f"f{i}" for i in range(N_TABLES)]
        ebc = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(
                    name=f"t{i}",
                    embedding_dim=DIM,
                    num_embeddings=ROWS_PER_TABLE,
                    feature_names=[keys[i]],
                )
                for i in range(N_TABLES)
            ],
            device=torch.device("meta"),
        )
        apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": LR})

        class Wrap(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.ebc = ebc

            def forward(self, cats: torch.Tensor) -> torch.Tensor:
                b = cats.shape[0]
                kjt = KeyedJaggedTensor.from_lengths_sync(
                    keys=keys,
                    values=cats.t().reshape(-1),
                    lengths=torch.ones(N_TABLES * b, dtype=torch.int32),
                )
                return self.ebc(kjt).values().view(b, N_TABLES, DIM)

        model = DistributedModelParallel(DLRM(Wrap(), DIM), device=torch.device("cpu"))
        dopt = KeyedOptimizerWrapper(
            dict(in_backward_optimizer_filter(model.named_parameters())),
            lambda ps: torch.optim.SGD(ps, lr=LR),
        )

        def step(dense: Any, cats: Any, y: Any) -> None:
            dopt.zero_grad()
            loss_fn(model(dense, cats), y).backward()
            dopt.step()

    else:
        raise ValueError(f"unknown speed kind {kind!r}")
    secs = _time_steps(step, batches, warmup)
    if kind == "coadapt" and hasattr(store, "prefetch_hits"):
        info["prefetch_hits"] = store.prefetch_hits  # pulls a prefetch answered
    return dict(info, rank=rank, seconds=secs, samples_per_s=steps * SPEED_BATCH / secs)


def _run_workers(kind: str, world: int, steps: int, extra: str) -> dict[str, Any]:
    port = free_port() if world > 1 or kind == "torchrec" else 0
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--speed-child",
                kind,
                str(r),
                str(world),
                str(port),
                str(steps),
                extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    outs = []
    for p in procs:
        so, se = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"{kind} worker failed (rc {p.returncode}):\n{se[-3000:]}")
        outs.append(json.loads(so.strip().splitlines()[-1]))
    secs = max(o["seconds"] for o in outs)  # the slowest worker sets the pace
    res = {
        "samples_per_s": world * steps * SPEED_BATCH / secs,
        "ms_per_step": 1e3 * secs / steps,
    }
    for k in ("pull_ms", "push_ms", "prefetch_hits"):
        if k in outs[0]:
            res[k] = outs[0][k]
    return res


def torchrec_available() -> bool:
    try:
        import torchrec  # noqa: F401
    except Exception:
        return False
    return True


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest of the repeats: other load on a shared machine only ever slows a run down."""
    best = max(runs, key=lambda r: float(r["samples_per_s"]))
    return dict(best, repeats=len(runs))


def speed_section(workers: list[int], steps: int, repeats: int = 2) -> list[dict[str, Any]]:
    """Each configuration ``repeats`` times, interleaved (TorchRec, EmbeddingBag, coadapt, ...),
    so a burst of outside load hits all of them alike; rows report the best run of each."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.sparse.scaling import speed_specs
    from coadapt.sparse.server import running_servers

    rows: list[dict[str, Any]] = []
    common = {
        "tables": N_TABLES,
        "dim": DIM,
        "rows_per_table": ROWS_PER_TABLE,
        "batch": SPEED_BATCH,
        "cpus": os.cpu_count(),
    }
    have_tr = torchrec_available()
    specs = speed_specs()
    locs: list[dict[str, Any]] = []  # in-process store: run with the W = 1 repeats
    for w in workers:
        trs, ebs, cos = [], [], []
        with tempfile.TemporaryDirectory() as work, running_servers(specs, w, work) as procs:
            ports = ",".join(str(p.port) for p in procs)
            pfs: list[dict[str, Any]] = []
            for _ in range(repeats):
                if have_tr:
                    trs.append(_run_workers("torchrec", w, steps, "-"))
                ebs.append(_run_workers("embeddingbag", w, steps, "-"))
                cos.append(_run_workers("coadapt", w, steps, ports))
                pfs.append(_run_workers("coadapt", w, steps, ports + "+prefetch"))
                if w == 1:
                    locs.append(_run_workers("coadapt", 1, steps, "local"))
        rows.append(dict(common, name=f"speed/nn_embeddingbag/{w}", workers=w, **_best(ebs)))
        tr = _best(trs) if trs else None
        if tr is not None:
            rows.append(dict(common, name=f"speed/torchrec/{w}", workers=w, **tr))
        variants = [(f"{w}x{w}", w, cos), (f"{w}x{w}+prefetch", w, pfs)]
        if w == 1 and locs:
            variants.insert(0, ("local", 0, locs))
        for label, servers, runs in variants:
            co = _best(runs)
            name = f"speed/coadapt/{label}"
            row = dict(common, name=name, workers=w, servers=servers, **co)
            if tr is not None:
                row["torchrec_samples_per_s"] = tr["samples_per_s"]
                row["speedup_vs_torchrec"] = co["samples_per_s"] / tr["samples_per_s"]
            rows.append(row)
    if 1 not in workers:
        local = _best([_run_workers("coadapt", 1, steps, "local") for _ in range(repeats)])
        rows.append(dict(common, name="speed/coadapt/local", workers=1, servers=0, **local))
    return rows


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.4f}"
    return str(v)


def print_table(rows: list[dict[str, Any]], cols: list[str]) -> None:
    """One line per row; a blank cell where a row lacks the column."""
    print("".join(f"{c:>20}" if i else f"{c:<30}" for i, c in enumerate(cols)))
    for r in rows:
        cells = [_fmt(r.get(c, "")) for c in cols]
        print("".join(f"{c:>20}" if i else f"{c:<30}" for i, c in enumerate(cells)), flush=True)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def memory_section(sizes: list[int], layouts: list[str]) -> list[dict[str, Any]]:
    """One fresh child process per (layout, rows)."""
    rows: list[dict[str, Any]] = []
    hdr = f"{'layout':<24}{'rows':>12}{'B/row':>8}{'raw':>5}{'ratio':>7}{'peak':>7}{'rss':>7}"
    print(hdr + f"{'load':>7}{'build k/s':>11}{'lookup k/s':>12}{'ins k/s':>9}")
    for lay in layouts:
        for i, n in enumerate(sizes):
            cmd = [sys.executable, __file__, "--child", lay, str(n)]
            if i == 0:
                cmd.append("--throughput")
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"{lay} {n}: child failed:\n{proc.stderr[-2000:]}")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append(r)
            look = r.get("lookup_keys_per_s")
            ins = r.get("insert_half_new_keys_per_s")
            print(
                f"{lay:<24}{n:>12,}{r['bytes_per_row']:>8.2f}{r['raw_bytes_per_row']:>5}"
                f"{r['bytes_per_row_ratio']:>7.3f}{r['peak_nbytes_ratio']:>7.3f}"
                f"{r['peak_rss_ratio']:>7.3f}{r['load_factor']:>7.3f}"
                f"{r['build_keys_per_s'] / 1e3:>11.0f}"
                + (f"{look / 1e3:>12.0f}{ins / 1e3:>9.0f}" if look and ins else ""),
                flush=True,
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--memory", action="store_true", help="memory section (default if none)")
    ap.add_argument("--sizes", default="1000000,10000000", help="comma-separated row counts")
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated layouts")
    ap.add_argument("--json", dest="json_out", help="write {'rows': [...]} here")
    ap.add_argument("--child", nargs=2, metavar=("LAYOUT", "ROWS"), help=argparse.SUPPRESS)
    ap.add_argument("--throughput", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--speed", action="store_true", help="speed vs TorchRec section")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per speed/scaling run")
    ap.add_argument("--workers", default="1,2", help="W for the W workers x W servers runs")
    ap.add_argument("--servers", default="1,2", help="S for the scaling section")
    ap.add_argument("--repeats", type=int, default=2, help="speed runs per config (best kept)")
    ap.add_argument("--compression", action="store_true", help="compression on/off section")
    ap.add_argument("--codecs", default="", help="compression configs (default: all)")
    ap.add_argument("--staleness", action="store_true", help="SSP bound s in {0,4,16} section")
    ap.add_argument("--bounds", default="0,4,16", help="staleness bounds")
    ap.add_argument("--freshness", action="store_true", help="online vs frozen on drifting data")
    ap.add_argument("--scaling", action="store_true", help="W x S grid + 2-node Ray run")
    ap.add_argument("--hotpath", action="store_true", help="server pull/push CPU ms per batch")
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray run of --scaling")
    ap.add_argument("--rows", type=int, default=196_608, help="planted rows (training sections)")
    ap.add_argument("--batch", type=int, default=2048, help="batch of the training sections")
    ap.add_argument("--all", action="store_true", help="every section with small defaults")
    ap.add_argument("--speed-child", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.throughput)))
        return 0
    if args.speed_child:
        kind, rank, world, port, steps, extra = args.speed_child
        out = speed_child(kind, int(rank), int(world), int(port), int(steps), extra)
        print(json.dumps(out))
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.sparse.scaling import scaling_section
    from benchmarks.sparse.training import (
        COMPRESSIONS,
        TrainSetup,
        compression_section,
        freshness_section,
        staleness_section,
    )

    for lay in args.layouts.split(","):
        if lay and lay not in LAYOUTS:
            ap.error(f"unknown layout {lay!r}; choose from {', '.join(LAYOUTS)}")
    args.codecs = args.codecs or ",".join(COMPRESSIONS)
    for c in args.codecs.split(","):
        if c not in COMPRESSIONS:
            ap.error(f"unknown codec {c!r}; choose from {', '.join(COMPRESSIONS)}")
    sections = ("memory", "hotpath", "speed", "compression", "staleness", "freshness", "scaling")
    chosen = {s for s in sections if args.all or getattr(args, s)} or {"memory"}
    if args.all and args.sizes == ap.get_default("sizes"):
        args.sizes = "1000000"
    setup = TrainSetup(rows=args.rows, batch=args.batch)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    rows: list[dict[str, Any]] = []
    if "memory" in chosen:
        layouts = [s for s in args.layouts.split(",") if s]
        rows += memory_section(_ints(args.sizes), layouts)
    if "hotpath" in chosen:
        from benchmarks.sparse.hotpath import hotpath_section

        got = hotpath_section()
        print_table(got, ["name", "unique_rows", "pull_cpu_ms", "push_cpu_ms", "pull_push_cpu_ms"])
        rows += got
    if "speed" in chosen:
        got = speed_section(_ints(args.workers), args.steps, args.repeats)
        print_table(
            got,
            [
                "name",
                "samples_per_s",
                "ms_per_step",
                "torchrec_samples_per_s",
                "speedup_vs_torchrec",
                "pull_ms",
                "push_ms",
            ],
        )
        rows += got
    if "compression" in chosen:
        got = compression_section(setup, args.codecs.split(","))
        print_table(
            got,
            [
                "name",
                "pushed_bytes_ratio",
                "auc",
                "auc_loss",
                "planted_auc",
                "samples_per_s",
                "meets_target",
            ],
        )
        rows += got
    if "staleness" in chosen:
        got = staleness_section(setup, _ints(args.bounds))
        print_table(
            got, ["name", "auc", "planted_auc", "samples_per_s", "max_staleness", "cache_hit_rate"]
        )
        for r in got:
            print(f"  {r['name']} AUC at steps: {r['auc_curve']}")
        rows += got
    if "freshness" in chosen:
        got = freshness_section(dataclasses.replace(setup, drift_period=2 * setup.rows))
        print_table(got, ["name", "auc", "planted_auc", "frozen_after_rows", "drift_period"])
        for r in got:
            print(f"  {r['name']} AUC per window: {[round(a, 3) for a in r['auc_per_window']]}")
        rows += got
    if "scaling" in chosen:
        ray_run = None if args.no_ray else (max(_ints(args.workers)), max(_ints(args.servers)))
        got = scaling_section(
            _run_workers,
            _ints(args.workers),
            _ints(args.servers),
            args.steps,
            args.repeats,
            ray_run,
        )
        print_table(got, ["name", "samples_per_s", "ms_per_step", "workers", "servers", "cpus"])
        for r in got:
            if "error" in r:
                print(f"  {r['name']} failed: {r['error']}", file=sys.stderr)
        rows += got
    print(f"load average at end: {os.getloadavg()}", flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

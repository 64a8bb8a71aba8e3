"""Sparse-package benchmarks. Memory section: EmbeddingTable bytes per row vs raw bytes.

For each (row count, row layout) a fresh subprocess grows a table from empty by inserting
random 64-bit IDs in batches and reports:

* ``bytes_per_row_ratio`` — ``table.nbytes() / (rows * raw)`` at the end, where raw is the
  8-byte key + ``width`` float32 (no counters in these runs);
* ``peak_nbytes_ratio`` — the worst such ratio seen after any batch once the table holds
  >= 10 % of the final rows (i.e. including right after segments grow);
* ``peak_rss_ratio`` — (process RSS high-water mark - RSS before the table existed) / raw bytes
  of the final rows: the honest cross-check, transient batch/rehash copies included.

It also measures lookup and lookup-or-insert throughput for a DLRM-sized batch of 2048 x 26 IDs.

    .venv/bin/python benchmarks/sparse_bench.py [--sizes 1000000,10000000] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

LAYOUTS = {
    # name: (dim, width) — width = dim + optimizer state columns
    "lr_ftrl": (1, 3),  # FTRL-Proximal: w, z, n
    "emb16_rowwise_adagrad": (16, 17),
    "emb16_adagrad": (16, 32),
}
BATCH = 1 << 18
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="1000000,10000000", help="comma-separated row counts")
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated layouts")
    ap.add_argument("--json", dest="json_out", help="write {'rows': [...]} here")
    ap.add_argument("--child", nargs=2, metavar=("LAYOUT", "ROWS"), help=argparse.SUPPRESS)
    ap.add_argument("--throughput", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.throughput)))
        return 0
    sizes = [int(s) for s in args.sizes.split(",") if s]
    layouts = [s for s in args.layouts.split(",") if s]
    for lay in layouts:
        if lay not in LAYOUTS:
            ap.error(f"unknown layout {lay!r}; choose from {', '.join(LAYOUTS)}")
    rows: list[dict[str, object]] = []
    hdr = f"{'layout':<24}{'rows':>12}{'B/row':>8}{'raw':>5}{'ratio':>7}{'peak':>7}{'rss':>7}"
    print(hdr + f"{'load':>7}{'build k/s':>11}{'lookup k/s':>12}{'ins k/s':>9}")
    for lay in layouts:
        for i, n in enumerate(sizes):
            cmd = [sys.executable, __file__, "--child", lay, str(n)]
            if i == 0:
                cmd.append("--throughput")
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                print(f"{lay} {n}: child failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
                return 1
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
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

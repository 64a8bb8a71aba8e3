"""Server hot path: CPU time of one shard's pull + push of a DLRM batch, without sockets.

26 tables x dim 64 x 100 k prefilled rows (row-wise AdaGrad), one batch of 2048 random IDs per
table (~2 k unique each). ``time.thread_time`` counts only this thread's CPU, so other load on
a shared machine barely moves it (unlike wall-clock samples/s). The caller passes a
:class:`~coadapt.sparse.server.CallerMemo` as a server connection does: the pull fills a reused
reply buffer and the push reuses the pull's row indices.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from coadapt.sparse.server import CallerMemo, ShardState, TableSpec


def hotpath_section(
    rows_per_table: int = 100_000, tables: int = 26, dim: int = 64, reps: int = 15
) -> list[dict[str, Any]]:
    specs = [TableSpec(f"t{i}", dim, "rowwise_adagrad", {"lr": 0.01}) for i in range(tables)]
    st = ShardState(specs)
    for t in range(tables):
        for a in range(0, rows_per_table, 20_000):
            st.pull(t, np.arange(a, min(a + 20_000, rows_per_table), dtype=np.uint64))
    rng = np.random.default_rng(0)
    ids = [np.unique(rng.integers(0, rows_per_table, 2048).astype(np.uint64)) for _ in specs]
    grads = [rng.standard_normal((k.size, dim)).astype(np.float32) * 1e-3 for k in ids]
    memo = CallerMemo()
    width = sum(k.size for k in ids) * dim

    def pull() -> None:
        reply = np.frombuffer(memo.buffer("reply", 4 * width), np.float32, width)
        off = 0
        for t, k in enumerate(ids):
            out = reply[off : off + k.size * dim].reshape(k.size, dim)
            st.pull(t, k, now=0, out=out, memo=memo)
            off += k.size * dim

    def push() -> None:
        for t, k in enumerate(ids):
            st.push(t, k, grads[t], now=0, memo=memo)

    pull_ms, push_ms = [], []
    for _ in range(reps + 1):
        t0 = time.thread_time()
        pull()
        t1 = time.thread_time()
        push()
        t2 = time.thread_time()
        pull_ms.append(1e3 * (t1 - t0))
        push_ms.append(1e3 * (t2 - t1))
    pull_ms, push_ms = pull_ms[1:], push_ms[1:]  # the first round warms the buffers
    return [
        {
            "name": "hotpath/server_pull_push",
            "unique_rows": int(sum(k.size for k in ids)),
            "pull_cpu_ms": float(np.median(pull_ms)),
            "push_cpu_ms": float(np.median(push_ms)),
            "pull_push_cpu_ms": float(np.median(np.add(pull_ms, push_ms))),
        }
    ]

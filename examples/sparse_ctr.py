"""Train LR / FM / DeepFM / Wide&Deep on planted Criteo-shaped data; report AUC vs the ceiling.

    .venv/bin/python examples/sparse_ctr.py --model deepfm --rows 200000 [--servers 2] [--json OUT]

Data comes from :mod:`coadapt.sparse.datasets` (no download): the last chunk is held out, and
the planted model's AUC on it is the ceiling. Sparse rows live in a local store, or with
``--servers N`` in N shard processes on 127.0.0.1 (stopped by PID at the end).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from coadapt.sparse.client import PSClient, SparseStore
from coadapt.sparse.datasets import PlantedConfig, iter_planted
from coadapt.sparse.models import (
    DeepFM,
    FactorizationMachine,
    LogisticRegression,
    auc,
    chunk_to_tensors,
    field_names,
)
from coadapt.sparse.server import TableSpec, running_servers

MODELS = ("lr", "fm", "deepfm", "widedeep")


def build(name: str, store: SparseStore | None, dim: int) -> nn.Module:
    if name == "lr":
        return LogisticRegression(store, optimizer="ftrl", hparams={"alpha": 1.0})
    if name == "fm":
        return FactorizationMachine(dim, store, hparams={"lr": 0.05, "init_scale": 0.01})
    return DeepFM(dim, fm=name == "deepfm", store=store, hparams={"lr": 0.05, "init_scale": 0.01})


def specs_for(name: str, dim: int) -> list[TableSpec]:
    """The server-side tables a model needs (same names and optimizers as its local mode)."""
    if name == "lr":
        return [TableSpec(n, 1, "ftrl", {"alpha": 1.0}) for n in field_names("lr_C")]
    pre = "fm_" if name == "fm" else "dfm_"
    hp = {"lr": 0.05, "init_scale": 0.01}
    return [TableSpec(n, 1, "adagrad", hp) for n in field_names(pre + "w")] + [
        TableSpec(n, dim, "adagrad", hp) for n in field_names(pre + "v")
    ]


def run(args: argparse.Namespace, store: SparseStore | None) -> dict[str, object]:
    torch.manual_seed(args.seed)
    cfg = PlantedConfig(
        rows=args.rows,
        seed=args.seed,
        chunk_rows=args.batch * 32,
        zipf_min=args.zipf_min,
        zipf_max=args.zipf_max,
    )
    chunks = list(iter_planted(cfg))
    test, train = chunks[-1], chunks[:-1]
    if not train:
        raise SystemExit("--rows must cover at least two chunks (32 batches each)")
    model = build(args.model, store, args.dim)
    dense_opt = torch.optim.Adam(model.parameters(), lr=args.dense_lr)
    loss_fn = nn.BCEWithLogitsLoss()
    t0 = time.perf_counter()
    seen = 0
    for _epoch in range(args.epochs):
        for ch in train:
            d, c, y = chunk_to_tensors(ch)
            for a in range(0, y.numel(), args.batch):
                dense_opt.zero_grad()
                loss = loss_fn(
                    model(d[a : a + args.batch], c[a : a + args.batch]), y[a : a + args.batch]
                )
                loss.backward()  # pushes the sparse gradients
                dense_opt.step()
                seen += min(args.batch, y.numel() - a)
    secs = time.perf_counter() - t0
    d, c, y = chunk_to_tensors(test)
    with torch.no_grad():
        scores = torch.cat(
            [model(d[a : a + 4096], c[a : a + 4096]) for a in range(0, y.numel(), 4096)]
        )
    return {
        "name": f"example/{args.model}",
        "rows": args.rows,
        "auc": auc(scores.numpy(), test.labels),
        "planted_auc": auc(test.logit, test.labels),
        "samples_per_s": seen / secs,
        "servers": args.servers,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", choices=MODELS, default="deepfm")
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--dim", type=int, default=8)
    ap.add_argument("--servers", type=int, default=0, help="shard processes (0 = local store)")
    ap.add_argument("--zipf-min", type=float, default=1.05)
    ap.add_argument("--zipf-max", type=float, default=1.6)
    ap.add_argument("--dense-lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args(argv)
    if args.servers > 0:
        with (
            tempfile.TemporaryDirectory() as work,
            running_servers(specs_for(args.model, args.dim), args.servers, work) as procs,
            PSClient([p.address for p in procs]) as client,
        ):
            row = run(args, client)
    else:
        row = run(args, None)
    print(json.dumps(row), file=sys.stdout)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"rows": [row]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

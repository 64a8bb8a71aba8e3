"""Online CTR training from a growing sample file, as a coadapt sparse job.

    coadapt submit examples/sparse_online.yaml
    .venv/bin/python examples/sparse_online.py --rows 20000 --servers 2   # without a controller

Writes planted Criteo-shaped rows (:mod:`coadapt.sparse.datasets`, no download) to a file once,
then trains on it as a stream with :mod:`coadapt.sparse.online`: checkpoints carry the stream
offset, a killed worker or shard server resumes exactly once. In a job the shard servers are
the job's own (its ``sparse:`` section); append more rows to the file and the job picks them up
until the stream has been idle for ``--idle-exit-s``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from coadapt.protocol import ReplicaEnv
from coadapt.sparse import online
from coadapt.sparse.datasets import PlantedConfig, generate
from coadapt.sparse.jobs import MODELS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", choices=MODELS, default="lr")
    ap.add_argument("--rows", type=int, default=20_000, help="planted rows written to the stream")
    ap.add_argument("--stream", help="sample file (default: stream.tsv in the checkpoint dir)")
    ap.add_argument("--servers", type=int, default=2, help="shard servers outside a job")
    ap.add_argument("--idle-exit-s", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    env = ReplicaEnv.from_env()
    base = Path(env.checkpoint_dir or "sparse-online")
    stream = Path(args.stream) if args.stream else base / "stream.tsv"
    if env.rank == 0 and not stream.exists():  # only the lead worker reads the stream
        stream.parent.mkdir(parents=True, exist_ok=True)
        generate(PlantedConfig(rows=args.rows, seed=args.seed), stream)
    flags = ["--source", f"file:{stream}", "--model", args.model]
    flags += ["--idle-exit-s", str(args.idle_exit_s), "--seed", str(args.seed)]
    if env.sparse_dir is None:  # no controller: start our own servers
        flags += ["--servers", str(args.servers), "--ckpt-dir", os.fspath(base / "ckpt")]
    return online.main(flags)


if __name__ == "__main__":
    raise SystemExit(main())

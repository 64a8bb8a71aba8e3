"""``python -m coadapt.serve``: serve model directories, list / verify / activate versions.

    python -m coadapt.serve --model mlp=/models/mlp [--port 8000] [--workers N] [--slo-ms 50]
        [--table-shards N] [--shard-timeout-ms 1000]   # a sparse model's tables over N processes
    python -m coadapt.serve ls DIR
    python -m coadapt.serve verify DIR VERSION
    python -m coadapt.serve activate DIR VERSION     # promotion and rollback (the LIVE pointer)

The server spawns its workers with ``python -m coadapt.serve _worker``; ``coadapt serve`` is
the same commands on the CLI (both call :mod:`coadapt.serve.commands`). Exit codes: 0 ok, 1 a
refused version or a server that did not start, 2 bad usage.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

COMMANDS = ("run", "ls", "verify", "activate", "_worker", "_table_shard")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="coadapt serve", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="serve models (the default command)")
    run.add_argument("--model", action="append", default=[], metavar="NAME=DIR",
                     help="a model name and its version directory (repeatable)")  # fmt: skip
    run.add_argument("--host", default="127.0.0.1")
    run.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    run.add_argument("--workers", type=int, default=0, help="worker processes (0: one per core)")
    run.add_argument("--threads", type=int, default=0, help="torch threads per worker (0: auto)")
    run.add_argument("--slo-ms", type=float, default=50.0, help="p99 latency target (batching)")
    run.add_argument("--max-body", type=int, default=8 * 1024 * 1024, help="bytes")
    run.add_argument("--max-rows", type=int, default=4096, help="rows in one request")
    run.add_argument("--poll-s", type=float, default=0.2, help="how often to look for versions")
    run.add_argument("--accept", choices=("reuseport", "shared"), default="reuseport")
    run.add_argument(
        "--forward-thread", action="store_true", help="forwards on a thread (long forwards)"
    )
    run.add_argument(
        "--table-shards",
        type=int,
        default=0,
        help="sparse tables held by N table-shard processes (0: in each worker)",
    )
    run.add_argument("--shard-timeout-ms", type=float, default=1000.0,
                     help="deadline of one batch's table-shard look-ups (then 503)")  # fmt: skip
    ls = sub.add_parser("ls", help="list complete versions")
    ls.add_argument("dir")
    for name in ("verify", "activate"):
        c = sub.add_parser(name, help=f"{name} a version")
        c.add_argument("dir")
        c.add_argument("version")
    w = sub.add_parser("_worker", help=argparse.SUPPRESS)
    w.add_argument("--index", type=int, required=True)
    w.add_argument("--listen-fd", type=int, required=True)
    w.add_argument("--port", type=int, required=True)
    w.add_argument("--ready-fd", type=int, required=True)
    w.add_argument("--config", required=True)
    t = sub.add_parser("_table_shard", help=argparse.SUPPRESS)
    t.add_argument("--index", type=int, required=True)
    t.add_argument("--ready-fd", type=int, required=True)
    t.add_argument("--config", required=True)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if not args_in or args_in[0] not in (*COMMANDS, "-h", "--help"):
        args_in.insert(0, "run")
    try:
        args = _parser().parse_args(args_in)
    except SystemExit as exc:  # --help (0) or a usage error (2): main returns, never exits
        return exc.code if isinstance(exc.code, int) else 2

    from coadapt.serve import commands

    if args.cmd == "ls":
        return commands.list_versions(args.dir)
    if args.cmd in ("verify", "activate"):
        return commands.check_version(args.dir, args.version, activate=args.cmd == "activate")
    if args.cmd == "_worker":
        from coadapt.serve.config import ServeConfig
        from coadapt.serve.workers import worker_main

        return worker_main(ServeConfig.from_json(args.config), args.index, args.listen_fd,
                           args.port, args.ready_fd)  # fmt: skip
    if args.cmd == "_table_shard":
        from coadapt.serve.config import ServeConfig
        from coadapt.serve.table_shards import table_shard_main

        cfg = ServeConfig.from_json(args.config)
        return table_shard_main(cfg.models, args.index, cfg.table_shards, cfg.shard_socket_dir,
                                cfg.poll_s, args.ready_fd)  # fmt: skip
    return commands.run_server(
        args.model, host=args.host, port=args.port, workers=args.workers,
        threads=args.threads, slo_ms=args.slo_ms, max_body=args.max_body,
        max_rows=args.max_rows, poll_s=args.poll_s, accept=args.accept,
        forward_thread=args.forward_thread, table_shards=args.table_shards,
        shard_timeout_ms=args.shard_timeout_ms,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

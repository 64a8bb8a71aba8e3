"""``coadapt serve run|ls|verify|activate``: the model server and its versions.

The work is :mod:`coadapt.serve.commands` (``python -m coadapt.serve`` calls the same
functions; the server's worker processes are started that way).
"""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(add_completion=False)
serve_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Serve trained models: dynamic batching to a latency SLO, hot swap, versions.",
)
app.add_typer(serve_app, name="serve")

RootArg = Annotated[str, typer.Argument(metavar="DIR", help="a model's version root")]
VersionArg = Annotated[str, typer.Argument(metavar="VERSION", help="a version in DIR")]


@serve_app.command("run")
def run(
    model: Annotated[
        list[str],
        typer.Option(
            "--model", metavar="NAME=DIR", help="a model name and its version root (repeatable)"
        ),
    ],
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="0 picks a free port")] = 8000,
    workers: Annotated[int, typer.Option(min=0, help="worker processes (0: one per core)")] = 0,
    threads: Annotated[int, typer.Option(min=0, help="torch threads per worker (0: auto)")] = 0,
    slo_ms: Annotated[
        float, typer.Option(min=0.1, help="p99 latency target the batch size follows")
    ] = 50.0,
    max_body: Annotated[int, typer.Option(min=1, help="largest request body, bytes")] = 8 << 20,
    max_rows: Annotated[int, typer.Option(min=1, help="most rows in one request")] = 4096,
    poll_s: Annotated[float, typer.Option(min=0.01, help="how often to look for versions")] = 0.2,
    accept: Annotated[
        str, typer.Option(help="reuseport (one socket per worker) or shared (one socket)")
    ] = "reuseport",
    forward_thread: Annotated[
        bool, typer.Option("--forward-thread", help="run forwards on a thread (long forwards)")
    ] = False,
    table_shards: Annotated[
        int,
        typer.Option(
            min=0, max=255, help="sparse tables held by N table-shard processes (0: in each worker)"
        ),
    ] = 0,
    shard_timeout_ms: Annotated[
        float, typer.Option(min=0.1, help="deadline of one batch's table-shard look-ups (503)")
    ] = 1000.0,
) -> int:
    """Serve the live version of each model until SIGTERM/SIGINT."""
    if accept not in ("reuseport", "shared"):
        raise typer.BadParameter("must be reuseport or shared", param_hint="--accept")
    from coadapt.serve.commands import run_server

    return run_server(
        model,
        host=host,
        port=port,
        workers=workers,
        threads=threads,
        slo_ms=slo_ms,
        max_body=max_body,
        max_rows=max_rows,
        poll_s=poll_s,
        accept=accept,
        forward_thread=forward_thread,
        table_shards=table_shards,
        shard_timeout_ms=shard_timeout_ms,
    )


@serve_app.command("ls")
def ls(root: RootArg) -> int:
    """List a model's complete versions (* marks the live one)."""
    from coadapt.serve.commands import list_versions

    return list_versions(root)


@serve_app.command("verify")
def verify(root: RootArg, version: VersionArg) -> int:
    """Check a version: checksums, shapes, finite values."""
    from coadapt.serve.commands import check_version

    return check_version(root, version)


@serve_app.command("activate")
def activate(root: RootArg, version: VersionArg) -> int:
    """Verify a version and make it live (promotion and rollback; servers swap to it)."""
    from coadapt.serve.commands import check_version

    return check_version(root, version, activate=True)

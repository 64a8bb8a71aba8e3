"""``coadapt deploy``: deployments (served models with a latency SLO) on a live controller.

    coadapt deploy SPEC.yaml        create a deployment; prints its URL
    coadapt deploy ls               your deployments: replicas, load, p99 vs SLO, shed, errors
    coadapt deploy show NAME        one deployment and its replicas
    coadapt deploy rm NAME          stop serving it (its replicas and gateway stop)

The first argument is a sub-command or a spec file (a file named like a sub-command: write
``./ls``). Same controller and token lookup and exit codes as the job commands: 0 ok, 2 invalid
input or a refused action (4xx), 3 controller unreachable.
"""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import typer

from coadapt.cli.output import (
    EXIT_INPUT,
    JsonOpt,
    OutputOpt,
    RetryOpt,
    ServerOpt,
    StateDirOpt,
    Target,
    TokenOpt,
    fmt,
    print_json,
    run_client,
    table,
    wants_json,
)
from coadapt.controller.client import DEFAULT_RETRY_S, Client

app = typer.Typer(add_completion=False)


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def _replicas(d: dict[str, Any]) -> str:
    """``ready/desired`` (``desired`` before the first round: what the plane is starting)."""
    r = d["replicas"]
    desired = r["desired"] if r["desired"] is not None else r["ready"] + r["starting"]
    return f"{r['ready']}/{desired}"


def _row(d: dict[str, Any]) -> list[str]:
    live = d["live"] or {}
    return [
        d["name"],
        d["tenant"],
        f"{d['model']}@{d['version']}",
        d["state"],
        _replicas(d),
        fmt(live.get("requests_per_s")),
        f"{_ms(live.get('latency_q_s'))}/{_ms(d['slo_s'])}",
        fmt(live.get("shed_total")),
        fmt(live.get("errors_total")),
        d["url"],
    ]


HEADER = ["NAME", "TENANT", "MODEL", "STATE", "READY", "REQ/S", "P99/SLO MS", "SHED", "ERRORS"]


def _create(client: Client, path: Path, as_json: bool) -> int:
    from coadapt.controller.specfile import read_spec_mapping
    from coadapt.deploy.spec import parse_deployment_spec

    spec = read_spec_mapping(path, "a deployment spec")
    parse_deployment_spec(spec)  # a bad file names each field here, before anything is sent
    d = client.create_deployment(spec)
    if as_json:
        print_json(d)
    else:
        print(f"{d['name']}  {d['url']}  (model {d['model']}, version {d['version']})")
    return 0


def _ls(client: Client, as_json: bool) -> int:
    deployments = client.deployments()
    if as_json:
        print_json(deployments)
    else:
        table([_row(d) for d in deployments], [*HEADER, "URL"])
    return 0


def _show(client: Client, name: str, as_json: bool) -> int:
    data = client.deployment(name)
    if as_json:
        print_json(data)
        return 0
    d, spec = data["deployment"], data["deployment"]["spec"]
    live = d["live"]
    print(f"{d['name']}  ({d['tenant']})  {d['state']}  {d['url']}")
    print(f"  model {d['model']}@{d['version']}  root {d['model_root']}")
    print(
        f"  SLO p{spec['slo_quantile'] * 100:g} <= {spec['slo_ms']:g} ms; replicas "
        f"{spec['min_replicas']}-{spec['max_replicas']}, ready/desired {_replicas(d)}; "
        f"scale to zero after {fmt(spec['scale_to_zero_s'], 0)} s; priority {spec['priority']}"
    )
    if live is None:
        print("  gateway: no figures (not answering yet)")
    else:
        print(
            f"  load {live['requests_per_s']:.1f} req/s, p99 {_ms(live['latency_q_s'])} ms, "
            f"within SLO {fmt(live['slo_attainment'], 4)}, shed {live['shed_total']}, "
            f"errors {live['errors_total']}, held {live['held_now']}"
        )
    print(f"  created {_when(d['created_at'])}")
    rows = [
        [
            str(r["id"]),
            f"{r['node']}:{r['slot']}",
            str(r["port"]),
            r["status"],
            fmt(r["pid"]),
            _when(r["started_at"]),
            _when(r["ready_at"]),
            r["reason"] or "-",
        ]
        for r in data["replicas"]
        if r["status"] != "exited"
    ]
    table(rows, ["REPLICA", "SLOT", "PORT", "STATUS", "PID", "STARTED", "READY", "REASON"])
    return 0


def _rm(client: Client, name: str, as_json: bool) -> int:
    d = client.delete_deployment(name)
    if as_json:
        print_json(d)
    else:
        print(f"{d['name']}: {d['state']} (its replicas and gateway stop)")
    return 0


HELP = (
    "Create, list, show or remove deployments (served models with a latency SLO).\n\n"
    "[bold]coadapt deploy SPEC.yaml[/bold]: create one and print its URL.\n\n"
    "[bold]coadapt deploy ls[/bold]: replicas ready/desired, load, p99 vs SLO, shed, errors.\n\n"
    "[bold]coadapt deploy show NAME[/bold]: one deployment and its replicas.\n\n"
    "[bold]coadapt deploy rm NAME[/bold]: stop serving it.\n\n"
    "Exit codes: 0 ok, 2 invalid input or a refused action, 3 controller unreachable."
)


@app.command("deploy", help=HELP, no_args_is_help=True)
def deploy(
    what: Annotated[
        str, typer.Argument(metavar="SPEC.yaml|ls|show|rm", help="a spec file or a sub-command")
    ],
    name: Annotated[
        str | None, typer.Argument(metavar="[NAME]", help="the deployment (show, rm)")
    ] = None,
    json_: JsonOpt = False,
    output: OutputOpt = "table",
    server: ServerOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    retry: RetryOpt = DEFAULT_RETRY_S,
) -> int:
    as_json = wants_json(output, json_)
    if what in ("show", "rm") and name is None:
        print(f"coadapt: deploy {what} needs a deployment NAME", file=sys.stderr)
        return EXIT_INPUT
    if what not in ("show", "rm") and name is not None:
        print(
            f"coadapt: unexpected argument {name!r}: `coadapt deploy SPEC.yaml`, "
            "`coadapt deploy ls`, or `coadapt deploy show|rm NAME`",
            file=sys.stderr,
        )
        return EXIT_INPUT

    ref = name or ""

    def go(client: Client) -> int:
        if what == "ls":
            return _ls(client, as_json)
        if what == "show":
            return _show(client, ref, as_json)
        if what == "rm":
            return _rm(client, ref, as_json)
        return _create(client, Path(what), as_json)

    return run_client(Target(server, token, state_dir, retry), go)

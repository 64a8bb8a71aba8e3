"""CLI sub-commands of the live cluster: ``server``, ``submit``, ``ls``, ``show``, ``logs``,
``cancel``, ``wait``, ``cluster`` and ``tenant create``.

Client commands find the controller from ``--server``, ``$COADAPT_SERVER``, the local state
dir's ``server.json``, or the default port; the token from ``--token``, ``$COADAPT_TOKEN``,
or the local state dir's ``admin-token``. Reads (and ``cancel``) ride out a controller
restart: they retry an unreachable controller for ``--retry`` seconds (``wait``: until its
``--timeout``, or for ever without one). Exit codes: 0 ok, 1 a job failed / timed out,
2 invalid input (4xx), 3 controller unreachable.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Annotated, Literal

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
    resolve_state_dir,
    run_client,
    table,
    wants_json,
)
from coadapt.controller.client import DEFAULT_RETRY_S, Client
from coadapt.controller.errors import ControllerError
from coadapt.controller.paths import DEFAULT_PORT

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")

app = typer.Typer(add_completion=False)
tenant_app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Manage tenants (admin token)."
)
app.add_typer(tenant_app, name="tenant")

JobsArg = Annotated[list[str], typer.Argument(metavar="JOB...", show_default=False)]
PollOpt = Annotated[float, typer.Option("--poll", hidden=True)]


@app.command("submit")
def submit(
    files: Annotated[list[Path], typer.Argument(metavar="FILE...", help="job spec files")],
    server: ServerOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    retry: RetryOpt = DEFAULT_RETRY_S,
) -> int:
    """Submit job specs (YAML/JSON); prints each new job's id.

    Every file is validated before it is sent: a bad spec names each field and exits 2."""
    from coadapt.controller.specfile import load_spec_file

    def go(client: Client) -> int:
        for path in files:
            print(client.submit(load_spec_file(path))["id"])
        return 0

    return run_client(Target(server, token, state_dir, retry), go)


@app.command("ls")
def ls(
    state: Annotated[
        list[str] | None,
        typer.Option("--state", metavar="STATE", help="only jobs in this state (repeatable)"),
    ] = None,
    json_: JsonOpt = False,
    output: OutputOpt = "table",
    server: ServerOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    retry: RetryOpt = DEFAULT_RETRY_S,
) -> int:
    """List jobs: id, tenant, state, replicas, batch size, step, restarts."""

    def go(client: Client) -> int:
        jobs = client.jobs(state)
        if wants_json(output, json_):
            print_json(jobs)
            return 0
        rows = [
            [
                j["id"],
                j["name"],
                j["tenant"],
                j["state"],
                str(j["replicas"]),
                fmt(j["batch_size"]),
                fmt(j["step"]),
                str(j["restarts"]),
            ]
            for j in jobs
        ]
        table(rows, ["ID", "NAME", "TENANT", "STATE", "REPLICAS", "BATCH", "STEP", "RESTARTS"])
        return 0

    return run_client(Target(server, token, state_dir, retry), go)


_SHOWN = (
    "id",
    "name",
    "tenant",
    "state",
    "reason",
    "replicas",
    "desired_replicas",
    "attempt",
    "restarts",
    "failures",
    "batch_size",
    "local_bsz",
    "accum_steps",
    "step",
    "epoch",
    "loss",
    "goodput",
    "speedup",
    "attained_service",
    "metrics",
)


@app.command("show")
def show(
    job: Annotated[str, typer.Argument(metavar="JOB", help="job id")],
    json_: JsonOpt = False,
    output: OutputOpt = "table",
    events: Annotated[
        int, typer.Option("--events", min=0, help="how many recent events to show")
    ] = 20,
    server: ServerOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    retry: RetryOpt = DEFAULT_RETRY_S,
) -> int:
    """Show one job and its recent events."""

    def go(client: Client) -> int:
        data = client.job(job)
        if wants_json(output, json_):
            print_json(data)
            return 0
        for key in _SHOWN:
            print(f"{key:>17}: {fmt(data.get(key), 3)}")
        print("           events:")
        recent = client.events(job)[-events:] if events else []
        for e in recent:
            print(
                f"    {time.strftime('%H:%M:%S', time.localtime(e['time']))} "
                f"{e['kind']:<13} {e['message']}"
            )
        return 0

    return run_client(Target(server, token, state_dir, retry), go)


@app.command("logs")
def logs(
    job: Annotated[str, typer.Argument(metavar="JOB", help="job id")],
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="follow until the job ends")
    ] = False,
    rank: Annotated[int, typer.Option("--rank", min=0, help="replica rank")] = 0,
    attempt: Annotated[
        int | None,
        typer.Option("--attempt", min=1, show_default=False, help="attempt (default: the latest)"),
    ] = None,
    poll: PollOpt = 1.0,
    server: ServerOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    retry: RetryOpt = DEFAULT_RETRY_S,
) -> int:
    """Print a job's log (one replica's, one attempt's); -f follows into later attempts."""

    def go(client: Client) -> int:
        current, offset = attempt, 0
        while True:
            chunk = client.logs(job, offset=offset, rank=rank, attempt=current)
            if chunk["text"]:
                sys.stdout.write(chunk["text"])
                sys.stdout.flush()
            offset = chunk["next_offset"]
            if not follow:
                return 0
            if chunk["text"]:
                continue
            if attempt is None and chunk["latest_attempt"] > chunk["attempt"]:
                current, offset = chunk["latest_attempt"], 0  # follow into the next attempt
                print(f"--- attempt {current} ---", flush=True)
                continue
            if chunk["state"] in TERMINAL:
                return 0
            time.sleep(poll)

    return run_client(Target(server, token, state_dir, retry), go)


@app.command("cancel")
def cancel(
    jobs: JobsArg,
    server: ServerOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    retry: RetryOpt = DEFAULT_RETRY_S,
) -> int:
    """Cancel jobs; prints "JOB CANCELLED" for each."""

    def go(client: Client) -> int:
        for job_id in jobs:
            print(f"{client.cancel(job_id)['id']} CANCELLED")
        return 0

    return run_client(Target(server, token, state_dir, retry), go)


@app.command("wait")
def wait(
    jobs: JobsArg,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout", metavar="SECONDS", show_default=False, help="give up after (exit 1)"
        ),
    ] = None,
    poll: PollOpt = 1.0,
    server: ServerOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    retry: RetryOpt = DEFAULT_RETRY_S,
) -> int:
    """Wait for jobs to finish; exit 0 if all succeeded, else 1.

    An unreachable controller (restarting) is retried until --timeout (for ever without one),
    not reported as exit 3 at once."""

    def go(client: Client) -> int:
        deadline = time.monotonic() + timeout if timeout is not None else None
        while True:
            until = deadline if deadline is not None else math.inf
            states = {j: client.job(j, retry_until=until)["state"] for j in jobs}
            if all(s in TERMINAL for s in states.values()):
                for j, s in states.items():
                    print(f"{j} {s}")
                return 0 if all(s == "SUCCEEDED" for s in states.values()) else 1
            if deadline is not None and time.monotonic() >= deadline:
                for j, s in states.items():
                    print(f"{j} {s}")
                print(f"coadapt: timed out after {timeout}s", file=sys.stderr)
                return 1
            time.sleep(poll)

    return run_client(Target(server, token, state_dir, retry), go)


@app.command("cluster")
def cluster(
    json_: JsonOpt = False,
    output: OutputOpt = "table",
    server: ServerOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    retry: RetryOpt = DEFAULT_RETRY_S,
) -> int:
    """Slots, allocations, goodput and batch sizes of the running jobs."""

    def go(client: Client) -> int:
        state = client.cluster()
        if wants_json(output, json_):
            print_json(state)
            return 0
        rnd = state.get("round") or {}
        print(
            f"policy {state['policy']}: {state['used']}/{state['slots']} slots used; "
            f"{rnd.get('count', 0)} rounds"
        )
        rows = [
            [
                j["id"],
                j["state"],
                str(j["replicas"]),
                str(j["desired_replicas"]),
                ",".join(str(s) for s in j["slots"]) or "-",
                fmt(j["batch_size"]),
                fmt(j["goodput"]),
                fmt(j["speedup"], 2),
                fmt(j["step"]),
            ]
            for j in state["jobs"]
        ]
        header = ["ID", "STATE", "REPLICAS", "DESIRED", "SLOTS", "BATCH", "GOODPUT", "SPEEDUP"]
        table(rows, [*header, "STEP"])
        for node in state.get("nodes") or ():  # GPU type of each node (older servers: none)
            print(
                f"node {node['name']}: {node.get('gpu_type', '-')}, "
                f"{node['used']}/{node['slots']} slots used"
            )
        return 0

    return run_client(Target(server, token, state_dir, retry), go)


@tenant_app.command("create")
def tenant_create(
    name: Annotated[str, typer.Argument(metavar="NAME", help="tenant name")],
    server: ServerOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    retry: RetryOpt = DEFAULT_RETRY_S,
) -> int:
    """Create a tenant; prints its token."""

    def go(client: Client) -> int:
        print(client.create_tenant(name)["token"])
        return 0

    return run_client(Target(server, token, state_dir, retry), go)


def _tenant_users(pairs: list[str]) -> dict[str, str]:
    """``--run-as-tenant alice=alice`` (repeatable) -> {"alice": "alice"}."""
    out: dict[str, str] = {}
    for pair in pairs:
        tenant, sep, user = pair.partition("=")
        if not sep or not tenant or not user:
            raise ControllerError(
                f"--run-as-tenant: {pair!r} is invalid; accepted: TENANT=USER[:GROUP]"
            )
        out[tenant] = user
    return out


@app.command("server")
def server(
    state_dir_: Annotated[
        str | None,
        typer.Option(
            "--state-dir",
            metavar="DIR",
            show_default=False,
            help="state directory (default: $COADAPT_STATE_DIR or ~/.coadapt)",
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="port to listen on")] = DEFAULT_PORT,
    db: Annotated[
        str | None,
        typer.Option(
            metavar="URL",
            show_default=False,
            help="database URL, e.g. postgresql://USER@HOST/DB (default: SQLite in the state dir)",
        ),
    ] = None,
    slots: Annotated[
        str | None,
        typer.Option(
            metavar="N|TYPE:N[,TYPE:N]",
            show_default=False,
            help="slots: a count, or per GPU type, e.g. a100:4 or a100:2,t4:2 (default: the "
            "GPUs by detected type, else the CPUs)",
        ),
    ] = None,
    policy: Annotated[
        str, typer.Option(help="pollux, pollux-ga, tiresias, optimus or fifo")
    ] = "pollux",
    interval: Annotated[
        float, typer.Option(metavar="SECONDS", help="seconds between scheduling rounds")
    ] = 60.0,
    tick: Annotated[
        float, typer.Option(metavar="SECONDS", help="seconds between observations")
    ] = 0.5,
    stop_grace: Annotated[
        float, typer.Option(metavar="SECONDS", help="seconds from SIGTERM to SIGKILL")
    ] = 30.0,
    restart_delay: Annotated[
        float,
        typer.Option(metavar="SECONDS", help="re-allocation cost the policy assumes (seconds)"),
    ] = 30.0,
    backoff: Annotated[
        float, typer.Option(metavar="SECONDS", help="first retry delay of a failed job")
    ] = 2.0,
    seed: Annotated[int, typer.Option(help="seed of the policy's randomness")] = 0,
    tune_policy: Annotated[
        str, typer.Option(help="cross-tenant tuning policy: ei-per-gpu, algorithm1 or fifo")
    ] = "ei-per-gpu",
    executor: Annotated[str, typer.Option(help="where replicas run: local or ray")] = "local",
    ray_address: Annotated[
        str | None,
        typer.Option(
            metavar="HOST:PORT",
            show_default=False,
            help="Ray cluster to join, e.g. HEAD_IP:6379 (default: start a local Ray)",
        ),
    ] = None,
    ray_slot_resource: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            show_default=False,
            help="Ray resource that counts slots (default: GPU if the cluster has GPUs, else CPU)",
        ),
    ] = None,
    ray_namespace: Annotated[
        str, typer.Option(help="Ray namespace of actors and placement groups")
    ] = "coadapt",
    placement_timeout: Annotated[
        float,
        typer.Option(
            metavar="SECONDS", help="seconds before an unplaced Ray placement group is given up"
        ),
    ] = 60.0,
    shared_dir: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR",
            show_default=False,
            help="job checkpoints and logs, on a path every node mounts (default: the state dir)",
        ),
    ] = None,
    isolation: Annotated[
        Literal["auto", "namespace", "user", "none"],
        typer.Option(
            metavar="MODE",
            help="replica confinement (docs/security.md): auto (the strongest available), "
            "namespace (private mounts + PID namespace), user (run-as user only), none",
        ),
    ] = "auto",
    run_as: Annotated[
        str | None,
        typer.Option(
            metavar="USER[:GROUP]",
            show_default=False,
            help="unprivileged user replicas run as (root controller; default nobody)",
        ),
    ] = None,
    run_as_tenant: Annotated[
        list[str] | None,
        typer.Option(
            metavar="TENANT=USER",
            show_default=False,
            help="run one tenant's replicas as their own user: TENANT=USER[:GROUP] (repeatable)",
        ),
    ] = None,
    memory_per_slot: Annotated[
        str | None,
        typer.Option(
            metavar="SIZE",
            show_default=False,
            help="memory limit of each replica, e.g. 16G (cgroup v2/v1, else RLIMIT_AS); a "
            "replica past it is reported out of memory",
        ),
    ] = None,
    colocation: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            show_default=False,
            help="GPU sharing: measured co-location throughputs, JSON rows {a, b, a_fraction, "
            "b_fraction} or CSV with that header (docs/hetero.md; e.g. "
            "examples/colocation_gavel.json); jobs with a packing_key may then share a slot",
        ),
    ] = None,
) -> int:
    """Run the controller: the REST API, the dashboard and the scheduling loop."""
    from coadapt.controller.colocation import load_colocation
    from coadapt.executors.gpu_types import parse_slots
    from coadapt.service import ServerOptions, serve

    try:
        slot_counts = parse_slots(slots) if slots is not None else None
    except ValueError as exc:
        print(f"coadapt server: {exc}", file=sys.stderr)
        return EXIT_INPUT
    try:
        table = load_colocation(colocation) if colocation is not None else {}
        return serve(
            ServerOptions(
                state_dir=resolve_state_dir(state_dir_),
                host=host,
                port=port,
                db=db,
                slots=slot_counts,
                policy=policy,
                interval=interval,
                tick=tick,
                stop_grace=stop_grace,
                restart_delay=restart_delay,
                backoff=backoff,
                seed=seed,
                tune_policy=tune_policy,
                executor=executor,
                ray_address=ray_address,
                ray_slot_resource=ray_slot_resource,
                ray_namespace=ray_namespace,
                placement_timeout=placement_timeout,
                shared_dir=shared_dir,
                isolation=isolation,
                run_as=run_as,
                run_as_tenant=_tenant_users(run_as_tenant or []),
                memory_per_slot=memory_per_slot,
                colocation=table,
            )
        )
    except ControllerError as exc:
        print(f"coadapt server: {exc.message}", file=sys.stderr)
        return EXIT_INPUT

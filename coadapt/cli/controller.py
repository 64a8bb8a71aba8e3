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

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from coadapt.cli.output import fmt, run_client, state_dir, table
from coadapt.controller.client import DEFAULT_RETRY_S, Client
from coadapt.controller.errors import ControllerError
from coadapt.controller.paths import DEFAULT_PORT

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def cmd_submit(client: Client, args: argparse.Namespace) -> int:
    from coadapt.controller.specfile import load_spec_file

    for path in args.files:
        job = client.submit(load_spec_file(path))
        print(job["id"])
    return 0


def cmd_ls(client: Client, args: argparse.Namespace) -> int:
    jobs = client.jobs(args.state)
    if args.json:
        print(json.dumps(jobs, indent=2))
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


def cmd_show(client: Client, args: argparse.Namespace) -> int:
    job = client.job(args.job)
    if args.json:
        print(json.dumps(job, indent=2))
        return 0
    for key in (
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
    ):
        print(f"{key:>17}: {fmt(job.get(key), 3)}")
    print("           events:")
    for e in client.events(args.job)[-args.events :]:
        print(
            f"    {time.strftime('%H:%M:%S', time.localtime(e['time']))} "
            f"{e['kind']:<13} {e['message']}"
        )
    return 0


def cmd_logs(client: Client, args: argparse.Namespace) -> int:
    attempt = args.attempt
    offset = 0
    while True:
        chunk = client.logs(args.job, offset=offset, rank=args.rank, attempt=attempt)
        if chunk["text"]:
            sys.stdout.write(chunk["text"])
            sys.stdout.flush()
        offset = chunk["next_offset"]
        if not args.follow:
            return 0
        if chunk["text"]:
            continue
        if args.attempt is None and chunk["latest_attempt"] > chunk["attempt"]:
            attempt, offset = chunk["latest_attempt"], 0  # follow into the next attempt
            print(f"--- attempt {attempt} ---", flush=True)
            continue
        if chunk["state"] in TERMINAL:
            return 0
        time.sleep(args.poll)


def cmd_cancel(client: Client, args: argparse.Namespace) -> int:
    for job_id in args.jobs:
        print(f"{client.cancel(job_id)['id']} CANCELLED")
    return 0


def cmd_wait(client: Client, args: argparse.Namespace) -> int:
    """Poll until every job is terminal; an unreachable controller (restarting) is retried
    until ``--timeout`` (for ever without one), not reported as exit 3 at once."""
    deadline = time.monotonic() + args.timeout if args.timeout is not None else None
    while True:
        until = deadline if deadline is not None else math.inf
        states = {j: client.job(j, retry_until=until)["state"] for j in args.jobs}
        if all(s in TERMINAL for s in states.values()):
            for j, s in states.items():
                print(f"{j} {s}")
            return 0 if all(s == "SUCCEEDED" for s in states.values()) else 1
        if deadline is not None and time.monotonic() >= deadline:
            for j, s in states.items():
                print(f"{j} {s}")
            print(f"coadapt: timed out after {args.timeout}s", file=sys.stderr)
            return 1
        time.sleep(args.poll)


def cmd_cluster(client: Client, args: argparse.Namespace) -> int:
    state = client.cluster()
    if args.json:
        print(json.dumps(state, indent=2))
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
    table(
        rows, ["ID", "STATE", "REPLICAS", "DESIRED", "SLOTS", "BATCH", "GOODPUT", "SPEEDUP", "STEP"]
    )
    return 0


def cmd_tenant_create(client: Client, args: argparse.Namespace) -> int:
    t = client.create_tenant(args.name)
    print(t["token"])
    return 0


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


def cmd_server(args: argparse.Namespace) -> int:
    from coadapt.service import ServerOptions, serve

    try:
        return serve(
            ServerOptions(
                state_dir=state_dir(args),
                host=args.host,
                port=args.port,
                db=args.db,
                slots=args.slots,
                policy=args.policy,
                interval=args.interval,
                tick=args.tick,
                stop_grace=args.stop_grace,
                restart_delay=args.restart_delay,
                backoff=args.backoff,
                seed=args.seed,
                tune_policy=args.tune_policy,
                executor=args.executor,
                ray_address=args.ray_address,
                ray_slot_resource=args.ray_slot_resource,
                ray_namespace=args.ray_namespace,
                placement_timeout=args.placement_timeout,
                shared_dir=Path(args.shared_dir) if args.shared_dir else None,
                isolation=args.isolation,
                run_as=args.run_as,
                run_as_tenant=_tenant_users(args.run_as_tenant),
                memory_per_slot=args.memory_per_slot,
            )
        )
    except ControllerError as exc:
        print(f"coadapt server: {exc.message}", file=sys.stderr)
        return 2


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; accepted: seconds >= 0")
    return value


def add_parsers(subparsers: Any) -> None:
    """Register the live-cluster sub-commands on a ``coadapt`` sub-parser collection."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--server",
        default=None,
        help="controller URL (default: $COADAPT_SERVER, the state dir's "
        f"server.json, or http://127.0.0.1:{DEFAULT_PORT})",
    )
    common.add_argument(
        "--token", default=None, help="API token (default: $COADAPT_TOKEN or the local admin token)"
    )
    common.add_argument(
        "--state-dir", default=None, help="local state dir ($COADAPT_STATE_DIR or ~/.coadapt)"
    )
    common.add_argument(
        "--retry",
        type=_non_negative,
        default=DEFAULT_RETRY_S,
        metavar="SECONDS",
        help="how long a read retries an unreachable (restarting) controller "
        f"(default {DEFAULT_RETRY_S:.0f}; 0: fail at once)",
    )

    p = subparsers.add_parser("server", help="run the controller (API + scheduler)")
    p.add_argument("--state-dir", default=None, help="state directory (default ~/.coadapt)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument(
        "--db",
        default=None,
        help="database URL (default: SQLite in the state dir; or postgresql://USER@HOST/DB)",
    )
    p.add_argument(
        "--slots", type=int, default=None, help="CPU slots (default: the GPUs, else the CPU count)"
    )
    p.add_argument(
        "--policy", default="pollux", help="pollux (default), pollux-ga, tiresias, optimus or fifo"
    )
    p.add_argument("--interval", type=float, default=60.0, help="seconds between rounds")
    p.add_argument("--tick", type=float, default=0.5, help="seconds between observations")
    p.add_argument("--stop-grace", type=float, default=30.0, help="seconds from SIGTERM to SIGKILL")
    p.add_argument(
        "--restart-delay",
        type=float,
        default=30.0,
        help="re-allocation cost the policy assumes (seconds)",
    )
    p.add_argument("--backoff", type=float, default=2.0, help="first retry delay (seconds)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--tune-policy",
        default="ei-per-gpu",
        help="cross-tenant tuning policy: ei-per-gpu (default), algorithm1 or fifo",
    )
    p.add_argument("--executor", default="local", help="where replicas run: local (default) or ray")
    p.add_argument(
        "--ray-address",
        default=None,
        help="Ray cluster to join, e.g. HEAD_IP:6379 (default: start a local Ray)",
    )
    p.add_argument(
        "--ray-slot-resource",
        default=None,
        help="Ray resource that counts slots (default: GPU if the cluster has GPUs, else CPU)",
    )
    p.add_argument("--ray-namespace", default="coadapt", help="Ray namespace of actors and groups")
    p.add_argument(
        "--placement-timeout",
        type=float,
        default=60.0,
        help="seconds before an unplaced Ray placement group is given up",
    )
    p.add_argument(
        "--shared-dir",
        default=None,
        help="job checkpoints and logs, on a path every node mounts (default: the state dir)",
    )
    p.add_argument(
        "--isolation",
        default="auto",
        choices=("auto", "namespace", "user", "none"),
        help="replica confinement (docs/security.md): auto (default: the strongest available), "
        "namespace (private mounts + PID namespace), user (run-as user only), none",
    )
    p.add_argument(
        "--run-as",
        default=None,
        metavar="USER[:GROUP]",
        help="unprivileged user replicas run as (root controller; default nobody)",
    )
    p.add_argument(
        "--run-as-tenant",
        action="append",
        default=[],
        metavar="TENANT=USER[:GROUP]",
        help="run one tenant's replicas as their own user (repeatable)",
    )
    p.add_argument(
        "--memory-per-slot",
        default=None,
        metavar="SIZE",
        help="memory limit of each replica, e.g. 16G (cgroup v2/v1, else RLIMIT_AS); a replica "
        "past it is reported out of memory",
    )
    p.set_defaults(func=cmd_server)

    p = subparsers.add_parser("submit", parents=[common], help="submit job specs (YAML/JSON)")
    p.add_argument("files", nargs="+", help="job spec files")
    p.set_defaults(func=run_client(cmd_submit))

    p = subparsers.add_parser("ls", parents=[common], help="list jobs")
    p.add_argument("--state", action="append", default=None, help="only jobs in this state")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_client(cmd_ls))

    p = subparsers.add_parser("show", parents=[common], help="show one job and its events")
    p.add_argument("job")
    p.add_argument("--json", action="store_true")
    p.add_argument("--events", type=int, default=20, help="how many recent events")
    p.set_defaults(func=run_client(cmd_show))

    p = subparsers.add_parser("logs", parents=[common], help="print a job's log")
    p.add_argument("job")
    p.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--attempt", type=int, default=None, help="default: the latest")
    p.add_argument("--poll", type=float, default=1.0, help=argparse.SUPPRESS)
    p.set_defaults(func=run_client(cmd_logs))

    p = subparsers.add_parser("cancel", parents=[common], help="cancel jobs")
    p.add_argument("jobs", nargs="+")
    p.set_defaults(func=run_client(cmd_cancel))

    p = subparsers.add_parser(
        "wait", parents=[common], help="wait for jobs to finish (exit 0 if all succeeded)"
    )
    p.add_argument("jobs", nargs="+")
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--poll", type=float, default=1.0, help=argparse.SUPPRESS)
    p.set_defaults(func=run_client(cmd_wait))

    p = subparsers.add_parser(
        "cluster", parents=[common], help="slots, allocations, goodput and batch sizes"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_client(cmd_cluster))

    p = subparsers.add_parser("tenant", help="manage tenants (admin token)")
    tsub = p.add_subparsers(dest="tenant_command", metavar="ACTION", required=True)
    tp = tsub.add_parser("create", parents=[common], help="create a tenant; prints its token")
    tp.add_argument("name")
    tp.set_defaults(func=run_client(cmd_tenant_create))

"""``coadapt model``: the model registry on a live controller.

``create`` registers a version root (with optional gates and retention), ``sync`` looks for new
versions now and waits for their gates, ``ls``/``show`` list models, versions, gate results and
lineage, ``promote``/``rollback`` move the serving LIVE pointer (``coadapt serve`` hot-swaps),
``rm`` deletes a version (or, without one, unregisters the model). Same controller and token
lookup and exit codes as the job commands: 0 ok, 1 a version failed its gates (``sync``),
2 invalid input or a refused action (4xx), 3 controller unreachable.
"""

from __future__ import annotations

import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import typer

from coadapt.cli.output import (
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
model_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="The model registry: versions, validation gates, promotion, rollback, retention.",
)
app.add_typer(model_app, name="model")

NameArg = Annotated[str, typer.Argument(metavar="NAME", help="a registered model")]
OwnerOpt = Annotated[
    str | None,
    typer.Option(
        "--owner", metavar="TENANT", show_default=False, help="admin: another tenant's model"
    ),
]
PENDING = ("registered", "validating")


def _path(name: str, owner: str | None, rest: str = "") -> tuple[str, dict[str, str]]:
    return f"/api/v1/models/{name}{rest}", ({"owner": owner} if owner else {})


def _resolve(client: Client, name: str, owner: str | None, version: str) -> str:
    """``3`` means ``00000003``: the registered version whose number it is."""
    if not version.isdigit():
        return version
    path, params = _path(name, owner)
    versions = [v["version"] for v in client.request("GET", path, params=params)["versions"]]
    same = [v for v in versions if v.isdigit() and int(v) == int(version)]
    return same[0] if len(same) == 1 else version


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


@model_app.command("create")
def create(
    name: NameArg,
    root: Annotated[Path, typer.Option("--root", metavar="DIR", help="the model's version root")],
    gates: Annotated[
        Path | None,
        typer.Option("--gates", metavar="FILE", show_default=False, help="gate config (YAML/JSON)"),
    ] = None,
    keep: Annotated[
        int | None,
        typer.Option("--keep", min=1, show_default=False, help="passed versions to keep (5)"),
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    retry: RetryOpt = DEFAULT_RETRY_S,
) -> int:
    """Register a model's version root; its versions are validated in the background.

    Registering pins what servers of the root serve now (or holds them empty), so a version
    published later serves only once promoted (``auto_promote: true`` does it itself)."""
    from coadapt.controller.specfile import read_spec_mapping
    from coadapt.registry.config import parse_model_spec

    def go(client: Client) -> int:
        spec: dict[str, Any] = {"name": name, "root": str(root.absolute())}
        if gates is not None:
            data = dict(read_spec_mapping(gates, "a gate config"))
            if "retention" in data:
                spec["retention"] = data.pop("retention")
            spec["gates"] = data
        if keep is not None:
            spec["retention"] = {**spec.get("retention", {}), "keep_passed": keep}
        parse_model_spec(spec)  # a bad file names each field here, before anything is sent
        out = client.request("POST", "/api/v1/models", json=spec)["model"]
        print(f"{out['name']}  {out['root']}")
        return 0

    return run_client(Target(server, token, state_dir, retry), go)


@model_app.command("sync")
def sync(
    name: NameArg,
    wait: Annotated[bool, typer.Option(help="wait for the new versions' gates")] = True,
    timeout: Annotated[float, typer.Option(metavar="SECONDS", help="give up after")] = 600.0,
    owner: OwnerOpt = None,
    json_: JsonOpt = False,
    output: OutputOpt = "table",
    server: ServerOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    retry: RetryOpt = DEFAULT_RETRY_S,
) -> int:
    """Look for new versions now and (by default) wait for their gates; exit 1 if one failed."""

    def go(client: Client) -> int:
        path, params = _path(name, owner)
        found = client.request("POST", f"{path}/sync", params=params)["registered"]
        deadline = time.monotonic() + timeout
        data = client.request("GET", path, params=params)
        while wait and any(v["state"] in PENDING for v in data["versions"]):
            if time.monotonic() >= deadline:
                print(f"coadapt: gates still running after {timeout:g}s", file=sys.stderr)
                return 1
            time.sleep(0.2)
            data = client.request("GET", path, params=params)
        new = [v for v in data["versions"] if v["version"] in set(found)]
        if wants_json(output, json_):
            print_json({"registered": found, "versions": new})
        else:
            if not found:
                print("no new versions")
            _versions_table(new)
        return 1 if any(v["state"] == "failed" for v in new) else 0

    return run_client(Target(server, token, state_dir, retry), go)


@model_app.command("ls")
def ls(
    name: Annotated[
        str | None, typer.Argument(metavar="[NAME]", help="list this model's versions")
    ] = None,
    owner: OwnerOpt = None,
    json_: JsonOpt = False,
    output: OutputOpt = "table",
    server: ServerOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    retry: RetryOpt = DEFAULT_RETRY_S,
) -> int:
    """List models (live version, versions by state), or one model's versions."""

    def go(client: Client) -> int:
        if name is not None:
            path, params = _path(name, owner)
            versions = client.request("GET", path, params=params)["versions"]
            if wants_json(output, json_):
                print_json(versions)
            else:
                _versions_table(versions)
            return 0
        models = client.request("GET", "/api/v1/models")["models"]
        if wants_json(output, json_):
            print_json(models)
            return 0
        rows = [
            [
                m["name"],
                m["tenant"],
                m["live"] or "-",
                m["newest"] or "-",
                " ".join(f"{k}={n}" for k, n in sorted(m["states"].items())) or "-",
                m["root"],
            ]
            for m in models
        ]
        table(rows, ["NAME", "TENANT", "LIVE", "NEWEST", "VERSIONS", "ROOT"])
        return 0

    return run_client(Target(server, token, state_dir, retry), go)


def _versions_table(versions: list[dict[str, Any]]) -> None:
    rows = [
        [
            v["version"],
            v["state"],
            v["kind"],
            v["parent"] or "-",
            fmt(v["job_id"]),
            fmt(v["step"]),
            fmt(v["data_offset"]),
            f"{v['size_bytes'] / 1e6:.1f}",
            v["reason"] or "-",
        ]
        for v in versions
    ]
    header = ["VERSION", "STATE", "KIND", "PARENT", "JOB", "STEP", "OFFSET", "MB", "REASON"]
    table(rows, header)


@model_app.command("show")
def show(
    ref: Annotated[str, typer.Argument(metavar="NAME[@VERSION]", help="a model or a version")],
    owner: OwnerOpt = None,
    json_: JsonOpt = False,
    output: OutputOpt = "table",
    server: ServerOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    retry: RetryOpt = DEFAULT_RETRY_S,
) -> int:
    """Show a model (versions, promotions) or one version (lineage and every gate result)."""
    name, _, version = ref.partition("@")

    def go(client: Client) -> int:
        path, params = _path(name, owner)
        if version:
            v = _resolve(client, name, owner, version)
            data = client.request("GET", f"{path}/versions/{v}", params=params)["version"]
            if wants_json(output, json_):
                print_json(data)
            else:
                _print_version(name, data)
            return 0
        data = client.request("GET", path, params=params)
        if wants_json(output, json_):
            print_json(data)
            return 0
        m = data["model"]
        print(f"{m['name']}  ({m['tenant']})  {m['root']}")
        print(f"  live: {m['live'] or '-'}   rollback to: {data['rollback_to'] or '-'}")
        g = m["gates"]
        gate_list = [x["metric"] for x in g["metrics"]]
        gate_list += [f"drift {x['stat']}" for x in g["drift"]]
        print(
            f"  gates: integrity{''.join(', ' + x for x in gate_list)}"
            f"{'; auto_promote' if g['auto_promote'] else ''};"
            f" keep {m['retention']['keep_passed']} passed"
        )
        _versions_table(data["versions"])
        if data["promotions"]:
            print()
            rows = [
                [_when(p["at"]), p["action"], p["from_version"] or "-", p["to_version"], p["who"]]
                for p in data["promotions"]
            ]
            table(rows, ["WHEN (UTC)", "ACTION", "FROM", "TO", "WHO"])
        return 0

    return run_client(Target(server, token, state_dir, retry), go)


def _print_version(name: str, v: dict[str, Any]) -> None:
    lin = v["lineage"]
    print(f"{name}@{v['version']}  {v['state']}  {v['kind']}"
          f"{' of ' + v['parent'] if v['parent'] else ''}")  # fmt: skip
    print(f"  lineage: job {fmt(lin['job_id'])}, step {fmt(lin['step'])}, "
          f"data offset {fmt(lin['data_offset'])}")  # fmt: skip
    print(f"  published {_when(v['created_at'])}, validated {_when(v['validated_at'])}, "
          f"{v['size_bytes']} bytes, manifest sha256 {v['manifest_sha256'][:16]}…")  # fmt: skip
    if v["reason"]:
        print(f"  reason: {v['reason']}")
    rows = [
        [
            c["name"],
            c["status"],
            fmt(c.get("value"), 6),
            c.get("bound") or "-",
            c.get("reason") or "-",
        ]
        for c in v["checks"]
    ]
    table(rows, ["CHECK", "STATUS", "VALUE", "BOUND", "DETAIL"])


@model_app.command("promote")
def promote(
    name: NameArg,
    version: Annotated[str, typer.Argument(metavar="VERSION", help="e.g. 00000003 or 3")],
    owner: OwnerOpt = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    retry: RetryOpt = DEFAULT_RETRY_S,
) -> int:
    """Make a version live (refused unless it passed its gates); servers hot-swap to it."""

    def go(client: Client) -> int:
        path, params = _path(name, owner, "/promote")
        v = _resolve(client, name, owner, version)
        p = client.request("POST", path, params=params, json={"version": v})["promotion"]
        print(f"{name}: {p['from_version'] or '-'} -> {p['to_version']} (live)")
        return 0

    return run_client(Target(server, token, state_dir, retry), go)


@model_app.command("rollback")
def rollback(
    name: NameArg,
    owner: OwnerOpt = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    retry: RetryOpt = DEFAULT_RETRY_S,
) -> int:
    """Go back to the version that was live before the live one."""

    def go(client: Client) -> int:
        path, params = _path(name, owner, "/rollback")
        p = client.request("POST", path, params=params)["promotion"]
        print(f"{name}: {p['from_version'] or '-'} -> {p['to_version']} (live, rolled back)")
        return 0

    return run_client(Target(server, token, state_dir, retry), go)


@model_app.command("rm")
def rm(
    name: NameArg,
    version: Annotated[
        str | None,
        typer.Argument(metavar="[VERSION]", help="delete this version (without: unregister)"),
    ] = None,
    owner: OwnerOpt = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    retry: RetryOpt = DEFAULT_RETRY_S,
) -> int:
    """Delete a version and its files (never the live one); without VERSION, unregister."""

    def go(client: Client) -> int:
        if version is None:
            path, params = _path(name, owner)
            client.request("DELETE", path, params=params)
            print(f"{name}: unregistered (files kept)")
            return 0
        v = _resolve(client, name, owner, version)
        path, params = _path(name, owner, f"/versions/{v}")
        client.request("DELETE", path, params=params)
        print(f"{name}@{v}: deleted")
        return 0

    return run_client(Target(server, token, state_dir, retry), go)

"""``--live``: one seed on a real controller, real trial processes, each policy in turn."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from _tune.tasks import ROOT, SCRIPT, VARIANTS
from _tune.workload import OBJECTIVES, targets, tenant_tasks


def live(args: argparse.Namespace, kind: str, path: Path) -> dict[str, Any]:
    """One seed on a real controller: four tenants, real trial processes (this file's
    ``--trial`` mode), for each policy; times to target from the metric times (when each
    trial reported the value, as the controller stores them)."""
    import random
    import tempfile

    from rich.progress import Progress

    from coadapt.controller.client import Client
    from coadapt.controller.subprocess_server import running_controller

    bank, _ = tenant_tasks(kind, {kind: path})
    names = list(bank)[: args.tenants]
    goal = targets({n: bank[n] for n in names}, args.quantile, args.objective)
    direction = OBJECTIVES[args.objective]
    order = names[:]
    random.Random(0).shuffle(order)
    es = {"rule": args.early_stopping, "grace_steps": 3, "min_peers": 3}
    out: dict[str, Any] = {
        "policies": {},
        "seeds": 1,
        "slots": args.slots,
        "targets": goal,
        "objective": {"metric": args.objective, "direction": direction},
        "mode": "live",
        "bank": kind,
        "order": order,
    }
    for policy in [q for q in args.policies if q not in VARIANTS]:  # no ablations live
        with tempfile.TemporaryDirectory(prefix="tune-live-") as tmp:
            state = Path(tmp) / "state"
            server_args = [
                "--slots",
                str(args.slots),
                "--tune-policy",
                policy,
                "--interval",
                "2",
                "--tick",
                "0.2",
                "--stop-grace",
                "5",
            ]
            with (
                running_controller(state, Path(tmp) / "controller.log", server_args) as ctl,
                Client(ctl.url, ctl.admin_token) as admin,
            ):
                ids: dict[str, str] = {}
                for n in order:
                    token = admin.create_tenant(f"tenant-{n}")["token"]
                    spec = {
                        "name": n,
                        "space": {
                            p: {"type": "categorical", "choices": v}
                            for p, v in bank[n].space.items()
                        },
                        "objective": {"metric": args.objective, "direction": direction},
                        "sampler": args.sampler,
                        "seed": 0,
                        "parallelism": args.parallelism,
                        "max_trials": args.max_trials,
                        "target": goal[n],
                        "max_steps": bank[n].epochs,
                        "early_stopping": es,
                        "max_retries": 1,
                        "dead_after_s": 120,
                        "trial": {
                            "script": str(SCRIPT),
                            "args": ["--trial", f"{kind}:{n}"],
                            "working_dir": str(ROOT),
                            "env": {"OMP_NUM_THREADS": "1"},
                            "min_replicas": 1,
                            "max_replicas": 1,
                        },
                    }
                    with Client(ctl.url, token) as c:
                        ids[n] = c.request("POST", "/api/v1/experiments", json=spec)["experiment"][
                            "id"
                        ]
                deadline = time.monotonic() + args.live_timeout
                with Progress() as progress:
                    bar = progress.add_task(f"live {policy}: targets reached", total=len(order))
                    while True:
                        exps = admin.request("GET", "/api/v1/experiments")["experiments"]
                        ended = sum(e["state"] != "RUNNING" for e in exps)
                        progress.update(bar, completed=ended)
                        if ended == len(order) or time.monotonic() > deadline:
                            break
                        time.sleep(1.0)
                per: dict[str, float | None] = {}
                trials: dict[str, int] = {}
                timeline: dict[str, list[dict[str, Any]]] = {}
                for n in order:
                    d = admin.request("GET", f"/api/v1/experiments/{ids[n]}")
                    created = d["experiment"]["created_at"]
                    hit = [
                        h[0]
                        for h in d["best_history"]
                        if (h[1] >= goal[n] if direction == "maximize" else h[1] <= goal[n])
                    ]
                    per[n] = hit[0] - created if hit else None
                    trials[n] = len(d["trials"])
                    timeline[n] = [
                        {
                            "number": t["number"],
                            "state": t["state"],
                            "value": t["value"],
                            "created_s": round(t["created_at"] - created, 2),
                            "ended_s": None
                            if t["ended_at"] is None
                            else round(t["ended_at"] - created, 2),
                            "steps": len(t["curve"]),
                        }
                        for t in d["trials"]
                    ]
                for e in admin.request("GET", "/api/v1/experiments")["experiments"]:
                    if e["state"] == "RUNNING":
                        admin.request("POST", f"/api/v1/experiments/{e['id']}/cancel")
                time.sleep(2.0)  # let the loop cancel the trial jobs before the stop
        reached = [v for v in per.values() if v is not None]
        out["policies"][policy] = {
            "total_s_mean": max(reached) if len(reached) == len(order) else None,
            "total_s_std": 0.0,
            "sum_s_mean": sum(reached) if len(reached) == len(order) else None,
            "per_tenant_s": {n: {"mean": per[n], "std": 0.0} for n in names},
            "trials": trials,
            "timeline": timeline,  # each trial: seconds from its experiment's submission
        }
        print(f"{policy}: " + ", ".join(f"{n} {_s(per[n])}" for n in names), flush=True)
    return out


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}s"

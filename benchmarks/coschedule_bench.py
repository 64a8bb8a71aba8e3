"""Serving and training on one cluster, simulated (issue 17, simulator half).

A 16x4 cluster runs an artifact training workload (``pollux-N``, inner policy ``pollux``)
beside one serving deployment whose diurnal, bursty request rate needs 40 % of the cluster at
its peak (p99 <= 50 ms). The same co-scheduling wrapper runs with three autoscalers:

* ``static-partition`` — a fixed reservation sized for the trace's peak;
* ``knative-style`` — Knative's KPA defaults (70 % target utilisation, 60 s / 6 s windows),
  taking what it asks from training every round;
* ``coadapt`` — the SLO autoscaler (learned capacity, forecast over the ready time, learned
  headroom), plus warm spare replicas on the slots training left idle (``--spare-share``).

``--dispatch pooled`` (the default) models the live gateway's least-outstanding routing: the
ready replicas share one queue (M/M/c), and the static partition, the oracle and the SLO
autoscaler size pools; ``--dispatch split`` is the model before (separate M/M/1 replicas).
Every strategy sees the same trace, the same replica model and the same mechanism: decisions
once per 60 s round (or ``--serving-round`` S s serving rounds between 60 s full rounds, for
all), a newly granted replica serves ``ready_s`` later, serving simulated at 1 s inside the
reservation (``docs/coschedule.md``). Deterministic: the figures depend only on ``--seed``;
``--jobs N`` runs the simulations in N processes.

    python benchmarks/coschedule_bench.py --json out/coschedule.json
    python benchmarks/coschedule_bench.py --workloads 1 2 3 --knative-utilisation 0.7 0.9

Targets: coadapt SLO attainment >= 99.9 % and training average JCT >= 30 % below the static
partition; knative-style compared at the same attainment.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.* as a script
from benchmarks.coschedule_live import add_arguments as live_arguments
from benchmarks.coschedule_live import print_report, run_live
from coadapt.policies import ClusterSnapshot, PolicyState, make_policy
from coadapt.policies.autoscale import (
    Autoscaler,
    DemandWindow,
    Deployment,
    KnativeAutoscaler,
    ScaleDecision,
    SloAutoscaler,
    StaticAutoscaler,
)
from coadapt.policies.coschedule import CoSchedulePolicy, Reservation, reservations_of
from coadapt.policies.queueing import replicas_for
from coadapt.sim import (
    SimConfig,
    SimulationError,
    Simulator,
    load_workload,
    parse_cluster,
    summarise,
)
from coadapt.sim.serving import (
    ReplicaModel,
    ServingConfig,
    ServingSimulation,
    TraceSpec,
    diurnal_trace,
)

CLUSTER = "16x4"
SERVING_SHARE = 0.4  # of the cluster's slots at the trace's peak
#: docs/serve.md: 4,325 req/s over 2 workers at p99 22.5 ms (one worker = one replica).
MEASURED_RPS_PER_REPLICA = 4325.0 / 2
MEASURED_P99_S = 0.0225
SLO_S = 0.05
READY_S = 20.0
TRACE_S = 3 * 86_400  # request traces are generated this long; runs must end before
#: coadapt's co-scheduling settings (docs/coschedule.md, "What was measured"): warm spare
#: replicas on slots training left idle, up to 100 % of the grant; the SLO autoscaler keeps
#: its default miss budget (0.1 % and 0.2 % were measured: below 99.9 % attainment).
COADAPT_SPARE_SHARE = 1.0
COADAPT_MISS_BUDGET = 0.0005
#: Pooled: a replica busy at most this share of the time at the SLO autoscaler's provision.
COADAPT_MAX_UTILISATION = 0.98
#: The live gateway routes least-outstanding over all ready replicas (coadapt/serve/gateway.py),
#: which pools them (M/M/c); "split" (separate M/M/1 replicas) was the model before.
DEFAULT_DISPATCH = "pooled"


@dataclass(frozen=True)
class Run:
    strategy: str
    workload: int
    slo_attainment: float
    train_avg_jct_s: float
    scale_up_s: float
    errors: int
    requests: int
    mean_serving_slots: float
    deficit_s: int
    train_restarts: int
    idle_slots: float  # mean slots neither serving nor training
    cold_start_s: float | None
    end_s: float
    wall_s: float


def deployment(capacity_rps: float) -> Deployment:
    return Deployment(
        name="chat",
        capacity_rps=capacity_rps,
        slo_s=SLO_S,
        slo_quantile=0.99,
        priority=10,
        min_replicas=1,
        max_replicas=64,
        ready_s=READY_S,
        scale_to_zero_s=None,
    )


@dataclass(frozen=True)
class OracleAutoscaler:
    """A bound, not a product: knows the trace's expected rate over the coming horizon and the
    true replica model, and reserves exactly that (no forecast error, no headroom): separate
    replicas of ``capacity`` each, or with ``pooled`` the least pool meeting the SLO."""

    rates: np.ndarray
    capacity: float
    model: ReplicaModel | None = None  # set: pooled (M/M/c) sizing with this replica
    name: str = "oracle"

    def decide(
        self,
        deployment: Deployment,
        window: DemandWindow,
        state: PolicyState,
        now: float,
        horizon: float,
    ) -> ScaleDecision:
        lo, hi = int(now), min(int(now + horizon) + 1, len(self.rates))
        peak = float(self.rates[lo:hi].max())
        if self.model is None:
            return ScaleDecision(max(1, math.ceil(peak / self.capacity)), self.capacity, peak, {})
        n = max(1, pooled_replicas(self.model, peak))
        return ScaleDecision(n, self.model.pooled_capacity(n, SLO_S, 0.99) / n, peak, {})


def pooled_replicas(model: ReplicaModel, rate: float) -> int:
    """The least pool of ``model`` replicas whose p99 at ``rate`` meets the SLO."""
    return replicas_for(model.service_rps, rate, SLO_S, 0.99, 10_000)


def make_autoscaler(
    strategy: str,
    static_slots: int,
    rates: np.ndarray,
    capacity: float,
    miss_budget: float | None = None,
    model: ReplicaModel | None = None,
    max_utilisation: float = 1.0,
) -> Autoscaler:
    """``model`` set: the replicas are pooled (``--dispatch pooled``) and the model-based
    strategies size pools of it; None: separate M/M/1 replicas."""
    if strategy == "oracle-bound":
        return OracleAutoscaler(rates, capacity, model)
    if strategy == "static-partition":
        return StaticAutoscaler({"chat": static_slots})
    if strategy == "coadapt":
        options: dict[str, Any] = {"pooled": model is not None}
        if model is not None:
            options["max_utilisation"] = max_utilisation
        if miss_budget is not None:
            options["miss_budget"] = miss_budget
        return SloAutoscaler(**options)
    if strategy.startswith("knative-style"):
        util = float(strategy.split("@", 1)[1]) if "@" in strategy else 0.7
        return KnativeAutoscaler(target_utilisation=util)
    raise ValueError(f"unknown strategy {strategy!r}")


def run_one(
    strategy: str,
    workload: int,
    seed: int,
    trough: float = 0.2,
    serving_round_s: float | None = None,
    spare_share: float = 0.0,
    miss_budget: float | None = None,
    dispatch: str = DEFAULT_DISPATCH,
    max_utilisation: float = 1.0,
) -> Run:
    """One co-scheduled simulation: training to completion, serving beside it.

    ``serving_round_s``: the live controller's two kinds of round (``docs/coschedule.md``):
    the engine steps this often, the autoscaler decides every step and takes free slots at
    once, and a full round (training too) runs every 60 s, when the set of jobs changed, or
    when serving needs training's slots. None: one full round per 60 s. ``spare_share``:
    :class:`CoSchedulePolicy`'s spare replicas on slots training left idle. ``miss_budget``:
    the SLO autoscaler's (None: its default). ``dispatch``: ``pooled`` (the live gateway's
    least-outstanding routing, M/M/c) or ``split`` (separate M/M/1 replicas); the static
    partition, the oracle and the SLO autoscaler size for it, Knative ignores it."""
    started = time.perf_counter()
    model = ReplicaModel.from_measurement(MEASURED_RPS_PER_REPLICA, MEASURED_P99_S)
    capacity = model.capacity(SLO_S, 0.99)
    cluster = parse_cluster(CLUSTER)
    peak = SERVING_SHARE * cluster.total_gpus * capacity
    pooled = dispatch == "pooled"
    static_slots = pooled_replicas(model, peak) if pooled else math.ceil(peak / capacity - 1e-9)
    dep = deployment(capacity)
    spec = TraceSpec(peak_rps=peak, duration_s=TRACE_S, trough=trough, seed=seed)
    rates = diurnal_trace(spec)
    serving_config = ServingConfig(seed=seed, dispatch="pooled" if pooled else "split")
    serving = ServingSimulation([dep], {"chat": rates}, {"chat": model}, serving_config)
    full_round_s = SimConfig().interval
    config = SimConfig(seed=seed, interval=serving_round_s or full_round_s)
    policy = CoSchedulePolicy(
        make_policy("pollux"),
        [dep],
        make_autoscaler(
            strategy,
            static_slots,
            rates,
            capacity,
            miss_budget,
            model if pooled else None,
            max_utilisation,
        ),
        serving,
        round_s=config.interval,
        full_round_s=None if serving_round_s is None else full_round_s,
        spare_share=spare_share,
    )
    sim = Simulator(load_workload(f"pollux-{workload}"), cluster, policy, config)
    # Every strategy starts from a warm static-size deployment (it was serving before t=0).
    start = Reservation(static_slots, static_slots, {}, capacity, None, config.interval)
    serving.apply(0.0, {"chat": start}, warm=True)
    # As Simulator.run does: the fits are tiny, BLAS threads only slow them down.
    with threadpool_limits(limits=1):
        while not sim.done:
            if sim.now >= config.max_time:
                raise SimulationError(f"pollux-{workload} under {strategy}: unfinished")
            serving.advance_to(sim.now + config.interval)
            rounds = len(sim.diagnostics)
            sim.step()
            if len(sim.diagnostics) == rounds:
                # No training job was active, so the engine skipped the policy; deployments
                # still need their round (the controller will run one for them too).
                quiet = ClusterSnapshot(now=sim.now, nodes=tuple(sim.nodes), jobs={})
                rng = np.random.default_rng([seed, sim.round])
                sim.policy_state = policy.optimize(quiet, sim.policy_state, rng).state
            serving.apply(sim.now, reservations_of(sim.policy_state))
    result = sim.result()
    summary = summarise(result)
    rec = serving.records()["chat"]
    delays = rec.scale_up_delays()
    reserved_at = [
        int(rec.reserved[min(int(t) - 1, len(rec.reserved) - 1)]) for t, _ in result.utilisation
    ]
    idle = [
        cluster.total_gpus * (1.0 - u) - r
        for (_, u), r in zip(result.utilisation, reserved_at, strict=True)
    ]
    return Run(
        strategy=strategy,
        workload=workload,
        slo_attainment=rec.attainment,
        train_avg_jct_s=summary.avg_jct_s,
        scale_up_s=float(np.mean(delays)) if delays else 0.0,
        errors=rec.errors,
        requests=rec.requests,
        mean_serving_slots=float(rec.reserved.mean()),
        deficit_s=int(np.sum(rec.ready < rec.need)),
        train_restarts=summary.restarts,
        idle_slots=float(np.mean(idle)) if idle else 0.0,
        cold_start_s=max(rec.cold_starts) if rec.cold_starts else None,
        end_s=sim.now,
        wall_s=time.perf_counter() - started,
    )


def scale_to_zero_run(seed: int, dispatch: str = DEFAULT_DISPATCH) -> dict[str, Any]:
    """A sporadic deployment (10-minute sessions at seeded times, idle between) under the SLO
    autoscaler with scale to zero after 300 s: how long the activator holds the first
    requests of each session (the cold start: the wait for the next round, then ``ready_s``)."""
    model = ReplicaModel.from_measurement(MEASURED_RPS_PER_REPLICA, MEASURED_P99_S)
    capacity = model.capacity(SLO_S, 0.99)
    dep = Deployment(
        name="sporadic",
        capacity_rps=capacity,
        slo_s=SLO_S,
        ready_s=READY_S,
        scale_to_zero_s=300.0,
    )
    duration = 6 * 3600
    rng = np.random.default_rng([seed, 5])
    rates = np.zeros(duration)
    for hour in range(6):
        start = hour * 3600 + int(rng.integers(600, 2400))
        rates[start : start + 600] = 0.5 * capacity
    pooled = dispatch == "pooled"
    config = ServingConfig(dispatch="pooled" if pooled else "split")
    serving = ServingSimulation([dep], {"sporadic": rates}, {"sporadic": model}, config)
    scaler = SloAutoscaler(pooled=pooled)
    policy = CoSchedulePolicy(make_policy("fifo"), [dep], scaler, serving)
    nodes = tuple(parse_cluster(CLUSTER).nodes())
    serving.apply(0.0, {"sporadic": Reservation(0, 0, {}, capacity, None, 0.0)}, warm=True)
    state: PolicyState = {}
    for now in range(60, duration - 60, 60):
        serving.advance_to(now)
        snapshot = ClusterSnapshot(now=float(now), nodes=nodes, jobs={})
        state = policy.optimize(snapshot, state, np.random.default_rng(now)).state
        serving.apply(float(now), reservations_of(state))
    rec = serving.records()["sporadic"]
    return {
        "cold_starts_s": list(rec.cold_starts),
        "mean_cold_start_s": float(np.mean(rec.cold_starts)) if rec.cold_starts else None,
        "slo_attainment": rec.attainment,
        "errors": rec.errors,
        "zero_replica_share": float(np.mean(rec.reserved == 0)),
    }


def aggregate(runs: list[Run], strategy: str) -> dict[str, Any]:
    mine = [r for r in runs if r.strategy == strategy]
    requests = sum(r.requests for r in mine)
    within = sum(r.slo_attainment * r.requests for r in mine)
    return {
        "name": strategy,
        "slo_attainment": within / requests if requests else 1.0,
        "train_avg_jct_s": float(np.mean([r.train_avg_jct_s for r in mine])),
        "scale_up_s": float(np.mean([r.scale_up_s for r in mine])),
        "errors": int(sum(r.errors for r in mine)),
        "requests": int(requests),
        "mean_serving_slots": float(np.mean([r.mean_serving_slots for r in mine])),
        "deficit_s": int(sum(r.deficit_s for r in mine)),
        "workloads": [r.workload for r in mine],
        "wall_s": float(sum(r.wall_s for r in mine)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", nargs="+", type=int, default=[1, 2], metavar="N")
    parser.add_argument(
        "--knative-utilisation",
        nargs="+",
        type=float,
        default=[],
        metavar="U",
        help="extra knative-style rows at these target utilisations (default row: 0.7)",
    )
    parser.add_argument("--oracle", action="store_true", help="add the clairvoyant bound row")
    parser.add_argument(
        "--trough", type=float, default=0.2, help="night demand as a fraction of the day's peak"
    )
    parser.add_argument(
        "--serving-round",
        type=float,
        default=None,
        metavar="S",
        help="serving rounds every S s between 60 s full rounds, as the live controller "
        "(all strategies; default: none)",
    )
    parser.add_argument(
        "--spare-share",
        type=float,
        default=COADAPT_SPARE_SHARE,
        help="coadapt: spare replicas on slots training left idle, as a share of the grant",
    )
    parser.add_argument(
        "--miss-budget",
        type=float,
        default=COADAPT_MISS_BUDGET,
        help="coadapt: the SLO autoscaler's share of requests allowed above its provision",
    )
    parser.add_argument(
        "--max-utilisation",
        type=float,
        default=COADAPT_MAX_UTILISATION,
        help="coadapt, pooled: the most each replica is busy at the provision",
    )
    parser.add_argument(
        "--dispatch",
        choices=("pooled", "split"),
        default=DEFAULT_DISPATCH,
        help="pooled: the replicas share one queue, as behind the live gateway's "
        "least-outstanding routing (M/M/c); split: separate M/M/1 replicas (the model before)",
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="simulations run in this many processes at once"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, metavar="OUT")
    parser.add_argument("--live", action="store_true", help="add the live run's row (below)")
    live_arguments(parser)
    args = parser.parse_args()
    strategies = ["static-partition", "knative-style", "coadapt"]
    strategies += [f"knative-style@{u:g}" for u in args.knative_utilisation]
    if args.oracle:
        strategies.append("oracle-bound")
    runs: list[Run] = []
    started = time.perf_counter()
    cases = [(s, w) for w in args.workloads for s in strategies]
    # Each run is deterministic on its own, so running them in processes changes no figure.
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [
            pool.submit(
                run_one,
                s,
                w,
                args.seed,
                args.trough,
                serving_round_s=args.serving_round,
                spare_share=args.spare_share if s == "coadapt" else 0.0,
                miss_budget=args.miss_budget if s == "coadapt" else None,
                dispatch=args.dispatch,
                max_utilisation=args.max_utilisation,
            )
            for s, w in cases
        ]
        for future in as_completed(futures):
            run = future.result()
            runs.append(run)
            print(
                f"[{len(runs)}/{len(cases)}] pollux-{run.workload} {run.strategy}: attainment "
                f"{run.slo_attainment:.5f}, JCT {run.train_avg_jct_s / 3600:.3f} h, slots "
                f"{run.mean_serving_slots:.1f}, errors {run.errors} ({run.wall_s:.0f} s wall)",
                file=sys.stderr,
                flush=True,
            )
    order = {case: i for i, case in enumerate(cases)}
    runs.sort(key=lambda r: order[(r.strategy, r.workload)])
    rows = [aggregate(runs, s) for s in strategies]
    by = {r["name"]: r for r in rows}
    static_jct = by["static-partition"]["train_avg_jct_s"]
    for r in rows:
        r["jct_vs_static"] = r["train_avg_jct_s"] / static_jct - 1.0
    title = f"Serving + training on {CLUSTER}, pollux-{args.workloads}, {args.dispatch} dispatch"
    table = Table(title=f"{title} (simulated)")
    cols = ("strategy", "SLO attain.", "train JCT h", "vs static", "scale-up s", "errors")
    for col in (*cols, "serving slots", "deficit s"):
        table.add_column(col, justify="left" if col == "strategy" else "right")
    for r in rows:
        table.add_row(
            r["name"],
            f"{r['slo_attainment']:.4%}",
            f"{r['train_avg_jct_s'] / 3600:.3f}",
            f"{r['jct_vs_static']:+.1%}",
            f"{r['scale_up_s']:.1f}",
            str(r["errors"]),
            f"{r['mean_serving_slots']:.1f}",
            str(r["deficit_s"]),
        )
    console = Console()
    console.print(table)
    co = by["coadapt"]
    ok = co["slo_attainment"] >= 0.999 and co["jct_vs_static"] <= -0.30
    console.print(
        f"coadapt: attainment {co['slo_attainment']:.4%} (target >= 99.9%), JCT "
        f"{co['jct_vs_static']:+.1%} vs static (target <= -30%); targets met: {ok}"
    )
    zero = scale_to_zero_run(args.seed, args.dispatch)
    console.print(
        f"scale to zero (sporadic deployment): cold starts {zero['cold_starts_s']} s, "
        f"attainment {zero['slo_attainment']:.4%}, errors {zero['errors']}, "
        f"at zero {zero['zero_replica_share']:.0%} of the time"
    )
    report = {
        "rows": rows,
        "scale_to_zero": zero,
        "per_workload": [r.__dict__ for r in runs],
        "config": {
            "cluster": CLUSTER,
            "serving_share_at_peak": SERVING_SHARE,
            "slo_s": SLO_S,
            "slo_quantile": 0.99,
            "ready_s": READY_S,
            "replica_service_rps": ReplicaModel.from_measurement(
                MEASURED_RPS_PER_REPLICA, MEASURED_P99_S
            ).service_rps,
            "seed": args.seed,
            "trough": args.trough,
            "serving_round_s": args.serving_round,
            "coadapt_spare_share": args.spare_share,
            "coadapt_miss_budget": args.miss_budget,
            "dispatch": args.dispatch,
            "coadapt_max_utilisation": args.max_utilisation,
            "workloads": args.workloads,
        },
        "targets_met": ok,
        "wall_s": time.perf_counter() - started,
    }
    if args.live:  # the live half: a real server, two jobs, a ramp (coschedule_live.py)
        live = run_live(args)
        print_report(live)
        rows.append(live["row"])
        report["live"] = live
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

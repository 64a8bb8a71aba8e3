"""The replay: every policy on a bank over several seeds in the simulator, aggregated."""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import Any

from _tune.report import print_replay
from _tune.tasks import VARIANTS
from _tune.workload import OBJECTIVES, targets, tenant_tasks


def _simulate_one(policy: str, seed: int, tenants: list[Any], slots: int) -> Any:
    """One replay (``solo``: the tenant alone under fifo; ``order``: fifo with the tenants'
    arrivals in a given order); a process pool's unit of work."""
    from coadapt.tune.sim import simulate

    name, params = VARIANTS.get(policy, ("fifo" if policy in ("solo", "order") else policy, {}))
    return simulate(tenants, slots, name, seed, params=params)


def replay(args: argparse.Namespace, kind: str, paths: dict[str, Path]) -> dict[str, Any]:
    """Every policy on bank ``kind`` over ``args.seeds`` seeds; the results and the table."""
    import random
    from dataclasses import replace

    from rich.progress import Progress

    from coadapt.tune.sim import SimTenant, summary

    bank, prov = tenant_tasks(kind, paths)
    if args.startup_scale != 1.0:  # sensitivity: warm trial workers (0) vs fresh processes
        bank = {n: replace(t, startup_s=t.startup_s * args.startup_scale) for n, t in bank.items()}
    names = list(bank)[: args.tenants]
    goal = targets({n: bank[n] for n in names}, args.quantile, args.objective)
    es = {"rule": args.early_stopping, "grace_steps": 3, "min_peers": 3}
    runs: dict[str, list[Any]] = {p: [] for p in args.policies}
    solo: dict[str, list[float | None]] = {n: [] for n in names}
    work: list[tuple[str, int, list[SimTenant]]] = []  # (policy or "solo", seed, tenants)
    for seed in range(args.seeds):
        order = names[:]
        random.Random(seed).shuffle(order)
        tenants = [
            SimTenant(
                name=n,
                task=bank[n],
                target=goal[n],
                arrival=order.index(n) * args.arrival_gap,
                parallelism=args.parallelism,
                sampler=args.sampler,
                max_trials=args.max_trials,
                early_stopping=es,
                sampler_seed=seed * 1000 + i,
                metric=args.objective,
                direction=OBJECTIVES[args.objective],
            )
            for i, n in enumerate(names)
        ]
        work += [(policy, seed, tenants) for policy in args.policies]
        # alone on the cluster, same sampler seed: a lower bound
        work += [("solo", seed, [replace(t, arrival=0.0)]) for t in tenants]
        if args.hindsight:  # fifo in every order of arrival: the best static order, in hindsight
            work += [
                (
                    "order",
                    seed,
                    [replace(t, arrival=p.index(t.name) * args.arrival_gap) for t in tenants],
                )
                for p in itertools.permutations(names)
            ]
    done: dict[int, Any] = {}
    with Progress() as progress:
        bar = progress.add_task(f"replaying the {kind} bank", total=len(work))
        if args.jobs > 1:  # independent, deterministic runs: any order gives the same results
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor, as_completed

            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=args.jobs, mp_context=ctx) as pool:
                futures = {
                    pool.submit(_simulate_one, w[0], w[1], w[2], args.slots): i
                    for i, w in enumerate(work)
                }
                for fut in as_completed(futures):
                    done[futures[fut]] = fut.result()
                    progress.advance(bar)
        else:
            for i, w in enumerate(work):
                done[i] = _simulate_one(w[0], w[1], w[2], args.slots)
                progress.advance(bar)
    orders: dict[int, list[Any]] = {}
    for i, (policy, seed, tenants) in enumerate(work):
        if policy == "solo":
            solo[tenants[0].name].append(done[i].sum_s)
        elif policy == "order":
            orders.setdefault(seed, []).append(done[i])
        else:
            runs[policy].append(done[i])
    trial_s = {
        n: {
            "startup_s": bank[n].startup_s,
            "training_s_mean": sum(sum(c.epoch_s) for c in bank[n].configs.values())
            / len(bank[n].configs),
        }
        for n in names
    }
    out: dict[str, Any] = {
        "policies": {},
        "seeds": args.seeds,
        "bank": kind,
        "bank_provenance": prov if kind == "mixed" else prov[kind],
        "trial_seconds": trial_s,
        "slots": args.slots,
        "parallelism": args.parallelism,
        "sampler": args.sampler,
        "early_stopping": es,
        "objective": {"metric": args.objective, "direction": OBJECTIVES[args.objective]},
        "quantile": args.quantile,
        "targets": goal,
        "startup_scale": args.startup_scale,
        "arrival_gap_s": args.arrival_gap,
        "total_is": "makespan: first arrival until every tenant reached its target",
    }
    for policy, rs in runs.items():
        mk = [r.makespan_s for r in rs]
        sm = [r.sum_s for r in rs]
        mean, std = summary(mk)
        smean, sstd = summary(sm)
        out["policies"][policy] = {
            "total_s_mean": mean,
            "total_s_std": std,
            "sum_s_mean": smean,
            "sum_s_std": sstd,
            "unfinished_runs": sum(v is None for v in mk),
            "per_tenant_s": {
                n: dict(
                    zip(("mean", "std"), summary([r.time_to_target[n] for r in rs]), strict=True)
                )
                for n in names
            },
            "trials_mean": {n: sum(r.trials[n] for r in rs) / len(rs) for n in names},
            "pruned_mean": {n: sum(r.pruned[n] for r in rs) / len(rs) for n in names},
            "preempted_mean": {n: sum(r.preempted[n] for r in rs) / len(rs) for n in names},
            "busy_fraction_mean": sum(r.busy_fraction for r in rs) / len(rs),
            "per_seed_total_s": mk,
        }
    # No policy can bring a tenant below its time alone on the cluster (same sampler seed),
    # so the makespan is at least the slowest tenant's solo time, seed by seed.
    bound: list[float | None] = []
    for k in range(args.seeds):
        times = [v[k] for v in solo.values()]
        bound.append(None if any(a is None for a in times) else max(a or 0.0 for a in times))
    out["solo_s"] = {
        n: dict(zip(("mean", "std"), summary(v), strict=True)) for n, v in solo.items()
    }
    out["makespan_lower_bound_s_mean"] = summary(bound)[0]
    sums = [sum(v[k] or 0.0 for v in solo.values()) for k in range(args.seeds)]
    out["sum_lower_bound_s_mean"] = summary(sums)[0]
    base_mk = out["policies"].get("fifo", {}).get("total_s_mean")
    if base_mk is not None:
        out["best_possible_ratio_fifo_over_any"] = base_mk / out["makespan_lower_bound_s_mean"]
        out["best_possible_ratio_fifo_over_any_sum"] = (
            out["policies"]["fifo"]["sum_s_mean"] / out["sum_lower_bound_s_mean"]
        )
    if orders:
        # Each seed's best order for each measure, chosen after the fact: an upper bound on
        # what any policy that only orders tenants (static priorities) could gain over fifo.
        best_mk = [
            min((r.makespan_s for r in rs if r.makespan_s is not None), default=None)
            for rs in orders.values()
        ]
        best_sum = [
            min((r.sum_s for r in rs if r.sum_s is not None), default=None)
            for rs in orders.values()
        ]
        out["hindsight_order"] = {
            "what": "fifo in every order of the tenants' arrivals; each seed's best order "
            "for each measure, chosen after the fact",
            "orders_per_seed": len(next(iter(orders.values()))),
            "makespan_s_mean": summary(best_mk)[0],
            "sum_s_mean": summary(best_sum)[0],
        }
        if base_mk is not None:
            out["hindsight_order"]["ratio_fifo_over_it"] = (
                base_mk / out["hindsight_order"]["makespan_s_mean"]
            )
            out["hindsight_order"]["ratio_fifo_over_it_sum"] = (
                out["policies"]["fifo"]["sum_s_mean"] / out["hindsight_order"]["sum_s_mean"]
            )
    ours = out["policies"].get("ei-per-gpu")
    base = out["policies"].get("fifo")
    if ours and base:
        out["ratio_fifo_over_ours"] = base["total_s_mean"] / ours["total_s_mean"]
        out["ratio_fifo_over_ours_sum"] = base["sum_s_mean"] / ours["sum_s_mean"]
    print_replay(out)
    return out

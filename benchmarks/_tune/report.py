"""The replay's report: the table and the lines under it, from the results alone."""

from __future__ import annotations

from typing import Any


def print_replay(out: dict[str, Any]) -> None:
    """Print a replay's results (what :func:`_tune.simulate.replay` returns) as a table."""
    from rich.console import Console
    from rich.table import Table

    kind = out["bank"]
    names = list(out["targets"])
    goal = out["targets"]
    trial_s = out["trial_seconds"]
    objective = out["objective"]["metric"]
    console = Console()
    table = Table(
        title=f"{kind} bank, {objective} targets: time to target (s), {out['seeds']} seeds, "
        f"{out['slots']} slots, "
        f"parallelism {out['parallelism']}, sampler {out['sampler']}"
    )
    table.add_column("policy")
    for n in names:
        table.add_column(f"{n}\n(target {goal[n]:.4g})", justify="right")
    table.add_column("makespan", justify="right")
    table.add_column("sum", justify="right")
    for policy, r in out["policies"].items():
        table.add_row(
            policy,
            *[
                f"{r['per_tenant_s'][n]['mean']:.1f} ± {r['per_tenant_s'][n]['std']:.1f}"
                for n in names
            ],
            f"{r['total_s_mean']:.1f} ± {r['total_s_std']:.1f}",
            f"{r['sum_s_mean']:.1f} ± {r['sum_s_std']:.1f}",
        )
    console.print(table)
    console.print(
        "a trial: "
        + ", ".join(
            f"{n} {v['startup_s']:.1f} s start-up + {v['training_s_mean']:.1f} s training"
            for n, v in trial_s.items()
        )
    )
    for policy, r in out["policies"].items():
        console.print(
            f"{policy}: trials/pruned/preempted per tenant (mean) "
            + ", ".join(
                f"{n} {r['trials_mean'][n]:.1f}/{r['pruned_mean'][n]:.1f}/"
                f"{r['preempted_mean'][n]:.1f}"
                for n in names
            )
        )
    if "best_possible_ratio_fifo_over_any" in out:
        console.print(
            "lower bound on any policy's makespan (the slowest tenant alone on the cluster): "
            f"{out['makespan_lower_bound_s_mean']:.1f} s, i.e. at most "
            f"{out['best_possible_ratio_fifo_over_any']:.2f}x below fifo; "
            f"on the sum: {out['sum_lower_bound_s_mean']:.1f} s "
            f"(at most {out['best_possible_ratio_fifo_over_any_sum']:.2f}x)"
        )
    if "ratio_fifo_over_it" in out.get("hindsight_order", {}):
        h = out["hindsight_order"]
        console.print(
            f"best static order in hindsight (fifo, best of {h['orders_per_seed']} arrival "
            f"orders per seed): makespan {h['makespan_s_mean']:.1f} s "
            f"({h['ratio_fifo_over_it']:.2f}x below fifo), sum {h['sum_s_mean']:.1f} s "
            f"({h['ratio_fifo_over_it_sum']:.2f}x)"
        )
    if "ratio_fifo_over_ours" in out:
        console.print(
            f"fifo / ei-per-gpu: makespan {out['ratio_fifo_over_ours']:.2f}x, "
            f"sum {out['ratio_fifo_over_ours_sum']:.2f}x (goal >= 1.5x on makespan)"
        )

"""What the tenants of a run tune: the recorded tasks of a bank (or the mix) and their targets."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from _tune.tasks import BANKS, MIXED, ROOT

#: The objectives a replay can tune: a recorded curve and its direction.
OBJECTIVES: dict[str, str] = {"accuracy": "maximize", "loss": "minimize"}


def targets(bank: dict[str, Any], quantile: float, metric: str = "accuracy") -> dict[str, float]:
    """Each task's target: the ``quantile`` of its per-configuration best ``metric`` ranked
    from worst to best (so about one configuration in ``1 / (1 - quantile)`` reaches it),
    rounded toward easier: accuracy floored to 3 decimals, log-loss ceiled to 4 (losses of
    the small tasks go down to ~0.003 nats)."""
    direction = OBJECTIVES[metric]
    out = {}
    for name, task in bank.items():
        best = task.best_values(metric, direction)  # worst first
        k = min(math.floor(quantile * (len(best) - 1)), len(best) - 1)
        if direction == "maximize":
            out[name] = math.floor(best[k] * 1000) / 1000
        else:
            out[name] = math.ceil(best[k] * 10_000) / 10_000
    return out


def tenant_tasks(kind: str, paths: dict[str, Path]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recorded tasks a replay of ``kind`` tunes (name -> task, in the bank's order) and
    their banks' provenance; ``mixed`` takes tasks of both banks, named ``<bank>-<task>``."""
    from dataclasses import replace

    from coadapt.tune.sim import load_bank

    parts = MIXED if kind == "mixed" else ((kind, len(BANKS[kind][1])),)
    tasks: dict[str, Any] = {}
    prov: dict[str, Any] = {}
    for bank_kind, count in parts:
        path = paths[bank_kind]
        bank = load_bank(path)
        for n in [n for n in BANKS[bank_kind][1] if n in bank][:count]:
            name = n if kind != "mixed" else f"{bank_kind}-{n}"
            tasks[name] = replace(bank[n], name=name)
        prov[bank_kind] = {
            "file": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
            **json.loads(path.read_text(encoding="utf-8")).get("provenance", {}),
        }
    return tasks, prov

"""The executor conformance scenarios on Ray: ``python ray_conformance.py RESULTS WORKDIR``.

Run by test_conformance.py inside a loopback-only network namespace (ray_support.py). Starts
one local Ray instance (4 ``coadapt_slot``), runs every scenario of
:data:`tests.executors.test_conformance.SCENARIOS` against :class:`RayExecutor`, each in a
fresh state dir, removes the scenario's placement groups after it, and writes
``{scenario: {"ok", "error", "seconds"}}`` to RESULTS after each one (what was reached
survives a timeout).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path

import ray

from coadapt.executors.ray_executor import DEFAULT_NAMESPACE, RayExecutor
from tests.executors.test_conformance import SCENARIOS, Kit, _no_op

SLOT = "coadapt_slot"


def executor() -> RayExecutor:
    return RayExecutor(slot_resource=SLOT, placement_timeout=30.0, inventory_ttl=0.0, init=False)


def main(results_path: Path, work: Path) -> int:
    ray.init(
        num_cpus=2,
        resources={SLOT: 4},
        namespace=DEFAULT_NAMESPACE,
        include_dashboard=False,
        logging_level=logging.WARNING,
        log_to_driver=False,
        configure_logging=False,
    )
    results: dict[str, dict[str, object]] = {}
    try:
        node = executor().nodes()[0].name
        for scenario in SCENARIOS:
            name = scenario.__name__.removeprefix("test_")
            top = work / name
            root = top / "state"
            (root / "jobs").mkdir(parents=True)
            kit = Kit(
                "ray", executor, _no_op, root, node=node, pids=False, cwd_checked_at_launch=False
            )
            started = time.monotonic()
            try:
                scenario(kit)
                results[name] = {"ok": True, "error": ""}
            except BaseException:  # pytest's Failed too: every outcome is reported
                results[name] = {"ok": False, "error": traceback.format_exc()[-4000:]}
            finally:
                executor().retain(())  # the scenario's groups (and actors) go
            results[name]["seconds"] = round(time.monotonic() - started, 2)
            print(f"{name}: {'ok' if results[name]['ok'] else 'FAILED'}", flush=True)
            results_path.write_text(json.dumps(results))
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    raise SystemExit(main(Path(sys.argv[1]), Path(sys.argv[2])))

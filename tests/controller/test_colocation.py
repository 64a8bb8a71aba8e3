"""GPU sharing for real: a policy that packs two 1-slot jobs on a 1-slot local cluster, and
both run to SUCCEEDED as two real processes on the same slot at the same time."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from coadapt.controller.db import sqlite_url
from coadapt.controller.reconciler import Controller, ControllerConfig
from coadapt.controller.spec import parse_spec
from coadapt.controller.states import JobState
from coadapt.controller.store import Store
from coadapt.executors import LocalExecutor
from coadapt.executors.sandbox import Isolation
from coadapt.policies import BatchMode, ClusterSnapshot, Decision, PolicyState

pytestmark = pytest.mark.timeout(60)

# Records when it ran (in its job directory, its HOME), then sleeps: two of these on one slot
# must overlap in time.
JOB = """
import json, os, sys, time
start = time.time()
time.sleep(float(sys.argv[1]))
out = {"start": start, "end": time.time(), "pid": os.getpid(),
       "devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
with open(os.path.join(os.environ["HOME"], "ran.json"), "w") as f:
    json.dump(out, f)
"""


@dataclass
class PackTwo:
    """Gives the first job the one slot and packs every other job onto it."""

    name: str = "pack-two"
    batch_mode: BatchMode = BatchMode.FIXED
    seen: list[ClusterSnapshot] = field(default_factory=list)

    def optimize(
        self, snapshot: ClusterSnapshot, state: PolicyState, rng: np.random.Generator
    ) -> Decision:
        self.seen.append(snapshot)
        jobs = list(snapshot.jobs)
        if not jobs:
            return Decision({})
        host = jobs[0]
        allocs: dict[str, tuple[int, ...]] = {j: (1,) for j in jobs}
        return Decision(allocs, packed={j: host for j in jobs[1:]})


def test_two_packed_jobs_share_one_slot_and_both_succeed(tmp_path: Path) -> None:
    store = Store.open(sqlite_url(tmp_path / "coadapt.db"))
    try:
        script = tmp_path / "sleeper.py"
        script.write_text(JOB)
        tenant = store.create_tenant("alice", time.time())[0]
        jobs = [
            store.create_job(
                tenant,
                parse_spec(
                    {
                        "name": name,
                        "command": [sys.executable, str(script), "2.0"],
                        "working_dir": str(tmp_path),
                        "min_replicas": 1,
                        "max_replicas": 1,
                        "max_restarts": 0,
                    }
                ),
                time.time(),
            )
            for name in ("host", "guest")
        ]
        executor = LocalExecutor(slots=1, isolation=Isolation(), warm=False)
        assert [(n.name, n.slots) for n in executor.nodes()] == [("local", 1)]
        policy = PackTwo()
        config = ControllerConfig(
            state_dir=tmp_path / "state", interval=0.5, stop_grace=5.0, min_round_gap=0.0
        )
        ctl = Controller(store, executor, policy, config)
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            ctl.step()
            if all(store.get_job(j.id).state.is_terminal for j in jobs):
                break
            time.sleep(0.1)
        states = {j.name: store.get_job(j.id).state for j in jobs}
        assert states == {"host": JobState.SUCCEEDED, "guest": JobState.SUCCEEDED}
        # One attempt each, on the same slot, never restarted (packing is not a rescale).
        reps = {j.name: store.replicas(j.id) for j in jobs}
        assert [(r.attempt, r.node, r.slot) for r in reps["host"]] == [(1, "local", 0)]
        assert [(r.attempt, r.node, r.slot) for r in reps["guest"]] == [(1, "local", 0)]
        ran = {j.name: json.loads((ctl.job_dir(j.id) / "ran.json").read_text()) for j in jobs}
        assert ran["host"]["devices"] == ran["guest"]["devices"]  # same GPUs, if any
        assert ran["host"]["pid"] != ran["guest"]["pid"]  # two processes ...
        assert ran["guest"]["start"] < ran["host"]["end"]  # ... at the same time
        assert ran["host"]["start"] < ran["guest"]["end"]
        assert any(s.total_gpus == 1 and len(s.jobs) == 2 for s in policy.seen)
    finally:
        store.close()

"""The Ray integration scenario: ``python ray_scenario.py WORKDIR`` (run by test_ray.py).

Must run where Ray binds to 127.0.0.1 only (a loopback-only network namespace). It starts a
real multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``: a head without
slots and two nodes with 2 ``coadapt_slot`` each), a real controller loop with the Ray
executor, and a real torch.distributed job (``dist_job.py``); then checks:

1. a job allocated across both nodes gets replicas on both and trains (gloo all-reduce);
2. a restarted controller re-adopts its live actors (found by name) instead of relaunching;
   it is rescaled (checkpoint → release the placement group → new group) and finishes;
3. a second job spread over both nodes loses a node mid-run: it restarts from its checkpoint
   on the node that remains, without counting a failure, and finishes; the replica process on
   the lost node is gone;
4. ``coadapt server --executor ray --ray-address ...`` joins the cluster and reports its slots.

Prints ``TIMING name seconds`` lines and ends with ``SCENARIO OK`` (exit 0), or raises.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray.cluster_utils import Cluster

from coadapt.controller.reconciler import Controller, ControllerConfig
from coadapt.controller.spec import parse_spec
from coadapt.controller.states import JobState
from coadapt.controller.store import Store
from coadapt.executors._proc import proc_state
from coadapt.executors.ray_executor import RayExecutor
from coadapt.policies import Allocation, BatchMode, ClusterSnapshot, Decision, PolicyState

HERE = Path(__file__).resolve().parent
JOB = HERE / "dist_job.py"
SLOT = "coadapt_slot"
T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


@dataclass
class SpreadPolicy:
    """Job -> replica count, spread one per node first, in node order (deterministic)."""

    want: dict[str, int] = field(default_factory=dict)
    name: str = "spread"
    batch_mode: BatchMode = BatchMode.ADAPTIVE

    def optimize(
        self, snapshot: ClusterSnapshot, state: PolicyState, rng: np.random.Generator
    ) -> Decision:
        free = [n.gpus for n in snapshot.nodes]
        out: dict[str, Allocation] = {}
        for job in snapshot.jobs:
            k = self.want.get(job, 0)
            alloc = [0] * len(free)
            while k > 0 and any(free):
                for i in range(len(free)):
                    if k > 0 and free[i] > 0:
                        alloc[i] += 1
                        free[i] -= 1
                        k -= 1
            out[job] = tuple(alloc)
        return Decision(out)


def wait_for(what: str, pred: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def starts(path: Path) -> list[dict[str, Any]]:
    return [r for r in records(path) if r["event"] == "start"]


def last_step(path: Path) -> int:
    steps = [r["step"] for r in records(path) if r["event"] == "step"]
    return steps[-1] if steps else 0


def main(work: Path) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    stop = threading.Event()
    loop: threading.Thread | None = None
    try:
        # Each node declares its GPU type as Ray's accelerator-type resource would.
        typed = {SLOT: 2, "accelerator_type:T4": 1}
        nodes = [cluster.add_node(num_cpus=1, resources=typed) for _ in range(2)]
        cluster.wait_for_nodes()
        say(f"ray cluster up at {cluster.address}")
        executor = RayExecutor(address=cluster.address, slot_resource=SLOT, placement_timeout=30.0)
        inventory = executor.nodes()
        assert [(n.slots, n.gpu_type) for n in inventory] == [(2, "t4"), (2, "t4")], inventory
        store = Store.open(f"sqlite:///{work / 'coadapt.db'}")
        tenant, _ = store.create_tenant("alice", time.time())
        policy = SpreadPolicy()
        config = ControllerConfig(
            state_dir=work / "state",
            shared_dir=work / "shared",
            interval=2.0,
            stop_grace=10.0,
            backoff_base=1.0,
            restart_delay=1.0,
            min_round_gap=0.2,
        )
        ctl = Controller(store, executor, policy, config)
        loop = threading.Thread(target=ctl.run, args=(stop, 0.2), daemon=True)
        loop.start()

        def submit(name: str, log: Path, steps: int) -> str:
            spec = {
                "name": name,
                "script": str(JOB),
                "args": ["--log", str(log), "--max-steps", str(steps), "--step-time", "0.15"],
                "working_dir": str(HERE),
                "batch_size": 16,
                "max_batch_size": 16,
                "min_replicas": 1,
                "max_replicas": 4,
                "max_restarts": 0,
                "env": {"GLOO_SOCKET_IFNAME": "lo"},
            }
            job = store.create_job(tenant, parse_spec(spec), time.time())
            return job.id

        # 1. Across two nodes: 3 replicas as (2, 1).
        log1 = work / "job1.jsonl"
        t = time.monotonic()
        j1 = submit("across", log1, 50)
        policy.want[j1] = 3
        ctl.poke()
        wait_for("job 1 at 3 replicas stepping", lambda: last_step(log1) >= 4, 60)
        say(f"job 1 trains at world {starts(log1)[-1]['world']}")
        print(f"TIMING first_launch_to_step4 {time.monotonic() - t:.2f}", flush=True)
        reps = store.replicas(j1, attempt=1)
        assert sorted(r.node for r in reps) == sorted(
            [inventory[0].name, inventory[0].name, inventory[1].name]
        ), reps
        assert store.get_job(j1).allocation == {inventory[0].name: 2, inventory[1].name: 1}
        assert starts(log1)[0]["world"] == 3 and starts(log1)[0]["nodes"] == "2"
        heads = [Path(r.log_path).read_text().splitlines()[0] for r in reps]
        assert len({h.split("ray node ")[1].split(")")[0] for h in heads}) == 2, heads

        # A restarted controller (fresh executor state) re-adopts the live actors by name.
        stop.set()
        loop.join(timeout=10)
        stop = threading.Event()
        executor = RayExecutor(slot_resource=SLOT, placement_timeout=30.0, init=False)
        ctl = Controller(store, executor, policy, config)
        loop = threading.Thread(target=ctl.run, args=(stop, 0.2), daemon=True)
        loop.start()
        step_then = last_step(log1)
        wait_for(
            "job 1 to step on under the new controller", lambda: last_step(log1) > step_then + 2, 30
        )
        assert store.get_job(j1).attempt == 1 and len(store.replicas(j1)) == 3
        assert all(r.status == "live" for r in store.replicas(j1)), store.replicas(j1)
        assert len(starts(log1)) == 1
        say("a new controller adopted job 1's actors")

        # 2. Rescale to 2 replicas, (1, 1): checkpoint, new group, resume.
        before = last_step(log1)
        t = time.monotonic()
        policy.want[j1] = 2
        ctl.poke()
        wait_for("job 1 restarted at 2", lambda: len(starts(log1)) >= 2, 60)
        print(f"TIMING rescale_stop_to_restart {time.monotonic() - t:.2f}", flush=True)
        resumed = starts(log1)[1]
        assert resumed["world"] == 2 and resumed["restored"], resumed
        assert resumed["steps"] >= before, (resumed, before)
        wait_for("job 1 to succeed", lambda: store.get_job(j1).state is JobState.SUCCEEDED, 60)
        job1 = store.get_job(j1)
        assert job1.attempt == 2 and job1.failures == 0 and records(log1)[-1]["steps"] == 50
        assert store.get_job(j1).desired_allocation == {
            inventory[0].name: 1,
            inventory[1].name: 1,
        }
        say("job 1 rescaled 3 -> 2 across nodes and succeeded")

        # 3. Node loss mid-run.
        log2 = work / "job2.jsonl"
        j2 = submit("survivor", log2, 30)
        policy.want[j2] = 2
        ctl.poke()
        wait_for("job 2 stepping on two nodes", lambda: last_step(log2) >= 5, 60)
        reps = store.replicas(j2, attempt=1)
        assert sorted(r.node for r in reps) == sorted(n.name for n in inventory), reps
        victim_name = reps[1].node
        victim = next(n for n in nodes if victim_name.endswith(n.node_id[:8]))
        pid_line = Path(reps[1].log_path).read_text().splitlines()[0]
        orphan = int(pid_line.split(" pid ")[1].split()[0])
        t = time.monotonic()
        cluster.remove_node(victim)
        say(f"removed node {victim_name}")
        wait_for("job 2 restarted on what remains", lambda: len(starts(log2)) >= 2, 90)
        print(f"TIMING node_loss_to_restart {time.monotonic() - t:.2f}", flush=True)
        again = starts(log2)[1]
        assert again["restored"] and again["steps"] > 0 and again["nodes"] == "1", again
        wait_for("job 2 to succeed", lambda: store.get_job(j2).state is JobState.SUCCEEDED, 60)
        job2 = store.get_job(j2)
        assert job2.failures == 0, job2
        assert all(r.node != victim_name for r in store.replicas(j2, attempt=job2.attempt))
        lost = [r for r in store.replicas(j2, attempt=1) if r.status == "lost"]
        assert [r.node for r in lost] == [victim_name], store.replicas(j2, attempt=1)
        # Gone, or a zombie nobody reaps (we may be PID 1 of the test's PID namespace).
        assert proc_state(orphan) in (None, "Z", "X"), "replica process outlived its node"
        kinds = [e.kind for e in store.events()]
        assert "nodes" in kinds, kinds
        say("job 2 lost a node, resumed from its checkpoint and succeeded")
        stop.set()
        loop.join(timeout=10)
        loop = None
        wait_for("placement groups released", lambda: not live_groups(), 15)

        # 4. The CLI joins the same cluster.
        t = time.monotonic()
        check_cli(work, cluster.address)
        print(f"TIMING cli_server_up {time.monotonic() - t:.2f}", flush=True)
        print("SCENARIO OK", flush=True)
    finally:
        stop.set()
        if loop is not None:
            loop.join(timeout=10)
        ray.shutdown()
        cluster.shutdown()


def live_groups() -> list[str]:
    from ray.util.placement_group import placement_group_table

    return [str(v["name"]) for v in placement_group_table().values() if v["state"] != "REMOVED"]


def check_cli(work: Path, address: str) -> None:
    state = work / "cli-state"
    argv = [
        sys.executable,
        "-m",
        "coadapt.cli",
        "server",
        "--state-dir",
        str(state),
        "--port",
        "7399",
        "--executor",
        "ray",
        "--ray-address",
        address,
        "--ray-slot-resource",
        SLOT,
        "--ray-namespace",
        "coadapt-cli",
    ]
    out = open(work / "cli.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:

        def cluster_view() -> dict[str, Any] | None:
            token_file = state / "admin-token"
            if not token_file.exists():
                return None
            req = urllib.request.Request(
                "http://127.0.0.1:7399/api/v1/cluster",
                headers={"Authorization": f"Bearer {token_file.read_text().strip()}"},
            )
            try:
                with urllib.request.urlopen(req, timeout=2) as resp:
                    return dict(json.loads(resp.read()))
            except OSError:
                return None

        view = wait_for("the CLI controller", cluster_view, 60)
        assert view["slots"] == 2, view  # one node of 2 slots is left
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.close()


if __name__ == "__main__":
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    main(Path(sys.argv[1]))

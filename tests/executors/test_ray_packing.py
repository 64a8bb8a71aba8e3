"""GPU sharing on Ray: a packed guest's actor goes into its host's bundle (half a GPU each),
so both run on the host's node with the host's GPU; the host's group lives while the guest
does, also across a controller restart.

The scenario (``main``, run as ``python test_ray_packing.py WORKDIR``) runs inside a loopback-only
network namespace (``ray_support``), on a real 2-node ``ray.cluster_utils.Cluster`` whose nodes
declare GPUs (2 and 1; Ray hands out GPU ids without real devices). Skipped, with the reason,
only where Ray is not installed or namespaces are not permitted.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.executors.ray_support import in_namespace, why_no_ray
from tests.requirements import unavailable

HERE = Path(__file__).resolve().parent

# Writes NAME.start (devices, pid), waits for the file go-NAME, then writes NAME.end.
SLEEPER = """
import json, os, sys, time
out, go = sys.argv[1], sys.argv[2]
rec = {"start": time.time(), "pid": os.getpid(),
       "devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
open(out + ".start", "w").write(json.dumps(rec))
while not os.path.exists(go):
    time.sleep(0.05)
open(out + ".end", "w").write(json.dumps({"end": time.time()}))
"""


@pytest.mark.timeout(300)
def test_a_guest_shares_its_hosts_bundle_and_gpu(tmp_path: Path) -> None:
    why = why_no_ray()
    if why is not None:
        print(f"skipping the Ray packing test: {why}")
        unavailable(why)
    code, out = in_namespace(Path(__file__), str(tmp_path), timeout=240)
    lines = [ln for ln in out.splitlines() if "network_util.cc" not in ln]
    print("\n".join(ln for ln in lines if ln.startswith("[")))
    assert code == 0 and "PACKING OK" in out, "\n".join(lines[-80:])


# -- the scenario (in the namespace) -----------------------------------------------------------
T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def wait_for(what: str, pred: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def main(work: Path) -> None:
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.placement_group import get_placement_group, placement_group_table

    from coadapt.executors.base import ReplicaHandle, ReplicaPhase, ReplicaSpec, ReplicaStatus
    from coadapt.executors.ray_executor import RayExecutor, actor_name, group_key

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=2, num_gpus=2)
        cluster.add_node(num_cpus=2, num_gpus=1)
        cluster.wait_for_nodes()
        ex = RayExecutor(address=cluster.address, placement_timeout=60.0)
        assert ex.shares_slots and ex.uses_gpus(), (ex.shares_slots, ex.slot_resource)
        two, one = sorted(ex.nodes(), key=lambda n: -n.slots)
        assert (two.slots, one.slots) == (2, 1), ex.nodes()
        say(f"ray cluster up: {two.name} (2 GPUs), {one.name} (1 GPU)")
        script = work / "sleeper.py"
        script.write_text(SLEEPER)

        def spec(name: str, node: str, slot: int) -> ReplicaSpec:
            run = work / name / "run-1"
            run.mkdir(parents=True)
            return ReplicaSpec(
                job_id=name,
                attempt=1,
                rank=0,
                world_size=1,
                argv=(sys.executable, str(script), str(work / name), str(work / f"go-{name}")),
                cwd=str(work),
                run_dir=str(run),
                log_path=str(run / "rank0.log"),
                slot=slot,
                node=node,
            )

        specs = {
            "x": spec("x", two.name, 0),  # alone on the 2-GPU node
            "host": spec("host", two.name, 1),
            "y": spec("y", one.name, 0),  # on the other node; a host after the restart
        }
        handles: dict[str, ReplicaHandle] = {}

        def launch(on: RayExecutor, name: str) -> None:
            (h,) = on.launch_group([specs[name]])
            assert isinstance(h, ReplicaHandle), h
            handles[name] = h

        def ended(on: RayExecutor, name: str) -> ReplicaStatus | None:
            status = on.poll(handles[name])
            return status if status.done else None

        def finish(on: RayExecutor, name: str) -> None:
            (work / f"go-{name}").touch()
            status = wait_for(f"{name} to exit", partial(ended, on, name))
            assert (status.phase, status.exit_code) == (ReplicaPhase.EXITED, 0), (name, status)

        def own_group(name: str) -> Any:
            return get_placement_group(f"coadapt-{group_key(specs[name].run_dir)}")

        for name in ("x", "host", "y"):
            launch(ex, name)
        # A guest goes on exactly its host's (node, slot), as the controller launches it.
        specs["guest"] = spec("guest", two.name, 1)
        launch(ex, "guest")
        # A restarted controller: it learns which slot y holds from y's actor, and packs a
        # second guest there.
        ex2 = RayExecutor(address=cluster.address, placement_timeout=60.0)
        ex2.scan_interval = 0.0

        def knows_y() -> bool:
            ex2.poll(handles["y"])
            return (one.name, 0) in ex2._holders

        wait_for("the restarted executor to learn y's slot", knows_y)
        specs["guest2"] = spec("guest2", one.name, 0)
        launch(ex2, "guest2")
        names = ("x", "host", "y", "guest", "guest2")
        wait_for("every job to start", lambda: all((work / f"{n}.start").exists() for n in names))
        rec = {n: json.loads((work / f"{n}.start").read_text()) for n in names}
        say(f"devices: { {n: r['devices'] for n, r in rec.items()} }")
        assert rec["guest"]["devices"] == rec["host"]["devices"] is not None
        assert rec["guest2"]["devices"] == rec["y"]["devices"] is not None
        assert rec["x"]["devices"] != rec["host"]["devices"]
        assert len({r["pid"] for r in rec.values()}) == len(names)
        for name, node in (("guest", two.name), ("guest2", one.name)):
            log = Path(specs[name].log_path).read_text()
            assert f"ray node {ex._node_ids[node][:8]}" in log, (name, log)
            with pytest.raises(ValueError):  # a guest makes no group of its own
                own_group(name)
        host_pg, y_pg = own_group("host"), own_group("y")
        for n in names:
            assert ex2.poll(handles[n]).phase is ReplicaPhase.RUNNING, n

        # The host ends first: its group stays while the guest lives in it. ex2 adopted the
        # guest: it releases nothing until the guest's actor has said where it lives.
        finish(ex2, "host")
        alive = [specs[n].run_dir for n in ("x", "y", "guest", "guest2")]
        for _ in range(20):
            ex2.retain(alive)
            assert ex2.poll(handles["guest"]).phase is ReplicaPhase.RUNNING
            time.sleep(0.1)
        assert placement_group_table(host_pg)["state"] != "REMOVED"
        say("host ended; its group stays for the guest")
        finish(ex2, "guest")
        ex2.retain([specs[n].run_dir for n in ("x", "y", "guest2")])
        wait_for(
            "the host's group to go", lambda: placement_group_table(host_pg)["state"] == "REMOVED"
        )
        with pytest.raises(ValueError):  # the guest's actor is gone with it
            ray.get_actor(actor_name(specs["guest"].run_dir, 0), namespace=ex2.namespace)
        say("guest ended; the host's group and the guest's actor are gone")
        # A guest that ends before its host: its actor goes, the host's group stays.
        finish(ex2, "guest2")
        ex2.retain([specs[n].run_dir for n in ("x", "y")])
        with pytest.raises(ValueError):
            ray.get_actor(actor_name(specs["guest2"].run_dir, 0), namespace=ex2.namespace)
        assert placement_group_table(y_pg)["state"] != "REMOVED"
        assert ex2.poll(handles["y"]).phase is ReplicaPhase.RUNNING
        for n in ("x", "y"):
            finish(ex2, n)
        ex2.retain([])
        wait_for("every group to go", lambda: placement_group_table(y_pg)["state"] == "REMOVED")
        print("PACKING OK", flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""Replicas as Ray actors on a Ray cluster (``coadapt server --executor ray``).

Inventory: Ray's alive nodes, each with as many slots as it has of the slot resource (``GPU``
when the cluster has GPUs, else a configured custom resource such as ``coadapt_slot`` that
each node declares, or ``CPU``). Nodes are named ``<ip>-<node id prefix>``; a node's
``address`` is that IP (Ray's ``NodeManagerAddress``), where the controller's deployment
gateways reach the serving replicas on it.

One attempt of a job is one detached placement group with one bundle per replica; bundle ``i``
carries a label selector on ``ray.io/node-id``, so the group realises exactly the policy's
per-node allocation, and it is reserved all at once (a gang) or not at all. Each replica is a
named detached actor scheduled into its bundle that runs the training command as a child
process on its node (same argv and environment as the local executor), appends its output to
the replica's log file (a shared path), turns ``stop`` into SIGTERM (checkpoint and exit 0) or
SIGKILL, and reports the exit code. Rank 0 picks ``MASTER_ADDR`` (its node's IP) and a port
free on its node; the other ranks ask rank 0's actor for them, so torch.distributed meets there.

Nothing here blocks the controller's loop: the group and its actors are created
asynchronously, :meth:`RayExecutor.poll` only looks at replies that have arrived
(``ray.wait(timeout=0)``), and a group not placed within ``placement_timeout`` is removed and
its replicas reported EVICTED (the job goes back to pending, no failure counted). Names are
derived from the attempt's run directory, so a restarted controller finds the actors and the
group again (re-adoption), and :meth:`RayExecutor.retain` removes the groups of attempts that
have ended (their actors go with them): rescale is checkpoint, release, new group.

GPU sharing (a packed guest, ``docs/hetero.md``): every actor takes half of its bundle's slot
resource (``num_gpus=0.5``, and half its CPUs), so the bundle still reserves a whole slot for
the attempt but has room for one more actor. A launch whose every replica is on a (node, slot)
that a running attempt of this process holds is a guest: its actors go into that attempt's
bundles (Ray's fractional resources), so each lands on its host's node and gets its host's GPU
from ``ray.get_gpu_ids()``, and no new group is made. The host's group then lives while a guest
in it does (:meth:`RayExecutor.retain`); a guest's own actors are killed when it ends. Each
guest actor knows its home group (its status replies carry it), so a restarted controller
that adopts a guest learns where it lives before it releases any group.

This is the only module that imports Ray (``pip install coadapt[ray]``).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import (
    PlacementGroup,
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from coadapt.executors.base import (
    ExecutorError,
    NodeInventory,
    ReplicaHandle,
    ReplicaPhase,
    ReplicaSpec,
    ReplicaStatus,
)
from coadapt.executors.gpu_types import DEFAULT_GPU_TYPE, ray_accelerator_type
from coadapt.ports import free_port

log = logging.getLogger("coadapt.executors.ray")

NODE_ID_LABEL = "ray.io/node-id"
DEFAULT_NAMESPACE = "coadapt"
_PR_SET_PDEATHSIG = 1
_MASTER_TIMEOUT_S = 120.0  # a rank waits this long for rank 0's address (inside its actor)
#: Each actor's share of its bundle: half, so a packed guest's actor fits beside it.
SHARE = 0.5
#: ``_Group.home`` of an adopted actor whose home group is not known yet.
_UNKNOWN = "?"


def group_key(run_dir: str) -> str:
    """A short stable id for one attempt (its run directory is unique per job and attempt)."""
    return hashlib.sha1(run_dir.encode()).hexdigest()[:16]


def actor_name(run_dir: str, rank: int) -> str:
    return f"coadapt-{group_key(run_dir)}-r{rank}"


def node_name(ip: str, node_id: str) -> str:
    """Readable and unique even when several Ray nodes share one IP (one-host clusters)."""
    return f"{ip}-{node_id[:8]}"


def _die_with_parent() -> None:
    """In the child: SIGKILL when the actor process dies (node lost, actor killed)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: best effort
        pass


class ReplicaRunner:
    """The actor behind one replica: starts the training process on its node in the
    constructor (which runs once the bundle is reserved) and answers status / stop calls."""

    def __init__(self, job: Mapping[str, Any], master: str | None, namespace: str) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.code: int | None = None
        self.reason = ""
        self.home: str | None = job.get("home")  # the group whose bundle it shares, if a guest
        self.place = (job.get("node"), job.get("slot"))  # the controller's (node, slot)
        ip = ray.util.get_node_ip_address()
        if master is None:
            self.addr: tuple[str, int] = (ip, free_port(""))
        else:
            rank0 = ray.get_actor(master, namespace=namespace)
            got: Any = ray.get(rank0.master.remote(), timeout=_MASTER_TIMEOUT_S)
            self.addr = (str(got[0]), int(got[1]))
        env = dict(os.environ)
        env.update(job["overlay"])
        env["MASTER_ADDR"], env["MASTER_PORT"] = self.addr[0], str(self.addr[1])
        if job["gpus"]:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(int(g)) for g in ray.get_gpu_ids())
        if env.get("GLOO_SOCKET_IFNAME") == "lo" and not self.addr[0].startswith("127."):
            del env["GLOO_SOCKET_IFNAME"]  # the controller's one-host default; wrong here
        log_path = str(job["log_path"])
        os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
        with open(log_path, "ab") as out:
            try:
                self.proc = subprocess.Popen(
                    list(job["argv"]),
                    cwd=str(job["cwd"]),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            except OSError as exc:
                out.write(f"coadapt: cannot start {job['argv'][0]!r}: {exc}\n".encode())
                self.code, self.reason = 127, f"cannot start: {exc}"
                return
            # The child writes to the same file; a short line from here is atomic (O_APPEND).
            out.write(
                f"[coadapt] rank {job['rank']} pid {self.proc.pid} on {ip} (ray node "
                f"{ray.get_runtime_context().get_node_id()[:8]}), master "
                f"{self.addr[0]}:{self.addr[1]}\n".encode()
            )

    def master(self) -> tuple[str, int]:
        return self.addr

    def status(self) -> dict[str, Any]:
        if self.proc is not None and self.code is None:
            code = self.proc.poll()
            if code is not None:
                if code < 0:
                    self.code, self.reason = 128 - code, f"killed by signal {-code}"
                else:
                    self.code, self.reason = code, "exited"
        return {
            "code": self.code,
            "reason": self.reason,
            "pid": self.proc.pid if self.proc is not None else None,
            "home": self.home,
            "node": self.place[0],
            "slot": self.place[1],
        }

    def stop(self, force: bool) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if force:
                os.killpg(self.proc.pid, signal.SIGKILL)
            else:
                self.proc.send_signal(signal.SIGTERM)


@dataclass
class _Actor:
    handle: Any = None  # ray ActorHandle, found by name when needed
    pending: Any = None  # an outstanding status() ObjectRef
    final: ReplicaStatus | None = None
    last: dict[str, Any] | None = None


@dataclass
class _Group:
    """What this controller process knows about one attempt's placement group (a guest's:
    the group of its host, whose bundles it shares)."""

    pg: PlacementGroup | None  # None: an adopted guest whose home is not known yet
    seen: float  # monotonic time this process created (or first saw) the group
    ready_ref: Any
    ready: bool = False
    failed: str | None = None  # why the group was given up (EVICTED from then on)
    nodes: dict[int, str] = field(default_factory=dict)  # bundle index -> Ray node id
    actors: dict[int, _Actor] = field(default_factory=dict)
    # GPU sharing: a guest's home (its host's group key; _UNKNOWN until an adopted guest's
    # actor says) and the bundle each of its ranks shares (rank i: bundle i when its own).
    home: str | None = None
    bundles: dict[int, int] = field(default_factory=dict)
    run_dir: str = ""  # the attempt's (a guest's actors are found by name from it)

    def bundle(self, rank: int) -> int:
        return self.bundles.get(rank, rank)


def node_gpu_type(resources: Mapping[str, float]) -> str:
    """A Ray node's GPU type: its ``accelerator_type:NAME`` resource (Ray sets it on GPU
    nodes; ``ray start --resources '{"accelerator_type:T4": 1}'`` declares one on any node),
    else :data:`DEFAULT_GPU_TYPE`."""
    return ray_accelerator_type(resources) or DEFAULT_GPU_TYPE


class RayExecutor:
    """Runs each attempt as a gang of actors in one placement group on a Ray cluster."""

    name = "ray"
    shares_slots = True  # a guest's actor takes the other half of its host's bundle
    scan_interval = 10.0  # seconds between scans for groups an earlier controller left

    def __init__(
        self,
        address: str | None = None,
        slot_resource: str | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        placement_timeout: float = 60.0,
        cpus_per_replica: float = 0.0,
        inventory_ttl: float = 1.0,
        init: bool = True,
    ) -> None:
        if placement_timeout <= 0:
            raise ExecutorError(f"placement timeout must be > 0, got {placement_timeout}")
        self.namespace = namespace
        self.placement_timeout = placement_timeout
        self.cpus_per_replica = cpus_per_replica
        self.inventory_ttl = inventory_ttl
        if init and not ray.is_initialized():
            kwargs: dict[str, Any] = {}
            if address is None and slot_resource not in (None, "GPU", "CPU"):
                # A fresh local cluster: give this machine the slot resource (one per CPU).
                kwargs["resources"] = {slot_resource: float(os.cpu_count() or 1)}
            try:
                ray.init(
                    address=address,
                    namespace=namespace,
                    logging_level=logging.WARNING,
                    log_to_driver=False,
                    configure_logging=False,
                    **kwargs,
                )
            except (ConnectionError, RuntimeError, ValueError) as exc:
                where = address or "a new local cluster"
                raise ExecutorError(f"cannot connect to Ray at {where}: {exc}") from exc
        self._runner = ray.remote(ReplicaRunner)
        self._groups: dict[str, _Group] = {}
        # (node, slot) -> (group key, bundle index) of the attempt launched there last: where
        # a later launch on the same slots is a packed guest.
        self._holders: dict[tuple[str, int], tuple[str, int]] = {}
        self._probed: set[str] = set()  # kept run dirs already looked up (retain)
        self._node_ids: dict[str, str] = {}  # node name -> Ray node id
        self._dead_ids: set[str] = set()
        self._inventory: list[NodeInventory] = []
        self._inventory_at = -float("inf")
        self._scanned_at = -float("inf")
        self._raw_nodes = self._ray_nodes()
        if slot_resource is None:
            has_gpus = any(n["Resources"].get("GPU", 0) > 0 for n in self._raw_nodes)
            slot_resource = "GPU" if has_gpus else "CPU"
        self.slot_resource = slot_resource

    # -- inventory ------------------------------------------------------------------------
    def _ray_nodes(self) -> list[dict[str, Any]]:
        try:
            return list(ray.nodes())
        except Exception as exc:  # GCS unreachable: surface as the executor's error
            raise ExecutorError(f"cannot list Ray nodes: {exc}") from exc

    def nodes(self) -> list[NodeInventory]:
        """Alive nodes with at least one slot, by name (cached for ``inventory_ttl``)."""
        now = time.monotonic()
        if now - self._inventory_at < self.inventory_ttl:
            return list(self._inventory)
        raw = self._ray_nodes()
        inventory = []
        for n in raw:
            if not n.get("Alive"):
                self._dead_ids.add(str(n["NodeID"]))
                continue
            slots = int(n.get("Resources", {}).get(self.slot_resource, 0))
            if slots <= 0:
                continue
            ip = str(n["NodeManagerAddress"])
            name = node_name(ip, str(n["NodeID"]))
            self._node_ids[name] = str(n["NodeID"])
            gpu_type = node_gpu_type(n.get("Resources", {}))
            inventory.append(NodeInventory(name, slots, gpu_type, address=ip))
        self._inventory = sorted(inventory, key=lambda x: x.name)
        self._inventory_at = now
        return list(self._inventory)

    def slots(self) -> int:
        return sum(n.slots for n in self.nodes())

    def uses_gpus(self) -> bool:
        return self.slot_resource == "GPU"

    # -- launch ---------------------------------------------------------------------------
    def _bundle(self) -> dict[str, float]:
        bundle = {self.slot_resource: 1.0}
        if self.cpus_per_replica > 0 and self.slot_resource != "CPU":
            bundle["CPU"] = self.cpus_per_replica
        return bundle

    def _actor_options(self, pg: PlacementGroup, index: int, name: str) -> dict[str, Any]:
        """Half of bundle ``index`` (:data:`SHARE`): the other half is a packed guest's."""
        opts: dict[str, Any] = {
            "name": name,
            "namespace": self.namespace,
            "lifetime": "detached",
            "max_restarts": 0,
            "num_cpus": 0,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=index
            ),
        }
        if self.slot_resource == "GPU":
            opts["num_gpus"] = SHARE
        elif self.slot_resource == "CPU":
            opts["num_cpus"] = SHARE
        else:
            opts["resources"] = {self.slot_resource: SHARE}
        if self.cpus_per_replica > 0 and self.slot_resource != "CPU":
            opts["num_cpus"] = self.cpus_per_replica * SHARE
        return opts

    def _home_of(self, specs: Sequence[ReplicaSpec]) -> tuple[str, list[int]] | None:
        """The running group whose bundles hold every spec's (node, slot), one bundle each,
        with the bundles by rank: the launch is then a packed guest's (None: it is not)."""
        held = [self._holders.get((s.node, s.slot)) for s in specs]
        keys = {h[0] for h in held if h is not None}
        if None in held or len(keys) != 1:
            return None
        key = keys.pop()
        bundles = [h[1] for h in held if h is not None]
        host = self._groups.get(key)
        if host is None or host.failed is not None or host.home is not None:
            return None
        if len(set(bundles)) != len(bundles):
            return None
        for b in bundles:  # the host's replica in each bundle still runs
            actor = host.actors.get(b)
            if actor is None or actor.final is not None:
                return None
        return key, bundles

    def launch_group(self, specs: Sequence[ReplicaSpec]) -> list[ReplicaHandle | ExecutorError]:
        """Create the attempt's placement group and its actors; returns at once."""
        if not specs:
            return []
        run_dir = specs[0].run_dir
        if any(s.run_dir != run_dir for s in specs):
            raise ExecutorError("one group is one attempt: specs with different run_dir")
        if [s.rank for s in specs] != list(range(len(specs))):
            raise ExecutorError("a group needs ranks 0..n-1 in order")
        self.nodes()
        missing = sorted({s.node for s in specs if s.node not in self._node_ids})
        if missing:
            err = ExecutorError(f"not in the Ray cluster: node(s) {', '.join(missing)}")
            return [err] * len(specs)
        key = group_key(run_dir)
        home = self._home_of(specs)
        try:
            if home is not None:  # a packed guest: into its host's bundles
                host = self._groups[home[0]]
                if host.pg is None:  # not reached: a host's group is its own (_home_of)
                    raise ExecutorError(f"host group {home[0]} has no placement group")
                pg = host.pg
                group = _Group(
                    pg=pg,
                    seen=time.monotonic(),
                    ready_ref=host.ready_ref,
                    ready=host.ready,
                    nodes=dict(host.nodes),
                    home=home[0],
                    bundles={s.rank: b for s, b in zip(specs, home[1], strict=True)},
                    run_dir=run_dir,
                )
            else:
                pg = placement_group(
                    [self._bundle() for _ in specs],
                    strategy="PACK",
                    name=f"coadapt-{key}",
                    lifetime="detached",
                    bundle_label_selector=[{NODE_ID_LABEL: self._node_ids[s.node]} for s in specs],
                )
                group = _Group(pg=pg, seen=time.monotonic(), ready_ref=pg.ready(), run_dir=run_dir)
            self._groups[key] = group
            master = actor_name(run_dir, 0)
            for spec in specs:
                name = actor_name(run_dir, spec.rank)
                job = {
                    "argv": list(spec.argv),
                    "cwd": spec.cwd,
                    "log_path": spec.log_path,
                    "rank": spec.rank,
                    "gpus": self.uses_gpus(),
                    # Only what coadapt (or the job spec) set: the node keeps its own PATH etc.
                    "overlay": {k: v for k, v in spec.env.items() if os.environ.get(k) != v},
                    "home": group.home,
                    "node": spec.node,
                    "slot": spec.slot,
                }
                opts = self._actor_options(pg, group.bundle(spec.rank), name)
                handle = self._runner.options(**opts).remote(
                    job, None if spec.rank == 0 else master, self.namespace
                )
                group.actors[spec.rank] = _Actor(handle=handle)
        except Exception as exc:  # Ray refused the request: nothing of it may linger
            self._release(key)
            err = ExecutorError(f"cannot create the placement group: {exc}")
            return [err] * len(specs)
        if home is None:
            for i, spec in enumerate(specs):
                self._holders[spec.node, spec.slot] = (key, i)
        return [ReplicaHandle(0, None, run_dir, s.rank) for s in specs]

    # -- observe --------------------------------------------------------------------------
    def _group(self, run_dir: str) -> _Group | None:
        """The attempt's group, adopting one created by an earlier controller process (a
        packed guest's: found by its actor, its home learnt from the actor's first reply)."""
        key = group_key(run_dir)
        group = self._groups.get(key)
        if group is not None:
            return group
        try:
            pg = get_placement_group(f"coadapt-{key}")
        except ValueError:
            try:  # no group of its own: a guest in its host's group, if its actor lives
                ray.get_actor(actor_name(run_dir, 0), namespace=self.namespace)
            except ValueError:
                return None
            group = _Group(
                pg=None, seen=time.monotonic(), ready_ref=None, ready=True, home=_UNKNOWN
            )
            group.run_dir = run_dir
            self._groups[key] = group
            return group
        if placement_group_table(pg).get("state") == "REMOVED":
            return None
        group = _Group(pg=pg, seen=time.monotonic(), ready_ref=pg.ready(), run_dir=run_dir)
        self._groups[key] = group
        return group

    def _node_dead(self, node_id: str | None) -> bool:
        if node_id is None:
            return False
        self._inventory_at = -float("inf")  # refresh now: a death is news
        self.nodes()
        return node_id in self._dead_ids

    def _placed(self, group: _Group) -> bool:
        """Whether the group's bundles are reserved (asked of Ray, without waiting, until
        they are; then its bundle -> node map is recorded)."""
        if not group.ready:
            done, _ = ray.wait([group.ready_ref], timeout=0)
            if not done:
                return False
            group.ready = True
            if group.pg is None:
                return True
            table = placement_group_table(group.pg)
            group.nodes = {int(i): str(n) for i, n in table.get("bundles_to_node_id", {}).items()}
        return True

    def _learn(self, handle: ReplicaHandle, group: _Group, reply: Any) -> None:
        """What an adopted actor's status reply tells: a guest's home group, and the (node,
        slot) a host's rank holds (so a guest launched after a controller restart still
        finds its host's bundle)."""
        if not isinstance(reply, dict):
            return
        if group.home == _UNKNOWN:
            group.home = reply.get("home")
        node, slot = reply.get("node"), reply.get("slot")
        if group.home is None and isinstance(node, str) and isinstance(slot, int):
            place = (group_key(handle.run_dir), group.bundle(handle.rank))
            self._holders.setdefault((node, slot), place)

    def poll(self, handle: ReplicaHandle) -> ReplicaStatus:
        group = self._group(handle.run_dir)
        if group is None:
            return ReplicaStatus(ReplicaPhase.LOST, None, "placement group gone")
        if group.failed is not None:
            return ReplicaStatus(ReplicaPhase.EVICTED, None, group.failed)
        if not self._placed(group):
            waited = time.monotonic() - group.seen
            if waited < self.placement_timeout:
                return ReplicaStatus(ReplicaPhase.RUNNING, None, "waiting for placement")
            group.failed = (
                f"placement group not placed within {self.placement_timeout:.0f}s "
                "(resources taken, or a node left)"
            )
            self._release(group_key(handle.run_dir), forget=False)
            return ReplicaStatus(ReplicaPhase.EVICTED, None, group.failed)
        actor = group.actors.setdefault(handle.rank, _Actor())
        if actor.final is not None:
            return actor.final
        if actor.handle is None:
            try:
                actor.handle = ray.get_actor(
                    actor_name(handle.run_dir, handle.rank), namespace=self.namespace
                )
            except ValueError:
                if group.home == _UNKNOWN:
                    group.home = None
                actor.final = ReplicaStatus(ReplicaPhase.LOST, None, "replica actor not found")
                return actor.final
        if actor.pending is None:
            actor.pending = actor.handle.status.remote()
        done, _ = ray.wait([actor.pending], timeout=0)
        if done:
            ref, actor.pending = actor.pending, None
            try:
                actor.last = ray.get(ref, timeout=0)
                self._learn(handle, group, actor.last)
            except ray.exceptions.RayActorError as exc:
                if group.home == _UNKNOWN:  # a dead guest holds no home: retain may go on
                    group.home = None
                node = group.nodes.get(group.bundle(handle.rank))
                if self._node_dead(node) or "node has died" in str(exc):
                    nid = (node or "?")[:8]
                    actor.final = ReplicaStatus(
                        ReplicaPhase.EVICTED, None, f"node {nid} died under the replica"
                    )
                else:
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else "died"
                    actor.final = ReplicaStatus(ReplicaPhase.LOST, None, f"actor died: {first}")
                return actor.final
            except ray.exceptions.RayError as exc:
                return ReplicaStatus(ReplicaPhase.RUNNING, None, f"status unavailable: {exc}")
        last = actor.last
        if last is None or last.get("code") is None:
            return ReplicaStatus(ReplicaPhase.RUNNING)
        actor.final = ReplicaStatus(ReplicaPhase.EXITED, int(last["code"]), str(last["reason"]))
        return actor.final

    def stop(self, handle: ReplicaHandle, force: bool = False) -> None:
        """SIGTERM (or SIGKILL) the training process through its actor; never waits."""
        group = self._group(handle.run_dir)
        if group is None or group.failed is not None:
            return
        actor = group.actors.setdefault(handle.rank, _Actor())
        if actor.final is not None:
            return
        if actor.handle is None:
            try:
                actor.handle = ray.get_actor(
                    actor_name(handle.run_dir, handle.rank), namespace=self.namespace
                )
            except ValueError:
                return
        actor.handle.stop.remote(force)
        # Asked afresh: a group this process has not polled since it was placed (an adopted
        # one, say) holds a running replica, and a forced stop of that one is a kill.
        if force and not self._placed(group):
            # Not placed yet, so nothing to checkpoint: give the group up right away.
            group.failed = "stopped before it was placed"
            self._release(group_key(handle.run_dir), forget=False)

    def recover(self, run_dir: str, rank: int) -> ReplicaHandle | None:
        try:
            ray.get_actor(actor_name(run_dir, rank), namespace=self.namespace)
        except ValueError:
            return None
        return ReplicaHandle(0, None, run_dir, rank)

    # -- release --------------------------------------------------------------------------
    def _release(self, key: str, forget: bool = True) -> None:
        """Remove the group (Ray kills the actors in it; their children follow by
        PDEATHSIG); a guest's own actors only, its host's group is not its to remove."""
        group = self._groups.get(key)
        if forget:
            self._groups.pop(key, None)
            for slot in [s for s, (k, _) in self._holders.items() if k == key]:
                del self._holders[slot]
        if group is not None and group.home is not None:
            self._kill_guest(group)
            return
        pg = group.pg if group is not None else None
        if pg is None:
            try:
                pg = get_placement_group(f"coadapt-{key}")
            except ValueError:
                return
        with contextlib.suppress(Exception):  # already removed, or the GCS is away: retried
            remove_placement_group(pg)

    def _kill_guest(self, group: _Group) -> None:
        """End a guest's actors (they live in its host's group, which stays); each rank the
        loop polled is known, rank 0 at least is looked up by name."""
        for rank in sorted(set(group.actors) | set(group.bundles) | {0}):
            actor = group.actors.get(rank)
            handle = actor.handle if actor is not None else None
            with contextlib.suppress(Exception):  # gone already, or the GCS is away
                if handle is None:
                    handle = ray.get_actor(
                        actor_name(group.run_dir, rank), namespace=self.namespace
                    )
                ray.kill(handle, no_restart=True)

    def retain(self, run_dirs: Collection[str]) -> None:
        """Remove the groups of attempts that have no live replica left, except a host's
        group while a packed guest lives in it. While an adopted guest has not yet said
        where it lives, nothing is removed (its home might be any group)."""
        self._probed &= set(run_dirs)
        for d in run_dirs:  # adopt kept attempts first: a guest among them holds its home
            if group_key(d) not in self._groups and d not in self._probed:
                self._probed.add(d)
                self._group(d)
        keep = {group_key(d) for d in run_dirs}
        homes = {g.home for k, g in self._groups.items() if k in keep and g.home is not None}
        if _UNKNOWN in homes:
            return
        keep |= {h for h in homes if h is not None}
        for key in [k for k in self._groups if k not in keep]:
            self._release(key)
        now = time.monotonic()
        if now - self._scanned_at < self.scan_interval:
            return
        self._scanned_at = now
        # Groups this process never saw (an earlier controller's): only our namespace's.
        try:
            table = placement_group_table()
        except Exception as exc:
            raise ExecutorError(f"cannot list placement groups: {exc}") from exc
        for info in table.values():
            name = str(info.get("name", ""))
            if not name.startswith("coadapt-") or info.get("state") == "REMOVED":
                continue
            key = name.removeprefix("coadapt-")
            if key in keep:
                continue
            with contextlib.suppress(ValueError):
                pg = get_placement_group(name)  # raises unless the group is in our namespace
                if pg.id.hex() == info.get("placement_group_id"):
                    with contextlib.suppress(Exception):
                        remove_placement_group(pg)

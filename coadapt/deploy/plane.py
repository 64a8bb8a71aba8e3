"""The deployment plane: replica and gateway processes that make deployments real.

The control loop (:mod:`coadapt.controller.reconciler`) decides how many slots each deployment
holds; this module, the :class:`~coadapt.controller.serving.ServingPlane` it calls, makes the
processes match, level-triggered like the training side: every tick re-reads the deployment
and replica rows, polls the processes, and acts on the difference, so a controller killed at
any point and restarted picks up where it stopped.

Per deployment:

* one *gateway* (``python -m coadapt.serve.gateway``) on the controller's machine, in a session
  of its own so it outlives the controller; its pid and start time are stored, and a restarted
  controller re-adopts it (never two gateways for one deployment);
* *replicas* (``python -m coadapt.serve run``) started through the executor on slots the
  reservation placed, each row written before its process starts; a replica listens on its
  node's ``address`` (:class:`~coadapt.executors.NodeInventory`: loopback on one machine, the
  node's IP on Ray), where the readiness probe and the gateway reach it, and enters the route
  table once its ``GET /readyz`` answers 200;
* scale-down drains first: the replica leaves the route table (a new generation), gets SIGTERM
  once the gateway reports that generation (or after :data:`DRAIN_WAIT_S`), SIGKILL after the
  stop grace.

Demand comes back from the gateways (``GET /-/stats``) as the autoscalers'
:class:`~coadapt.policies.autoscale.DemandWindow`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence, Set
from pathlib import Path
from typing import Any

from coadapt.atomicfile import atomic_write
from coadapt.controller.errors import ControllerError
from coadapt.controller.launch_plan import inherited
from coadapt.controller.serving import Slot
from coadapt.deploy.spec import DeploymentSpec
from coadapt.deploy.store import (
    DeploymentRecord,
    DeploymentState,
    DeploymentStore,
    ServingReplicaRecord,
    ServingReplicaStatus,
)
from coadapt.executors import Executor, ExecutorError, ReplicaHandle, ReplicaPhase, ReplicaSpec
from coadapt.executors._proc import proc_start_ticks, proc_state
from coadapt.policies.autoscale import Autoscaler, DemandWindow, Deployment, make_autoscaler
from coadapt.policies.coschedule import Reservation
from coadapt.ports import free_port
from coadapt.protocol import ENV_TENANT, EventKind
from coadapt.serve.routing import (
    STATS_PATH,
    Backend,
    GatewayStats,
    RouteError,
    RouteTable,
    demand_window,
)

log = logging.getLogger("coadapt.deploy")

S = ServingReplicaStatus
#: A replica row whose process may be alive (its slot is taken).
ALIVE = (S.STARTING, S.READY, S.DRAINING, S.STOPPING)
#: A replica that counts towards the deployment's grant (not on its way out).
SERVING = (S.STARTING, S.READY)
PROBE_TIMEOUT_S = 0.1  # one readiness probe (a replica still loading refuses at once)
PROBE_BUDGET_S = 0.2  # all readiness probes of one tick together
STATS_TIMEOUT_S = 0.5  # the autoscaler's demand fetch, once per serving round
GENERATION_TIMEOUT_S = 0.1  # "has the gateway read the new table yet?" (while draining)
DRAIN_WAIT_S = 2.0  # SIGTERM a drained replica after this even if the gateway never said
RESIGNAL_S = 5.0  # re-send SIGTERM this often while a stop is pending (level-triggered)
MAX_BACKOFF_S = 60.0  # longest wait before restarting a replica that keeps dying unready
HOST = "127.0.0.1"  # gateways listen here, on the controller's machine (replicas: their node's)
REPLICA_RANK = 0  # a serving replica is the one rank of an attempt of its own (its run dir)


def _get_json(host: str, port: int, path: str, timeout: float) -> tuple[int, Any] | None:
    """``GET http://host:port/path`` -> (status, parsed JSON or None); None if no answer."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()
    try:
        return resp.status, json.loads(body) if body else None
    except ValueError:
        return resp.status, None


def _alive(pid: int | None, start_ticks: int | None) -> bool:
    """The process exists, is not a zombie, and is the one recorded (same start time)."""
    if pid is None:
        return False
    ticks = proc_start_ticks(pid)
    if ticks is None or (start_ticks is not None and ticks != start_ticks):
        return False
    return proc_state(pid) not in (None, "Z", "X")


def _handle(row: ServingReplicaRecord) -> ReplicaHandle:
    if row.pid is None:
        raise ValueError(f"serving replica {row.id} has no pid yet")
    return ReplicaHandle(row.pid, row.start_ticks, row.run_dir, REPLICA_RANK)


class GatewayDemand:
    """The :class:`~coadapt.policies.autoscale.DemandSource` of the plane: each deployment's
    gateway figures, fetched when the autoscaler asks (once per serving round)."""

    def __init__(self, plane: DeploymentPlane) -> None:
        self._plane = plane
        self._unreachable: set[int] = set()  # deployments whose gateway was logged as down

    def stats(self, deployment: str, since: int, timeout: float) -> GatewayStats | None:
        """The gateway's figures for seconds ``>= since``, or None (no gateway, no answer)."""
        rec = self._plane.record(deployment)
        if rec is None:
            return None
        got = _get_json(HOST, rec.gateway_port, f"{STATS_PATH}?since={since}", timeout)
        stats: GatewayStats | None = None
        if got is not None and got[0] == 200:
            try:
                stats = GatewayStats.from_json(got[1])
            except RouteError as exc:
                log.warning("deployment %s: bad gateway stats: %s", deployment, exc)
        if stats is None and rec.id not in self._unreachable:
            self._unreachable.add(rec.id)
            log.warning(
                "deployment %s: gateway on port %d unreachable; no demand figures until it answers",
                deployment,
                rec.gateway_port,
            )
        elif stats is not None:
            self._unreachable.discard(rec.id)
        return stats

    def window(self, deployment: str, start: float, end: float) -> DemandWindow:
        stats = self.stats(deployment, math.floor(start), STATS_TIMEOUT_S)
        seconds = stats.seconds if stats is not None else ()
        held = stats.held_now if stats is not None else 0
        return demand_window(seconds, start, end, self._plane.ready_count(deployment), held)


class DeploymentPlane:
    """Runs each deployment's gateway and replicas; the controller's serving half."""

    def __init__(
        self,
        deploys: DeploymentStore,
        executor: Executor,
        state_dir: Path,
        stop_grace: float = 30.0,
        autoscaler_name: str = "slo",
        python: str | None = None,
        jobs_dir: Path | None = None,
    ) -> None:
        self.deploys = deploys
        self.store = deploys.store  # events (the controller's ``events`` table), tenants
        self.executor = executor
        self.state_dir = Path(state_dir)
        # Replicas run tenant code (a model's factory): like a job's replicas they get a job
        # directory under the jobs root, which the executor's confinement binds back and hands
        # to the tenant's run-as user; the state dir itself stays hidden from them.
        self.jobs_dir = Path(jobs_dir) if jobs_dir is not None else self.state_dir / "jobs"
        self.stop_grace = stop_grace
        self.python = python or sys.executable
        self._autoscaler = make_autoscaler(autoscaler_name)
        self._demand = GatewayDemand(self)
        self._records: dict[str, DeploymentRecord] = {}  # scheduling name -> record
        self._names: dict[int, str] = {}  # record id -> scheduling name
        self._gateways: dict[int, subprocess.Popen[bytes]] = {}  # ours, to reap them
        self._gateway_stop: dict[int, float] = {}  # deployment id -> when SIGTERM was sent
        self._tables: dict[int, RouteTable] = {}  # deployment id -> the table last written
        self._drain: dict[int, tuple[float, int]] = {}  # replica -> (since, generation)
        self._stop_since: dict[int, float] = {}  # replica -> first SIGTERM
        self._signalled: dict[int, float] = {}  # replica -> last SIGTERM
        self._recovered = False
        # Replicas that died before they were ready: (failures in a row, no start before).
        self._failures: dict[int, int] = {}
        self._retry_at: dict[int, float] = {}
        self._gateway_fails: dict[int, int] = {}  # gateway starts in a row (reset once it runs)
        self._gateway_retry_at: dict[int, float] = {}
        self._tenants: dict[str, str] = {}
        # The executor's inventory, read once per tick: slots per node (where replicas may
        # start) and each node's address (where they listen); an address stays known after
        # its node leaves, for the replicas still recorded there.
        self._slots: dict[str, int] = {}
        self._addresses: dict[str, str] = {}

    # -- ServingPlane -------------------------------------------------------------------
    def deployments(self) -> Sequence[Deployment]:
        """ACTIVE deployments as the scheduler sees them (named by :meth:`name_of`)."""
        self._refresh_records()
        return [
            dataclasses.replace(rec.spec.deployment(), name=name)
            for name, rec in sorted(self._records.items())
            if rec.state is DeploymentState.ACTIVE
        ]

    def demand(self) -> GatewayDemand:
        return self._demand

    def autoscaler(self) -> Autoscaler:
        return self._autoscaler

    def occupied(self) -> Set[Slot]:
        """Slots of replica rows whose process may be alive (a row without a pid is counted
        too: its process may be starting)."""
        return {(r.node, r.slot) for r in self.deploys.replicas(statuses=ALIVE)}

    def reconcile(
        self, reservations: Mapping[str, Reservation], busy: Set[Slot], now: float
    ) -> None:
        if not self._recovered:
            self._recover(now)
            self._recovered = True
        self._read_nodes()
        self._refresh_records()
        rows = self.deploys.replicas(statuses=ALIVE)
        by_dep: dict[int, list[ServingReplicaRecord]] = {}
        for row in rows:
            by_dep.setdefault(row.deployment_id, []).append(row)
        taken = {(r.node, r.slot) for r in rows} | set(busy)
        budget = [time.monotonic() + PROBE_BUDGET_S]
        for name, rec in sorted(self._records.items()):
            try:
                self._reconcile_one(
                    name, rec, reservations.get(name), by_dep.get(rec.id, []), taken, now, budget
                )
            except (ControllerError, ExecutorError, OSError, RouteError) as exc:
                log.error("deployment %s: reconcile failed: %s", name, exc)
                self._event(rec, f"reconcile failed: {exc}", now)
        # Rows of deployments no longer listed (deleted meanwhile): make sure nothing runs.
        known = {rec.id for rec in self._records.values()}
        for dep_id, orphans in by_dep.items():
            if dep_id not in known:
                for row in orphans:
                    self._poll(row, now)

    def _read_nodes(self) -> None:
        """This tick's inventory; when the executor cannot say, no replica starts this tick
        (the running ones keep their known addresses)."""
        try:
            nodes = self.executor.nodes()
        except ExecutorError as exc:
            log.warning("deployments: cannot read the executor's nodes: %s", exc)
            self._slots = {}
            return
        self._slots = {n.name: n.slots for n in nodes}
        self._addresses.update({n.name: n.address for n in nodes})

    # -- lookups ------------------------------------------------------------------------
    def address(self, node: str) -> str | None:
        """Where replicas on ``node`` listen (None: a node this plane never saw)."""
        return self._addresses.get(node)

    def record(self, name: str) -> DeploymentRecord | None:
        """The deployment a scheduling name stands for (None: unknown or gone)."""
        return self._records.get(name)

    def name_of(self, rec: DeploymentRecord) -> str:
        """The scheduling name of ``rec``: its own name, or ``tenant/name`` when two tenants
        use the same name (reservations are keyed by it)."""
        return self._names.get(rec.id, rec.name)

    def run_dirs(self) -> set[str]:
        """Run directories of replicas that may be alive: what the controller must keep when
        it tells the executor to release finished attempts (``Executor.retain``; on Ray a
        replica's placement group is keyed by its run directory)."""
        return {r.run_dir for r in self.deploys.replicas(statuses=ALIVE)}

    def ready_count(self, name: str) -> int:
        rec = self._records.get(name)
        if rec is None:
            return 0
        return len(self.deploys.replicas(rec.id, statuses=(S.READY,)))

    def replica_job_dir(self, deployment_id: int) -> Path:
        """The job directory the deployment's replicas run in (``deploy-<id>`` under the
        jobs root, where the executor's confinement expects a job's directory)."""
        return self.jobs_dir / f"deploy-{deployment_id}"

    def _view(self, rec: DeploymentRecord) -> Path:
        return self.run_dir(rec.id) / "pinned"

    def run_dir(self, deployment_id: int) -> Path:
        return self.state_dir / "deployments" / str(deployment_id)

    def _refresh_records(self) -> None:
        records = self.deploys.list(None, (DeploymentState.ACTIVE, DeploymentState.DELETING))
        counts: dict[str, int] = {}
        for rec in records:
            counts[rec.name] = counts.get(rec.name, 0) + 1
        self._records.clear()
        self._names.clear()
        for rec in records:
            name = rec.name
            if counts[rec.name] > 1:
                name = f"{self._tenant_name(rec.tenant_id)}/{rec.name}"
            self._records[name] = rec
            self._names[rec.id] = name

    def _tenant_name(self, tenant_id: str) -> str:
        if tenant_id not in self._tenants:
            self._tenants = {t.id: t.name for t in self.store.tenants()}
        return self._tenants.get(tenant_id, tenant_id)

    def _event(self, rec: DeploymentRecord, message: str, now: float, **data: Any) -> None:
        self.store.add_event(
            None,
            EventKind.DEPLOY,
            f"deployment {self.name_of(rec)}: {message}",
            now,
            {"deployment": self.name_of(rec), "deployment_id": rec.id, **data},
        )

    # -- after a controller restart -----------------------------------------------------
    def _recover(self, now: float) -> None:
        """Rows a dead controller wrote before their process started (or before it recorded
        the pid): adopt the process if the executor finds it running, else the row is over.
        Either way no replica runs unrecorded, so none is started twice."""
        for row in self.deploys.replicas(statuses=ALIVE):
            if row.pid is not None:
                continue
            handle = self.executor.recover(row.run_dir, REPLICA_RANK)
            if handle is not None and self.executor.poll(handle).phase is ReplicaPhase.RUNNING:
                self.deploys.update_replica(row.id, pid=handle.pid, start_ticks=handle.start_ticks)
                log.info("serving replica %d re-adopted (pid %d)", row.id, handle.pid)
                continue
            self.deploys.update_replica(
                row.id,
                status=S.EXITED,
                ended_at=now,
                reason="the controller stopped before the replica started",
            )

    # -- one deployment -----------------------------------------------------------------
    def _reconcile_one(
        self,
        name: str,
        rec: DeploymentRecord,
        res: Reservation | None,
        rows: list[ServingReplicaRecord],
        taken: set[Slot],
        now: float,
        budget: list[float],
    ) -> None:
        rows = [r for r in rows if self._poll(r, now)]
        deleting = rec.state is DeploymentState.DELETING
        if not deleting:
            self._ensure_gateway(rec, now)
        rows = [self._probe(rec, r, now, budget) for r in rows]
        want = {} if deleting or res is None else dict(res.placement)
        rows = self._scale(rec, rows, want, taken, now)
        table = self._route(rec, name, res, rows)
        self._stop_drained(rec, rows, table, now)
        if deleting and not rows:
            self._finish_delete(rec, now)

    def _poll(self, row: ServingReplicaRecord, now: float) -> bool:
        """Whether the replica's process still runs; an ended one's row becomes EXITED."""
        if row.pid is None:
            return True  # being started (or recovered at startup)
        status = self.executor.poll(_handle(row))
        if not status.done:
            return True
        expected = row.status in (S.DRAINING, S.STOPPING)
        self.deploys.update_replica(
            row.id,
            status=S.EXITED,
            ended_at=now,
            exit_code=status.exit_code,
            reason=status.reason or ("stopped" if expected else "exited"),
        )
        for memo in (self._drain, self._stop_since, self._signalled):
            memo.pop(row.id, None)
        if not expected:
            rec = self.deploys.by_id(row.deployment_id)
            if row.status is S.STARTING:  # a crash loop backs off: 1, 2, 4, ... 60 s
                fails = self._failures[rec.id] = self._failures.get(rec.id, 0) + 1
                self._retry_at[rec.id] = now + min(2.0 ** (fails - 1), MAX_BACKOFF_S)
            self._event(
                rec,
                f"replica {row.id} on {row.node}:{row.slot} ended unexpectedly "
                f"(code {status.exit_code}, {status.reason or 'no reason'}); see {row.log_path}",
                now,
                replica=row.id,
                exit_code=status.exit_code,
            )
        return False

    def _probe(
        self, rec: DeploymentRecord, row: ServingReplicaRecord, now: float, budget: list[float]
    ) -> ServingReplicaRecord:
        """A STARTING replica whose ``/readyz`` answers 200 becomes READY (cold start noted)."""
        host = self._addresses.get(row.node)
        if row.status is not S.STARTING or row.pid is None or host is None:
            return row
        if time.monotonic() > budget[0]:
            return row
        got = _get_json(host, row.port, "/readyz", PROBE_TIMEOUT_S)
        if got is None or got[0] != 200:
            return row
        row = self.deploys.update_replica(row.id, status=S.READY, ready_at=now)
        self._failures.pop(rec.id, None)
        self._retry_at.pop(rec.id, None)
        cold = now - row.started_at
        self._event(
            rec,
            f"replica {row.id} ready on {row.node}:{row.slot} after {cold:.1f} s",
            now,
            replica=row.id,
            cold_start_s=round(cold, 3),
        )
        return row

    def _scale(
        self,
        rec: DeploymentRecord,
        rows: list[ServingReplicaRecord],
        want: Mapping[str, int],
        taken: set[Slot],
        now: float,
    ) -> list[ServingReplicaRecord]:
        """Start replicas on free slots of nodes short of their grant; drain the newest
        beyond it. Returns the deployment's live rows after the changes."""
        out = list(rows)
        for node in sorted(set(want) | {r.node for r in rows}):
            serving = [r for r in out if r.node == node and r.status in SERVING]
            extra = len(serving) - want.get(node, 0)
            if extra > 0:
                newest = sorted(serving, key=lambda r: (r.started_at, r.id), reverse=True)
                for row in newest[:extra]:
                    out[out.index(row)] = self._begin_stop(rec, row, now)
                continue
            missing = -extra
            for row in [r for r in out if r.node == node and r.status is S.DRAINING][:missing]:
                # the scale-down is called off before its SIGTERM: back into the route table
                self._drain.pop(row.id, None)
                out[out.index(row)] = self.deploys.update_replica(row.id, status=S.READY)
                missing -= 1
            if missing <= 0 or now < self._retry_at.get(rec.id, -math.inf):
                continue
            free = [s for s in range(self._slots.get(node, 0)) if (node, s) not in taken]
            for slot in free[:missing]:
                started = self._start_replica(rec, node, self._addresses[node], slot, now)
                taken.add((node, slot))
                if started is not None:
                    out.append(started)
        return out

    def _begin_stop(
        self, rec: DeploymentRecord, row: ServingReplicaRecord, now: float
    ) -> ServingReplicaRecord:
        """A ready replica is drained (out of the route table first); one not ready yet
        serves nobody and is stopped at once."""
        if row.status is S.READY:
            self._drain[row.id] = (now, -1)  # the generation is known once the table is out
            self._event(rec, f"replica {row.id} draining (scale down)", now, replica=row.id)
            return self.deploys.update_replica(row.id, status=S.DRAINING)
        return self._terminate(row, now)

    def _terminate(self, row: ServingReplicaRecord, now: float) -> ServingReplicaRecord:
        self._drain.pop(row.id, None)
        self._stop_since.setdefault(row.id, now)
        row = self.deploys.update_replica(row.id, status=S.STOPPING)
        self._signal(row, now)
        return row

    def _signal(self, row: ServingReplicaRecord, now: float) -> None:
        """SIGTERM (re-sent every :data:`RESIGNAL_S`), SIGKILL after the stop grace."""
        if row.pid is None:
            return
        since = self._stop_since.setdefault(row.id, now)
        force = now - since >= self.stop_grace
        last = self._signalled.get(row.id)
        if not force and last is not None and now - last < RESIGNAL_S:
            return
        try:
            self.executor.stop(_handle(row), force=force)
        except ExecutorError as exc:
            log.error("cannot stop serving replica %d: %s", row.id, exc)
        self._signalled[row.id] = now

    def _stop_drained(
        self,
        rec: DeploymentRecord,
        rows: list[ServingReplicaRecord],
        table: RouteTable | None,
        now: float,
    ) -> None:
        """Drained replicas get SIGTERM once the gateway runs a table without them (or after
        :data:`DRAIN_WAIT_S`); stopping ones are signalled again or killed."""
        draining = [r for r in rows if r.status is S.DRAINING]
        seen: int | None = None
        if draining and table is not None:
            stats = self._demand.stats(self.name_of(rec), math.floor(now), GENERATION_TIMEOUT_S)
            seen = stats.generation if stats is not None else None
        for row in rows:
            if row.status is S.STOPPING:
                self._signal(row, now)
                continue
            if row.status is not S.DRAINING:
                continue
            since, gen = self._drain.get(row.id, (now, -1))
            if gen < 0 and table is not None:
                gen = table.generation
            self._drain[row.id] = (since, gen)
            if (seen is not None and gen >= 0 and seen >= gen) or now - since >= DRAIN_WAIT_S:
                self._terminate(row, now)

    def _start_replica(
        self, rec: DeploymentRecord, node: str, address: str, slot: int, now: float
    ) -> ServingReplicaRecord | None:
        """Row first, then the process, then its pid (a crash in between is found again by
        :meth:`_recover`).

        The port is one free on the controller's machine: on a remote node (Ray) it may be
        taken there. Such a replica cannot listen, exits 1 before it is ready, and is started
        again (after the crash backoff, 1 s the first time) with another port."""
        spec = rec.spec
        port = free_port()
        try:
            argv = self._argv(rec, port, address)
        except (OSError, ValueError) as exc:  # a pinned version gone from the model's root
            self._retry_at[rec.id] = now + MAX_BACKOFF_S
            self._event(rec, f"cannot start a replica: {exc}", now)
            return None
        stamp = f"{int(now * 1000)}-{node}-{slot}"
        job_dir = self.replica_job_dir(rec.id)
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        job_dir.mkdir(mode=0o700, exist_ok=True)
        # Run files (pid, exit record) and logs stay the controller's, beside the job dir's
        # content like a training attempt's (a replica cannot forge its own exit record).
        run_dir = job_dir / "runs" / stamp
        run_dir.mkdir(parents=True, exist_ok=True)
        log_path = job_dir / "logs" / f"{stamp}.log"
        row = self.deploys.add_replica(rec.id, node, slot, port, str(run_dir), str(log_path), now)
        env = {k: v for k, v in os.environ.items() if inherited(k)}
        env["PYTHONUNBUFFERED"] = "1"
        env["OMP_NUM_THREADS"] = str(spec.threads)
        env["HOME"] = str(job_dir)
        env[ENV_TENANT] = self._tenant_name(rec.tenant_id)  # its run-as user, its sandbox
        if self.executor.uses_gpus():
            env["CUDA_VISIBLE_DEVICES"] = str(slot)
        replica = ReplicaSpec(
            job_id=f"deploy-{rec.id}",
            attempt=0,
            rank=REPLICA_RANK,
            world_size=1,
            argv=argv,
            cwd=str(job_dir),
            run_dir=str(run_dir),
            log_path=str(log_path),
            slot=slot,
            env=env,
            node=node,
            # what it serves from, bound back read-only where confinement hides it
            expose=(rec.model_root, *(() if spec.follows_live else (str(self._view(rec)),))),
        )
        try:
            (result,) = self.executor.launch_group([replica])
        except ExecutorError as exc:
            result = exc
        if isinstance(result, ExecutorError):
            self.deploys.update_replica(
                row.id,
                status=S.EXITED,
                ended_at=now,
                exit_code=127,
                reason=f"launch failed: {result}",
            )
            self._event(rec, f"replica on {node}:{slot} failed to start: {result}", now)
            return None
        row = self.deploys.update_replica(row.id, pid=result.pid, start_ticks=result.start_ticks)
        how = f"pid {result.pid}" if result.pid > 0 else f"through {self.executor.name}"
        self._event(
            rec,
            f"replica {row.id} starting on {node}:{slot} (at {address}:{port}, {how})",
            now,
            replica=row.id,
            node=node,
            slot=slot,
        )
        return row

    def _argv(self, rec: DeploymentRecord, port: int, host: str = HOST) -> tuple[str, ...]:
        spec: DeploymentSpec = rec.spec
        model = f"{spec.model}={self._model_root(rec)}"
        return (
            self.python, "-m", "coadapt.serve", "run", "--model", model,
            "--host", host, "--port", str(port), "--workers", str(spec.workers),
            "--threads", str(spec.threads), "--slo-ms", str(spec.slo_ms),
        )  # fmt: skip

    def _model_root(self, rec: DeploymentRecord) -> str:
        """The version root a replica serves from. ``version: live`` is the registered root
        itself (a replica follows its LIVE pointer as the registry moves it); a pinned version
        is a view of that root whose own LIVE pointer names the version for good: links to the
        versions up to it (a delta reads its parents) and nothing newer, so the replica, which
        only ever follows a root's pointer, stays on the pinned version."""
        spec: DeploymentSpec = rec.spec
        if spec.follows_live:
            return rec.model_root
        from coadapt.serve import artifacts  # torch: only for pinned deployments

        root = Path(rec.model_root)
        artifacts.read_manifest(root, spec.version)  # ArtifactError: gone from the root
        view = self._view(rec)
        view.mkdir(parents=True, exist_ok=True)
        for src in artifacts.version_dirs(root):
            link = view / src.name
            if src.name <= spec.version and not link.is_symlink():
                link.symlink_to(src.resolve(), target_is_directory=True)
        atomic_write(view / artifacts.LIVE_FILE, f"{spec.version}\n".encode())
        return str(view)

    # -- route table --------------------------------------------------------------------
    def _route(
        self,
        rec: DeploymentRecord,
        name: str,
        res: Reservation | None,
        rows: Iterable[ServingReplicaRecord],
    ) -> RouteTable | None:
        """Rewrite the gateway's route table when what it says changes (generation + 1). A
        backend is its replica's node address (a ready replica on a node never seen since the
        controller started is left out: its node left, and the executor reports it lost)."""
        gw_dir = self.run_dir(rec.id) / "gateway"
        ready = sorted(
            (r for r in rows if r.status is S.READY and r.node in self._addresses),
            key=lambda r: r.id,
        )
        table = RouteTable(
            deployment=name,
            model=rec.spec.model,
            generation=0,
            backends=tuple(Backend(str(r.id), self._addresses[r.node], r.port) for r in ready),
            admit_rps=res.admit_rps if res is not None else None,
            retry_after_s=max(res.retry_after_s, 1.0) if res is not None else 60.0,
            slo_s=rec.spec.slo_ms / 1000.0,
            slo_quantile=rec.spec.slo_quantile,
        )
        last = self._tables.get(rec.id)
        if last is None:
            with contextlib.suppress(RouteError):
                last = RouteTable.read(gw_dir)
        if last is not None and dataclasses.replace(last, generation=0) == table:
            self._tables[rec.id] = last
            return last
        table = dataclasses.replace(table, generation=(last.generation if last else 0) + 1)
        gw_dir.mkdir(parents=True, exist_ok=True)
        table.write(gw_dir)
        self._tables[rec.id] = table
        return table

    # -- gateway ------------------------------------------------------------------------
    def _gateway_alive(self, rec: DeploymentRecord) -> bool:
        child = self._gateways.get(rec.id)
        if child is not None and child.pid == rec.gateway_pid:
            if child.poll() is None:
                return True
            del self._gateways[rec.id]  # reaped
            return False
        return _alive(rec.gateway_pid, rec.gateway_start_ticks)

    def _ensure_gateway(self, rec: DeploymentRecord, now: float) -> None:
        if self._gateway_alive(rec):
            if now >= self._gateway_retry_at.get(rec.id, math.inf):
                self._gateway_fails.pop(rec.id, None)  # it outlived its backoff: healthy
            return
        if now < self._gateway_retry_at.get(rec.id, -math.inf):
            return
        gw_dir = self.run_dir(rec.id) / "gateway"
        gw_dir.mkdir(parents=True, exist_ok=True)
        if rec.id not in self._tables:  # the gateway starts with a table to read
            self._route(rec, self.name_of(rec), None, ())
        argv = [self.python, "-m", "coadapt.serve.gateway", "--run-dir", str(gw_dir)]
        argv += ["--port", str(rec.gateway_port), "--host", HOST]
        env = {k: v for k, v in os.environ.items() if inherited(k)}
        pkg_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), pkg_root) if p)
        env["PYTHONUNBUFFERED"] = "1"
        with open(gw_dir / "gateway.log", "ab") as out:
            proc = subprocess.Popen(
                argv,
                cwd=gw_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives the controller; re-adopted by pid + ticks
            )
        self._gateways[rec.id] = proc
        # One that dies at once is not restarted every tick: 1, 2, 4, ... 60 s apart.
        fails = self._gateway_fails[rec.id] = self._gateway_fails.get(rec.id, 0) + 1
        self._gateway_retry_at[rec.id] = now + min(2.0 ** (fails - 1), MAX_BACKOFF_S)
        self.deploys.set_gateway(rec.id, proc.pid, proc_start_ticks(proc.pid), str(gw_dir), now)
        was = "restarted" if rec.gateway_pid is not None else "started"
        self._event(
            rec,
            f"gateway {was} on {HOST}:{rec.gateway_port} (pid {proc.pid})",
            now,
            pid=proc.pid,
            port=rec.gateway_port,
        )

    def _finish_delete(self, rec: DeploymentRecord, now: float) -> None:
        """No replica runs: stop the gateway (SIGTERM, SIGKILL after the grace), then the
        deployment is DELETED."""
        if self._gateway_alive(rec) and rec.gateway_pid is not None:
            since = self._gateway_stop.get(rec.id)
            if since is None or now - since >= self.stop_grace:
                sig = signal.SIGTERM if since is None else signal.SIGKILL
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(rec.gateway_pid, sig)  # it leads its own session
                self._gateway_stop.setdefault(rec.id, now)
            return
        self._gateway_stop.pop(rec.id, None)
        self._gateways.pop(rec.id, None)
        self._tables.pop(rec.id, None)
        self.deploys.set_gateway(rec.id, None, None, rec.gateway_run_dir, now)
        self.deploys.mark_deleted(rec.id, now)
        self._event(rec, "deleted (replicas and gateway stopped)", now)

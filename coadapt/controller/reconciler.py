"""The level-triggered control loop: observe replicas, settle job states, run the policy,
and make the processes match the policy's decision.

Every tick re-derives what to do from the database and the executor's observations, never
from memory of what it did last, so it is idempotent and a controller killed at any point
picks up where it stopped (Kubernetes-controller style). The policy is only ever called as
``policy.optimize(snapshot, state, rng)``, with ``state`` the previous round's, read back from
the database (``meta`` key ``policy_state:<name>``); the loop never asks which policy it runs.

Invariants the loop keeps:

* a job launches a new attempt only when none of its replicas is alive (no job runs twice);
* a launch happens only into free slots of the nodes the policy chose, and all replicas of an
  attempt launch together (a rescaling job holds its slots until it exits);
* every replica row is written before its process starts and carries PID + start time, so a
  restarted controller re-adopts live replicas instead of duplicating them;
* the cluster is whatever the executor reports each tick: a node that leaves takes its replicas
  with it (they are "lost", and the job restarts from its checkpoint on what remains without
  counting a failure); a node that joins is used from the next policy round.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from coadapt.controller.errors import ControllerError, InvalidTransitionError
from coadapt.controller.launch_plan import AttemptPlan, replica_specs, server_spec
from coadapt.controller.serving import SERVING_STATE_KEY, ServingPlane, Slot
from coadapt.controller.snapshot import (
    ATTEMPT_GPU_TYPE,
    accrued_service,
    allocation_dict,
    build_snapshot,
)
from coadapt.controller.spec import JobSpec
from coadapt.controller.states import ACTIVE, JobState
from coadapt.controller.store import Job, Replica, Store
from coadapt.executors import Executor, ExecutorError, ReplicaHandle, ReplicaPhase
from coadapt.policies import (
    Allocation,
    ClusterSnapshot,
    Decision,
    NodeInfo,
    Policy,
    PolicyError,
    state_from_json,
    state_to_json,
    validate_allocations,
)
from coadapt.policies.autoscale import Deployment
from coadapt.policies.base import PolicyState
from coadapt.policies.coschedule import CoSchedulePolicy, Reservation, reservations_of
from coadapt.ports import free_port
from coadapt.protocol import EventKind, ReplicaStatus
from coadapt.sparse.jobs import JobLayout
from coadapt.train.memory import read_limit, shrink

log = logging.getLogger("coadapt.controller")

Clock = Callable[[], float]
LIVE = (ReplicaStatus.STARTING, ReplicaStatus.LIVE)
_RESIGNAL_S = 5.0  # re-send SIGTERM this often while a stop is pending (level-triggered)
_SPARSE = "sparse"  # a sparse job's JobLayout root, under its job directory
_STOPPED = "STOPPED"  # marker: every shard server of an ended job is gone
PACKING_KEY = "packing"  # meta key: the last round's Decision.packed, as JSON


@dataclass(frozen=True)
class ControllerConfig:
    """Tunables of the loop (CLI flags of ``coadapt server``)."""

    state_dir: Path
    interval: float = 60.0  # seconds between policy rounds (plus prompt rounds on changes)
    stop_grace: float = 30.0  # SIGTERM -> SIGKILL after this many seconds
    backoff_base: float = 2.0  # first retry delay after a failure; doubles per failure
    backoff_max: float = 300.0
    restart_delay: float = 30.0  # δ the policy charges for a re-allocation
    seed: int = 0
    metrics_base_url: str | None = None  # e.g. http://127.0.0.1:7373
    min_round_gap: float = 1.0  # prompt rounds (submit, finish) at most this often
    # Where job directories (checkpoints, logs, run files) live; on a cluster, a path every
    # node mounts (NFS, a shared volume). None: under ``state_dir``.
    shared_dir: Path | None = None
    # GPU sharing: measured co-location throughputs handed to the policy
    # (ClusterSnapshot.colocation); empty (the default) means the policy never packs.
    colocation: Mapping[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    # Serving deployments (issue 17): their autoscalers decide this often between full rounds.
    serving_interval: float = 5.0


def _handle(rep: Replica) -> ReplicaHandle:
    if rep.pid is None:
        raise ValueError(f"replica {rep.id} has no pid yet")
    return ReplicaHandle(rep.pid, rep.start_ticks, rep.run_dir, rep.rank)


def _count(place: Sequence[tuple[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for node, _ in place:
        out[node] = out.get(node, 0) + 1
    return out


def type_violations(
    snapshot: ClusterSnapshot, allocations: Mapping[str, Allocation]
) -> dict[str, str]:
    """Jobs whose allocation spans two GPU types or uses a type outside their spec's
    ``gpu_types`` (a job runs on one allowed type at a time), with why."""
    out: dict[str, str] = {}
    for job_id, alloc in allocations.items():
        info = snapshot.jobs.get(job_id)
        types = sorted({n.gpu_type for n, k in zip(snapshot.nodes, alloc, strict=False) if k > 0})
        if len(types) > 1:
            out[job_id] = f"allocation of {job_id!r} spans GPU types {types}"
        elif info is not None and types and not info.allows(types[0]):
            out[job_id] = (
                f"allocation of {job_id!r} is on {types[0]}, outside its gpu_types "
                f"{list(info.gpu_types or ())}"
            )
    return out


def fmt_alloc(alloc: dict[str, int]) -> str:
    """``3`` on the single node ``local``, else ``node-a:2+node-b:1`` (events, logs)."""
    if set(alloc) <= {"local"}:
        return str(sum(alloc.values()))
    return "+".join(f"{n}:{k}" for n, k in sorted(alloc.items())) or "0"


class Controller:
    """Reconciles desired (policy) with observed (executor) state, one :meth:`step` at a time."""

    def __init__(
        self,
        store: Store,
        executor: Executor,
        policy: Policy,
        config: ControllerConfig,
        clock: Clock = time.time,
        serving: ServingPlane | None = None,
    ) -> None:
        self.store = store
        self.serving = serving
        self.executor = executor
        self.policy = policy
        self.config = config
        self.clock = clock
        self._nodes: tuple[NodeInfo, ...] = tuple(
            NodeInfo(n.name, n.slots, n.gpu_type) for n in executor.nodes()
        )
        self._poke = threading.Event()
        self._next_round = -np.inf
        self._last_schedulable: frozenset[str] | None = None
        self._signalled: dict[int, float] = {}
        self._tenant_names: dict[str, str] = {}
        self._round = int(store.meta_get("policy_round") or 0)
        self.policy_state_key = f"policy_state:{policy.name}"  # one memory per policy
        self.last_diagnostics: dict[str, float] = {}  # the last round's Decision.diagnostics
        self.last_round_seconds: float | None = None
        self.last_round_at: float | None = None
        # Sparse jobs whose shard servers may still run (found again on disk after a restart).
        self._server_jobs: set[str] = {
            p.parent.parent.name
            for p in (self.config.shared_dir or self.config.state_dir).glob(
                f"jobs/*/{_SPARSE}/servers"
            )
            if not (p / _STOPPED).exists()
        }
        self._server_stop_at: dict[str, float] = {}
        # Handles of the shard servers this process started: a just-started shard has not
        # written its pid file yet, so ``recover`` is only for servers of an earlier controller.
        self._server_handles: dict[tuple[str, int], ReplicaHandle] = {}
        # What serving holds for this round (read back after a restart: replicas keep running).
        self._next_serving_round = -np.inf
        self.reservations: dict[str, Reservation] = reservations_of(self._serving_state())

    # -- public ---------------------------------------------------------------------------
    @property
    def nodes(self) -> tuple[NodeInfo, ...]:
        """The cluster as last observed (name and slots of each node)."""
        return self._nodes

    @property
    def slots(self) -> int:
        """Slots of the whole cluster as last observed."""
        return sum(n.gpus for n in self._nodes)

    @property
    def next_round_at(self) -> float:
        """When the next policy round is due at the latest (an interval, or a retry delay's
        end, whichever comes first); prompt rounds may come sooner."""
        return float(self._next_round)

    @property
    def rounds(self) -> int:
        """Policy rounds run so far (persisted: the RNG of round r is seeded with r)."""
        return self._round

    def poke(self) -> None:
        """Ask for a prompt policy round (after a submit, a cancel, a finish); rounds are
        coalesced to at most one per ``min_round_gap`` so a burst of submissions costs one."""
        self._poke.set()

    def step(self) -> None:
        """One reconciliation: observe, settle, maybe schedule, act."""
        now = self.clock()
        self._observe_nodes(now)
        self._observe(now)
        self._settle(now)
        jobs = self.store.list_jobs(states=ACTIVE)
        schedulable = frozenset(j.id for j in jobs if self._schedulable(j, now))
        prompt = self._poke.is_set() or schedulable != self._last_schedulable
        recent = (
            self.last_round_at is not None and now - self.last_round_at < self.config.min_round_gap
        )
        if now >= self._next_round or (prompt and not recent):
            self._poke.clear()
            self.schedule(now)
            self._last_schedulable = schedulable
        elif (
            self.serving is not None
            and now >= self._next_serving_round
            and self.serving_round(now)  # serving needs training's slots (or frees some)
        ):
            self.schedule(now)
            self._last_schedulable = schedulable
        self._act(self.clock())
        self._servers(self.clock())
        self._serve(self.clock())

    def run(self, stop: threading.Event, tick: float = 0.5) -> None:
        """Loop until ``stop`` is set; an error in one step is logged and the loop goes on."""
        self.store.add_event(
            None,
            EventKind.CONTROLLER,
            f"controller started (policy {self.policy.name}, executor {self.executor.name}, "
            f"{len(self._nodes)} node(s), {self.slots} slots)",
            self.clock(),
        )
        while not stop.is_set():
            try:
                self.step()
            except (ControllerError, ExecutorError) as exc:
                log.error("reconcile step failed: %s", exc)
            except Exception:  # the supervisor must outlive a bug in one step; loudly
                log.exception("unexpected error in the reconcile step")
            stop.wait(tick)

    # -- observe --------------------------------------------------------------------------
    def _observe_nodes(self, now: float) -> None:
        """Take the executor's inventory; a change (node joined, left, resized) asks for a
        prompt round so new nodes are used and lost ones are planned around."""
        try:
            nodes = tuple(NodeInfo(n.name, n.slots, n.gpu_type) for n in self.executor.nodes())
        except ExecutorError as exc:
            log.error("cannot list the executor's nodes (keeping the last view): %s", exc)
            return
        if nodes == self._nodes:
            return
        old = {n.name: n.gpus for n in self._nodes}
        new = {n.name: n.gpus for n in nodes}
        joined = sorted(set(new) - set(old))
        left = sorted(set(old) - set(new))
        self._nodes = nodes
        parts = [f"{self.slots} slots on {len(nodes)} node(s)"]
        if joined:
            parts.append("joined: " + ", ".join(joined))
        if left:
            parts.append("left: " + ", ".join(left))
        self.store.add_event(
            None,
            EventKind.NODES,
            "; ".join(parts),
            now,
            {
                "nodes": new,
                "joined": joined,
                "left": left,
                "gpu_types": {n.name: n.gpu_type for n in nodes},
            },
        )
        self.poke()

    def _observe(self, now: float) -> None:
        for rep in self.store.replicas(statuses=LIVE):
            if rep.pid is None:  # the controller died between writing the row and starting
                handle = self.executor.recover(rep.run_dir, rep.rank)
                if handle is None:
                    self.store.update_replica(
                        rep.id,
                        status=ReplicaStatus.EXITED,
                        exit_code=None,
                        reason="launch interrupted",
                        ended_at=now,
                    )
                    continue
                rep = self.store.update_replica(
                    rep.id,
                    status=ReplicaStatus.LIVE,
                    pid=handle.pid,
                    start_ticks=handle.start_ticks,
                )
            status = self.executor.poll(_handle(rep))
            if status.phase is ReplicaPhase.RUNNING:
                if rep.status != ReplicaStatus.LIVE:
                    self.store.update_replica(rep.id, status=ReplicaStatus.LIVE)
                continue
            self._signalled.pop(rep.id, None)
            present = {n.name for n in self._nodes}
            # Evicted, or ended badly on a node that has left: the cluster's doing, not the job's.
            lost = status.phase is ReplicaPhase.EVICTED or (
                rep.node not in present and status.exit_code != 0
            )
            reason = status.reason or status.phase.value
            if lost and status.phase is not ReplicaPhase.EVICTED:
                reason = f"node {rep.node} left the cluster ({reason})"
            if status.oom and "memory" not in reason:
                reason = f"out of memory ({reason})"
            self.store.update_replica(
                rep.id,
                status=ReplicaStatus.LOST if lost else ReplicaStatus.EXITED,
                exit_code=status.exit_code,
                reason=reason,
                ended_at=now,
                oom=status.oom,
            )
            self.store.add_event(
                rep.job_id,
                EventKind.REPLICA_EXIT,
                f"attempt {rep.attempt} rank {rep.rank} "
                + (f"lost: {reason}" if lost else f"exited: code {status.exit_code} ({reason})"),
                now,
                {
                    "attempt": rep.attempt,
                    "rank": rep.rank,
                    "exit_code": status.exit_code,
                    "node": rep.node,
                    "lost": lost,
                    "oom": status.oom,
                },
            )
        # Level-triggered release of what finished attempts still hold (Ray placement groups);
        # shard servers of sparse jobs are kept while the job is active or stopping them.
        keep = {r.run_dir for r in self.store.replicas(statuses=LIVE)}
        for job_id in self._server_jobs:
            root = JobLayout(self.job_dir(job_id) / _SPARSE)
            keep.update(str(d) for d in root.servers_dir.glob("run-*"))
        if self.serving is not None:  # serving replicas are not the loop's rows
            keep |= set(self.serving.run_dirs())
        try:
            self.executor.retain(keep)
        except ExecutorError as exc:
            log.error("cannot release finished attempts' resources: %s", exc)

    # -- settle ---------------------------------------------------------------------------
    def _accrue(self, job: Job, now: float) -> dict[str, float | None]:
        """Attained service (slot-seconds) up to ``now``, for fields of an update."""
        if job.service_at is None or job.replicas <= 0:
            return {"service_at": None}
        attained = accrued_service(job.attained_service, job.replicas, job.service_at, now)
        return {"attained_service": attained, "service_at": None}

    def _settle(self, now: float) -> None:
        """Turn finished or failed attempts into state transitions."""
        for job in self.store.list_jobs(states=(JobState.RUNNING, JobState.RESCALING)):
            reps = self.store.replicas(job.id, attempt=job.attempt)
            live = [r for r in reps if r.status in LIVE]
            failed = [r for r in reps if r.status == ReplicaStatus.EXITED and r.exit_code != 0]
            lost = [r for r in reps if r.status == ReplicaStatus.LOST]
            if live:
                if (failed or lost) and job.state is JobState.RUNNING:
                    why = "a replica was lost" if lost else "a replica failed"
                    self._stop_all(job, live, now, EventKind.STOP, why)
                continue
            try:
                self._finish_attempt(job, reps, failed, now, lost)
            except InvalidTransitionError:
                continue  # someone (a cancel) changed the job meanwhile: next tick decides

    def _finish_attempt(
        self,
        job: Job,
        reps: Sequence[Replica],
        failed: Sequence[Replica],
        now: float,
        lost: Sequence[Replica] = (),
    ) -> None:
        accrued = self._accrue(job, now)
        common = dict(replicas=0, allocation=None, stop_requested_at=None, **accrued)
        if job.state is JobState.RESCALING or len(reps) < job.replicas or lost:
            if lost:  # a node left, or the placement never came: not the job's fault
                why = (
                    f"attempt {job.attempt} rank {lost[0].rank} lost ({lost[0].reason}); "
                    "restarting from the last checkpoint"
                )
            elif job.state is JobState.RESCALING:
                why = "stopped for re-allocation"
            else:
                why = "launch interrupted"
            self.store.update_job(
                job.id,
                now,
                state=JobState.PENDING,
                expect=job.state,
                event=(EventKind.ALLOC, f"{why}; 0 slots"),
                event_data={"replicas": 0},
                **common,
            )
            self.poke()
            return
        if not failed:
            self.store.update_job(
                job.id,
                now,
                state=JobState.SUCCEEDED,
                expect=job.state,
                reason="all replicas exited 0",
                event=(EventKind.ALLOC, "succeeded; 0 slots"),
                event_data={"replicas": 0},
                **common,
            )
            self.poke()
            return
        first = failed[0]
        cause = (
            f"attempt {job.attempt} rank {first.rank} exited with code {first.exit_code}"
            f" ({first.reason})"
        )
        ooms = [r for r in failed if r.oom]
        if ooms and self._retry_smaller(job, ooms[0], now, common):
            return
        if ooms:
            cause += "; out of memory even at per-replica batch 1"
        failures = job.failures + 1
        max_restarts = int(job.spec.get("max_restarts", 0))
        if failures > max_restarts:
            self.store.update_job(
                job.id,
                now,
                state=JobState.FAILED,
                expect=job.state,
                failures=failures,
                reason=f"{cause}; gave up after {max_restarts} restarts",
                event=(EventKind.ALLOC, f"failed: {cause}; 0 slots"),
                event_data={"replicas": 0},
                **common,
            )
        else:
            delay = min(self.config.backoff_base * 2 ** (failures - 1), self.config.backoff_max)
            self.store.update_job(
                job.id,
                now,
                state=JobState.PENDING,
                expect=job.state,
                failures=failures,
                not_before=now + delay,
                reason=cause,
                event=(
                    EventKind.ALLOC,
                    f"{cause}; retry {failures}/{max_restarts} in {delay:.0f}s "
                    "from the last checkpoint",
                ),
                event_data={"replicas": 0},
                **common,
            )
        self.poke()

    def _failed_local_bsz(self, job: Job) -> int:
        """The per-replica batch the attempt ran out of memory at: what the library recorded
        (a CUDA or host allocation failure it caught), else the last one the job reported
        (the OOM killer gives it no chance to say), else the submitted split."""
        cap = job.max_local_bsz
        recorded = read_limit(self.job_dir(job.id) / "checkpoints")
        if recorded is not None and (cap is None or recorded.max_local_bsz < cap):
            return recorded.oom_local_bsz
        reported = (job.report or {}).get("local_bsz")
        if isinstance(reported, int) and reported >= 1:
            failed = reported
        else:
            spec = job.job_spec
            failed = -(-spec.batch_size // max(job.replicas, 1))  # the data loader's split
            if spec.max_local_bsz is not None:
                failed = min(failed, spec.max_local_bsz)
        return min(failed, cap) if cap is not None else failed

    def _retry_smaller(self, job: Job, rep: Replica, now: float, common: dict[str, Any]) -> bool:
        """Out of memory: learn a smaller per-replica batch cap and retry at once without
        counting a failure, while the cap can still shrink (False: it cannot, a real one)."""
        failed = self._failed_local_bsz(job)
        cap = shrink(failed)
        if cap >= failed:
            return False
        old = job.memory_limit or {}
        limit = {"max_local_bsz": cap, "oom_local_bsz": failed, "ooms": int(old.get("ooms", 0)) + 1}
        why = (
            f"attempt {job.attempt} rank {rep.rank} ran out of memory at per-replica batch "
            f"{failed}; retrying with per-replica batch <= {cap} (more accumulation steps)"
        )
        self.store.update_job(
            job.id,
            now,
            state=JobState.PENDING,
            expect=job.state,
            memory_limit=limit,
            reason=why,
            event=(EventKind.ALLOC, f"{why}; 0 slots"),
            event_data={"replicas": 0, "memory_limit": limit},
            **common,
        )
        self.poke()
        return True

    # -- schedule -------------------------------------------------------------------------
    def _schedulable(self, job: Job, now: float) -> bool:
        return job.state is not JobState.PENDING or job.not_before <= now

    def schedule(self, now: float) -> dict[str, int]:
        """One policy round: snapshot → ``policy.optimize`` → desired replicas per job (with
        serving deployments: one :class:`CoSchedulePolicy` round over both)."""
        self._next_round = now + self.config.interval
        self._next_serving_round = now + self.config.serving_interval
        self.last_round_at = now
        active = self.store.list_jobs(states=ACTIVE)
        jobs = [j for j in active if self._schedulable(j, now)]
        chosen = {j.id for j in jobs}
        # A job sitting out a retry delay is decided the moment the delay ends, not at the
        # next interval: its slots would otherwise stay idle until then (issue 13.3).
        waits = [j.not_before for j in active if j.id not in chosen]
        if waits:
            self._next_round = min(self._next_round, min(waits))
        for job in active:  # jobs sitting out a backoff hold nothing and want nothing now
            if job.id not in chosen and (job.desired_replicas != 0 or job.wanted):
                self.store.update_job(job.id, now, desired_replicas=0, desired_allocation={})
        deployments = self._deployments()
        if not deployments:
            self.reservations = {}
        if not jobs and not deployments:
            if self.packing():  # the last packed pair ended: nothing is shared any more
                self.store.meta_set(PACKING_KEY, "{}")
            return {}
        # Attained service up to now, so the policy sees current figures (Tiresias' LAS).
        jobs = [self._refresh_service(j, now) for j in jobs]
        started = time.perf_counter()
        snapshot = build_snapshot(jobs, self._nodes, now, self.config.restart_delay)
        if self.config.colocation and self.executor.shares_slots:
            snapshot = replace(snapshot, colocation=dict(self.config.colocation))
        rng = np.random.default_rng([self.config.seed, self._round])
        try:
            state = state_from_json(self.store.meta_get(self.policy_state_key))
            policy: Policy = self.policy
            if deployments:
                policy = self._coschedule(deployments)
                state = {"inner": state, **self._serving_state()}
            decision = policy.optimize(snapshot, state, rng)
            decided = decision.allocations
            validate_allocations(snapshot, decided, decision.packed)
            if decision.packed and not self.executor.shares_slots:
                raise PolicyError(
                    f"packed {sorted(decision.packed)}, but executor {self.executor.name} "
                    "cannot share a slot between two jobs"
                )
            decided, packed = self._refuse_wrong_types(snapshot, decision, now)
            stored = state_to_json(
                decision.state.get("inner", {}) if deployments else decision.state
            )
            serving_stored = (
                json.dumps(
                    {"serving": decision.state["serving"], "last_now": decision.state["last_now"]}
                )
                if deployments
                else None
            )
        except PolicyError as exc:
            self.store.add_event(
                None, EventKind.POLICY_ERROR, f"policy {self.policy.name}: {exc}", now
            )
            log.error("policy %s failed: %s", self.policy.name, exc)
            return {}
        self.last_round_seconds = time.perf_counter() - started
        self._round += 1
        self.last_diagnostics = decision.diagnostics
        # The round counter and the policy's memory (Tiresias' queues, the GA's population)
        # are persisted together, so a restarted controller carries on where this one stopped.
        # The packing (guest -> host) is kept with them: a restarted controller still starts a
        # pending guest on its host's slots.
        self.store.meta_set_many(
            {
                "policy_round": str(self._round),
                self.policy_state_key: stored,
                PACKING_KEY: json.dumps(dict(sorted(packed.items()))),
                **({SERVING_STATE_KEY: serving_stored} if serving_stored is not None else {}),
            }
        )
        if deployments:
            self.reservations = reservations_of(decision.state)
        desired: dict[str, int] = {}
        changes: dict[str, tuple[int, str, dict[str, Any]]] = {}
        allocations: dict[str, dict[str, int]] = {}
        for job in jobs:
            alloc = allocation_dict(decided.get(job.id, (0,) * len(snapshot.nodes)), snapshot.nodes)
            k = sum(alloc.values())
            desired[job.id] = k
            if k != job.desired_replicas or alloc != job.wanted:
                old = job.wanted
                what = (
                    f"{sum(old.values())} -> {k} slots"
                    if set(old) | set(alloc) <= {"local"}
                    else f"{fmt_alloc(old)} -> {fmt_alloc(alloc)}"
                )
                changes[job.id] = (
                    k,
                    f"policy {self.policy.name}: {what}",
                    {"desired": k, "allocation": alloc, "round": self._round},
                )
                allocations[job.id] = alloc
        self.store.set_desired(changes, now, allocations)
        return desired

    # -- serving (issue 17) -----------------------------------------------------------------
    def _deployments(self) -> list[Deployment]:
        if self.serving is None:
            return []
        try:
            return list(self.serving.deployments())
        except (ControllerError, PolicyError) as exc:
            log.error("cannot list the deployments (serving keeps what it holds): %s", exc)
            return []

    def _coschedule(self, deployments: Sequence[Deployment]) -> CoSchedulePolicy:
        assert self.serving is not None
        return CoSchedulePolicy(
            self.policy,
            deployments,
            self.serving.autoscaler(),
            self.serving.demand(),
            round_s=self.config.serving_interval,
        )

    def _serving_state(self) -> PolicyState:
        """``{"serving", "last_now"}`` of the last co-scheduled round ({} before the first)."""
        raw = self.store.meta_get(SERVING_STATE_KEY)
        if not raw:
            return {}
        try:
            data = json.loads(raw)
        except json.JSONDecodeError:
            log.error("stored serving state is not JSON; starting serving afresh")
            return {}
        return data if isinstance(data, dict) else {}

    def _training_slots(self) -> set[Slot]:
        """Slots training replicas hold now (alive, whatever their job's state)."""
        return {(r.node, r.slot) for r in self.store.replicas(statuses=LIVE)}

    def serving_round(self, now: float) -> bool:
        """Ask only the autoscalers (every ``serving_interval``). What they want is applied at
        once when it fits beside what training holds now; returns True when a full round must
        follow: serving needs slots training holds, or gave slots back training may take."""
        self._next_serving_round = now + self.config.serving_interval
        deployments = self._deployments()
        if not deployments:
            if self.reservations:
                self.reservations = {}
                return True
            return False
        active = [j for j in self.store.list_jobs(states=ACTIVE) if self._schedulable(j, now)]
        snapshot = build_snapshot(active, self._nodes, now, self.config.restart_delay)
        try:
            reservations, serving, diagnostics = self._coschedule(deployments).plan(
                snapshot, self._serving_state()
            )
        except PolicyError as exc:
            self.store.add_event(None, EventKind.POLICY_ERROR, f"serving round: {exc}", now)
            log.error("serving round failed: %s", exc)
            return False
        training = _count(sorted(self._training_slots()))
        for node in self._nodes:
            serving_here = sum(r.placement.get(node.name, 0) for r in reservations.values())
            if serving_here + training.get(node.name, 0) > node.gpus:
                return True  # decided again, with training, by the full round
        before = sum(r.slots for r in self.reservations.values())
        changed = {k: v.placement for k, v in reservations.items()} != {
            k: v.placement for k, v in self.reservations.items()
        }
        self.store.meta_set(SERVING_STATE_KEY, json.dumps({"serving": serving, "last_now": now}))
        self.reservations = reservations
        self.last_diagnostics = {
            **{k: v for k, v in self.last_diagnostics.items() if not k.startswith("serving.")},
            **diagnostics,
        }
        if changed:
            log.info(
                "serving round: %s",
                ", ".join(f"{k} {v.slots}/{v.desired}" for k, v in sorted(reservations.items())),
            )
        return sum(r.slots for r in reservations.values()) < before

    def _serve(self, now: float) -> None:
        """Level-triggered: the serving plane makes its replicas match the reservations."""
        if self.serving is None:
            return
        self.serving.reconcile(dict(self.reservations), frozenset(self._training_slots()), now)

    def _refresh_service(self, job: Job, now: float) -> Job:
        if job.service_at is None or job.replicas <= 0 or now <= job.service_at:
            return job
        return self.store.update_job(
            job.id,
            now,
            attained_service=accrued_service(
                job.attained_service, job.replicas, job.service_at, now
            ),
            service_at=now,
        )

    # -- act ------------------------------------------------------------------------------
    def _act(self, now: float) -> None:
        live = self.store.replicas(statuses=LIVE)
        by_job: dict[str, list[Replica]] = {}
        for rep in live:
            by_job.setdefault(rep.job_id, []).append(rep)
        used = {(rep.node, rep.slot) for rep in live}
        if self.serving is not None:  # a serving replica's slot is never a training one
            used |= set(self.serving.occupied())
        free = {n.name: [s for s in range(n.gpus) if (n.name, s) not in used] for n in self._nodes}
        jobs = {j.id: j for j in self.store.list_jobs(states=ACTIVE)}
        packing = self.packing()
        # Replicas of finished jobs or of superseded attempts: stop, then kill.
        for job_id, reps in by_job.items():
            job = jobs.get(job_id)
            stray = reps if job is None else [r for r in reps if r.attempt != job.attempt]
            if stray:
                owner = job if job is not None else self.store.get_job(job_id)
                since = owner.finished_at if owner.finished_at is not None else now
                self._signal(stray, now, force=now - since >= self.config.stop_grace)
        for job in jobs.values():
            mine = [r for r in by_job.get(job.id, []) if r.attempt == job.attempt]
            if job.state is JobState.PENDING:
                want = job.wanted
                if by_job.get(job.id) or not want or job.not_before > now:
                    continue
                if job.id in packing:  # GPU sharing: on exactly its host's slots, or wait
                    host = self._host_place(packing[job.id])
                    if host and want == _count(host):
                        self._launch(job, host, now, packed_with=packing[job.id])
                    continue
                # All or nothing, on exactly the nodes the policy chose (a node that left
                # meanwhile: wait for the round its departure triggered). A host may also
                # take the slots its running guests hold (it joins them there).
                shared = self._guest_slots(job.id, packing, by_job, jobs)
                if all(
                    k <= len(free.get(node, ())) + len(shared.get(node, ()))
                    for node, k in want.items()
                ):
                    place: list[tuple[str, int]] = []
                    for node, k in want.items():
                        mine_first = [*shared.get(node, ()), *free.get(node, ())][:k]
                        place.extend((node, s) for s in mine_first)
                        free[node] = [s for s in free.get(node, ()) if s not in mine_first]
                    self._launch(job, place, now)
            elif job.state is JobState.RUNNING:
                # A change of placement is a re-allocation too, not only a change of count.
                if job.wanted != job.held and mine:
                    self._stop_all(
                        job,
                        mine,
                        now,
                        EventKind.RESCALE,
                        f"re-allocation {fmt_alloc(job.held)} -> {fmt_alloc(job.wanted)}",
                    )
                elif mine and (why := self._misplaced(job, mine, live, packing)):
                    self._stop_all(job, mine, now, EventKind.RESCALE, why)
            elif job.state is JobState.RESCALING:
                started = job.stop_requested_at if job.stop_requested_at is not None else now
                self._signal(mine, now, force=now - started >= self.config.stop_grace)

    def _refuse_wrong_types(
        self, snapshot: ClusterSnapshot, decision: Decision, now: float
    ) -> tuple[dict[str, Allocation], dict[str, str]]:
        """The decision without the allocations a job may not have (on two GPU types, or
        outside its ``gpu_types``: a type-unaware policy's choice); those jobs, and guests
        packed on them, get nothing this round (an event says why) and the rest stands."""
        bad = type_violations(snapshot, decision.allocations)
        if not bad:
            return dict(decision.allocations), dict(decision.packed)
        width = len(snapshot.nodes)
        decided = dict(decision.allocations)
        packed = {g: h for g, h in decision.packed.items() if g not in bad and h not in bad}
        for job_id in [*bad, *(g for g, h in decision.packed.items() if h in bad)]:
            decided[job_id] = (0,) * width
        why = "; ".join(bad[j] for j in sorted(bad))
        self.store.add_event(
            None, EventKind.POLICY_ERROR, f"policy {self.policy.name}: refused {why}", now
        )
        log.warning("policy %s: refused %s", self.policy.name, why)
        return decided, packed

    # -- GPU sharing ----------------------------------------------------------------------
    def packing(self) -> dict[str, str]:
        """The last round's packing, guest job -> host job (``Decision.packed``)."""
        raw = self.store.meta_get(PACKING_KEY)
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            return {}
        return {str(g): str(h) for g, h in data.items()} if isinstance(data, dict) else {}

    def _guest_slots(
        self,
        host_id: str,
        packing: dict[str, str],
        by_job: dict[str, list[Replica]],
        jobs: dict[str, Job],
    ) -> dict[str, list[int]]:
        """Per node, the slots that running guests of ``host_id`` hold (their current
        attempt), which the host may take: a guest that ran alone first is joined there."""
        out: dict[str, list[int]] = {}
        for guest, host in packing.items():
            job = jobs.get(guest)
            if host != host_id or job is None or job.state is not JobState.RUNNING:
                continue
            for rep in by_job.get(guest, ()):
                if rep.attempt == job.attempt and rep.slot not in out.get(rep.node, []):
                    out.setdefault(rep.node, []).append(rep.slot)
        return {node: sorted(slots) for node, slots in out.items()}

    def _host_place(self, host_id: str) -> list[tuple[str, int]]:
        """The (node, slot) of each rank of the host's running attempt, by rank; empty while
        the host is not running (its guest waits for it)."""
        try:
            host = self.store.get_job(host_id)
        except ControllerError:
            return []
        if host.state is not JobState.RUNNING:
            return []
        reps = self.store.replicas(host_id, attempt=host.attempt)
        if not reps or any(r.status not in LIVE for r in reps):
            return []
        return [(r.node, r.slot) for r in sorted(reps, key=lambda r: r.rank)]

    def _misplaced(
        self,
        job: Job,
        mine: Sequence[Replica],
        live: Sequence[Replica],
        packing: dict[str, str],
    ) -> str | None:
        """Why a running job must move although its per-node counts are right: a packed
        guest not on its host's slots, or a job no longer packed still sharing the slots of
        one that started before it (it restarts on slots of its own)."""
        where = {(r.node, r.slot) for r in mine}
        host_id = packing.get(job.id)
        if host_id is not None:  # (a host not running now: the guest stays where it is)
            host = set(self._host_place(host_id))
            if host and where != host:
                return f"packed with {host_id}: moving onto its slots"
            return None
        first = min(r.started_at for r in mine)
        for other in live:
            if other.job_id == job.id or (other.node, other.slot) not in where:
                continue
            if packing.get(other.job_id) == job.id:
                continue  # its own guest
            if (other.started_at, other.job_id) < (first, job.id):
                return f"no longer packed with {other.job_id}: moving to slots of its own"
        return None

    def _stop_all(
        self,
        job: Job,
        reps: Sequence[Replica],
        now: float,
        kind: EventKind,
        why: str,
    ) -> None:
        """SIGTERM every live replica of the job's attempt (checkpoint and exit 0); ``kind``
        RESCALE makes it a re-allocation (the job goes RESCALING), STOP a plain stop."""
        if job.state is JobState.RUNNING and job.stop_requested_at is None:
            rescale = kind is EventKind.RESCALE
            try:
                self.store.update_job(
                    job.id,
                    now,
                    state=JobState.RESCALING if rescale else None,
                    expect=JobState.RUNNING,
                    stop_requested_at=now,
                    event=(kind, f"SIGTERM to {len(reps)} replica(s): {why}"),
                )
            except InvalidTransitionError:
                return
            started = now
        else:
            started = job.stop_requested_at if job.stop_requested_at is not None else now
        self._signal(reps, now, force=now - started >= self.config.stop_grace)

    def _signal(self, reps: Sequence[Replica], now: float, force: bool) -> None:
        for rep in reps:
            if rep.pid is None:
                continue
            last = self._signalled.get(rep.id)
            if not force and last is not None and now - last < _RESIGNAL_S:
                continue
            try:
                self.executor.stop(_handle(rep), force=force)
            except ExecutorError as exc:
                log.error("cannot stop replica %s: %s", rep.id, exc)
            self._signalled[rep.id] = now

    # -- sparse jobs' shard servers -------------------------------------------------------
    def _servers(self, now: float) -> None:
        """Level-triggered: every active sparse job that has launched has its shard servers
        running (a dead one is restarted; it loads the last committed checkpoint); the
        servers of a job that ended are stopped (SIGTERM, SIGKILL after ``stop_grace``)."""
        active = {
            j.id: j
            for j in self.store.list_jobs(states=ACTIVE)
            if j.job_spec.sparse is not None and j.attempt > 0
        }
        for job in active.values():
            self._server_jobs.add(job.id)
            self._ensure_servers(job, now)
        for job_id in sorted(self._server_jobs - set(active)):
            job = self.store.get_job(job_id)
            if job.state in ACTIVE:
                continue  # not launched again yet (e.g. pending a retry): servers stay
            self._stop_servers(job, now)

    def _server_handle(self, job_id: str, layout: JobLayout, shard: int) -> ReplicaHandle | None:
        """The shard's live server, or None (never started, or ended)."""
        handle = self._server_handles.get((job_id, shard))
        if handle is None:
            handle = self.executor.recover(str(layout.run_dir(shard)), shard)
        if handle is None or self.executor.poll(handle).phase is not ReplicaPhase.RUNNING:
            self._server_handles.pop((job_id, shard), None)
            return None
        self._server_handles[(job_id, shard)] = handle
        return handle

    def _ensure_servers(self, job: Job, now: float) -> None:
        sparse = job.job_spec.sparse
        if sparse is None:
            return
        layout = JobLayout(self.job_dir(job.id) / _SPARSE)
        for shard in range(sparse.servers):
            if self._server_handle(job.id, layout, shard) is not None:
                continue
            restart = layout.config_file(shard).exists()
            layout.port_file(shard).unlink(missing_ok=True)  # workers wait for the new one
            layout.write_config(shard, sparse.servers, sparse.model, sparse.dim)
            spec = server_spec(
                self._plan(job, job.attempt, 0),
                shard,
                sparse.servers,
                layout.shard_argv(shard),
                str(layout.run_dir(shard)),
                os.environ,
            )
            try:
                (result,) = self.executor.launch_group([spec])
            except ExecutorError as exc:
                result = exc
            if isinstance(result, ExecutorError):
                self.store.add_event(
                    job.id, EventKind.LAUNCH_ERROR, f"shard server {shard}: {result}", now
                )
                continue
            self._server_handles[(job.id, shard)] = result
            what = "restarted from the last checkpoint" if restart else "started"
            self.store.add_event(
                job.id,
                EventKind.SERVERS,
                f"shard server {shard}/{sparse.servers} {what} (pid {result.pid})",
                now,
                {"shard": shard, "pid": result.pid, "restart": restart},
            )

    def _stop_servers(self, job: Job, now: float) -> None:
        sparse = job.job_spec.sparse
        layout = JobLayout(self.job_dir(job.id) / _SPARSE)
        shards = sparse.servers if sparse is not None else 0
        handles = [
            h for i in range(shards) if (h := self._server_handle(job.id, layout, i)) is not None
        ]
        if not handles:
            self._server_jobs.discard(job.id)
            self._server_stop_at.pop(job.id, None)
            if layout.servers_dir.exists():
                (layout.servers_dir / _STOPPED).touch()
            self.store.add_event(job.id, EventKind.SERVERS, "shard servers stopped", now)
            return
        since = self._server_stop_at.setdefault(job.id, now)
        force = now - since >= self.config.stop_grace
        for h in handles:
            try:
                self.executor.stop(h, force=force)
            except ExecutorError as exc:
                log.error("cannot stop shard server %s of job %s: %s", h.rank, job.id, exc)

    # -- launch ---------------------------------------------------------------------------
    def job_dir(self, job_id: str) -> Path:
        return (self.config.shared_dir or self.config.state_dir) / "jobs" / job_id

    def _tenant_name(self, tenant_id: str) -> str:
        """The executor maps it to a run-as user (``coadapt server --run-as-tenant``)."""
        if tenant_id not in self._tenant_names:
            self._tenant_names = {t.id: t.name for t in self.store.tenants()}
        return self._tenant_names.get(tenant_id, tenant_id)

    def _argv(self, spec: JobSpec) -> tuple[str, ...]:
        if spec.script is not None:
            return (sys.executable, spec.script, *spec.args)
        cmd = list(spec.command or ())
        if cmd and cmd[0] in ("python", "python3"):
            cmd[0] = sys.executable  # the controller's interpreter, which has coadapt
        return (*cmd, *spec.args)

    def _plan(self, job: Job, attempt: int, port: int) -> AttemptPlan:
        """The attempt's plain inputs to :mod:`coadapt.controller.launch_plan`."""
        spec = job.job_spec
        jdir = self.job_dir(job.id)
        url = token = None
        if self.config.metrics_base_url:
            token = self.store.job_token(job.id)
            url = f"{self.config.metrics_base_url}/api/v1/jobs/{job.id}/metrics?token={token}"
        return AttemptPlan(
            job_id=job.id,
            attempt=attempt,
            argv=self._argv(spec),
            cwd=spec.working_dir or str(jdir.resolve()),  # never the state dir itself
            job_dir=jdir,
            tenant=self._tenant_name(job.tenant_id),
            batch_mode=self.policy.batch_mode.value,
            port=port,
            spec_env=dict(spec.env),
            uses_gpus=self.executor.uses_gpus(),
            metrics_url=url,
            job_token=token,
            max_local_bsz=job.max_local_bsz,  # learned after an OOM (coadapt.train.memory)
            sparse_dir=None if spec.sparse is None else str((jdir / _SPARSE).resolve()),
            sparse_servers=None if spec.sparse is None else spec.sparse.servers,
            checkpoint_interval=None if spec.sparse is None else spec.sparse.checkpoint_every_s,
        )

    def _launch(
        self,
        job: Job,
        place: Sequence[tuple[str, int]],
        now: float,
        packed_with: str | None = None,
    ) -> None:
        """Start attempt ``job.attempt + 1`` with one replica per (node, slot) of ``place``:
        rows first, then the whole group in one executor call (a gang on a cluster);
        ``packed_with``: the host job whose slots these are (GPU sharing)."""
        attempt, k = job.attempt + 1, len(place)
        alloc: dict[str, int] = {}
        for node, _ in place:
            alloc[node] = alloc.get(node, 0) + 1
        slots = [s for _, s in place]
        port = free_port()
        jdir = self.job_dir(job.id)
        # Only the controller (and the replica's run-as user, once the executor hands the
        # directory over) may enter a job's directory.
        jdir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        jdir.mkdir(mode=0o700, exist_ok=True)
        (jdir / "checkpoints").mkdir(mode=0o700, exist_ok=True)
        where = str(slots) if set(alloc) <= {"local"} else f"on {fmt_alloc(alloc)}"
        if packed_with is not None:
            where += f", shared with {packed_with}"
        try:
            job = self.store.update_job(
                job.id,
                now,
                state=JobState.RUNNING,
                expect=JobState.PENDING,
                attempt=attempt,
                replicas=k,
                allocation=alloc,
                num_restarts=job.num_restarts + (1 if job.attempt > 0 else 0),
                max_gpus_held=max(job.max_gpus_held, k),
                service_at=now,
                started_at=job.started_at if job.started_at is not None else now,
                stop_requested_at=None,
                event=(EventKind.ALLOC, f"attempt {attempt}: {k} slot(s) {where}"),
                event_data={
                    "replicas": k,
                    "attempt": attempt,
                    "slots": slots,
                    "allocation": alloc,
                    **({"packed_with": packed_with} if packed_with is not None else {}),
                },
            )
        except InvalidTransitionError:
            return  # cancelled meanwhile
        types = {n.name: n.gpu_type for n in self._nodes}
        gpu_type = types.get(place[0][0]) if place else None
        if gpu_type is not None:  # what its next profile reports are measured on
            self.store.merge_report(job.id, {ATTEMPT_GPU_TYPE: gpu_type})
        plan = self._plan(job, attempt, port)
        specs = replica_specs(plan, place, os.environ)
        rows: list[Replica] = [
            self.store.add_replica(
                job.id, attempt, r.rank, r.slot, r.run_dir, r.log_path, now, node=r.node
            )
            for r in specs
        ]
        try:
            results = self.executor.launch_group(specs)
        except ExecutorError as exc:
            results = [exc] * len(specs)
        for rep, result in zip(rows, results, strict=True):
            if isinstance(result, ExecutorError):
                self.store.update_replica(
                    rep.id,
                    status=ReplicaStatus.EXITED,
                    exit_code=127,
                    reason=f"launch failed: {result}",
                    ended_at=now,
                )
                self.store.add_event(job.id, EventKind.LAUNCH_ERROR, str(result), now)
                continue  # settle: a failed replica stops the others and retries/fails
            self.store.update_replica(
                rep.id, status=ReplicaStatus.LIVE, pid=result.pid, start_ticks=result.start_ticks
            )

"""The simulation engine: a virtual clock that steps a cluster in fixed scheduling intervals.

Semantics follow the Pollux artifact's simulator (OSDI'21 §5.3) so that its published results
can be reproduced:

* Each step first advances every allocated job by ``interval`` seconds of trace-driven
  training, then asks the policy for the allocations of all submitted, unfinished jobs, then
  re-allocates the jobs whose allocation changed. A re-allocation costs ``restart_delay``
  seconds without progress (but with GPUs held) and counts as a restart, except the first.
* A job's progress is counted in M0-equivalent iterations: per segment of constant
  configuration it advances at ``gain / T_iter`` (AdaScale gain times true throughput); an
  epoch ends at the traced progress mark and the job completes after its last epoch.
* Jobs pick their batch per the policy's :class:`BatchMode` at every epoch boundary, every
  step and on re-allocation; adaptive jobs profile every new configuration and refit their
  throughput model, exactly as a real job would, and choose (m, s) with the training
  library's own rule (:func:`coadapt.goodput.agent.choose_batch`), in its artifact-compatible
  mode unless :attr:`SimConfig.artifact_agent` is off.

Everything is deterministic: no wall-clock reads, and the policy gets a generator derived
from ``(seed, round)``, so runs with the same inputs give identical results.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
from threadpoolctl import threadpool_limits

from coadapt.goodput import (
    BatchLimits,
    GoodputModel,
    GradParams,
    Observations,
    PerfParams,
    fit_perf_params,
)
from coadapt.goodput.agent import MIN_MEASUREMENTS, choose_batch, split_total
from coadapt.goodput.fit import FitError
from coadapt.policies.base import (
    DEFAULT_GPU_TYPE,
    Allocation,
    BatchMode,
    ClusterSnapshot,
    Policy,
    PolicyError,
    PolicyState,
    validate_allocations,
)
from coadapt.policies.snapshot import JobFacts, accrued_service, allocation_dict, build_snapshot
from coadapt.sim.applications import Application, Placement, get_application
from coadapt.sim.cluster import ClusterSpec
from coadapt.sim.errors import SimInputError, SimulationError
from coadapt.sim.gpu_types import colocation_table, speed_factor, typed_throughput
from coadapt.sim.type_models import anchor_type, measured_speed, scale_compute
from coadapt.sim.workload import Workload, WorkloadJob

_EPS = 1e-8
#: Largest allocation the traces can answer (the artifact's limit for elastic jobs).
MAX_TRACED_REPLICAS = 64


@dataclass(frozen=True)
class SimConfig:
    """Knobs of one simulation (defaults are the artifact's)."""

    interval: float = 60.0  # seconds between scheduling rounds
    restart_delay: float = 30.0  # seconds a re-allocation costs a job
    interference: float = 0.0  # slowdown of distributed jobs sharing a node, in [0, 1)
    seed: int = 0
    max_time: float = 90 * 24 * 3600.0  # give up (as an error) past this simulated time
    # Adaptive jobs' batch rule (coadapt.goodput.agent): True = the Pollux artifact's
    # unguarded eq. 14 optimum, which reproduces the published figures; False = the agent
    # the training library ships (noise gate, 2x trust region, 5% adoption threshold).
    artifact_agent: bool = True
    # GPU sharing: hand policies Gavel's co-location table (off: no job is ever packed).
    packing: bool = True

    def __post_init__(self) -> None:
        if not self.interval > 0:
            raise SimInputError(f"--interval: {self.interval} is invalid; accepted: seconds > 0")
        if self.restart_delay < 0:
            raise SimInputError(
                f"--restart-delay: {self.restart_delay} is invalid; accepted: seconds >= 0"
            )
        if not 0.0 <= self.interference < 1.0:
            raise SimInputError(
                f"--interference: {self.interference} is invalid; accepted: a fraction in [0, 1)"
            )


@dataclass(frozen=True)
class JobRecord:
    """The outcome of one job."""

    name: str
    application: str
    submit_time: float
    completion_time: float | None  # None if the simulation stopped first
    first_alloc_time: float | None
    restarts: int
    gpu_seconds: float  # GPU-time held, restart delays included

    @property
    def jct(self) -> float | None:
        if self.completion_time is None:
            return None
        return self.completion_time - self.submit_time

    @property
    def queueing_delay(self) -> float | None:
        if self.first_alloc_time is None:
            return None
        return self.first_alloc_time - self.submit_time


@dataclass(frozen=True)
class SimResult:
    """Everything a simulation produced, for :mod:`coadapt.sim.metrics`."""

    policy: str
    workload: str
    cluster: str
    config: SimConfig
    jobs: tuple[JobRecord, ...]
    utilisation: tuple[tuple[float, float], ...]  # (time, allocated GPUs / total) per round
    end_time: float
    # Per round: sum over jobs of GPUs x the fraction of their speed they keep (co-location)
    # / total GPUs, i.e. isolated-equivalent GPU work; above ``utilisation`` when packing pays.
    effective_utilisation: tuple[float, ...] = ()


def oracle_step_time(
    app: Application,
    batch_size: int,
    replicas: int,
    gpus_per_node: int,
    gpu_type: str = DEFAULT_GPU_TYPE,
) -> float:
    """True seconds per optimizer step at a fixed total batch on ``replicas`` packed GPUs
    of ``gpu_type``.

    This is Optimus+Oracle's throughput model: the simulator hands it the traces instead of a
    fitted model. A single GPU always accumulates at least once, as in the artifact.
    """
    full, rest = divmod(replicas, gpus_per_node)
    placement: Placement = (gpus_per_node,) * full + ((rest,) if rest else ())
    local = math.ceil(batch_size / replicas - _EPS)
    accum = math.ceil(local / app.max_local_bsz - _EPS) - 1
    if replicas == 1:
        accum = max(1, accum)
    atomic = math.ceil(local / (accum + 1) - _EPS)
    atomic = min(atomic, int(app.max_batch_size / (replicas * (accum + 1))))
    step, sync = typed_throughput(app, gpu_type, placement, atomic)
    return step + (step - sync) * accum


@dataclass
class _Job:
    """Mutable state of one simulated job (the artifact's ``Job``)."""

    spec: WorkloadJob
    app: Application
    mode: BatchMode
    limits: BatchLimits
    target_batch: int | None
    max_replicas: int
    restart_delay: float
    placement: Placement = ()
    alloc: Allocation | None = None
    atomic_bsz: int = 0
    accum_steps: int = 0
    progress: float = 0.0
    epoch: int = 0
    attained: float = 0.0  # GPU-seconds
    restarts: int | None = None
    rescale_left: float = 0.0
    completion_time: float | None = None
    first_alloc_time: float | None = None
    # The type of the GPUs the job holds (or last held) and its profile on each type.
    gpu_type: str = DEFAULT_GPU_TYPE
    profiles: dict[str, dict[tuple[int, int, int], tuple[float, float]]] = field(
        default_factory=dict
    )
    grad: GradParams | None = None
    _perf: dict[str, PerfParams] = field(default_factory=dict)  # fit per type (anchors only)
    _prev_perf: dict[str, PerfParams] = field(default_factory=dict)  # warm starts per type
    _models: dict[str, GoodputModel] = field(default_factory=dict)  # cached models per type
    share: float = 1.0  # fraction of its speed a packed job keeps (co-location)
    artifact_agent: bool = True  # see SimConfig.artifact_agent
    measurements: int = 0  # gradient-noise observations (the agent's gate counts them)
    _total: int = 0  # total batch M of the last choice (the shipped agent's trust region)
    # Last batch choice: same inputs give the same answer (saves ~10^4 calls).
    _choice: tuple[tuple[object, ...], int, int] | None = None

    @property
    def gpus(self) -> int:
        return sum(self.placement)

    @property
    def max_profiled_replicas(self) -> int:
        return max((k[1] for p in self.profiles.values() for k in p), default=0)

    def goodput_model(self) -> GoodputModel | None:
        """The job's goodput model on the type it runs (or last ran) on."""
        return self.model_on(self.gpu_type)

    def model_on(self, gpu_type: str) -> GoodputModel | None:
        """The job's goodput model on ``gpu_type``: fitted on its anchor type, scaled to others
        (:mod:`coadapt.sim.type_models`); refits only after a new configuration was profiled."""
        if not self.profiles or self.grad is None:
            return None
        model = self._models.get(gpu_type)
        if model is None:
            anchor = anchor_type(self.profiles, self.gpu_type)
            perf = self._perf.get(anchor)
            if perf is None:
                perf = self._perf[anchor] = self._fit(anchor)
            if gpu_type != anchor:
                speed = measured_speed(perf, self.profiles.get(gpu_type, {}))
                if speed is None:  # never ran there: Gavel's speed ratio
                    speed = speed_factor(self.app.name, gpu_type) / speed_factor(
                        self.app.name, anchor
                    )
                perf = scale_compute(perf, speed)
            model = self._models[gpu_type] = GoodputModel(perf, self.grad, self.app.init_batch_size)
        return model

    def _fit(self, gpu_type: str) -> PerfParams:
        profile = self.profiles[gpu_type]
        keys = np.array(list(profile), dtype=np.float64)
        times = np.array(list(profile.values()), dtype=np.float64)
        try:
            obs = Observations.build(
                keys[:, 0],
                keys[:, 1],
                keys[:, 2],
                iter_time=times[:, 0],
                grad_time=times[:, 0] - times[:, 1],
            )
            return fit_perf_params(obs, initial=self._prev_perf.get(gpu_type))
        except FitError as exc:
            raise SimulationError(f"{self.spec.name}: cannot fit its profile: {exc}") from exc

    def observe(
        self, nodes: int, replicas: int, step: float, sync: float, sqr: float, var: float
    ) -> None:
        self.measurements += 1
        if self.grad is None or self.grad.sqr != sqr or self.grad.var != var:
            self.grad = GradParams(sqr, var)
            self._models.clear()
        key = (nodes, replicas, self.atomic_bsz)
        profile = self.profiles.setdefault(self.gpu_type, {})
        if key not in profile:
            profile[key] = (step, sync)
            t = self.gpu_type
            previous = self._perf.pop(t, None) or self._prev_perf.get(t)
            if previous is not None:
                self._prev_perf[t] = previous
            self._models.clear()

    def batch_limits(self) -> BatchLimits:
        """The job's batch bounds; a packed job shares its GPU's memory, so its batch stays
        within the memory rule of sharing (half the largest traced per-GPU batch). Without
        the cap the agent grows a packed job's batch past the rule after its first profile,
        and the next round must split the pair (a restart for nothing)."""
        half = self.app.max_local_bsz // 2
        limits = self.limits
        if (
            self.share >= 1.0
            or limits.pinned_batch is not None
            or half < max(limits.init_batch_size, limits.min_local_bsz)
        ):
            return limits
        return replace(
            limits,
            max_batch_size=min(limits.max_batch_size, half),
            max_local_bsz=min(limits.upper_local_bsz, half),
        )

    def choose_batch(self) -> None:
        """Pick (atomic batch, accumulation steps) for the current placement."""
        app = self.app
        replicas = self.gpus
        target = self.target_batch
        limits = self.batch_limits()
        if target is None and not self.profiles:
            target = max(app.init_batch_size, app.min_local_bsz * replicas)
        if target is None:
            model = self.goodput_model()
            assert model is not None  # a profile implies grad stats; internal invariant
            nodes = len(self.placement)
            if self.artifact_agent:
                current = (0, 0)  # unused by the artifact's rule
                memo_key: tuple[object, ...] = (model, nodes, replicas, limits)
            else:  # the current total batch, split over the replicas the job has now (at
                # least the traced minimum micro-batch each: the traces cover nothing smaller)
                total = max(self._total, self.app.init_batch_size, replicas * app.min_local_bsz)
                current = split_total(total, replicas, limits.max_local_bsz)
                gated = self.measurements < MIN_MEASUREMENTS
                memo_key = (model, nodes, replicas, current, gated, limits)
            if self._choice is None or self._choice[0] != memo_key:
                choice = choose_batch(
                    model,
                    limits,
                    current,
                    nodes,
                    replicas,
                    self.measurements,
                    artifact_compatible=self.artifact_agent,
                )
                self._choice = (memo_key, *choice.config)
            _, atomic, accum = self._choice
        else:
            local = math.ceil(target / replicas - _EPS)
            accum = math.ceil(local / app.max_local_bsz - _EPS) - 1
            if replicas == 1 and target > app.init_batch_size:
                accum = max(1, accum)
            atomic = math.ceil(local / (accum + 1) - _EPS)
        self.accum_steps = accum
        self.atomic_bsz = min(atomic, int(app.max_batch_size / (replicas * (accum + 1))))
        self._total = replicas * self.atomic_bsz * (accum + 1)

    def reallocate(self, alloc: Allocation | None, now: float, gpu_type: str) -> None:
        if alloc is None:
            self.placement = ()
            self.alloc = None
            self.atomic_bsz = 0
            return
        self.alloc = alloc
        self.gpu_type = gpu_type
        # Greedy placers fill the emptiest node first, so the ring visits nodes in
        # non-increasing order of GPUs; the artifact keeps that order.
        self.placement = tuple(sorted((int(x) for x in alloc if x), reverse=True))
        self.choose_batch()
        self.rescale_left = self.restart_delay
        self.restarts = 0 if self.restarts is None else self.restarts + 1
        if self.first_alloc_time is None:
            self.first_alloc_time = now

    def advance(self, start: float, seconds: float, interference: float) -> None:
        """Train for ``seconds`` of simulated time starting at ``start``."""
        if not self.placement or self.completion_time is not None:
            return
        app = self.app
        replicas = self.gpus
        nodes = len(self.placement)
        now = start
        delay = min(self.rescale_left, seconds)
        now += delay
        self.rescale_left -= delay
        seconds -= delay
        m0 = app.init_batch_size
        while seconds > 0 and self.completion_time is None:
            batch = replicas * self.atomic_bsz * (self.accum_steps + 1)
            step, sync = typed_throughput(app, self.gpu_type, self.placement, self.atomic_bsz)
            sqr, var = app.grad_stats(batch, self.epoch)
            scale = batch / m0
            gain = (var + sqr) / (var / scale + sqr)
            # Profiles record the job's own speed; co-location slows it by a known fraction.
            self.observe(nodes, replicas, step, sync, sqr, var)
            goodput = gain / (step + (step - sync) * self.accum_steps) * (1.0 - interference)
            goodput *= self.share
            next_progress = app.progress_at(self.epoch + 1)
            if self.progress + goodput * seconds < next_progress:
                self.progress += goodput * seconds
                now += seconds
                seconds = 0
            else:
                self.epoch += 1
                delta = round((next_progress - self.progress) / goodput)
                if self.epoch > app.completion_epoch:
                    self.completion_time = now + delta
                self.progress = next_progress
                now += delta
                seconds -= delta
            self.choose_batch()
        # GPUs are held (and counted) from ``start`` through restart delays until ``now``.
        self.attained = accrued_service(self.attained, replicas, start, now)

    def fraction_done(self) -> float:
        """Epochs done over the epochs the job runs (``max_epochs``), the current epoch counted
        by its statistical progress: what a training script reports live (its epoch counter
        and position) against the epochs its user declared."""
        app = self.app
        total = app.completion_epoch + 1
        if self.completion_time is not None or self.epoch >= total:
            return 1.0
        lo, hi = app.progress_at(self.epoch), app.progress_at(self.epoch + 1)
        within = (self.progress - lo) / (hi - lo) if hi > lo else 0.0
        return min(max((self.epoch + within) / total, 0.0), 1.0)

    def remaining_iterations(self) -> float:
        """Optimizer iterations left at the submitted batch (Optimus' oracle)."""
        batch = self.spec.batch_size
        last = self.app.completion_epoch
        if last <= self.epoch:
            return 1.0
        return self.app.iterations(batch, last) - self.app.iterations(batch, self.epoch)

    def record(self) -> JobRecord:
        return JobRecord(
            name=self.spec.name,
            application=self.spec.application,
            submit_time=self.spec.submit_time,
            completion_time=self.completion_time,
            first_alloc_time=self.first_alloc_time,
            restarts=self.restarts or 0,
            gpu_seconds=self.attained,
        )


ProgressFn = Callable[[int, int, float], None]  # (completed jobs, total jobs, simulated time)


class Simulator:
    """One policy on one workload on one cluster; call :meth:`run` (or :meth:`step`)."""

    def __init__(
        self,
        workload: Workload,
        cluster: ClusterSpec,
        policy: Policy,
        config: SimConfig | None = None,
    ) -> None:
        self.workload = workload
        self.cluster = cluster
        self.policy = policy
        self.config = config or SimConfig()
        self.nodes = cluster.nodes()
        self.now = 0.0
        self.round = 0
        self._alloc: dict[str, Allocation] = {}
        self.policy_state: PolicyState = {}  # handed back to the policy each round
        self.diagnostics: list[dict[str, float]] = []  # each round's Decision.diagnostics
        self._utilisation: list[tuple[float, float]] = []
        self._effective: list[float] = []
        self._step_time_memo: dict[tuple[str, str, int, int], float] = {}
        self._types = cluster.gpu_types
        self._colocation = colocation_table() if self.config.packing else {}
        self._packed: dict[str, str] = {}  # guest -> host of the last decision
        self._jobs = [self._make_job(spec) for spec in workload.jobs]
        self._by_name = {j.spec.name: j for j in self._jobs}

    def _make_job(self, spec: WorkloadJob) -> _Job:
        app = get_application(spec.application)
        mode = self.policy.batch_mode
        elastic_cap = app.spec.elastic_max_replicas
        pinned = app.spec.adaptive_batch if mode is BatchMode.ADAPTIVE else None
        if mode is BatchMode.FIXED:
            pinned = spec.batch_size  # so a policy can price the job's fixed batch per type
        if mode is BatchMode.ADAPTIVE:
            target: int | None = pinned
            max_replicas = min(MAX_TRACED_REPLICAS, app.max_batch_size // app.min_local_bsz)
            max_replicas = min(max_replicas, elastic_cap or max_replicas)
        elif mode is BatchMode.FIXED_BATCH:
            target = spec.batch_size
            max_replicas = max(1, spec.batch_size // app.min_local_bsz)
            max_replicas = min(max_replicas, elastic_cap or max_replicas)
        else:
            target = spec.batch_size
            if spec.num_replicas > self.cluster.total_gpus:
                raise SimInputError(
                    f"{self.workload.name}: job {spec.name} asks for {spec.num_replicas} GPUs "
                    f"but cluster {self.cluster} has {self.cluster.total_gpus}; accepted: "
                    f"num_replicas <= {self.cluster.total_gpus}"
                )
            # A job runs on one GPU type at a time: a request larger than every type is cut
            # to the largest type (its batch stays as submitted).
            largest = max(g.num_nodes * g.gpus_per_node for g in self.cluster.groups)
            max_replicas = min(spec.num_replicas, largest)
        limits = BatchLimits(
            init_batch_size=app.init_batch_size,
            max_batch_size=app.max_batch_size,
            min_local_bsz=app.min_local_bsz,
            max_local_bsz=app.max_local_bsz,
            accumulation=True,
            pinned_batch=pinned,
        )
        job = _Job(spec, app, mode, limits, target, max_replicas, self.config.restart_delay)
        job.artifact_agent = self.config.artifact_agent
        return job

    @property
    def done(self) -> bool:
        return all(j.completion_time is not None for j in self._jobs)

    @property
    def completed(self) -> int:
        return sum(j.completion_time is not None for j in self._jobs)

    def _interference(self) -> dict[str, float]:
        """Slowdown per job: distributed jobs that share a node with another distributed job."""
        level = self.config.interference
        if level <= 0:
            return {}
        spread = {
            name: frozenset(i for i, x in enumerate(a) if x)
            for name, a in self._alloc.items()
            if sum(1 for x in a if x) > 1
        }
        count = np.zeros(len(self.nodes), dtype=np.int64)
        for nodes in spread.values():
            count[list(nodes)] += 1
        return {name: level for name, nodes in spread.items() if any(count[i] > 1 for i in nodes)}

    def _step_time_fn(self, job: _Job) -> Callable[[int], float]:
        """The oracle's step time on the type the job runs (or last ran) on."""
        app, batch = job.app, job.spec.batch_size
        gpu_type = job.gpu_type if job.gpu_type in self._types else self._types[0]
        gpn = self.cluster.gpus_per_node_of(gpu_type)
        memo = self._step_time_memo

        def step_time(replicas: int) -> float:
            key = (app.name, gpu_type, batch, replicas)
            hit = memo.get(key)
            if hit is None:
                hit = memo[key] = oracle_step_time(app, batch, replicas, gpn, gpu_type)
            return hit

        return step_time

    def _packable(self, job: _Job) -> bool:
        """The memory rule of GPU sharing: a job on one GPU whose batch needs at most half of
        the largest traced per-GPU batch (the traces' memory limit), so two fit on one GPU."""
        if job.gpus > 1 or (job.mode is BatchMode.FIXED and job.spec.num_replicas != 1):
            return False
        if job.placement:
            batch = job._total
        elif job.mode is BatchMode.ADAPTIVE:
            batch = job.target_batch or job.app.init_batch_size
        else:
            batch = job.spec.batch_size
        return batch <= job.app.max_local_bsz // 2

    def _job_facts(self, job: _Job) -> JobFacts:
        """The simulated job in the snapshot builder's neutral terms (attained service is
        already counted up to the round: :meth:`_Job.advance` ran first)."""
        mode = job.mode
        alloc = self._alloc.get(job.spec.name)
        return JobFacts(
            name=job.spec.name,
            submit_time=job.spec.submit_time,
            attained_service=job.attained,
            num_restarts=job.restarts or 0,
            min_replicas=0,
            max_replicas=job.max_replicas,
            max_gpus_held=job.max_profiled_replicas,
            goodput=job.goodput_model() if mode is BatchMode.ADAPTIVE else None,
            goodput_by_type=self._models_by_type(job),
            limits=job.limits,
            requested_replicas=job.spec.num_replicas,
            step_time=self._step_time_fn(job) if mode is BatchMode.FIXED_BATCH else None,
            remaining_iterations=(
                job.remaining_iterations() if mode is BatchMode.FIXED_BATCH else None
            ),
            allocation=allocation_dict(alloc, self.nodes) if alloc else {},
            progress=job.fraction_done(),
        )

    def _models_by_type(self, job: _Job) -> dict[str, GoodputModel] | None:
        """Per-type models, on clusters of several types only (one type: ``goodput`` says it
        all); also for fixed-batch jobs, which a heterogeneity-aware policy prices per type."""
        if len(self._types) < 2:
            return None
        out: dict[str, GoodputModel] = {}
        for t in self._types:
            model = job.model_on(t)
            if model is not None:
                out[t] = model
        return out

    def _snapshot(self, active: list[_Job]) -> ClusterSnapshot:
        snapshot = build_snapshot(
            [self._job_facts(j) for j in active],
            self.nodes,
            self.now,
            self.config.restart_delay,
        )
        if not self._colocation:
            return snapshot
        jobs = {
            j.spec.name: replace(snapshot.jobs[j.spec.name], packing_key=j.spec.application)
            if self._packable(j)
            else snapshot.jobs[j.spec.name]
            for j in active
        }
        return replace(snapshot, jobs=jobs, colocation=self._colocation)

    def _check(
        self, snapshot: ClusterSnapshot, new: dict[str, Allocation], packed: dict[str, str]
    ) -> dict[str, str]:
        """Each job's GPU type; raise :class:`PolicyError` for a job given GPUs of two types
        or a packing the memory rule or the co-location table does not allow."""
        types: dict[str, str] = {}
        for name, alloc in new.items():
            kinds = {self.nodes[i].gpu_type for i, x in enumerate(alloc) if x}
            if len(kinds) > 1:
                raise PolicyError(
                    f"job {name!r} got GPUs of several types ({', '.join(sorted(kinds))}); "
                    f"a job runs on one type at a time"
                )
            types[name] = kinds.pop()
        hosts: set[str] = set()
        for guest, host in packed.items():
            if host in hosts:
                raise PolicyError(f"host {host!r} has more than one packed guest")
            hosts.add(host)
            a, b = snapshot.jobs[guest], snapshot.jobs[host]
            if a.packing_key is None or b.packing_key is None or sum(new[host]) != 1:
                raise PolicyError(
                    f"packing {guest!r} on {host!r}: only 1-GPU jobs within the memory limit "
                    f"(a packing_key) may share a GPU"
                )
            if (a.packing_key, b.packing_key) not in snapshot.colocation:
                raise PolicyError(f"packing {guest!r} on {host!r}: pair has no co-location data")
        return types

    def step(self) -> None:
        """Advance one scheduling interval, then run the policy and apply its decision."""
        interval = self.config.interval
        slow = self._interference()
        for job in self._jobs:
            job.advance(self.now, interval, slow.get(job.spec.name, 0.0))
        self.now += interval
        active = [
            j for j in self._jobs if j.spec.submit_time <= self.now and j.completion_time is None
        ]
        if active:
            snapshot = self._snapshot(active)
            current = snapshot.current
            rng = np.random.default_rng([self.config.seed, self.round])
            decision = self.policy.optimize(snapshot, self.policy_state, rng)
            decided = decision.allocations
            self.policy_state = decision.state
            self.diagnostics.append(decision.diagnostics)
            new = {k: tuple(int(x) for x in a) for k, a in decided.items() if any(a)}
            packed = dict(decision.packed)
            try:
                validate_allocations(snapshot, decided, packed)
                types = self._check(snapshot, new, packed)
            except PolicyError as exc:
                raise SimulationError(f"policy {self.policy.name}: {exc}") from exc
            shares: dict[str, float] = {}
            apps = {j.spec.name: j.spec.application for j in active}
            for guest, host in packed.items():
                shares[guest], shares[host] = self._colocation[apps[guest], apps[host]]
            for job in active:
                name = job.spec.name
                before, after = current.get(name), new.get(name)
                share, job.share = job.share, shares.get(name, 1.0)
                if before != after:
                    job.reallocate(after, self.now, types.get(name, job.gpu_type))
                elif share != job.share and job.placement:
                    job.choose_batch()  # packed or unpacked in place: memory cap changes
            self._alloc = new
            self._packed = packed
        # Busy GPUs: a GPU shared by a packed pair counts once.
        used = sum(sum(a) for k, a in self._alloc.items() if a and k not in self._packed)
        self._utilisation.append((self.now, used / self.cluster.total_gpus))
        work = sum(sum(a) * self._by_name[k].share for k, a in self._alloc.items() if a)
        self._effective.append(work / self.cluster.total_gpus)
        self.round += 1

    def run(self, progress: ProgressFn | None = None) -> SimResult:
        """Step until every job completed; ``progress`` is told after each round."""
        total = len(self._jobs)
        # The simulation is sequential and its linear algebra tiny (7-parameter fits): BLAS
        # worker threads only add overhead (10x slower fits on a busy 2-core machine).
        with threadpool_limits(limits=1):
            while not self.done:
                if self.now >= self.config.max_time:
                    raise SimulationError(
                        f"{self.workload.name} under {self.policy.name}: "
                        f"{total - self.completed} jobs unfinished after "
                        f"{self.config.max_time:.0f} simulated seconds"
                    )
                self.step()
                if progress is not None:
                    progress(self.completed, total, self.now)
        return self.result()

    def result(self) -> SimResult:
        return SimResult(
            policy=self.policy.name,
            workload=self.workload.name,
            cluster=str(self.cluster),
            config=self.config,
            jobs=tuple(j.record() for j in self._jobs),
            utilisation=tuple(self._utilisation),
            end_time=self.now,
            effective_utilisation=tuple(self._effective),
        )


def simulate(
    workload: Workload,
    cluster: ClusterSpec,
    policy: Policy,
    config: SimConfig | None = None,
    progress: ProgressFn | None = None,
) -> SimResult:
    """Run ``policy`` on ``workload`` to completion (see :class:`Simulator`)."""
    return Simulator(workload, cluster, policy, config).run(progress)

"""The tuning loop: experiments → trials → ordinary jobs of the experiment's tenant.

Level-triggered like :mod:`coadapt.controller.reconciler`: every :meth:`TuneRunner.step`
re-derives what to do from the database (experiments, trials, the trial jobs and their metric
rows, the Optuna studies), never from memory of what it did, so it is idempotent and a
controller killed at any point resumes with no trial lost or duplicated:

* **ask → record → submit.** A trial is asked from Optuna (committed as RUNNING there),
  recorded as a PENDING row with its Optuna number, then its job is created with the marker
  ``ENV_TUNE_TRIAL=<experiment>/<number>/<attempt>`` in its environment, then the row
  gets the job id. A crash after the ask adopts Optuna RUNNING trials that have no row; a crash
  after the record submits the PENDING row; a crash after the job creation finds the job by
  its marker and adopts it instead of submitting a second one (also for retries).
* **cancel first, then record.** Jobs the loop stops (pruned, dead, experiment over) are
  cancelled with a ``tune: <why>`` reason before the trial row changes, so a crash in between
  is settled from the job's reason on the next tick.
* **tell is guarded.** Optuna is told only while its trial is still RUNNING, so telling again
  after a crash is a no-op.

Each tick: observe every running experiment (curves from the objective's metric rows,
success → tell the last value, failure → retry up to ``max_retries`` with a new job, early
stopping with :func:`coadapt.tune.pruning.decide`, dead trials, stop conditions), then ask the
cross-tenant policy (:mod:`coadapt.tune.policies`) how many trials each may run, stop the
running trials it preempts (job cancelled with ``tune: preempted for <experiment>``, trial
PRUNED and told PRUNED with its curve, exactly like early stopping), and submit the difference.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from coadapt.controller.errors import (
    ControllerError,
    InvalidTransitionError,
    NotFoundError,
    SpecError,
)
from coadapt.controller.spec import parse_spec
from coadapt.controller.states import ACTIVE, JobState
from coadapt.controller.store import Job, Store
from coadapt.protocol import ENV_TUNE_TRIAL, CancelCause, EventKind
from coadapt.tune.direction import at_least_as_good, better
from coadapt.tune.policies import ClusterView, ExperimentView, Grant, RunningTrial, get_policy
from coadapt.tune.store import Experiment, ExperimentState, Trial, TrialState, TuneStore

log = logging.getLogger("coadapt.tune")

Clock = Callable[[], float]
MARKER_ENV = ENV_TUNE_TRIAL
ACTIVE_JOB = ACTIVE
ACTIVE_TRIAL = (TrialState.PENDING, TrialState.RUNNING)
#: Reason texts the loop writes on the jobs it cancels (for people; the loop reads back the
#: job's ``cancel_cause`` after a crash, never these).
WHY_PRUNED, WHY_DEAD, WHY_ENDED = "tune: pruned", "tune: dead", "tune: experiment ended"
WHY_PREEMPTED = "tune: preempted"  # the policy gave the slot to another trial


@dataclass
class _Live:
    """One running experiment during a tick."""

    exp: Experiment
    spec: Any  # ExperimentSpec
    trials: list[Trial]
    best: float | None
    best_trial: int | None


class TuneRunner:
    """Runs every tuning experiment of the cluster, one :meth:`step` at a time."""

    def __init__(
        self,
        store: Store,
        slots: int | Callable[[], int],
        policy: str = "ei-per-gpu",
        clock: Clock = time.time,
        on_change: Callable[[], None] = lambda: None,
        storage: Any = None,
    ) -> None:
        self.store = store
        self.tune = TuneStore(store)
        # A callable reads the job loop's current inventory (Ray nodes join and leave).
        self._slots = slots
        self.policy_name = policy
        self.policy = get_policy(policy)
        self.clock = clock
        self.on_change = on_change
        self._optuna_db = storage
        self._studies: dict[str, Any] = {}

    def close(self) -> None:
        """Release Optuna's connections (the controller's engine is the Store's to close)."""
        self._studies.clear()
        if self._optuna_db is not None and hasattr(self._optuna_db, "engine"):
            self._optuna_db.scoped_session.remove()
            self._optuna_db.engine.dispose()
        self._optuna_db = None

    # -- optuna ---------------------------------------------------------------------------
    @property
    def storage(self) -> Any:
        if self._optuna_db is None:
            from coadapt.tune.store import optuna_db

            url = self.store.engine.url.render_as_string(hide_password=False)
            self._optuna_db = optuna_db(url)
        return self._optuna_db

    def study(self, exp: Experiment, spec: Any) -> Any:
        study = self._studies.get(exp.id)
        if study is None:
            from coadapt.tune.samplers import create_study

            study = create_study(self.storage, exp.study_name, spec)
            self._studies[exp.id] = study
        return study

    def _tell(
        self,
        exp: Experiment,
        spec: Any,
        number: int,
        state: str,
        value: float | None,
        curve: Sequence[Sequence[float]],
    ) -> None:
        """Tell Optuna how trial ``number`` ended, unless it already knows (idempotent)."""
        from optuna.trial import TrialState as OS

        study = self.study(exp, spec)
        db = self.storage  # our own storage object: public methods only
        try:
            study_id = db.get_study_id_from_name(exp.study_name)
            tid = db.get_trial_id_from_study_id_trial_number(study_id, number)
        except KeyError:
            return
        frozen = db.get_trial(tid)
        if frozen.state.is_finished():
            return
        if state in ("COMPLETE", "PRUNED"):
            for point in curve:
                step = int(point[0])
                if step not in frozen.intermediate_values:
                    db.set_trial_intermediate_value(tid, step, float(point[1]))
        # skip_if_finished: another process (or a restart of this one) may have told it
        # between the check above and here.
        if state == "COMPLETE" and value is not None:
            study.tell(number, value, skip_if_finished=True)
        elif state == "PRUNED":
            study.tell(number, state=OS.PRUNED, skip_if_finished=True)
        else:
            study.tell(number, state=OS.FAIL, skip_if_finished=True)

    # -- jobs -----------------------------------------------------------------------------
    def _cancel_job(self, job_id: str | None, now: float, cause: CancelCause, reason: str) -> None:
        if job_id is None:
            return
        try:
            self.store.update_job(
                job_id,
                now,
                state=JobState.CANCELLED,
                expect=ACTIVE_JOB,
                reason=reason,
                cancel_cause=cause,
                desired_replicas=0,
                event=(EventKind.CANCELLED, reason),
            )
        except (InvalidTransitionError, NotFoundError):
            return
        self.on_change()

    def _orphan(self, exp: Experiment, marker: str) -> Job | None:
        """A job created for ``marker`` whose id never reached the trial row (crash)."""
        tenant = self.tune.tenant(exp.tenant_id)
        for job in self.store.list_jobs(tenant):
            if job.spec.get("env", {}).get(MARKER_ENV) == marker:
                return job
        return None

    def _submit(self, exp: Experiment, spec: Any, t: Trial, now: float, **changes: Any) -> Trial:
        """Create (or adopt) the job of ``t``'s next attempt and record it on the row (with
        ``changes``, in the same transaction)."""
        from coadapt.tune.spec import trial_job_spec

        attempt = t.attempts + 1
        marker = f"{exp.id}/{t.number}/{attempt}"
        job = self._orphan(exp, marker)
        if job is None:
            data = trial_job_spec(spec, t.params, t.number)
            env = dict(data.get("env") or {})
            env[MARKER_ENV] = marker
            data["env"] = env
            data["max_restarts"] = 0  # the experiment's max_retries retries, with a new job
            data["priority"] = t.priority
            if not any(k in data for k in ("replicas", "min_replicas", "max_replicas")):
                data["min_replicas"] = data["max_replicas"] = 1
            job = self.store.create_job(self.tune.tenant(exp.tenant_id), parse_spec(data), now)
            self.on_change()
        return self.tune.update_trial(
            t.id,
            state=TrialState.RUNNING,
            job_id=job.id,
            attempts=attempt,
            started_at=t.started_at if t.started_at is not None else now,
            last_progress_at=now,
            curve=[],
            **changes,
        )

    def _curve(self, job_id: str, metric: str) -> list[list[float]]:
        """``[[step, value, time], ...]`` of the objective metric (steps default to 1, 2...)."""
        out: list[list[float]] = []
        for m in self.store.metrics(job_id):
            if m.name != metric or m.value is None or not math.isfinite(m.value):
                continue
            step = m.step if m.step is not None else len(out) + 1
            out.append([float(step), float(m.value), float(m.time)])
        return out

    @staticmethod
    def _attempt_cost(job: Job) -> float:
        if job.attained_service > 0:
            return job.attained_service
        if job.started_at is not None and job.finished_at is not None:
            return max(job.finished_at - job.started_at, 0.0) * max(job.replicas, 1)
        return 0.0

    # -- one trial ------------------------------------------------------------------------
    def _fail_attempt(self, live: _Live, t: Trial, job: Job | None, now: float, why: str) -> Trial:
        """An attempt died: retry with a new job while retries remain, else FAIL."""
        cost = t.gpu_seconds + (self._attempt_cost(job) if job is not None else 0.0)
        spec = live.spec
        if t.attempts <= spec.max_retries and not live.exp.state.is_terminal:
            self.store.add_event(
                t.job_id,
                EventKind.TUNE_RETRY,
                f"trial {live.exp.name}#{t.number} attempt {t.attempts} failed ({why}); "
                f"retry {t.attempts}/{spec.max_retries}",
                now,
            )
            return self._submit(live.exp, spec, t, now, gpu_seconds=cost, reason=why)
        self._tell(live.exp, spec, t.number, "FAIL", None, t.curve)
        return self.tune.update_trial(
            t.id,
            state=TrialState.FAILED,
            gpu_seconds=cost,
            ended_at=now,
            reason=f"{why}; gave up after {t.attempts} attempt(s)",
        )

    def _advance(self, live: _Live, t: Trial, now: float) -> Trial:
        """Move one active trial forward from what its job did."""
        spec, exp = live.spec, live.exp
        if t.state is TrialState.PENDING or t.job_id is None:
            return self._submit(exp, spec, t, now)
        try:
            job: Job | None = self.store.get_job(t.job_id)
        except NotFoundError:
            job = None
        if job is None:
            return self._fail_attempt(live, t, None, now, f"job {t.job_id} vanished")
        curve = self._curve(job.id, spec.objective.metric)
        if curve != t.curve:
            t = self.tune.update_trial(t.id, curve=curve, last_progress_at=curve[-1][2])
        last = curve[-1][1] if curve else None
        if job.state is JobState.SUCCEEDED:
            if last is None:
                return self._fail_attempt(
                    live, t, job, now, f"no {spec.objective.metric!r} value reported"
                )
            self._tell(exp, spec, t.number, "COMPLETE", last, curve)
            return self.tune.update_trial(
                t.id,
                state=TrialState.SUCCEEDED,
                value=last,
                ended_at=now,
                gpu_seconds=t.gpu_seconds + self._attempt_cost(job),
            )
        if job.state is JobState.FAILED:
            return self._fail_attempt(live, t, job, now, job.reason or "job failed")
        if job.state is JobState.CANCELLED:
            return self._settle_cancelled(live, t, job, now, last)
        # active job: dead? pruned?
        if job.state is JobState.RUNNING:
            since = max(t.last_progress_at or 0.0, job.started_at or 0.0, t.started_at or 0.0)
            if now - since > spec.dead_after_s:
                self._cancel_job(
                    job.id,
                    now,
                    CancelCause.TUNE_DEAD,
                    f"{WHY_DEAD}: no report for {now - since:.0f}s",
                )
                return self._fail_attempt(
                    live,
                    t,
                    self.store.get_job(job.id),
                    now,
                    f"dead: no report for {now - since:.0f}s",
                )
            if curve and spec.early_stopping.rule != "none":
                decision = self._decide(live, t, curve)
                if decision is not None:
                    self._cancel_job(
                        job.id, now, CancelCause.TUNE_PRUNED, f"{WHY_PRUNED}: {decision}"
                    )
                    return self._settle_cancelled(live, t, self.store.get_job(job.id), now, last)
        return t

    def _decide(self, live: _Live, t: Trial, curve: list[list[float]]) -> str | None:
        from coadapt.tune.pruning import decide

        spec = live.spec
        pts = [(p[0], p[1]) for p in curve]
        peers = [[(p[0], p[1]) for p in o.curve] for o in live.trials if o.id != t.id and o.curve]
        done = [
            o.value for o in live.trials if o.state is TrialState.SUCCEEDED and o.value is not None
        ]
        best = None
        for v in done:
            if best is None or better(spec.objective.direction, v, best):
                best = v
        d = decide(spec.early_stopping, spec.objective.direction, spec.max_steps, pts, peers, best)
        return d.reason or "stopped early" if d.stop else None

    def _settle_cancelled(
        self, live: _Live, t: Trial, job: Job, now: float, last: float | None
    ) -> Trial:
        """A trial's job is CANCELLED: finish the trial by the reason on the job."""
        reason = job.reason or ""
        cost = t.gpu_seconds + self._attempt_cost(job)
        exp, spec = live.exp, live.spec
        cause = job.cancel_cause
        if cause in (CancelCause.TUNE_PRUNED, CancelCause.TUNE_PREEMPTED):
            self._tell(exp, spec, t.number, "PRUNED", None, t.curve)
            kind = (
                EventKind.TUNE_PRUNED
                if cause is CancelCause.TUNE_PRUNED
                else EventKind.TUNE_PREEMPTED
            )
            self.store.add_event(job.id, kind, reason, now)
            return self.tune.update_trial(
                t.id,
                state=TrialState.PRUNED,
                value=last,
                ended_at=now,
                gpu_seconds=cost,
                reason=reason,
            )
        if cause is CancelCause.TUNE_DEAD:
            return self._fail_attempt(live, t, job, now, reason)
        if (
            cause is CancelCause.TUNE_ENDED
            and live.exp.target_reached_at is not None
            and live.best_trial == t.number
            and last is not None
        ):
            self._tell(exp, spec, t.number, "COMPLETE", last, t.curve)
            return self.tune.update_trial(
                t.id,
                state=TrialState.SUCCEEDED,
                value=last,
                ended_at=now,
                gpu_seconds=cost,
                reason="reached the target",
            )
        self._tell(exp, spec, t.number, "FAIL", None, t.curve)
        return self.tune.update_trial(
            t.id,
            state=TrialState.CANCELLED,
            value=last,
            ended_at=now,
            gpu_seconds=cost,
            reason=reason or "job cancelled",
        )

    # -- experiments ----------------------------------------------------------------------
    def _observe(self, exp: Experiment, now: float) -> _Live | None:
        """Advance every trial of a running experiment; end it when it is done."""
        from optuna.trial import TrialState as OS

        from coadapt.tune.spec import parse_experiment

        try:
            spec = parse_experiment(exp.spec)
            # raises SpecError too: a sampler this controller cannot run (a missing extra)
            study = self.study(exp, spec)
        except SpecError as exc:
            self.tune.update_experiment(
                exp.id, now, state=ExperimentState.FAILED, reason=f"invalid spec: {exc.message}"
            )
            return None
        trials = self.tune.trials(exp.id)
        known = {t.number for t in trials}
        for ft in study.get_trials(deepcopy=False, states=(OS.RUNNING,)):
            if ft.number in known:
                continue
            # asked, then the controller died before recording: adopt it if its parameters
            # were all suggested, else (died mid-suggest) it never ran: tell FAIL
            params = dict(ft.params)
            point: dict[str, Any] = {}
            complete = True
            for name in spec.space:
                if spec.active(name, point):
                    if name not in params:
                        complete = False
                        break
                    point[name] = params[name]
            if complete:
                trials.append(self.tune.add_trial(exp.id, ft.number, params, now))
            else:
                study.tell(ft.number, state=OS.FAIL)
        trials.sort(key=lambda t: t.number)
        live = _Live(exp, spec, trials, exp.best_value, exp.best_trial)
        for i, t in enumerate(trials):
            if t.state.is_active:
                try:
                    trials[i] = self._advance(live, t, now)
                except SpecError as exc:
                    self._end(live, now, ExperimentState.FAILED, f"trial job spec: {exc.message}")
                    return None
        self._update_best(live, now)
        return self._check_end(live, now)

    def _update_best(self, live: _Live, now: float) -> None:
        direction = live.spec.objective.direction
        best, best_trial = live.exp.best_value, live.exp.best_trial
        points = sorted((p[2], p[1], t.number) for t in live.trials for p in t.curve if len(p) > 2)
        history = [list(h) for h in live.exp.best_history]
        changed = False
        for when, value, number in points:
            if best is None or better(direction, value, best):
                best, best_trial = value, number
                history.append([when, value])
                changed = True
        if changed:
            live.exp = self.tune.update_experiment(
                live.exp.id, now, best_value=best, best_trial=best_trial, best_history=history
            )
        live.best, live.best_trial = best, best_trial

    def _check_end(self, live: _Live, now: float) -> _Live | None:
        spec, exp = live.spec, live.exp
        direction = spec.objective.direction
        if (
            spec.target is not None
            and live.best is not None
            and at_least_as_good(direction, live.best, spec.target)
        ):
            self._end(
                live,
                now,
                ExperimentState.SUCCEEDED,
                f"target {spec.target:g} reached by trial #{live.best_trial} ({live.best:g})",
                target_reached_at=now,
            )
            return None
        finished = [t for t in live.trials if not t.state.is_active]
        active = [t for t in live.trials if t.state.is_active]
        if spec.max_trials is not None and len(finished) >= spec.max_trials:
            self._end(live, now, *self._outcome(live, f"max_trials {spec.max_trials} done"))
            return None
        if spec.max_time_s is not None and now - exp.created_at >= spec.max_time_s:
            self._end(live, now, *self._outcome(live, f"max_time_s {spec.max_time_s:g} spent"))
            return None
        if exp.policy_state.get("exhausted") and not active:
            self._end(live, now, *self._outcome(live, "every grid point tried"))
            return None
        return live

    @staticmethod
    def _outcome(live: _Live, why: str) -> tuple[ExperimentState, str]:
        if live.best is None:
            return ExperimentState.FAILED, f"{why} without a single result"
        return ExperimentState.SUCCEEDED, f"{why}; best {live.best:g} (trial #{live.best_trial})"

    def _end(
        self,
        live: _Live,
        now: float,
        state: ExperimentState,
        reason: str,
        target_reached_at: float | None = None,
    ) -> None:
        extra: dict[str, Any] = {}
        if target_reached_at is not None:
            extra["target_reached_at"] = target_reached_at
        try:
            live.exp = self.tune.update_experiment(
                live.exp.id,
                now,
                expect=ExperimentState.RUNNING,
                state=state,
                reason=reason,
                **extra,
            )
        except InvalidTransitionError:
            live.exp = self.tune.get_experiment(live.exp.id)
        log.info("experiment %s: %s", live.exp.id, reason)
        self._wind_down(live.exp, now)

    def _wind_down(self, exp: Experiment, now: float) -> None:
        """Cancel the jobs of an ended experiment's active trials and finish those trials."""
        active = self.tune.trials(exp.id, states=ACTIVE_TRIAL)
        if not active:
            return
        from coadapt.tune.spec import parse_experiment

        spec = parse_experiment(exp.spec)
        live = _Live(exp, spec, self.tune.trials(exp.id), exp.best_value, exp.best_trial)
        for t in active:
            if t.job_id is not None:
                self._cancel_job(
                    t.job_id,
                    now,
                    CancelCause.TUNE_ENDED,
                    f"{WHY_ENDED}: {exp.reason or exp.state.value}",
                )
                try:
                    job = self.store.get_job(t.job_id)
                except NotFoundError:
                    job = None
            else:
                job = None
            if job is None or job.state is not JobState.CANCELLED:
                if job is not None and job.state is JobState.SUCCEEDED and t.curve:
                    self._tell(exp, spec, t.number, "COMPLETE", t.curve[-1][1], t.curve)
                    self.tune.update_trial(
                        t.id, state=TrialState.SUCCEEDED, value=t.curve[-1][1], ended_at=now
                    )
                    continue
                self._tell(exp, spec, t.number, "FAIL", None, t.curve)
                self.tune.update_trial(
                    t.id,
                    state=TrialState.CANCELLED,
                    ended_at=now,
                    reason=f"experiment {exp.state.value.lower()}",
                )
                continue
            last = t.curve[-1][1] if t.curve else None
            self._settle_cancelled(live, t, job, now, last)

    # -- scheduling -----------------------------------------------------------------------
    def view(self, live: _Live, now: float) -> ExperimentView:
        spec, trials = live.spec, live.trials
        active = [t for t in trials if t.state.is_active]
        done = sorted(
            (t for t in trials if t.state is TrialState.SUCCEEDED and t.value is not None),
            key=lambda t: (t.ended_at or 0.0, t.number),
        )
        ended = [t for t in trials if not t.state.is_active]
        costs = tuple(
            t.gpu_seconds
            if t.gpu_seconds > 0
            else max((t.ended_at or now) - (t.started_at or now), 0.0)
            for t in ended
            if t.state in (TrialState.SUCCEEDED, TrialState.PRUNED)
        )
        idle_since = None
        if not active:
            idle_since = max([t.ended_at or 0.0 for t in ended] + [live.exp.created_at])
        width = 1
        try:
            from coadapt.tune.spec import sample_point, trial_job_spec

            probe = dict(trial_job_spec(spec, sample_point(spec), 0))
            if not any(k in probe for k in ("replicas", "min_replicas", "max_replicas")):
                probe["min_replicas"] = probe["max_replicas"] = 1
            width = parse_spec(probe).requested_replicas
        except SpecError:
            width = 1
        return ExperimentView(
            id=live.exp.id,
            tenant=live.exp.tenant_id,
            submit_time=live.exp.created_at,
            parallelism=spec.parallelism,
            running=len(active),
            direction=spec.objective.direction,
            target=spec.target,
            max_steps=spec.max_steps,
            results=tuple(float(t.value) for t in done if t.value is not None),
            pruned=tuple(
                float(t.value)
                for t in trials
                if t.state is TrialState.PRUNED and t.value is not None
            ),
            curves=tuple(tuple((float(p[0]), float(p[1])) for p in t.curve) for t in active),
            trial_costs=costs,
            gpu_seconds=sum(t.gpu_seconds for t in trials),
            best=live.best,
            idle_since=idle_since,
            slots_per_trial=max(width, 1),
            state=dict(live.exp.policy_state),
            running_trials=tuple(
                RunningTrial(
                    t.number,
                    tuple((float(p[0]), float(p[1])) for p in t.curve),
                    max(now - (t.started_at if t.started_at is not None else now), 0.0),
                    self._step_s(t.curve),
                )
                for t in active
                if t.state is TrialState.RUNNING and t.job_id is not None
            ),
        )

    @staticmethod
    def _step_s(curve: Sequence[Sequence[float]]) -> float | None:
        """Seconds per step between the first and the last report (None: not measurable)."""
        if len(curve) < 2 or len(curve[0]) < 3 or curve[-1][0] <= curve[0][0]:
            return None
        return max(curve[-1][2] - curve[0][2], 0.0) / (curve[-1][0] - curve[0][0])

    @property
    def slots(self) -> int:
        """The cluster's slots now."""
        return int(self._slots() if callable(self._slots) else self._slots)

    def _capacity(self, lives: Sequence[_Live]) -> tuple[int, int]:
        """(slots tuning may use, of those free): the cluster minus other jobs' slots."""
        trial_jobs = {t.job_id for live in lives for t in live.trials if t.state.is_active}
        other = 0
        for job in self.store.list_jobs(states=ACTIVE_JOB):
            if job.id not in trial_jobs and MARKER_ENV not in job.spec.get("env", {}):
                other += job.replicas
        total = max(self.slots - other, 0)
        return total, total

    def _schedule(self, lives: list[_Live], now: float) -> dict[str, Grant]:
        if not lives:
            return {}
        views = [self.view(live, now) for live in lives]
        total, _ = self._capacity(lives)
        held = sum(v.running * v.slots_per_trial for v in views)
        grants = self.policy(views, ClusterView(now, total, max(total - held, 0)))
        for live, v in zip(lives, views, strict=True):
            g = grants.get(v.id)
            if g is None:
                continue
            state = dict(g.state)
            if live.exp.policy_state.get("exhausted"):
                state["exhausted"] = True
            state["priority"] = g.priority
            state["grant"] = g.slots
            state["why"] = g.why
            if state != live.exp.policy_state:
                live.exp = self.tune.update_experiment(live.exp.id, now, policy_state=state)
        stopped = {live.exp.id: self._preempt(live, grants.get(live.exp.id), now) for live in lives}
        for live, v in zip(lives, views, strict=True):  # stops first: they free the slots
            g = grants.get(v.id)
            if g is not None:
                self._start_trials(live, g.slots - (v.running - stopped[v.id]), g.priority, now)
        return grants

    def _preempt(self, live: _Live, grant: Grant | None, now: float) -> int:
        """Stop the trials the policy preempts (cancel first, then settle: PRUNED, told
        PRUNED with the curve); how many it stopped."""
        if grant is None or not grant.stop:
            return 0
        n = 0
        for stop in grant.stop:
            for i, t in enumerate(live.trials):
                if t.number != stop.trial or t.state is not TrialState.RUNNING or not t.job_id:
                    continue
                reason = f"{WHY_PREEMPTED} for {stop.to}" + (f": {stop.why}" if stop.why else "")
                self._cancel_job(t.job_id, now, CancelCause.TUNE_PREEMPTED, reason)
                job = self.store.get_job(t.job_id)
                if job.state is JobState.CANCELLED:
                    last = t.curve[-1][1] if t.curve else None
                    live.trials[i] = self._settle_cancelled(live, t, job, now, last)
                    n += 1
        return n

    def _start_trials(self, live: _Live, n: int, priority: int, now: float) -> None:
        from coadapt.tune.samplers import GridExhausted, ask_params

        spec = live.spec
        for _ in range(max(n, 0)):
            if spec.max_trials is not None and len(live.trials) >= spec.max_trials:
                return
            study = self.study(live.exp, spec)
            try:
                trial, params = ask_params(study, spec)
            except GridExhausted:
                state = {**live.exp.policy_state, "exhausted": True}
                live.exp = self.tune.update_experiment(live.exp.id, now, policy_state=state)
                return
            row = self.tune.add_trial(live.exp.id, trial.number, params, now, priority)
            try:
                row = self._submit(live.exp, spec, row, now)
            except SpecError as exc:
                self._end(live, now, ExperimentState.FAILED, f"trial job spec: {exc.message}")
                return
            live.trials.append(row)

    # -- loop -----------------------------------------------------------------------------
    def step(self) -> dict[str, Grant]:
        """One tick: settle ended experiments, advance running ones, grant and submit."""
        now = self.clock()
        lives: list[_Live] = []
        for exp in self.tune.list_experiments(states=(ExperimentState.RUNNING,)):
            live = self._observe(exp, now)
            if live is not None:
                lives.append(live)
        for exp_id in self.tune.ended_with_active_trials():
            self._wind_down(self.tune.get_experiment(exp_id), now)
        return self._schedule(lives, now)

    def run(self, stop: threading.Event, tick: float = 1.0) -> None:
        """Loop until ``stop`` is set; an error in one step is logged and the loop goes on."""
        while not stop.is_set():
            try:
                self.step()
            except ControllerError as exc:
                log.error("tuning step failed: %s", exc)
            except Exception:  # the loop must outlive a bug in one step; loudly
                log.exception("unexpected error in the tuning step")
            stop.wait(tick)

"""AdaptiveModel: DDP plus gradient-noise measurement, LR scaling, profiling and re-tuning.

One call per micro-batch, ``model.step(loss)``, does what a PolluxAgent does inside a job:

* backward with the loss scaled for ``s`` accumulation steps (DDP's all-reduce only on the
  sync micro-batch);
* measures the gradient noise without extra backward passes (see :mod:`coadapt.train.gns`),
  on one optimizer step in every ``measure_every`` so its cost (norms, a host sync) is
  amortised (on every step while the noise gate still holds the batch at M0): with K > 1
  replicas every step is DDP's own C++ all-reduce, and on a measuring step hooks take each
  gradient's local squared norm before DDP reduces it; the norms, the stop/save flags and
  rank 0's spacing of measuring steps are then agreed in one small all-reduce (a SIGTERM or
  a due checkpoint waits for the next measuring step, at most ``FLAG_LATENCY_S`` of steps
  beyond ``measure_every``). With K = 1
  it uses the first micro-batch vs the accumulated gradient; without accumulation the loader
  splits a measuring step into two micro-batches (both pieces at the same weights: unbiased,
  unlike consecutive steps), flattened into one buffer so that a single 2×2 Gram matrix
  gives every norm at once;
* scales the LR by the rule (AdaScale for SGD, sqrt for adaptive optimisers) for the
  optimizer step only, so any user LR scheduler composes with it;
* records (nodes, K, m, s, T_iter, T_grad) and every ``retune_every`` steps and at epoch
  boundaries (no more often than lets re-tunes cost ``RETUNE_BUDGET`` of the time) fits
  θ_sys and picks (m, s) by eq. 14, adopting it only when ``should_adopt``;
* on SIGTERM, checkpoints at this step boundary and exits 0; every ``checkpoint_interval``
  seconds (default 120, stretched so a checkpoint costs ≤ 2% of the time between them) and
  every ``checkpoint_every`` steps it checkpoints too, so a crash loses little;
* out of memory, records the per-replica batch that did not fit and exits with
  OOM_EXIT_CODE (see :mod:`coadapt.train.memory`).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from coadapt.goodput import (
    BatchLimits,
    FitError,
    GoodputModel,
    GradParams,
    LRRule,
    Observations,
    PerfParams,
    fit_perf_params,
    lr_factor,
)
from coadapt.goodput.agent import MIN_MEASUREMENTS, Reason, choose_batch, epoch_limits
from coadapt.protocol import (
    BatchRecord,
    CheckpointRecord,
    FirstStepRecord,
    GoodputRecord,
    ProgressRecord,
)
from coadapt.train.context import TrainConfigError
from coadapt.train.data import AdaptiveDataLoader
from coadapt.train.gns import GradNoiseEMA, estimate, halves_estimate
from coadapt.train.memory import is_oom
from coadapt.train.profile import Profile

_ADAPTIVE = (
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.Adagrad,
    torch.optim.RMSprop,
    torch.optim.Adamax,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.Adadelta,
)
_PRECONDITIONED = (torch.optim.Adam, torch.optim.AdamW)
_WARMUP_STEPS = 3  # steps after a start or batch change that are not profiled
_FOLLOWUP_STEPS = 6  # timed steps of a new configuration before the early re-tune
# Adam's P = 1/(sqrt(v̂) + ε) is not measured with before the optimizer has taken this many
# steps: after one, v̂ = ḡ² and P·ḡ = ±1 in every coordinate, a piece's |P g1|² read 10⁸ and
# that first update dominated the cancer MLP's smoothed noise for 60 steps (issue 19).
_PRECONDITION_WARMUP = 4
# Periodic checkpoints may cost at most this fraction of the time between them (issue 13.2),
CHECKPOINT_BUDGET = 0.02
# and come often enough that a crash loses at most this share of the training time so far
# (a young job checkpoints every few seconds, a long one every ``checkpoint_interval``),
CHECKPOINT_LOSS_SHARE = 0.02
# but never more often than this (seconds): a cheap checkpoint still writes a file.
CHECKPOINT_MIN_GAP = 0.5
# Periodic and epoch-boundary re-tunes may cost at most this share of the training time
# between them (the gate's, a follow-up's and a forced one always run). A re-tune with a fit
# took 2-5 ms on the cancer MLP, whose steps take ~1 ms: with one every 8 steps (an epoch at
# batch 53) they were 30% of its training CPU time (issue 19, round 3).
RETUNE_BUDGET = 0.05
#: Share of the training time that split noise measurements (K = 1) may cost.
MEASURE_BUDGET = 0.05
#: Noise measurements a job takes after a batch change before its follow-up re-tune (which
#: waits for them, at most _FOLLOWUP_STEPS more steps; a one-replica job without
#: accumulation splits every other step until then, outside MEASURE_BUDGET). Without them
#: the follow-ups re-read the gate's φ: on the H200 a split step costs a whole step, the
#: budget spaced measurements 20 steps apart, and digits jobs grew 32 -> 179 at steps 15,
#: 24 and 33 on the φ = 324 they read at the gate (brute force 30-60), their AdaScale gain at
#: its cap, and collapsed; on the CPU three more measurements took the same seed's φ to 34.
FRESH_MEASUREMENTS = 3
#: Most optimizer steps between two noise measurements at K > 1, however dear one is.
MAX_MEASURE_SPACING = 64
#: K > 1: a SIGTERM or a due checkpoint is agreed on at the next measuring step, so measuring
#: steps are never spaced more than this many seconds of training apart (beyond
#: ``measure_every`` steps): a rescale waits at most that long for the replicas to agree.
FLAG_LATENCY_S = 0.5


def default_lr_rule(optimizer: torch.optim.Optimizer) -> LRRule:
    """AdaScale (capped at the square-root rule) for SGD-like optimizers, square root for
    adaptive ones (seed 000 §3.1; the cap: issue 19, see :mod:`coadapt.goodput.lr`)."""
    return LRRule.SQRT if isinstance(optimizer, _ADAPTIVE) else LRRule.ADASCALE_SQRT


class AdaptiveModel:
    """Wraps a module for elastic, goodput-adaptive data-parallel training."""

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        loader: AdaptiveDataLoader,
        *,
        scheduler: Any | None = None,
        lr_rule: LRRule | str | Callable[[int, int], float] | None = None,
        adapt: bool = True,
        retune_every: int = 50,
        measure_every: int = 4,
        grad_smoothing: float = 0.9,
        report_every: int = 20,
        name: str = "model",
        ddp_kwargs: dict[str, Any] | None = None,
        checkpoint_every: int | None = None,
        checkpoint_interval: float | None = None,
        measure_noise: bool | None = None,
    ) -> None:
        """``measure_noise``: whether to pay for gradient-noise measurements (a split step's
        extra micro-batch at one replica, the norm hooks and agreement at K > 1), within
        MEASURE_BUDGET. None (the default): only in a job that may change its batch, the one
        that reads φ; True: in a fixed job too, to report φ (at one replica one step in
        ``measure_every``: a fixed job does not fit the timings that budget needs); the
        pieces of an accumulating step at one replica are measured whatever it says (they
        cost nothing extra)."""
        if retune_every < 1 or measure_every < 2 or report_every < 1:
            raise TrainConfigError("need retune_every >= 1, measure_every >= 2, report_every >= 1")
        if checkpoint_every is None:
            checkpoint_every = loader.ctx.env.checkpoint_every
        if checkpoint_every < 0:
            raise TrainConfigError(
                f"checkpoint_every must be >= 0 (0 = only on SIGTERM), got {checkpoint_every}"
            )
        # Periodic checkpoints bound the work lost when a node dies without a SIGTERM. Counted
        # in optimizer steps, which every rank agrees on, so no extra collective is needed.
        self.checkpoint_every = checkpoint_every
        if checkpoint_interval is None:
            checkpoint_interval = loader.ctx.env.checkpoint_interval
        if not 0 <= checkpoint_interval < math.inf:
            raise TrainConfigError(
                f"checkpoint_interval must be seconds >= 0 (0 = none), got {checkpoint_interval}"
            )
        # ... and by time, on by default: rank 0 decides when one is due and the decision
        # rides the all-reduced stop flag, so every rank saves at the same step.
        self.checkpoint_interval = float(checkpoint_interval)
        self.ctx = loader.ctx
        self.loader = loader
        self.module = module.to(self.ctx.device)
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.lr_rule: LRRule | str | Callable[[int, int], float] = (
            lr_rule if lr_rule is not None else default_lr_rule(optimizer)
        )
        lr_factor(self.lr_rule, 1, 1)  # validate the rule now, not at the first batch change
        # The scheduler's policy may fix the batch (ReplicaEnv.batch_mode); then never retune.
        self.adapt = adapt and self.ctx.env.batch_mode == "adaptive"
        self.retune_every = retune_every
        self.measure_every = measure_every
        self.report_every = report_every
        self.gns = GradNoiseEMA(grad_smoothing)
        self.profile = Profile()
        self.steps = 0
        self.lr_scale = 1.0
        self.last_loss = float("nan")
        self._precondition = isinstance(optimizer, _PRECONDITIONED)
        self._params = [p for p in self.module.parameters() if p.requires_grad]
        self._replicas = self.ctx.world_size
        self._piece_scale: float | None = None  # set when _rows[0] holds a piece gradient
        # (samples, seconds) of the in-flight split step's halves, timed as the profile's
        # micro-batches of that size once the optimizer step's time is added
        self._halves: list[tuple[int, float]] = []
        # (2, P): the first micro-batch's gradient and the step's (K = 1)
        self._rows: torch.Tensor | None = None
        # K > 1, a measuring step: hooks that take each gradient's local squared norm before
        # DDP reduces it (registered by the forward of its sync micro-batch), the norms they
        # took, and Adam's P for them
        self._norm_hooks: list[Any] = []
        self._hook_pinv: list[torch.Tensor] | None = None
        self._agreements: list[_AgreementBuffer] = []  # two, used in turn (_open_agreement)
        self._agreement: _AgreementBuffer | None = None  # the one this measuring step fills
        self._pending: _PendingMeasurement | None = None  # its agreement, still in flight
        self._flags: dict[tuple[bool, bool, int], torch.Tensor] = {}
        self._norm_takers: list[Callable[[torch.Tensor], None]] = []  # one per parameter
        # K > 1: recent wall times of measuring and other steps at the current (m, s), and
        # the agreed spacing of measuring steps that keeps their extra cost in MEASURE_BUDGET
        # rank 0's step times at K > 1 by kind (_record_wall): a measuring step ("launch"),
        # the next one, which finishes its agreement ("finish"), and the rest ("plain")
        self._walls: dict[str, deque[float]] = {
            "launch": deque(maxlen=16),
            "finish": deque(maxlen=16),
            "plain": deque(maxlen=32),
        }
        self._walls_key: tuple[int, int, int, int] | None = None
        self._sync_spacing = 0
        self._warmup = _WARMUP_STEPS
        self._followup = -1  # the step of an early re-tune after a batch change
        # no periodic or epoch re-tune before this step (RETUNE_BUDGET; rank 0's verdict)
        self._next_periodic = 0
        # Re-tune once the noise measurements have doubled since the last re-tune (0: none
        # yet): O(log steps) re-tunes in all, outside RETUNE_BUDGET. At ~3 ms a re-tune, that
        # budget spaced periodic ones 80-270 steps apart on sub-millisecond steps, and a job
        # that kept 64 at step 24 (φ read 81, optimum 71) stayed there while φ grew to 260
        # for 100-400 steps, most of its run (teacher MLP, issue 19).
        self._recheck_at = 0
        # Until the noise gate opens the job may not change its batch, so it measures the
        # noise on every step it can (not one in measure_every) and re-tunes the moment the
        # gate opens rather than at the next multiple of retune_every (issue 19).
        self._gated = (
            self.adapt
            and loader.max_batch_size > loader.init_batch_size
            and loader.pinned_batch_size is None
        )
        # Only a job that may change its batch reads φ (at a fixed M the efficiency is 1
        # whatever φ is), so only it pays to measure it: a split step's extra micro-batch at
        # one replica without accumulation, the norm hooks and reads at K > 1 (about a
        # quarter of a 2-replica digits step per measurement: issue 19). A fixed job's
        # agreement steps at K > 1 carry the stop and save flags alone.
        if measure_noise is False and self._gated:
            raise TrainConfigError(
                "measure_noise=False, but this job may change its batch size, and it chooses "
                "one from the gradient noise: pin the batch (max_batch_size = batch_size) or "
                "leave measure_noise unset"
            )
        self._reads_noise = self._gated if measure_noise is None else measure_noise
        # K = 1 without accumulation: steps between split measurements so that their extra
        # micro-batch costs at most MEASURE_BUDGET of the training time (set at re-tunes)
        self._split_spacing = 0
        # gns.count at the last batch change (-1: none yet), and the step by which the
        # follow-up re-tune runs even if FRESH_MEASUREMENTS are not in (e.g. Adam's warm-up)
        self._changed_at_count = -1
        self._followup_by = -1
        self._perf: PerfParams | None = None  # the last θ_sys fit, and the profile it saw
        self._fit_version: tuple[Any, ...] = ()
        self._stop_pending = False
        self._save_pending = False
        self._last_save = time.monotonic()
        self._started = time.monotonic()
        self._trained_before = 0.0  # training seconds of earlier attempts (from the checkpoint)
        self._stepped = False
        self._last_epoch = loader.epoch
        self._saved_replicas = self._replicas
        restored = self.ctx.register(name, self)
        self._force_retune = restored and self._saved_replicas != self._replicas
        self.ddp: DistributedDataParallel | None = None
        if self.ctx.distributed:
            ids = [self.ctx.device.index] if self.ctx.device.type == "cuda" else None
            # No comm hook: DDP's own all-reduce runs in C++ on every step. A measuring step
            # takes the local norms on the side (_open_agreement), see there.
            self.ddp = DistributedDataParallel(self.module, device_ids=ids, **(ddp_kwargs or {}))
        self._update_lr_scale()
        self._request_split()
        self.ctx.restore_rng()
        if self.adapt and loader.max_batch_size > loader.init_batch_size:
            # The first fit imports SciPy's optimiser (0.3-1.6 s); import it while the first
            # steps run, not at the first re-tune in the middle of training.
            _OPTIMIZER.start()

    @property
    def _measure_period(self) -> int:
        """Optimizer steps between two noise measurements (every rank computes the same).

        While gated: every step, except at one replica without accumulation, where every
        other one (a measuring step is split and not timed, so the rest time M0 for the
        first fit). After a batch change, until FRESH_MEASUREMENTS are in: every other step
        (split) or every step (K > 1). Otherwise ``measure_every``, or the spacing that keeps
        measuring within MEASURE_BUDGET if that is longer.
        """
        split = self.ddp is None and self.loader.accum_steps == 0
        if not self._gated:
            if split and self._needs_fresh:
                return 2
            if split:
                return max(self.measure_every, self._split_spacing)
            if self.ddp is None:
                return self.measure_every
            # K > 1: fresh evidence after a batch change, then as the budget allows
            return 1 if self._needs_fresh else max(self.measure_every, self._sync_spacing)
        return 2 if split else 1

    @property
    def _needs_fresh(self) -> bool:
        """Whether the last batch change still waits for FRESH_MEASUREMENTS of the noise."""
        start = self._changed_at_count
        return start >= 0 and 0 <= self.gns.count - start < FRESH_MEASUREMENTS

    @property
    def _measuring(self) -> bool:
        """Whether the in-flight step measures the gradient noise (every rank agrees)."""
        if self._precondition and self.steps < _PRECONDITION_WARMUP:
            return False
        return self.steps % self._measure_period == 0

    def leave_process_group(self) -> None:
        """Drop the DDP wrapper (and with it this model's hold on the process group): called
        by ``ct.shutdown()`` before the group is destroyed. The model still runs forward
        passes on its own module (an evaluation after training)."""
        self.ddp = None
        self._close_agreement()
        pending, self._pending = self._pending, None
        if pending is not None:  # the group is about to go: let its last collective end
            with contextlib.suppress(RuntimeError):
                pending.work.wait()

    # -- forward --------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._stop_pending:
            self.ctx.exit_for_rescale()
        if self._save_pending:  # at the boundary, like a stop: the state after the last step
            self._save_pending = False
            self.ctx.save()
            self._last_save = time.monotonic()
            self.ctx.metrics.emit(
                CheckpointRecord(step=self.steps, seconds=self.ctx.last_save_seconds)
            )
        try:
            if self.ddp is not None:
                # DDP all-reduces only on the last micro-batch of an optimizer step.
                sync = self.loader.is_sync_step
                self.ddp.require_backward_grad_sync = sync
                if sync and self._agreement is None and self.steps % self._measure_period == 0:
                    self._open_agreement()
                return self.ddp(*args, **kwargs)
            return self.module(*args, **kwargs)
        except Exception as exc:
            if is_oom(exc):
                self.ctx.exit_for_oom(exc)
            raise

    @property
    def trained_seconds(self) -> float:
        """Wall time this job has trained, over all its attempts."""
        return self._trained_before + time.monotonic() - self._started

    @property
    def checkpoint_period(self) -> float:
        """Seconds between periodic checkpoints (0: off, or no checkpoint directory).

        A crash should cost at most CHECKPOINT_LOSS_SHARE of the training so far, so the
        period grows with the job's age from CHECKPOINT_MIN_GAP up to ``checkpoint_interval``;
        and a checkpoint should cost at most CHECKPOINT_BUDGET of the time between two, so the
        period never drops below the typical save time (the lower median of the last few,
        robust to one stalled write) / CHECKPOINT_BUDGET (that rule wins).
        """
        if self.checkpoint_interval <= 0 or self.ctx.env.checkpoint_dir is None:
            return 0.0
        by_age = max(CHECKPOINT_MIN_GAP, CHECKPOINT_LOSS_SHARE * self.trained_seconds)
        cost = self.ctx.typical_save_seconds or 0.0
        return max(min(self.checkpoint_interval, by_age), cost / CHECKPOINT_BUDGET)

    def _checkpoint_due(self) -> bool:
        """Rank 0's verdict (the others follow it through the all-reduced flag)."""
        period = self.checkpoint_period
        return period > 0 and time.monotonic() - self._last_save >= period

    def train(self, mode: bool = True) -> AdaptiveModel:
        self.module.train(mode)
        return self

    def eval(self) -> AdaptiveModel:
        self.module.eval()
        return self

    @property
    def pgns(self) -> float:
        """Smoothed pre-conditioned gradient noise scale φ (samples)."""
        return self.gns.pgns()

    @property
    def grad_params(self) -> GradParams | None:
        return self.gns.grad_params(self.loader.init_batch_size)

    # -- pre-conditioning -----------------------------------------------------------------
    def _pinv(
        self, params: list[torch.Tensor], unseen_out: bool = False
    ) -> list[torch.Tensor] | None:
        """Adam's sqrt(v̂) + ε per parameter (None before the first step: P = I).

        ``unseen_out``: ∞ where v̂ is 0, so a coordinate that has never had a gradient
        weighs nothing. At K > 1 the norms are taken before the optimizer step, with the v̂
        of the steps before: a dead ReLU unit's weights (5-10% of the cancer MLP's early
        on) have v̂ = 0, and the first gradient one of them gets on one replica was divided
        by ε = 1e-8, so |G|² read 4e11 against 1.5e3 at one replica, whose norms follow
        the step (v̂ then holds that gradient), φ read ~1.4, and the job never left M0
        (issue 19)."""
        if not self._precondition:
            return None
        vs, bcs, eps = [], [], 1e-8
        for p in params:
            st = self.optimizer.state.get(p)
            if not st or "exp_avg_sq" not in st:
                return None
            vs.append(st["exp_avg_sq"])
            step = float(st["step"]) if "step" in st else 1.0
            bcs.append(1.0 - self.optimizer.param_groups[0]["betas"][1] ** max(step, 1.0))
            eps = float(self.optimizer.param_groups[0]["eps"])
        out = list(torch._foreach_div(vs, bcs))
        torch._foreach_sqrt_(out)
        torch._foreach_add_(out, eps)
        if unseen_out:
            for t in out:
                t.masked_fill_(t <= eps, math.inf)
        return out

    def _grads(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        params: list[torch.Tensor] = [p for p in self._params if p.grad is not None]
        return [p.grad for p in params if p.grad is not None], params

    def _request_split(self) -> None:
        """K = 1: ask the loader to split the next step in two if it is a measuring one (only
        in a job that may change its batch: a fixed one at s = 0 does not measure φ)."""
        self.loader.split_next = (
            self._reads_noise and self.ddp is None and self._replicas == 1 and self._measuring
        )

    def _flatten(self, row: int) -> bool:
        """Copy the current gradients into row ``row`` of the (2, P) buffer (one ``cat``)."""
        grads, _ = self._grads()
        total = sum(g.numel() for g in grads)
        rows = self._rows
        if rows is None or rows.shape[1] != total:
            if row > 0:
                return False  # the gradient set changed since row 0 was filled
            dtype = (
                torch.float64 if any(g.dtype == torch.float64 for g in grads) else (torch.float32)
            )
            rows = self._rows = torch.zeros(2, total, dtype=dtype, device=self.ctx.device)
        torch.cat([g.detach().reshape(-1) for g in grads], out=rows[row])
        return True

    def _gram(self, n: int, params: list[torch.Tensor]) -> list[list[float]]:
        """The n x n Gram matrix of the first n (pre-conditioned) rows, one host sync.

        K = 1 calls it after the optimizer step, so that Adam's v̂ has seen every row: before
        it, a coordinate first non-zero in the newest row was divided by ε alone, and one
        such row made the cancer MLP's φ 1e7 instead of ~40 (issue 19).
        """
        rows = self._rows
        if rows is None:
            raise TrainConfigError("no flattened gradients to measure")
        rows = rows[:n]
        pinv = self._pinv(params)
        if pinv is not None:
            rows = rows / torch.cat([t.reshape(-1) for t in pinv]).to(rows.dtype)
        gram: list[list[float]] = torch.mm(rows, rows.t()).tolist()
        return gram

    # -- measuring steps at K > 1 -----------------------------------------------------------
    def _open_agreement(self) -> None:
        """Before a measuring step's sync backward (K > 1): take each gradient's squared norm
        (pre-conditioned for Adam) the moment it is accumulated, before DDP reduces it (in a
        job that reads φ; in a fixed one the step agrees on the flags alone).

        A tensor's post-accumulate-grad hook runs inside its AccumulateGrad node, before the
        node's post hooks, where DDP's reducer copies the gradient into its bucket: the hook
        sees this replica's own gradient (checked with many buckets; with accumulation, the
        micro-batches' sum). So DDP's all-reduce runs in C++, overlapped with the backward,
        on every step. The library used to register a Python comm hook instead: such a hook,
        even one that only all-reduced, cost 3.4% of a plain 2-replica digits step, measured
        with the jobs in lockstep (``benchmarks/lockstep.py``; issue 19). Reducing a
        measuring step's gradients by hand instead (no overlap) made it cost 2-3x a step on
        the teacher MLP, and spacing such steps to their budget starved the agent of noise
        readings. The hooks exist only during measuring steps.
        """
        params = self._params
        buf = self._next_agreement(params)
        buf.local.zero_()  # a parameter the backward does not reach adds nothing
        self._agreement = buf
        if not self._reads_noise:
            return
        self._hook_pinv = self._pinv(list(params), unseen_out=True) if self._precondition else None
        if not self._norm_takers:
            self._norm_takers = [self._norm_taker(i) for i in range(len(params))]
        self._norm_hooks = [
            p.register_post_accumulate_grad_hook(take)
            for p, take in zip(params, self._norm_takers, strict=True)
        ]

    def _norm_taker(self, i: int) -> Callable[[torch.Tensor], None]:
        """Parameter ``i``'s hook: its local |g|² (pre-conditioned) into the agreement's slot
        ``i``, in place (no tensor to stack later)."""

        def take(p: torch.Tensor) -> None:
            g, buf, pinv = p.grad, self._agreement, self._hook_pinv
            if g is None or buf is None:
                return
            x = (g if pinv is None else g / pinv[i]).reshape(-1)
            slot = buf.slots[i]
            if x.dtype != slot.dtype:
                x = x.to(slot.dtype)
            torch.dot(x, x, out=slot)

        return take

    def _next_agreement(self, params: list[nn.Parameter]) -> _AgreementBuffer:
        """The agreement buffer not in flight: two, used in turn, since a step that measures
        right after another fills one while the other's all-reduce may still run."""
        if not self._agreements:
            dtype = torch.float64 if any(p.dtype == torch.float64 for p in params) else None
            device = next((p.device for p in params), self.ctx.device)
            self._agreements = [
                _AgreementBuffer.make(len(params), device, dtype or torch.float32) for _ in range(2)
            ]
        buf = self._agreements.pop(0)
        self._agreements.append(buf)
        return buf

    def _close_agreement(self) -> None:
        for h in self._norm_hooks:
            h.remove()
        self._norm_hooks = []
        self._agreement = None

    def _launch_measurement(self, buf: _AgreementBuffer) -> _PendingMeasurement:
        """After a measuring step's backward (K > 1; DDP has reduced its gradients): start
        agreeing on [Σ local |g|², stop, save, rank 0's spacing] in one small all-reduce, in
        the background, and take |ḡ|² meanwhile (|·|² pre-conditioned for Adam).

        The all-reduce is waited for at the next step (:meth:`_measure_distributed`), by
        which time it has long finished: waiting for it here added a second point per step
        where a rank waits for the other, and on two shared cores that cost more than the
        measurement itself (lockstep, issue 19).
        """
        self._close_agreement()
        pinv, self._hook_pinv = self._hook_pinv, None
        stop = self.ctx.stop_requested
        lead = self.ctx.rank == 0
        save = lead and self._checkpoint_due()
        spacing = self._propose_spacing() if lead else 0
        buf.flags.copy_(self._flag(stop, save, spacing, buf.send.device, buf.send.dtype))
        work = dist.all_reduce(buf.send, async_op=True)  # summed: divided when read
        if not self._reads_noise:
            return _PendingMeasurement(work, buf, None, False, 0)
        total = self._reduced_norm(pinv, buf.send.dtype, buf.send.device)
        piece_bsz = self.loader.step_local_bsz * (self.loader.accum_steps + 1)
        return _PendingMeasurement(work, buf, total, self._measuring, piece_bsz)

    def _reduced_norm(
        self, pinv: list[torch.Tensor] | None, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """|ḡ| of the replicas' mean gradient (DDP has reduced it), pre-conditioned: a few
        fused ops, however many parameters (a dot per parameter cost ~13 µs each here)."""
        present = [(p.grad, i) for i, p in enumerate(self._params) if p.grad is not None]
        if not present:
            return torch.zeros((), dtype=dtype, device=device)
        grads = [g for g, _ in present]
        if pinv is not None:
            grads = list(torch._foreach_div(grads, [pinv[i] for _, i in present]))
        norms = list(torch._foreach_norm(grads))
        if any(n.dtype != dtype for n in norms):
            norms = [n.to(dtype) for n in norms]
        return torch.linalg.vector_norm(torch.stack(norms))

    def _propose_spacing(self) -> int:
        """Rank 0's spacing of measuring steps at K > 1 (0: too few timed steps to say).

        A measuring step pays its norm hooks inside the backward, a pass over the reduced
        gradients and a small all-reduce: ~1 ms on the 2-replica digits CNN's ~4 ms step
        (below), a cost that grows with the model (one dot per parameter tensor). So
        measuring steps are spaced until their extra time is at most MEASURE_BUDGET of the
        training time, as split steps are at one replica, from the wall times of the kinds
        of step at the current (m, s) (after the gate, which measures every step); the
        spacing rides the same all-reduce, so every rank adopts it at the same step. The
        stop and save flags ride these steps as well, so the spacing never exceeds
        FLAG_LATENCY_S of steps either (a job that does not read φ: that bound alone).
        (Reducing a measuring step by hand, without DDP's overlap, had cost 2-3x a step on
        the teacher MLP, and spacing such steps left the agent starved of noise readings:
        issue 19.)

        A measurement's cost is split over two steps: the measuring step itself, and the next
        one, which waits for the agreement, reads it back and updates the estimate. Timing
        only the first, the digits CNN's measuring steps read *faster* than the others (3.5
        vs 3.6 ms: the others held the second half), so the spacing stayed at
        ``measure_every`` while measuring cost 4.5% of the training CPU time (issue 19).
        """
        walls = self._walls
        if len(walls["plain"]) < 8:
            return 0
        base = statistics.median(walls["plain"])
        if base <= 0:
            return 1
        by_latency = max(1, int(FLAG_LATENCY_S / base))  # the flags ride these steps too
        if not self._reads_noise:  # only the flags to agree on
            return min(MAX_MEASURE_SPACING, by_latency)
        if len(walls["launch"]) < 3 or len(walls["finish"]) < 3:
            return 0
        extra = statistics.median(walls["launch"]) + statistics.median(walls["finish"]) - 2 * base
        if extra <= 0:
            return 1
        by_budget = math.ceil(extra / (MEASURE_BUDGET * base))
        return min(MAX_MEASURE_SPACING, by_latency, by_budget)

    def _record_wall(self, launched: bool, finished: bool, seconds: float) -> None:
        """Time one step at K > 1 for :meth:`_propose_spacing` (rank 0's; per (m, s)): one
        that ``launched`` a measurement, ``finished`` the last one's agreement, or neither. A
        step that did both (measuring every step) tells neither cost apart: not kept."""
        key = self._key()
        if key != self._walls_key:
            self._walls_key = key
            for times in self._walls.values():
                times.clear()
        if not (launched and finished):
            self._walls["launch" if launched else "finish" if finished else "plain"].append(seconds)

    def _flag(
        self, stop: bool, save: bool, spacing: int, device: torch.device, dtype: torch.dtype
    ) -> torch.Tensor:
        """The cached [stop, save, spacing] on the gradients' device (no per-step
        allocation)."""
        flag = self._flags.get((stop, save, spacing))
        if flag is None or flag.dtype != dtype or flag.device != device:
            flag = self._flags[(stop, save, spacing)] = torch.tensor(
                [float(stop), float(save), float(spacing)], dtype=dtype, device=device
            )
        return flag

    # -- the training step ----------------------------------------------------------------
    def step(self, loss: torch.Tensor) -> bool:
        """Backward one micro-batch; on the sync micro-batch also step the optimizer.

        Returns True when an optimizer step happened. May not return at all: after SIGTERM
        it checkpoints and exits with status 0 at this step boundary (in the next forward);
        out of memory it records the batch that did not fit and exits with OOM_EXIT_CODE.
        """
        try:
            return self._step(loss)
        except Exception as exc:
            if is_oom(exc):
                self.ctx.exit_for_oom(exc)
            raise

    def _step(self, loss: torch.Tensor) -> bool:
        loader = self.loader
        s = loader.step_accum
        sync = loader.is_sync_step
        weight = loader.micro_weight
        (loss * weight if s > 0 else loss).backward()
        if loader.split_step and self._warmup <= 0:  # a half's time ends with its backward
            first = loader.micro_index == 0
            half = loader.piece_bsz if first else loader.step_local_bsz - loader.piece_bsz
            self._halves.append((half, time.perf_counter() - loader.fetch_start))
        # Split steps are not timed as steps at m: eq. 12 has no cost per step beyond its
        # micro-batches, so their extra micro-batch (0.13 ms where a cancer MLP step took
        # 0.57 ms) read as the fixed cost and the rest as per-sample cost, and the fit priced
        # 64 at 3x 16 (it costs the same; issue 19). Their halves are timed as what they
        # are, micro-batches of m // 2 and m - m // 2 (_time_halves).
        timed = (
            self._warmup <= 0
            and loader.step_local_bsz == loader.local_bsz
            and not loader.split_step
        )
        if not sync:
            if loader.micro_index == 0 and self.ddp is None and self._measuring:
                # The first micro-batch's gradient, scaled back from loss * weight.
                self._piece_scale = 1.0 / weight**2 if self._flatten(0) else None
            if timed:
                self.profile.record_grad(self._key(), time.perf_counter() - loader.fetch_start)
            return False
        stop = self.ctx.stop_requested
        finish: Callable[[], None] | None = None
        launched, finished = self._agreement is not None, self._pending is not None
        if self.ddp is not None:
            stop, save = self._measure_distributed()
        else:
            save = self._checkpoint_due()
            finish = self._measure_single()
        stepping = time.perf_counter()
        self._optimizer_step()
        if self._halves:
            self._time_halves(time.perf_counter() - stepping)
        if finish is not None:
            finish()
        loader.commit_step()
        self.steps += 1
        now = time.perf_counter()
        if self._warmup > 0:
            self._warmup -= 1
        elif timed:
            # Not the short last step of an epoch: a handful of those made profile rows of
            # their own (m = 29 next to m = 32) whose noisy times swayed the fit (issue 19).
            self.profile.record_iter(self._key(), now - loader.step_start)
            if s == 0 and self._replicas == 1:
                self.profile.record_grad(self._key(), now - loader.step_start)
            if self.ddp is not None and self.ctx.rank == 0 and not self._gated:
                # not while gated: every step measures then, and early steps run slower
                self._record_wall(launched, finished, now - loader.step_start)
        if not self._stepped:  # restart latency: the controller times a rescale by this
            self._stepped = True
            self.ctx.metrics.emit(
                FirstStepRecord(
                    step=self.steps, replicas=self._replicas, batch_size=loader.batch_size
                )
            )
        if self.steps % self.report_every == 0:
            self.last_loss = float(loss.detach())  # a device sync: only every report_every
        # Every step: the sink keeps only the newest progress (O(1)), so the final step and
        # epoch reach the controller whatever report_every is.
        self._emit_progress()
        if save or (self.checkpoint_every and self.steps % self.checkpoint_every == 0):
            self._save_pending = True
        if stop:
            # Exit at the next forward, so the caller still sees (and logs) this step and the
            # checkpoint holds exactly the state after it, RNG included.
            self._stop_pending = True
        gate_opened = self._gated and self.gns.count >= MIN_MEASUREMENTS
        if gate_opened:
            self._gated = False
        # After a batch change the next look is the follow-up, once the new size is timed: an
        # epoch boundary in between re-tuned on a model that had not seen it, and the trust
        # region let the cancer MLP grow 2x twice in two steps (76 -> 152; issue 19).
        if self.steps == self._followup < self._followup_by and self._needs_fresh:
            self._followup += 1  # the next look needs news of the noise, not the same φ
        settling = self.steps < self._followup
        # While gated a periodic re-tune cannot change the batch (it only fitted); after,
        # periodic ones wait until their cost fits RETUNE_BUDGET (same step on every rank).
        periodic = (
            not self._gated
            and self.steps >= self._next_periodic
            and (self.steps % self.retune_every == 0 or loader.epoch != self._last_epoch)
        )
        recheck = not self._gated and 0 < self._recheck_at <= self.gns.count
        if self._force_retune or (
            not settling and (gate_opened or periodic or recheck or self.steps == self._followup)
        ):
            self._last_epoch = loader.epoch
            self._force_retune = False
            self.retune()
        self._request_split()
        return True

    def _time_halves(self, optimizer_s: float) -> None:
        """Profile a split step's two halves as micro-batches of their own sizes.

        Until a job has run a second batch size, its fit had only one micro-batch size and
        split it evenly into fixed and per-sample cost (a prior). A measuring step already
        runs m // 2 and m - m // 2 samples at the same weights, so its halves time a second
        size for free: each half's forward and backward (from its fetch, so the gradient
        copies and the Gram matrix are not in it), plus the optimizer step that a step at
        that size would take. On a GPU, where a step at 32 costs what one at 256 does, the
        prior priced 2x at 1.5x the time and no digits job grew (issue 19).
        """
        nodes, replicas = self.ctx.env.num_nodes, self._replicas
        for size, seconds in self._halves:
            self.profile.record_grad((nodes, replicas, size, 0), seconds + optimizer_s)
        self._halves = []

    def _key(self) -> tuple[int, int, int, int]:
        return (
            self.ctx.env.num_nodes,
            self._replicas,
            self.loader.step_local_bsz,
            self.loader.accum_steps,
        )

    def _measure_distributed(self) -> tuple[bool, bool]:
        """Finish the last measuring step's agreement (update the noise estimate, adopt the
        spacing) and return its *agreed* stop and save flags; start this step's, if it
        measures. Every rank does the same at the same steps.

        Only the all-reduced flag may decide: a SIGTERM that lands on one rank after it sent
        0 is carried by the next measuring step, whereas stopping on the local flag now would
        leave that rank in a barrier while the others run the next step (deadlock).
        """
        stop = save = False
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.work.wait()
            *local, stop_f, save_f, spacing = pending.buffer.send.tolist()
            if pending.update and pending.total is not None:  # not while Adam's P was young
                global_sq = float(pending.total) ** 2
                local_sq = math.fsum(local) / self._replicas  # the replicas' mean
                self.gns.update(*estimate(local_sq, global_sq, pending.piece_bsz, self._replicas))
            proposed = round(spacing)  # rank 0's alone: the others sent 0
            if proposed > 0:
                self._sync_spacing = proposed
            stop, save = stop_f > 0, save_f > 0
        if self._agreement is not None:
            self._pending = self._launch_measurement(self._agreement)
        return stop, save

    def _measure_single(self) -> Callable[[], None] | None:
        """K = 1: noise from the step's micro-batch pieces, all taken at the same weights.

        With accumulation the pieces are the s + 1 micro-batches; without, a measuring step is
        split in two (``loader.split_next``: one extra fixed cost per measuring step). The
        library used to take three *consecutive* steps' gradients instead, but each step's
        noise moves the next step's weights (G2 = G1 − ηHξ1), so the estimate read tr Σ
        2-3x too high on the examples (``benchmarks/gns_check.py``; issue 19).

        Copies this step's gradient now (the step frees it); returns what finishes the
        measurement after the optimizer step, if this step completes one.
        """
        loader = self.loader
        scale, self._piece_scale = self._piece_scale, None
        if loader.step_accum == 0 or scale is None or not self._flatten(1):
            return None
        _, params = self._grads()  # the step frees the gradients: keep their parameters
        first = float(loader.piece_bsz)
        samples = float(loader.step_local_bsz * (loader.accum_steps + 1))
        split = loader.split_step

        def finish() -> None:
            (piece, cross), (_, total) = self._gram(2, params)
            if split:  # rows: w1·g1 and ḡ, with scale = 1 / w1²
                self.gns.update(
                    *halves_estimate(
                        piece * scale, cross * scale**0.5, total, first, samples - first
                    )
                )
            else:
                self.gns.update(*estimate(piece * scale, total, first, samples / first))

        return finish

    def _optimizer_step(self) -> None:
        factor = self.lr_scale
        if factor != 1.0:
            saved = [g["lr"] for g in self.optimizer.param_groups]
            for g in self.optimizer.param_groups:
                g["lr"] = g["lr"] * factor
            self.optimizer.step()
            for g, lr in zip(self.optimizer.param_groups, saved, strict=True):
                g["lr"] = lr
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    # -- learning rate and batch size -----------------------------------------------------
    def _update_lr_scale(self) -> None:
        self.lr_scale = lr_factor(
            self.lr_rule, self.loader.init_batch_size, self.loader.batch_size, self.grad_params
        )

    def goodput_model(self, wait: bool = True) -> GoodputModel | None:
        """The job's current goodput model (None until it has a profile and noise stats;
        with ``wait=False`` also None while the optimiser is still being imported)."""
        obs = self.profile.observations()
        grad = self.grad_params
        if obs is None:
            return None
        if grad is None:
            if self.loader.max_batch_size > self.loader.init_batch_size and (
                self.loader.pinned_batch_size is None
            ):
                return None  # cannot judge a batch change without noise statistics
            grad = GradParams(sqr=1.0, var=0.0)
        perf = self._fit(obs, wait)
        if perf is None:
            return None
        return GoodputModel(perf, grad, self.loader.init_batch_size)

    def _fit(self, obs: Observations, wait: bool = True) -> PerfParams | None:
        """θ_sys, refitted only when the profile has news: a new configuration, or a row with
        twice the steps it had at the last fit (mean times then settle, and refitting every
        retune cost up to 0.2 s a time on a loaded 2-core machine, 10-20 steps' worth).

        Rows of one replica only: Gauss-Newton on (α, β), in plain Python. Otherwise SciPy's
        L-BFGS-B with one BLAS thread: its vectors have 7 entries, and OpenBLAS's threads,
        spinning against the training thread for the cores, made the same fit take 1 ms or
        100 ms. Warm-started from the previous fit. ``wait=False`` (a re-tune during
        training): while SciPy is still being imported in the background, the last fit.
        """
        version = tuple(  # a row of split-step halves (micro-batches only) counts those
            (k, int(math.log2(max(r[0] if r[0] > 0 else r[2], 1.0))))
            for k, r in sorted(self.profile.rows.items())
        )
        if version == self._fit_version and self._perf is not None:
            return self._perf
        try:
            if bool((obs.num_replicas == 1).all()):
                # Gauss-Newton in plain Python (0.16 ms): neither SciPy nor BLAS is needed,
                # so even the first re-tune of a one-replica job need not wait for them.
                self._perf = fit_perf_params(obs, initial=self._perf, exact_one_replica=True)
            elif not wait and not _OPTIMIZER.ready:
                # A re-tune in training never waits for SciPy's import: the first one used
                # to block for it (1.6 s, half a short job's run, on a loaded machine).
                _OPTIMIZER.start()
                return self._perf
            else:
                with _OPTIMIZER.one_blas_thread():
                    self._perf = fit_perf_params(obs, initial=self._perf)
        except FitError:
            return None
        self._fit_version = version
        return self._perf

    def _choose(self) -> tuple[int, int]:
        """Rank 0's choice of (m, s) by eq. 14, kept unless the gain is worth a change."""
        loader = self.loader
        cur = (loader.local_bsz, loader.accum_steps)
        model = self.goodput_model(wait=False)
        if model is None:
            return cur
        limits = BatchLimits(
            init_batch_size=loader.init_batch_size,
            max_batch_size=loader.max_batch_size,
            min_local_bsz=loader.min_local_bsz,
            max_local_bsz=loader.max_local_bsz,
            pinned_batch=loader.pinned_batch_size,
        )
        if loader.pinned_batch_size is None:  # at least a few steps per epoch (small data)
            limits = epoch_limits(limits, loader.size)
        # The one agent rule the simulator runs too: noise gate, 2x trust region, threshold.
        sizes = {k[2] for k, r in self.profile.rows.items() if r[0] > 0}
        agent = choose_batch(
            model,
            limits,
            cur,
            self.ctx.env.num_nodes,
            self._replicas,
            self.gns.count,
            explore=len(sizes) == 1,
            timed_steps=int(
                self.profile.rows.get((self.ctx.env.num_nodes, self._replicas, *cur), [0.0])[0]
            ),
        )
        if agent.reason is Reason.GATED or agent.best is None:
            return cur  # the first noise estimates are too noisy to bet the batch on
        new, new_good, cur_good = agent.best, agent.best_goodput, agent.current_goodput
        self.ctx.metrics.emit(
            GoodputRecord(
                step=self.steps,
                pgns=self.pgns,
                perf=model.perf.__dict__,
                grad=model.grad.__dict__,
                profile=self.profile.table(),
                current=list(cur),
                current_goodput=cur_good,
                best=list(new),
                best_goodput=new_good,
            )
        )
        return agent.config

    def retune(self) -> None:
        """Re-fit the goodput model and maybe adopt a new (m, s) (all ranks must call)."""
        loader = self.loader
        fixed = loader.pinned_batch_size is None and loader.max_batch_size <= loader.init_batch_size
        if not self.adapt or fixed:
            self._update_lr_scale()
            return
        started = time.perf_counter()
        choice = self._choose() if self.ctx.rank == 0 else (0, 0)
        spacing = self._retune_spacing(time.perf_counter() - started)
        if self.ddp is not None:
            t = torch.tensor([*choice, spacing], dtype=torch.int64, device=_comm_device(self))
            dist.broadcast(t, src=0)
            choice, spacing = (int(t[0]), int(t[1])), int(t[2])
        self._next_periodic = self.steps + spacing
        self._recheck_at = 2 * self.gns.count
        if choice != (loader.local_bsz, loader.accum_steps):
            loader.set_batch(*choice)
            self._warmup = _WARMUP_STEPS
            # Look again as soon as the new configuration has a few timed steps, rather than
            # a whole retune_every later: growing 2x per 20-50 steps kept short jobs near M0
            # for most of their run (issue 19). Every rank computes the same step.
            self._followup = self.steps + _WARMUP_STEPS + _FOLLOWUP_STEPS
            self._followup_by = self._followup + _FOLLOWUP_STEPS
            self._changed_at_count = self.gns.count
            self._piece_scale = None
            self.ctx.metrics.emit(
                BatchRecord(
                    step=self.steps,
                    local_bsz=choice[0],
                    accum_steps=choice[1],
                    batch_size=loader.batch_size,
                )
            )
        self._update_lr_scale()
        self._split_spacing = self._measure_spacing()

    def _measure_spacing(self) -> int:
        """Steps between two split measurements at K = 1: a split step pays one more
        micro-batch's fixed cost (θ_sys's alpha_grad), which at one in 4 steps made the
        adaptive machinery cost 16-28% per step on the examples at M0 (issue 19); spaced
        so that it is at most MEASURE_BUDGET of the step time (0: no fit yet)."""
        step = self.profile.iter_time(self._key())
        if self._perf is None or not math.isfinite(step) or step <= 0:
            return 0
        return math.ceil(max(self._perf.alpha_grad, 0.0) / (MEASURE_BUDGET * step))

    def _retune_spacing(self, cost: float) -> int:
        """Steps before the next periodic re-tune, so that one costing ``cost`` seconds
        takes at most RETUNE_BUDGET of the training time (0 until a step is timed)."""
        step = self.profile.iter_time(self._key())
        if not math.isfinite(step) or step <= 0:
            return 0
        return math.ceil(cost / (RETUNE_BUDGET * step))

    def _emit_progress(self) -> None:
        self.ctx.metrics.emit(
            ProgressRecord(
                step=self.steps,
                epoch=self.loader.epoch,
                position=self.loader.position,
                batch_size=self.loader.batch_size,
                local_bsz=self.loader.local_bsz,
                accum_steps=self.loader.accum_steps,
                replicas=self._replicas,
                lr_scale=self.lr_scale,
                pgns=self.pgns,
                loss=self.last_loss,
                fraction=self.loader.fraction_done,
            )
        )

    # -- checkpoint -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "module": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "gns": self.gns.state_dict(),
            "profile": self.profile.state_dict(),
            "steps": self.steps,
            "replicas": self._replicas,
            "trained_seconds": self.trained_seconds,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.gns.load_state_dict(state["gns"])
        self.profile.load_state_dict(state["profile"])
        self.steps = int(state["steps"])
        self._saved_replicas = int(state["replicas"])
        self._trained_before = float(state.get("trained_seconds", 0.0))
        self._started = time.monotonic()


class _Optimizer:
    """SciPy's optimiser and a BLAS thread limiter, loaded once per process on a background
    thread (the fit of θ_sys needs both; the training thread must not wait for them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._controller: Any = None

    @property
    def ready(self) -> bool:
        return self._controller is not None

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._load, name="coadapt-prewarm", daemon=True
                )
                self._thread.start()

    def _load(self) -> None:
        import scipy.optimize  # noqa: F401  (loads the BLAS the controller must see)
        from threadpoolctl import ThreadpoolController

        self._controller = ThreadpoolController()

    def one_blas_thread(self) -> Any:
        """A context in which BLAS runs one thread (loads everything first if need be)."""
        if self._controller is None:
            self.start()
            assert self._thread is not None
            self._thread.join()
            if self._controller is None:  # the loading thread died (a fork, an import error)
                self._load()
        return self._controller.limit(limits=1, user_api="blas")


_OPTIMIZER = _Optimizer()


def prewarm_optimizer(wait: bool = True) -> None:
    """Load what fitting θ_sys needs (SciPy's optimiser, a BLAS thread limiter) now.

    An adaptive ``AdaptiveModel`` starts this in the background by itself; a process that
    runs many trainings (a benchmark) calls it once up front, so no training pays for it.
    """
    _OPTIMIZER.start()
    if wait:
        with _OPTIMIZER.one_blas_thread():
            pass


@dataclass
class _AgreementBuffer:
    """What a measuring step all-reduces (K > 1), allocated once: each parameter's local |g|²
    (written by its hook), then the stop and save flags and rank 0's spacing; summed over
    the replicas. ``slots``, ``local`` and ``flags`` are views into ``send``."""

    send: torch.Tensor
    local: torch.Tensor
    flags: torch.Tensor
    slots: list[torch.Tensor]

    @classmethod
    def make(cls, params: int, device: torch.device, dtype: torch.dtype) -> _AgreementBuffer:
        send = torch.zeros(params + 3, dtype=dtype, device=device)
        return cls(send, send[:params], send[params:], list(send[:params].unbind()))


@dataclass
class _PendingMeasurement:
    """A measuring step's agreement in flight (K > 1): the all-reduce of its buffer, |ḡ|
    (this replica's reduced gradient's norm, pre-conditioned), whether it updates the noise
    estimate, and the samples per replica it measured."""

    work: Any
    buffer: _AgreementBuffer
    total: torch.Tensor | None  # None: the flags alone (a job that does not read φ)
    update: bool
    piece_bsz: int


def _comm_device(model: AdaptiveModel) -> torch.device:
    return model.ctx.device if dist.get_backend() == "nccl" else torch.device("cpu")

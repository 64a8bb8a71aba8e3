"""Early-stopping decisions as pure functions of reported curves.

The controller's tuning loop and the simulator's replay both call :func:`decide` with a
trial's curve, its peers' curves and the best final value so far, so a replay takes the same
decisions as the live cluster. Nothing here keeps state: a rule sees only the curves it is
given each time it is asked (a caller asks after each new report of the objective metric).

A *curve* is the ``(step, value)`` pairs of the objective metric as the trial reported them
(step ascending; non-finite values are ignored). ``direction`` is the objective's
(``maximize``/``minimize``); "better" and "worse" below follow it.

* ``asha`` — asynchronous successive halving (Li et al., 2020). Rungs sit at
  ``r_k = max(grace_steps, 1) * reduction_factor**k`` below ``max_steps``. At the highest
  rung a trial has reached, its value there (the last point at or before the rung) is ranked
  among the values of every peer that has also reached the rung; it goes on only while it is
  in the top ``max(1, n // reduction_factor)`` of those ``n`` values. With fewer than
  ``min_peers`` peers at the rung it goes on (too little evidence). Being stateless, a trial
  promoted at rung k is re-ranked there as peers arrive until it reaches rung k+1.
* ``median`` — Optuna's/Vizier's median rule. After ``grace_steps``, a trial whose best value
  so far is worse than the median of its peers' best values up to the same step stops; only
  peers that have reported at or beyond that step count, and at least ``min_peers`` must.
* ``curve`` — SpotTune's EarlyCurve. Once the trial has spent ``theta * max_steps`` steps and
  reported ``min_points`` points, :func:`~coadapt.tune.curves.extrapolate` predicts its value
  at ``max_steps``; it stops when even the optimistic end of the prediction (``high`` when
  maximising, ``low`` when minimising) is worse than ``best``, the best final value so far.

No rule stops a trial that has reached ``max_steps`` (it is finished, not pruned).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from coadapt.tune.curves import Curve, extrapolate
from coadapt.tune.direction import best_of, better, maximizing, parse_direction
from coadapt.tune.spec import EarlyStopping

__all__ = ["Curve", "PruneDecision", "asha_rungs", "decide"]


@dataclass(frozen=True)
class PruneDecision:
    """Whether to stop the trial now, and why (shown in the trial's history)."""

    stop: bool
    reason: str


def _points(curve: Curve) -> list[tuple[float, float]]:
    pts = [(float(s), float(v)) for s, v in curve if math.isfinite(float(v))]
    pts.sort(key=lambda p: p[0])
    return pts


def _value_at(pts: Sequence[tuple[float, float]], step: float) -> float | None:
    """The value at ``step`` (the last point at or before it), if the curve has reached it."""
    if not pts or pts[-1][0] < step:
        return None
    before = [v for s, v in pts if s <= step]
    return before[-1] if before else pts[0][1]


def _best_upto(pts: Sequence[tuple[float, float]], step: float, direction: str) -> float | None:
    vals = [v for s, v in pts if s <= step]
    return best_of(direction, vals) if vals else None


def asha_rungs(rule: EarlyStopping, max_steps: int | None, up_to: float) -> list[float]:
    """The rung steps ``≤ up_to`` (and below ``max_steps``), smallest first."""
    base = float(max(rule.grace_steps, 1))
    rungs, r = [], base
    while r <= up_to and (max_steps is None or r < max_steps):
        rungs.append(r)
        r *= rule.reduction_factor
    return rungs


def decide(
    rule: EarlyStopping,
    direction: str,
    max_steps: int | None,
    curve: Curve,
    peers: Sequence[Curve],
    best: float | None,
) -> PruneDecision:
    """Whether the trial with ``curve`` should stop now under ``rule`` (see the module)."""
    parse_direction(direction)  # a clear error for a misspelt direction
    if rule.rule == "none":
        return PruneDecision(False, "early stopping is off")
    pts = _points(curve)
    if not pts:
        return PruneDecision(False, "no finite value reported yet")
    step = pts[-1][0]
    if max_steps is not None and step >= max_steps:
        return PruneDecision(False, f"reached max_steps {max_steps}")
    peer_pts = [p for p in (_points(c) for c in peers) if p]
    if rule.rule == "asha":
        return _asha(rule, direction, max_steps, pts, peer_pts)
    if rule.rule == "median":
        return _median(rule, direction, pts, peer_pts)
    if rule.rule == "curve":
        return _curve(rule, direction, max_steps, pts, best)
    raise ValueError(f"unknown early-stopping rule {rule.rule!r}")


def _asha(
    rule: EarlyStopping,
    direction: str,
    max_steps: int | None,
    pts: list[tuple[float, float]],
    peers: list[list[tuple[float, float]]],
) -> PruneDecision:
    rungs = asha_rungs(rule, max_steps, pts[-1][0])
    if not rungs:
        return PruneDecision(False, "below the first rung")
    rung = rungs[-1]
    mine = _value_at(pts, rung)
    assert mine is not None
    others = [v for v in (_value_at(p, rung) for p in peers) if v is not None]
    if len(others) < rule.min_peers:
        return PruneDecision(
            False, f"{len(others)} peer(s) at rung {rung:g}, need {rule.min_peers}"
        )
    values = sorted([*others, mine], reverse=maximizing(direction))
    keep = max(1, len(values) // rule.reduction_factor)
    cutoff = values[keep - 1]
    if better(direction, cutoff, mine):
        return PruneDecision(
            True,
            f"asha: {mine:.6g} at rung {rung:g} is not in the top "
            f"{keep} of {len(values)} (cut-off {cutoff:.6g})",
        )
    return PruneDecision(
        False, f"asha: {mine:.6g} at rung {rung:g} is in the top {keep} of {len(values)}"
    )


def _median(
    rule: EarlyStopping,
    direction: str,
    pts: list[tuple[float, float]],
    peers: list[list[tuple[float, float]]],
) -> PruneDecision:
    step = pts[-1][0]
    if step < rule.grace_steps:
        return PruneDecision(False, f"within grace_steps {rule.grace_steps}")
    mine = _best_upto(pts, step, direction)
    assert mine is not None
    others = [
        v
        for v in (_best_upto(p, step, direction) for p in peers if p[-1][0] >= step)
        if v is not None
    ]
    if len(others) < rule.min_peers:
        return PruneDecision(
            False, f"{len(others)} peer(s) reached step {step:g}, need {rule.min_peers}"
        )
    median = statistics.median(others)
    if better(direction, median, mine):
        return PruneDecision(
            True,
            f"median: best {mine:.6g} by step {step:g} is worse than "
            f"the peers' median {median:.6g} ({len(others)} peers)",
        )
    return PruneDecision(
        False,
        f"median: best {mine:.6g} by step {step:g} is not worse than "
        f"the peers' median {median:.6g}",
    )


def _curve(
    rule: EarlyStopping,
    direction: str,
    max_steps: int | None,
    pts: list[tuple[float, float]],
    best: float | None,
) -> PruneDecision:
    if max_steps is None:
        return PruneDecision(False, "curve needs max_steps")
    step = pts[-1][0]
    start = rule.theta * max_steps
    if step < start:
        return PruneDecision(False, f"step {step:g} is before theta*max_steps = {start:g}")
    if best is None:
        return PruneDecision(False, "no finished trial to compare with")
    if len(pts) < rule.min_points:
        return PruneDecision(False, f"{len(pts)} point(s), need {rule.min_points}")
    if not better(direction, best, pts[-1][1]):
        return PruneDecision(False, f"already at {pts[-1][1]:.6g}, as good as the best {best:.6g}")
    pred = extrapolate(pts, max_steps)
    optimistic = pred.high if maximizing(direction) else pred.low
    verdict = (
        f"predicted {pred.mean:.6g} [{pred.low:.6g}, {pred.high:.6g}] at step "
        f"{max_steps} vs best {best:.6g}"
    )
    if better(direction, best, optimistic):
        return PruneDecision(True, f"curve: {verdict}: cannot beat it")
    return PruneDecision(False, f"curve: {verdict}: may beat it")

"""An objective's direction as Optuna's ``StudyDirection``, and comparisons by it.

Every place that ranks trial values (pruning, cross-tenant policies, the replay simulator,
targets) asks these helpers instead of testing ``direction == "maximize"`` itself: a copy that
got the sign wrong once is how this module came to be.
"""

from __future__ import annotations

import typing

from optuna.study import StudyDirection


def parse_direction(direction: str | StudyDirection) -> StudyDirection:
    """``"maximize"``/``"minimize"`` (the spec's spelling) as Optuna's enum."""
    if isinstance(direction, StudyDirection):
        if direction is StudyDirection.NOT_SET:
            raise ValueError("the objective's direction is not set: use maximize or minimize")
        return direction
    try:
        return {"maximize": StudyDirection.MAXIMIZE, "minimize": StudyDirection.MINIMIZE}[direction]
    except KeyError:
        raise ValueError(f"direction must be 'maximize' or 'minimize', got {direction!r}") from None


def maximizing(direction: str | StudyDirection) -> bool:
    """Whether larger values are better (sort order, sign of a normalised value)."""
    return parse_direction(direction) is StudyDirection.MAXIMIZE


def better(direction: str | StudyDirection, a: float, b: float) -> bool:
    """Whether ``a`` is strictly better than ``b`` for an objective of this direction."""
    return a > b if maximizing(direction) else a < b


def at_least_as_good(direction: str | StudyDirection, a: float, b: float) -> bool:
    """Whether ``a`` is as good as ``b`` or better (a target is met when this holds; NaN never
    is)."""
    return a >= b if maximizing(direction) else a <= b


def best_of(direction: str | StudyDirection, values: typing.Iterable[float]) -> float:
    """The best of ``values`` (non-empty) for this direction."""
    pick = max if maximizing(direction) else min
    return pick(values)

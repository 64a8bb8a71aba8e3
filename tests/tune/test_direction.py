"""Comparisons by an objective's direction (one helper instead of repeated sign tests)."""

from __future__ import annotations

import math

import pytest

from coadapt.tune.direction import StudyDirection, at_least_as_good, best_of, better


def test_directions() -> None:
    assert better("maximize", 2, 1) and not better("maximize", 1, 1)
    assert better(StudyDirection.MINIMIZE, 1, 2)
    assert at_least_as_good("minimize", 1, 1) and not at_least_as_good("maximize", math.nan, 0)
    assert best_of("minimize", [3, 1, 2]) == 1 and best_of("maximize", [3, 1, 2]) == 3
    with pytest.raises(ValueError, match="maximize"):
        better("max", 1, 2)

"""Trace lookups against hand-picked rows of the bundled CSVs."""

from __future__ import annotations

import pytest

from coadapt.sim.applications import canonical_placement, get_application
from coadapt.sim.errors import SimulationError


def test_listed_placement_is_exact_at_traced_batch() -> None:
    # cifar10/placements.csv: "22,64,0.1699998140335083,0.11147219543457032"
    step, sync = get_application("cifar10").throughput((2, 2), 64)
    assert step == pytest.approx(0.1699998140335083)
    assert sync == pytest.approx(0.11147219543457032)


def test_listed_placement_interpolates_linearly_in_batch() -> None:
    # bert/placements.csv: "1,4,0.45532354712486267,0.0137386..." and "1,6,0.5693899691104889,..."
    step, _ = get_application("bert").throughput((1,), 5)
    assert step == pytest.approx((0.45532354712486267 + 0.5693899691104889) / 2)


def test_placement_is_normalised_to_smallest_rotation() -> None:
    assert canonical_placement((4, 2, 1)) == (1, 4, 2)
    assert canonical_placement((0, 2, 0, 1, 4)) == (1, 4, 2)
    app = get_application("cifar10")
    assert app.throughput((4, 2, 1), 128) == app.throughput((1, 4, 2), 128)
    assert app.throughput((0, 2, 2), 64) == app.throughput((2, 2), 64)


def test_unlisted_placement_uses_scalability_rows() -> None:
    # cifar10/scalability.csv: "16,64,64,0.30169918537139895,0.24091715087890625"
    step, sync = get_application("cifar10").throughput((4,) * 16, 64)
    assert step == pytest.approx(0.30169918537139895)
    assert sync == pytest.approx(0.24091715087890625)


def test_grad_stats_interpolate_between_validated_batches() -> None:
    app = get_application("bert")
    sqr12, var12 = app.grad_stats(12, 0)
    assert sqr12 == pytest.approx(195590723287826.75)
    assert var12 == pytest.approx(6894015304034181.0)
    sqr24, var24 = app.grad_stats(24, 0)
    sqr18, var18 = app.grad_stats(18, 0)
    assert sqr18 == pytest.approx((sqr12 + sqr24) / 2)
    assert var18 == pytest.approx((var12 + var24) / 2)


def test_epoch_ends_at_smallest_traced_progress() -> None:
    app = get_application("bert")
    assert app.progress_at(0) == 0.0
    assert app.progress_at(1) == pytest.approx(7387.0)  # min over the validation files
    assert app.completion_epoch == 1


def test_application_constants_match_the_artifact() -> None:
    yolo = get_application("yolov3")
    assert (yolo.init_batch_size, yolo.max_batch_size, yolo.max_local_bsz) == (8, 512, 8)
    ncf = get_application("ncf")
    assert ncf.spec.adaptive_batch == 32768 and ncf.spec.elastic_max_replicas == 1
    assert get_application("imagenet").max_epochs == 90


def test_batch_outside_traces_is_an_error() -> None:
    with pytest.raises(SimulationError, match="outside the traced range"):
        get_application("bert").grad_stats(1000, 0)

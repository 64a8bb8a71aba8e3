"""The job page's "did co-adaptation pay" figure (``tta`` in ``GET /api/v1/ui/jobs/{id}``):
the model's time for the steps the job took vs the user's initial batch, fixed, for the same
progress (issue 19), checked against a hand computation of eq. 7 and eq. 12."""

from __future__ import annotations

from typing import Any

import pytest

from coadapt.controller.dashboard.tta import efficiency
from coadapt.controller.store import Store
from coadapt.goodput import PerfParams, iter_time
from tests.controller.conftest import FakeClock
from tests.controller.test_api import Api, submit
from tests.controller.test_dashboard_api import api, clock, post, run  # noqa: F401 (fixtures)

# A step's fixed cost dominates: growing the batch buys throughput.
PERF = {
    "alpha_grad": 0.04,
    "beta_grad": 0.0001,
    "alpha_local": 0.005,
    "beta_local": 0.001,
    "alpha_node": 0.01,
    "beta_node": 0.002,
    "gamma": 1.0,
}


def progress(step: int, batch: int, pgns: float) -> dict[str, Any]:
    return {
        "kind": "progress",
        "step": step,
        "epoch": 0,
        "batch_size": batch,
        "local_bsz": batch,
        "accum_steps": 0,
        "replicas": 1,
        "lr_scale": 1.0,
        "pgns": pgns,
        "loss": 1.0,
    }


def test_time_so_far_vs_the_initial_batch(api: Api, clock: FakeClock) -> None:  # noqa: F811
    job = submit(api, "alice")  # M0 = 32
    run(api, job, [0], clock())
    post(api, job, {"kind": "goodput", "step": 0, "pgns": 96.0, "perf": PERF})
    for step, batch in ((10, 32), (20, 32), (30, 128), (40, 128)):
        clock.advance(1.0)
        post(api, job, progress(step, batch, 96.0))
    tta = api.call("GET", f"/api/v1/ui/jobs/{job}").json()["tta"]

    perf = PerfParams(**PERF)
    t32, t128 = float(iter_time(perf, 1, 1, 32, 0)), float(iter_time(perf, 1, 1, 128, 0))
    eff = (96 + 32) / (96 + 128)  # eq. 7 at M = 128
    # 10 steps at 32, then 20 at 128 worth 20 * 128 * eff samples at M0 = 32
    adaptive = 10 * t32 + 20 * t128
    fixed = 10 * t32 + 20 * 128 * eff / 32 * t32
    assert tta["init_batch"] == 32
    assert tta["adaptive_model_s"] == pytest.approx(adaptive)
    assert tta["fixed_model_s"] == pytest.approx(fixed)
    assert tta["speedup"] == pytest.approx(fixed / adaptive) and tta["speedup"] > 1.5
    assert tta["elapsed_s"] == pytest.approx(3.0)  # three 1 s intervals
    assert tta["equivalent_samples"] == pytest.approx(320 + 20 * 128 * eff)
    assert [p[1:] for p in tta["points"]][-1] == pytest.approx([adaptive, fixed, 3.0])
    assert len(tta["points"]) == 3


def test_a_restart_is_left_out_and_no_model_means_no_figure(
    api: Api,  # noqa: F811
    clock: FakeClock,  # noqa: F811
    sqlite_store: Store,
) -> None:
    job = submit(api, "alice")
    run(api, job, [0], clock())
    clock.advance(1.0)
    post(api, job, progress(10, 32, 50.0))
    clock.advance(1.0)
    post(api, job, progress(20, 32, 50.0))
    # progress but no throughput model yet: nothing to compare with
    assert api.call("GET", f"/api/v1/ui/jobs/{job}").json()["tta"] is None
    post(api, job, {"kind": "goodput", "step": 20, "pgns": 50.0, "perf": PERF})
    clock.advance(20.0)  # checkpoint-restart: that gap is no batch-size choice
    sqlite_store.add_event(job, "alloc", "attempt 2", clock(), {"replicas": 1})
    clock.advance(1.0)
    post(api, job, progress(30, 64, 50.0))
    tta = api.call("GET", f"/api/v1/ui/jobs/{job}").json()["tta"]
    t32 = float(iter_time(PerfParams(**PERF), 1, 1, 32, 0))
    assert tta["elapsed_s"] == pytest.approx(1.0)  # only the interval before the restart
    assert tta["adaptive_model_s"] == pytest.approx(10 * t32)
    assert tta["speedup"] == pytest.approx(1.0)  # at M0 both are the same


def test_efficiency_is_eq_7_and_neutral_without_a_noise_scale() -> None:
    assert efficiency(96.0, 32, 128) == pytest.approx(128 / 224)
    assert efficiency(None, 32, 128) == 1.0
    assert efficiency(float("inf"), 32, 128) == 1.0
    assert efficiency(0.0, 32, 32) == 1.0

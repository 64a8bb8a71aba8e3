"""Building the policy's view of a job from what the job reported."""

from __future__ import annotations

import math
from dataclasses import replace

from coadapt.controller.snapshot import build_snapshot, goodput_model, perf_params, speedup
from coadapt.controller.spec import parse_spec
from coadapt.controller.states import JobState
from coadapt.controller.store import Job
from tests.controller.conftest import make_spec

PERF = {
    "alpha_grad": 0.01,
    "beta_grad": 0.001,
    "alpha_local": 0.005,
    "beta_local": 0.001,
    "alpha_node": 0.01,
    "beta_node": 0.001,
    "gamma": 1.0,
}


def job(report: dict | None = None, **fields: object) -> Job:
    base = Job(
        id="j",
        tenant_id="t",
        name="j",
        spec=parse_spec(make_spec()).model_dump(mode="json"),
        state=JobState.PENDING,
        priority=0,
        submit_time=1.0,
        updated_at=1.0,
        started_at=None,
        finished_at=None,
        attempt=0,
        replicas=0,
        desired_replicas=0,
        num_restarts=0,
        failures=0,
        not_before=0.0,
        attained_service=0.0,
        service_at=None,
        max_gpus_held=0,
        stop_requested_at=None,
        reason=None,
        report=report,
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def test_no_model_until_the_job_reports_one() -> None:
    assert goodput_model(job()) is None
    assert goodput_model(job({"perf": PERF})) is None  # no gradient statistics yet
    assert (
        goodput_model(job({"perf": {**PERF, "gamma": None}, "grad": {"sqr": 1, "var": 1}})) is None
    )
    assert speedup(job(), 2) is None


def test_model_from_reported_parameters_or_fitted_profile() -> None:
    direct = goodput_model(job({"perf": PERF, "grad": {"sqr": 1.0, "var": 2.0}}))
    assert direct is not None and direct.perf.alpha_grad == 0.01
    profile = [
        {
            "nodes": 1,
            "replicas": k,
            "local_bsz": 32,
            "accum_steps": 0,
            "iter_time": 0.042 + 0.004 * (k > 1),
            "grad_time": math.nan,
            "count": 10,
        }
        for k in (1, 2, 4)
    ]
    fitted = goodput_model(job({"profile": profile, "grad": {"sqr": 1.0, "var": 2.0}}))
    assert fitted is not None and fitted.init_batch_size == 32
    s = speedup(job({"perf": PERF, "grad": {"sqr": 1.0, "var": 2.0}}), 2)
    assert s is not None and 1.0 < s <= 2.0


def test_snapshot_has_one_node_and_current_allocations() -> None:
    running = job(id="a", state=JobState.RUNNING, replicas=3)
    pending = job(id="b")
    snap = build_snapshot([running, pending], 4, 10.0, 5.0)
    assert snap.total_gpus == 4 and snap.restart_delay == 5.0
    assert dict(snap.current) == {"a": (3,)}
    assert list(snap.jobs) == ["a", "b"]


def test_attained_service_counts_up_to_the_round() -> None:
    running = job(state=JobState.RUNNING, replicas=2, attained_service=10.0, service_at=5.0)
    snap = build_snapshot([running], 4, 15.0, 5.0)
    assert snap.jobs["j"].attained_service == 30.0  # 10 + 2 slots x 10 s


def test_profile_fit_is_reported_as_such_and_reused() -> None:
    profile = [
        {"nodes": 1, "replicas": k, "local_bsz": 32, "accum_steps": 0, "iter_time": 0.04 + k / 1e3}
        for k in (1, 2)
    ]
    perf, source = perf_params({"profile": profile})
    assert perf is not None and source == "fitted from profile"
    assert perf_params({"profile": [dict(r) for r in profile]})[0] is perf  # cached, not refit
    assert perf_params({"perf": PERF})[1] == "reported" and perf_params({}) == (None, None)

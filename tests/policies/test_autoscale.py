"""Autoscalers on crafted load curves: pure, seeded, table-driven where it helps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from coadapt.policies import state_from_json, state_to_json
from coadapt.policies.autoscale import (
    DemandWindow,
    Deployment,
    DeploymentError,
    KnativeAutoscaler,
    LatencySample,
    ScaleDecision,
    SloAutoscaler,
    StaticAutoscaler,
    make_autoscaler,
    prior_service_rate,
)
from coadapt.policies.base import PolicyError, PolicyState
from coadapt.policies.queueing import pooled_capacity, pooled_quantile

CAP = 1000.0  # requests/s per replica at the SLO


def dep(**kw: object) -> Deployment:
    base: dict[str, object] = {"name": "web", "capacity_rps": CAP, "ready_s": 20.0}
    base.update(kw)
    return Deployment(**base)  # type: ignore[arg-type]


def drive(
    scaler: KnativeAutoscaler | SloAutoscaler,
    d: Deployment,
    rates: list[float],
    replicas: int,
    every: int = 60,
    start: float = 0.0,
    state: PolicyState | None = None,
    follow: bool = True,
) -> tuple[list[ScaleDecision], PolicyState]:
    """Feed ``rates`` in windows of ``every`` seconds; replicas follow the decisions."""
    out: list[ScaleDecision] = []
    st: PolicyState = state or {}
    now = start
    for i in range(0, len(rates), every):
        now += every
        window = DemandWindow(now, tuple(rates[i : i + every]), (), replicas)
        dec = scaler.decide(d, window, st, now, 60.0 + d.ready_s)
        st = state_from_json(state_to_json(dec.state))  # what a controller would persist
        out.append(dec)
        if follow:
            replicas = dec.replicas
    return out, st


# --------------------------------------------------------------- deployment spec
@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"name": "a"}, "capacity_rps"),
        ({"name": "a", "capacity_rps": -1}, "capacity_rps"),
        ({"name": "a", "capacity_rps": 10, "slo_ms": 0}, "slo_ms"),
        ({"name": "a", "capacity_rps": 10, "slo_quantile": 1.0}, "slo_quantile"),
        ({"name": "a", "capacity_rps": 10, "min_replicas": 3, "max_replicas": 2}, "max_replicas"),
        ({"name": "a", "capacity_rps": 10, "ready_s": -1}, "ready_s"),
        ({"name": "a", "capacity_rps": 10, "scale_to_zero_s": "soon"}, "scale_to_zero_s"),
        ({"name": "a", "capacity_rps": 10, "replicas": 3}, "replicas"),
        ({"name": "", "capacity_rps": 10}, "name"),
    ],
)
def test_bad_deployment_names_the_field(spec: dict[str, object], field: str) -> None:
    with pytest.raises(DeploymentError, match=f"'{field}'"):
        Deployment.from_mapping(spec)


def test_deployment_from_mapping_reads_slo_ms() -> None:
    d = Deployment.from_mapping({"name": "a", "capacity_rps": 10, "slo_ms": 80, "priority": 2})
    assert d.slo_s == pytest.approx(0.08)
    assert d.priority == 2


# --------------------------------------------------------------- knative
def test_knative_step_up_follows_the_stable_average() -> None:
    d = dep(min_replicas=1)
    decisions, _ = drive(KnativeAutoscaler(), d, [1400.0] * 60 + [2100.0] * 120, replicas=2)
    # 1400 / (1000 * 0.7) = 2; the step to 2100 needs 3, under 2x the ready 2: no panic
    assert [x.replicas for x in decisions] == [2, 3, 3]
    assert all(x.diagnostics["panic"] == 0.0 for x in decisions)


def test_knative_spike_panics_and_holds_while_panicking() -> None:
    d = dep(min_replicas=1)
    scaler = KnativeAutoscaler()
    # 54 s quiet then a 6 s spike at 10x: the 60 s average barely moves, the 6 s one does
    rates = [700.0] * 54 + [7000.0] * 6
    decisions, st = drive(scaler, d, rates, replicas=1)
    assert decisions[0].diagnostics["panic"] == 1.0
    assert decisions[0].replicas == 10  # ceil(7000 / 700)
    # back to quiet: no scale-down while the panic lasts (one stable window) ...
    later, st = drive(scaler, d, [700.0] * 30, replicas=10, every=30, start=60.0, state=st)
    assert later[0].replicas == 10
    # ... then the stable average rules again
    after, _ = drive(scaler, d, [700.0] * 60, replicas=10, every=60, start=90.0, state=st)
    assert after[0].diagnostics["panic"] == 0.0
    assert after[0].replicas == 5  # max scale-down rate 2: 10 -> 5, not straight to 1


def test_knative_ramp_down_is_rate_limited() -> None:
    d = dep(min_replicas=1)
    decisions, _ = drive(KnativeAutoscaler(), d, [0.0 + 700.0] * 240, replicas=16)
    assert [x.replicas for x in decisions] == [8, 4, 2, 1]


def test_knative_scales_to_zero_after_idle_and_back_on_a_request() -> None:
    d = dep(scale_to_zero_s=0.0)
    scaler = KnativeAutoscaler()
    decisions, st = drive(scaler, d, [0.0] * 180, replicas=1, every=30)
    # a stable window without traffic plus the 30 s grace, then zero
    assert [x.replicas for x in decisions] == [1, 1, 1, 0, 0, 0]
    back, _ = drive(scaler, d, [5.0] * 10, replicas=0, every=10, start=180.0, state=st)
    assert back[0].replicas == 1  # the activator's request asks for a replica at once


def test_knative_never_scales_to_zero_when_the_deployment_forbids_it() -> None:
    decisions, _ = drive(KnativeAutoscaler(), dep(scale_to_zero_s=None), [0.0] * 600, 1)
    assert all(x.replicas == 1 for x in decisions)


# --------------------------------------------------------------- SLO autoscaler
def mm1_latency(load: float, mu: float, q: float = 0.99) -> float:
    return math.log(1 / (1 - q)) / (mu - load)


def test_capacity_learning_converges_on_synthetic_latencies() -> None:
    rng = np.random.default_rng(3)
    true_cap = 1300.0  # the load test said CAP = 1000: the scaler must find the truth
    d = dep()
    mu = true_cap + d.tail_factor / d.slo_s
    scaler = SloAutoscaler()
    st: PolicyState = {}
    for k in range(40):
        loads = rng.uniform(0.5 * true_cap, 1.05 * true_cap, size=6)
        samples = tuple(
            LatencySample(float(x), mm1_latency(float(x), mu) * float(rng.lognormal(0, 0.05)))
            for x in loads
        )
        window = DemandWindow(60.0 * (k + 1), (5000.0,) * 60, samples, 5)
        st = scaler.decide(d, window, st, 60.0 * (k + 1), 80.0).state
    assert scaler.capacity(d, st) == pytest.approx(true_cap, rel=0.03)
    assert scaler.capacity(d, {}) == pytest.approx(CAP)  # the prior alone: the load test


def test_prior_curve_passes_through_the_load_test_point() -> None:
    d = dep()
    assert pooled_quantile(prior_service_rate(d), 1, CAP, d.slo_quantile) == pytest.approx(d.slo_s)
    assert SloAutoscaler().capacity(d, {}) == pytest.approx(CAP)


@pytest.mark.parametrize("replicas", [1, 4, 16])
def test_pooled_fit_converges_to_the_true_service_rate(replicas: int) -> None:
    """Samples from c pooled replicas (M/M/c, the gateway's least-outstanding routing) at
    loads the pool really meets: the fit finds the replica's true mu, 30 % above the load
    test's, where the per-replica M/M/1 reading of the same samples does not."""
    rng = np.random.default_rng([5, replicas])
    d = dep()
    true_mu = 1.3 * prior_service_rate(d)
    pooled, split = SloAutoscaler(), SloAutoscaler(pooled=False)
    st_pooled: PolicyState = {}
    st_split: PolicyState = {}
    for k in range(40):
        utilisation = rng.uniform(0.3, 0.95, size=6)
        samples = tuple(
            LatencySample(
                float(u * true_mu),
                pooled_quantile(true_mu, replicas, float(u * true_mu * replicas), 0.99)
                * float(rng.lognormal(0, 0.05)),
                replicas,
            )
            for u in utilisation
        )
        now = 60.0 * (k + 1)
        window = DemandWindow(now, (5000.0,) * 60, samples, replicas)
        st_pooled = pooled.decide(d, window, st_pooled, now, 80.0).state
        st_split = split.decide(d, window, st_split, now, 80.0).state
        st_pooled = state_from_json(state_to_json(st_pooled))
    assert pooled.service_rate(d, st_pooled) == pytest.approx(true_mu, rel=0.03)
    mm1 = split.service_rate(d, st_split)
    if replicas == 1:  # one replica: the two readings are the same model
        assert mm1 == pytest.approx(true_mu, rel=0.03)
    else:  # a pool's light tail read as one replica's: mu (and capacity) far too high
        assert mm1 > 1.2 * true_mu


def test_pooled_count_is_the_least_pool_meeting_the_slo() -> None:
    d = dep(max_replicas=64)
    scaler = SloAutoscaler(min_headroom=0.0, max_headroom=0.0)
    mu = prior_service_rate(d)
    rate = 20.0 * CAP  # separate replicas would need 20
    dec = scaler.decide(d, DemandWindow(60.0, (rate,) * 60, (), 20), {}, 60.0, 80.0)
    c = dec.replicas
    assert pooled_quantile(mu, c, rate, 0.99) <= d.slo_s < pooled_quantile(mu, c - 1, rate, 0.99)
    assert c == 19  # pooling: one fewer than ceil(rate / capacity) at this size
    assert dec.capacity_rps == pytest.approx(pooled_capacity(mu, c, d.slo_s, 0.99) / c)
    split = SloAutoscaler(min_headroom=0.0, max_headroom=0.0, pooled=False)
    assert split.decide(d, DemandWindow(60.0, (rate,) * 60, (), 20), {}, 60.0, 80.0).replicas == 20
    # a utilisation cap leaves each replica spare service rate to drain a burst's queue
    capped = SloAutoscaler(min_headroom=0.0, max_headroom=0.0, max_utilisation=0.9)
    n = capped.decide(d, DemandWindow(60.0, (rate,) * 60, (), 20), {}, 60.0, 80.0).replicas
    assert n == math.ceil(rate / (0.9 * mu))
    with pytest.raises(PolicyError, match="max_utilisation"):
        SloAutoscaler(max_utilisation=1.5)


def test_old_samples_and_old_state_still_load() -> None:
    """A sample written without ``replicas`` is one replica serving its load (the M/M/1
    reading it always had); a state saved by the per-replica line fit keeps its capacity."""
    assert LatencySample(700.0, 0.01) == LatencySample(700.0, 0.01, 1)
    with pytest.raises(DeploymentError, match="'replicas'"):
        LatencySample(700.0, 0.01, 0)
    d = dep()
    # the old fit's statistics [w, Σx, Σy, Σxx, Σxy] of the line 1/latency = b0 + b1 * load
    # through the M/M/1 curve of a replica whose capacity at the SLO is 1,300 req/s
    mu = 1300.0 + d.tail_factor / d.slo_s
    stats = [0.0] * 5
    for x in (0.0, 650.0, 1300.0):
        y = (mu - x) / d.tail_factor
        stats = [a + b for a, b in zip(stats, (1.0, x, y, x * x, x * y), strict=True)]
    old = state_from_json(state_to_json({"fit": stats, "level": 2000.0, "trend": 0.0}))
    scaler = SloAutoscaler()
    assert scaler.capacity(d, old) == pytest.approx(1300.0)
    dec = scaler.decide(d, DemandWindow(60.0, (2000.0,) * 60, (), 2), old, 60.0, 80.0)
    assert dec.state["mu_fit"][1] / dec.state["mu_fit"][0] == pytest.approx(math.log(mu))
    # a state whose line does not fall (no learning yet) starts from the load test
    assert scaler.capacity(d, {"fit": [1.0, 0.0, 0.0, 0.0, 0.0]}) == pytest.approx(CAP)


def test_slo_autoscaler_provisions_ahead_of_a_ramp() -> None:
    d = dep(min_replicas=1)
    scaler = SloAutoscaler(min_headroom=0.0)
    ramp = [1000.0 + 10.0 * t for t in range(1200)]  # +10 req/s per second
    decisions, _ = drive(scaler, d, ramp, replicas=2)
    horizon = 60.0 + d.ready_s
    for i, dec in enumerate(decisions[3:], start=3):
        now = 60 * (i + 1)
        demand_at_horizon = 1000.0 + 10.0 * (now + horizon)
        assert dec.replicas * CAP >= 0.97 * demand_at_horizon  # Holt's trend looks ahead


def test_slo_autoscaler_learns_headroom_from_a_burst() -> None:
    d = dep(min_replicas=1)
    scaler = SloAutoscaler()
    flat = [2000.0] * 600
    before, st = drive(scaler, d, flat, replicas=3)
    assert before[-1].diagnostics["headroom"] == pytest.approx(scaler.min_headroom)
    burst = [2000.0] * 30 + [3000.0] * 60 + [2000.0] * 510  # +50 % for a minute
    after, st = drive(scaler, d, burst, replicas=3, start=600.0, state=st)
    # the burst surprised a past forecast by 50 %: that is now the headroom
    assert after[-1].diagnostics["headroom"] == pytest.approx(0.5, abs=0.02)
    calm, _ = drive(scaler, d, [2000.0] * 600, replicas=4, start=1200.0, state=st)
    assert calm[-1].replicas == math.ceil(2000.0 * 1.5 / CAP)


def test_slo_autoscaler_judges_the_whole_horizon_of_a_decision() -> None:
    d = dep(min_replicas=1)
    scaler = SloAutoscaler()
    _, st = drive(scaler, d, [2000.0] * 600, replicas=3, every=120)
    # a 25 s burst early in the horizon of the decision at t=600 only (rounds of 120 s)
    burst = [2000.0] * 5 + [3000.0] * 25 + [2000.0] * 450
    after, _ = drive(scaler, d, burst, replicas=3, every=120, start=600.0, state=st)
    assert after[-1].diagnostics["headroom"] == pytest.approx(0.5, abs=0.02)


def test_slo_autoscaler_idles_to_zero_and_wakes_on_a_request() -> None:
    d = dep(scale_to_zero_s=120.0)
    scaler = SloAutoscaler()
    decisions, st = drive(scaler, d, [0.0] * 600, replicas=1)
    assert [x.replicas for x in decisions][:3] == [1, 1, 0]
    back, _ = drive(scaler, d, [50.0] * 60, replicas=0, start=600.0, state=st)
    assert back[0].replicas == 1


def test_autoscalers_are_deterministic_and_state_is_json() -> None:
    rng = np.random.default_rng(11)
    rates = list(rng.uniform(500, 4000, size=900))
    for scaler in (KnativeAutoscaler(), SloAutoscaler()):
        a, sa = drive(scaler, dep(), rates, replicas=2)
        b, sb = drive(scaler, dep(), rates, replicas=2)
        assert [x.replicas for x in a] == [x.replicas for x in b]
        assert state_to_json(sa) == state_to_json(sb)


def test_static_and_factory() -> None:
    d = dep(max_replicas=8)
    dec = StaticAutoscaler({"web": 12}).decide(d, DemandWindow(0.0), {}, 0.0, 80.0)
    assert dec.replicas == 8  # clamped to the deployment's bounds
    with pytest.raises(DeploymentError, match="'other'"):
        StaticAutoscaler({"web": 1}).decide(dep(name="other"), DemandWindow(0.0), {}, 0.0, 1.0)
    assert make_autoscaler("slo").name == "slo"
    assert make_autoscaler("knative", target_utilisation=0.8).name == "knative"
    with pytest.raises(ValueError, match="accepted: slo, knative"):
        make_autoscaler("hpa")


@pytest.mark.parametrize("every", [10, 60])
def test_slo_autoscaler_forgets_by_time_not_by_decisions(every: int) -> None:
    # the live controller decides every 5 s, the simulator every 60 s: a burst must be
    # remembered as long (in time) either way, or fast rounds forget it before the next one
    d = dep(min_replicas=1)
    scaler = SloAutoscaler()
    _, st = drive(scaler, d, [2000.0] * 600, replicas=3, every=every)
    burst = [2000.0] * 30 + [3000.0] * 60 + [2000.0] * 510
    _, st = drive(scaler, d, burst, replicas=3, every=every, start=600.0, state=st)
    calm, _ = drive(scaler, d, [2000.0] * 14_400, replicas=3, every=every, start=1200.0, state=st)
    assert calm[-1].diagnostics["headroom"] == pytest.approx(0.5, abs=0.02)
    with pytest.raises(PolicyError, match="forget_period_s"):
        SloAutoscaler(forget_period_s=0.0)


def test_slo_autoscaler_honours_a_short_idle_time_over_its_recent_peak() -> None:
    """scale_to_zero_s shorter than the 60 s peak window: the user's idle time decides (the
    remembered peak alone kept a replica for a minute after the last request)."""
    d = dep(min_replicas=0, scale_to_zero_s=5.0)
    scaler = SloAutoscaler()
    decs, st = drive(scaler, d, [3.0] + [0.0] * 4, 1, every=5)
    assert decs[-1].replicas == 1  # the request came within this window
    decs, _ = drive(scaler, d, [0.0] * 5, 1, every=5, start=5.0, state=st)
    assert decs[-1].replicas == 0  # 5 s without a request, though the peak window remembers it


@pytest.mark.parametrize("scaler", [SloAutoscaler(), KnativeAutoscaler()], ids=["slo", "knative"])
def test_requests_held_by_the_activator_keep_a_replica_coming(
    scaler: SloAutoscaler | KnativeAutoscaler,
) -> None:
    """A request that arrived windows ago and still waits for a first replica is demand: the
    replica being started for it is never scaled away before it answers."""
    d = dep(min_replicas=0, scale_to_zero_s=0.0)
    st: PolicyState = {}
    for k in range(1, 6):  # 5 idle windows of 60 s, with one request held all along
        now = 60.0 * k
        window = DemandWindow(now, (0.0,) * 60, (), replicas=0, held_now=1)
        dec = scaler.decide(d, window, st, now, 80.0)
        st = dec.state
        assert dec.replicas == 1, k
    dec = scaler.decide(d, DemandWindow(360.0, (0.0,) * 60, (), 0), st, 360.0, 80.0)
    assert dec.replicas == 0  # answered and idle: back to zero

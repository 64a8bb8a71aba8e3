"""Heterogeneous clusters: spec parsing, per-type step times, one type per job, per-type models."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from coadapt.goodput import PerfParams
from coadapt.policies import (
    BatchMode,
    ClusterSnapshot,
    Decision,
    NodeInfo,
    PolicyState,
    make_policy,
)
from coadapt.sim import (
    ClusterSpec,
    SimConfig,
    SimInputError,
    SimulationError,
    Simulator,
    load_workload,
    parse_cluster,
    simulate,
)
from coadapt.sim.applications import APPLICATION_NAMES, get_application
from coadapt.sim.engine import oracle_step_time
from coadapt.sim.gpu_types import (
    GAVEL_JOB_TYPES,
    REFERENCE_TYPE,
    colocation_table,
    speed_factor,
    typed_throughput,
)
from coadapt.sim.type_models import anchor_type, measured_speed, scale_compute
from coadapt.sim.workload import parse_workload

HETERO = "v100:1x4,p100:1x4,k80:2x4"


def test_typed_spec_gives_typed_nodes() -> None:
    spec = parse_cluster(" V100:1x4, p100:1x2,k80:2x4")
    assert spec.total_gpus == 14
    assert spec.gpu_types == ("v100", "p100", "k80")
    assert str(spec) == "v100:1x4,p100:1x2,k80:2x4"
    assert parse_cluster(str(spec)) == spec
    nodes = spec.nodes()
    assert [n.gpu_type for n in nodes] == ["v100", "p100", "k80", "k80"]
    assert [n.gpus for n in nodes] == [4, 2, 4, 4]
    assert len({n.name for n in nodes}) == 4
    assert spec.gpus_per_node_of("p100") == 2


def test_homogeneous_spec_keeps_its_api() -> None:
    spec = parse_cluster("16x4")
    assert spec == ClusterSpec(16, 4) and str(spec) == "16x4" and spec.total_gpus == 64
    assert {n.gpu_type for n in spec.nodes()} == {"gpu"}


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("a100:2x4", "unknown GPU type 'a100'"),
        ("v100:2x4,v100:1x4", "appears twice"),
        ("v100:2x4,3x4", "needs a TYPE: prefix"),
        ("v100:2x8", "invalid cluster spec"),
        ("v100:", "invalid cluster spec"),
    ],
)
def test_bad_specs_are_input_errors(spec: str, match: str) -> None:
    with pytest.raises(SimInputError, match=match) as info:
        parse_cluster(spec)
    assert "--cluster" in str(info.value) and "v100:4x4" in str(info.value)


def _gavel_iters_per_s(gpu_type: str, job_type: str) -> float:
    ref = resources.files("coadapt.sim").joinpath("data", "gavel", "throughputs_1gpu.json")
    data = json.loads(ref.read_text("utf-8"))
    return float(data[gpu_type][f"('{job_type}', 1)"]["null"])


def test_speed_factor_is_gavels_throughput_ratio() -> None:
    for app in APPLICATION_NAMES:
        job = GAVEL_JOB_TYPES[app]
        ref = _gavel_iters_per_s(REFERENCE_TYPE, job)
        for t in ("k80", "v100"):
            assert speed_factor(app, t) == pytest.approx(_gavel_iters_per_s(t, job) / ref)
        assert speed_factor(app, "gpu") == speed_factor(app, REFERENCE_TYPE) == 1.0


def test_resnet50_is_fastest_on_v100_and_slowest_on_k80() -> None:
    app = get_application("imagenet")
    steps = {t: oracle_step_time(app, 800, 4, 4, t) for t in ("k80", "p100", "v100")}
    assert steps["v100"] < steps["p100"] < steps["k80"]
    assert steps["p100"] == oracle_step_time(app, 800, 4, 4)  # the reference: the traces


def test_only_compute_scales_with_the_type() -> None:
    app = get_application("cifar10")
    step, sync = app.throughput((4, 4), 128)
    assert typed_throughput(app, "gpu", (4, 4), 128) == (step, sync)
    v_step, v_sync = typed_throughput(app, "v100", (4, 4), 128)
    assert v_sync == sync
    assert (step - sync) / (v_step - v_sync) == pytest.approx(speed_factor("cifar10", "v100"))


def test_colocation_table_is_consistent_and_skips_pairs_that_do_not_fit() -> None:
    table = colocation_table()
    for (a, b), (fa, fb) in table.items():
        assert table[b, a] == (fb, fa)
        assert 0 < fa <= 1.5 and 0 < fb <= 1.5
    assert ("imagenet", "imagenet") not in table  # Gavel measured [0, 0]: out of memory


def test_per_type_model_bootstraps_from_the_anchor_type() -> None:
    perf = PerfParams(0.1, 0.01, 0.05, 0.001, 0.2, 0.01, 1.5)
    k80 = {(1, 1, 32): (0.1 + 0.01 * 32, 0.0), (1, 2, 32): (0.5, 0.08)}
    v100 = {(1, 1, 16): ((0.1 + 0.01 * 16) / 4.0, 0.0)}  # measured 4x faster
    profiles = {"k80": k80, "v100": v100}
    assert anchor_type(profiles, "v100") == "k80"  # most configurations
    assert anchor_type({"k80": k80, "p100": k80}, "p100") == "p100"  # tie: the current type
    assert measured_speed(perf, v100) == pytest.approx(4.0)
    assert measured_speed(perf, {}) is None
    fast = scale_compute(perf, 4.0)
    assert fast.alpha_grad == pytest.approx(0.025) and fast.beta_grad == pytest.approx(0.0025)
    assert (fast.alpha_node, fast.gamma) == (perf.alpha_node, perf.gamma)
    with pytest.raises(ValueError, match="speed"):
        scale_compute(perf, 0.0)


@dataclass
class _Scripted:
    """A test policy: fixed allocations and packing from round one on."""

    allocations: dict[str, tuple[int, ...]]
    packed: dict[str, str]
    name: str = "scripted"
    batch_mode: BatchMode = BatchMode.FIXED

    def optimize(
        self, snapshot: ClusterSnapshot, state: PolicyState, rng: np.random.Generator
    ) -> Decision:
        del state, rng
        allocs = {k: a for k, a in self.allocations.items() if k in snapshot.jobs}
        return Decision(allocs, {}, {}, {g: h for g, h in self.packed.items() if g in allocs})


def _workload(*rows: str) -> str:
    return "name,time,application,num_replicas,batch_size\n" + "\n".join(rows) + "\n"


def test_engine_rejects_a_job_on_two_gpu_types() -> None:
    wl = parse_workload(_workload("a,0,cifar10,2,256"), "two.csv")
    policy = _Scripted({"a": (1, 1)}, {})
    sim = Simulator(wl, parse_cluster("v100:1x1,k80:1x1"), policy)
    with pytest.raises(SimulationError, match="several types"):
        sim.step()


def test_job_learns_its_speed_on_each_type_it_runs_on() -> None:
    wl = parse_workload(_workload("a,0,cifar10,1,128"), "one.csv")
    cluster = parse_cluster("v100:1x1,k80:1x1")
    policy = _Scripted({"a": (0, 1)}, {})  # on the K80
    sim = Simulator(wl, cluster, policy, SimConfig(restart_delay=0))
    sim.step()
    sim.step()
    job = sim._jobs[0]
    assert job.gpu_type == "k80" and set(job.profiles) == {"k80"}
    facts = sim._job_facts(job)
    assert facts.goodput_by_type is not None and set(facts.goodput_by_type) == {"k80", "v100"}
    k80, v100 = facts.goodput_by_type["k80"], facts.goodput_by_type["v100"]
    prior = speed_factor("cifar10", "v100") / speed_factor("cifar10", "k80")
    assert k80.perf.beta_grad / v100.perf.beta_grad == pytest.approx(prior)
    policy.allocations = {"a": (1, 0)}  # move to the V100: measured there from now on
    sim.step()
    sim.step()
    assert job.gpu_type == "v100" and set(job.profiles) == {"k80", "v100"}
    assert job.goodput_model() == job.model_on("v100")


def test_homogeneous_snapshots_carry_no_per_type_models(small_workload_path: Path) -> None:
    sim = Simulator(
        load_workload(str(small_workload_path)), parse_cluster("2x2"), make_policy("pollux")
    )
    for _ in range(3):
        sim.step()
    assert all(sim._job_facts(j).goodput_by_type is None for j in sim._jobs)


def test_fixed_request_larger_than_every_type_is_cut_to_the_largest() -> None:
    wl = parse_workload(_workload("big,0,cifar10,6,1024"), "big.csv")
    sim = Simulator(wl, parse_cluster("v100:1x4,k80:1x4"), make_policy("tiresias"))
    assert sim._jobs[0].max_replicas == 4


@pytest.mark.parametrize("policy", ["pollux", "gavel", "tiresias"])
def test_small_heterogeneous_simulation_finishes_and_is_deterministic(
    small_workload_path: Path, policy: str
) -> None:
    wl = load_workload(str(small_workload_path))
    cluster = parse_cluster("v100:1x2,k80:1x2")
    a = simulate(wl, cluster, make_policy(policy), SimConfig(seed=3))
    b = simulate(wl, cluster, make_policy(policy), SimConfig(seed=3))
    assert a == b
    assert all(j.completion_time is not None for j in a.jobs)


def test_types_change_job_times(small_workload_path: Path) -> None:
    wl = load_workload(str(small_workload_path))
    fast = simulate(wl, parse_cluster("v100:2x2"), make_policy("tiresias"))
    slow = simulate(wl, parse_cluster("k80:2x2"), make_policy("tiresias"))
    for f, s in zip(fast.jobs, slow.jobs, strict=True):
        assert f.jct is not None and s.jct is not None and f.jct < s.jct


def test_node_info_types_reach_the_snapshot() -> None:
    wl = parse_workload(_workload("a,0,ncf,1,256"), "one.csv")
    seen: list[tuple[NodeInfo, ...]] = []

    @dataclass
    class Spy(_Scripted):
        def optimize(
            self, snapshot: ClusterSnapshot, state: PolicyState, rng: np.random.Generator
        ) -> Decision:
            seen.append(snapshot.nodes)
            return super().optimize(snapshot, state, rng)

    Simulator(wl, parse_cluster(HETERO), Spy({}, {})).step()
    assert [n.gpu_type for n in seen[0]] == ["v100", "p100", "k80", "k80"]


def test_cli_simulates_a_typed_cluster(
    small_workload_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from coadapt.cli import main

    out = tmp_path / "out.json"
    argv = ["simulate", "--workload", str(small_workload_path), "--cluster", "v100:1x2,k80:1x2"]
    assert main([*argv, "--policy", "gavel", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data[0]["cluster"] == "v100:1x2,k80:1x2" and data[0]["completed"] == 5
    assert 0.0 < data[0]["gpu_util"] <= 1.0
    assert main([*argv[:3], "--cluster", "h100:2x4"]) == 2
    assert "unknown GPU type 'h100'" in capsys.readouterr().err

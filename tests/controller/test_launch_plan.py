"""The launch plan: torchrun coordinates, the environment allowlist and the contract."""

from __future__ import annotations

from pathlib import Path

from coadapt.controller.launch_plan import AttemptPlan, expand, places, replica_specs
from coadapt.protocol import ReplicaEnv


def _plan(tmp_path: Path, **kw: object) -> AttemptPlan:
    args: dict[str, object] = {
        "job_id": "j1",
        "attempt": 2,
        "argv": ("python", "t.py", "--out", "${COADAPT_CHECKPOINT_DIR}/r.json", "${NOPE}"),
        "cwd": str(tmp_path),
        "job_dir": tmp_path / "jobs" / "j1",
        "tenant": "alice",
        "batch_mode": "adaptive",
        "port": 4321,
        "spec_env": {"FOO": "1", "RANK": "99"},
        "uses_gpus": True,
    }
    args.update(kw)
    return AttemptPlan(**args)  # type: ignore[arg-type]


def test_places_number_nodes_by_first_appearance() -> None:
    got = places([("b", 3), ("a", 0), ("b", 5)])
    assert [(p.node, p.local_rank, p.local_world, p.node_rank) for p in got] == [
        ("b", 0, 2, 0),
        ("a", 0, 1, 1),
        ("b", 1, 2, 0),
    ]
    assert got[0].node_slots == (3, 5) and got[1].node_slots == (0,)


def test_specs_carry_the_contract_and_only_allowlisted_controller_variables(
    tmp_path: Path,
) -> None:
    controller = {"PATH": "/bin", "SECRET_DB_URL": "postgres://x", "NCCL_DEBUG": "INFO"}
    plan = _plan(tmp_path, metrics_url="http://c/m?token=t", job_token="t", max_local_bsz=8)
    specs = replica_specs(plan, [("b", 3), ("a", 0), ("b", 5)], controller)
    assert [s.rank for s in specs] == [0, 1, 2] and all(s.world_size == 3 for s in specs)
    env = dict(specs[2].env)
    assert "SECRET_DB_URL" not in env and env["PATH"] == "/bin" and env["NCCL_DEBUG"] == "INFO"
    assert env["FOO"] == "1" and env["CUDA_VISIBLE_DEVICES"] == "3,5"
    wire = ReplicaEnv.from_env(env)
    assert (wire.rank, wire.local_rank, wire.group_rank, wire.num_nodes) == (2, 1, 0, 2)
    assert (wire.restarts, wire.attempt, wire.tenant, wire.node) == (1, 2, "alice", "b")
    assert wire.max_local_bsz == 8 and wire.job_token == "t" and wire.master_port == 4321
    ckpt = str((tmp_path / "jobs" / "j1" / "checkpoints").resolve())
    assert specs[0].argv == ("python", "t.py", "--out", f"{ckpt}/r.json", "${NOPE}")
    assert specs[1].log_path.endswith("logs/attempt-2.rank-1.log")
    assert specs[1].run_dir == str(tmp_path / "jobs" / "j1" / "runs" / "2")


def test_cpu_replicas_get_one_thread_and_no_metrics_without_a_url(tmp_path: Path) -> None:
    (spec,) = replica_specs(_plan(tmp_path, uses_gpus=False), [("local", 0)], {})
    assert spec.env["OMP_NUM_THREADS"] == "1" and "CUDA_VISIBLE_DEVICES" not in spec.env
    assert "COADAPT_METRICS_URL" not in spec.env and "COADAPT_MAX_LOCAL_BSZ" not in spec.env


def test_expand_leaves_unknown_names() -> None:
    assert expand(["${A}-${B}"], {"A": "x"}) == ("x-${B}",)

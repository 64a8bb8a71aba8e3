"""GPU types of the executors' inventory: device names, ``--slots a100:4``, Ray's
accelerator-type resources, and the local executor's nodes per type (a replica on the second
type's node sees that type's devices)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from coadapt.executors import ExecutorError, LocalExecutor, ReplicaSpec, parse_slots
from coadapt.executors.gpu_types import (
    DEFAULT_GPU_TYPE,
    check_type_name,
    device_type,
    ray_accelerator_type,
)
from coadapt.executors.local import detect_gpu_types, plan_nodes
from coadapt.executors.sandbox import Isolation
from coadapt.policies import DEFAULT_GPU_TYPE as POLICY_DEFAULT


@pytest.mark.parametrize(
    ("name", "gpu_type"),
    [
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("Tesla V100-SXM2-16GB", "v100"),
        ("Tesla P100-PCIE-16GB", "p100"),
        ("Tesla K80", "k80"),
        ("Tesla T4", "t4"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA GeForce RTX 3090", "rtx3090"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA", DEFAULT_GPU_TYPE),
        ("", DEFAULT_GPU_TYPE),
    ],
)
def test_device_names_normalise_to_one_type_per_generation(name: str, gpu_type: str) -> None:
    assert device_type(name) == gpu_type


def test_the_default_type_is_the_policies_default() -> None:
    assert DEFAULT_GPU_TYPE == POLICY_DEFAULT == "gpu"


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("4", 4),
        ("a100:4", {"a100": 4}),
        ("A100:4", {"a100": 4}),
        (" a100:2, t4:2 ", {"a100": 2, "t4": 2}),
    ],
)
def test_slots_parse_as_a_count_or_per_type(text: str, parsed: int | dict[str, int]) -> None:
    assert parse_slots(text) == parsed


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0", "is invalid"),
        ("a100", "not TYPE:COUNT"),
        ("a100:0", "COUNT >= 1"),
        ("a100:x", "not TYPE:COUNT"),
        ("a 100:4", "invalid GPU type 'a 100'"),
        ("a100:2,a100:2", "given twice"),
        ("a100:2,", "not TYPE:COUNT"),
    ],
)
def test_bad_slots_name_the_flag_and_the_accepted_forms(text: str, says: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_slots(text)
    assert str(err.value).startswith("--slots:") and says in str(err.value)


def test_type_names_are_checked() -> None:
    assert check_type_name("a100") == "a100"
    for bad in ("A100", "1gpu", "a b", "", "x" * 33, None):
        with pytest.raises(ValueError, match="invalid GPU type"):
            check_type_name(bad)


def test_ray_accelerator_resources_give_the_type() -> None:
    assert ray_accelerator_type({"GPU": 4.0, "accelerator_type:A100": 1.0}) == "a100"
    assert ray_accelerator_type({"GPU": 1.0, "accelerator_type:V100": 1.0}) == "v100"
    assert ray_accelerator_type({"accelerator_type:A100-80G": 1.0}) == "a100"
    assert ray_accelerator_type({"CPU": 8.0}) is None
    assert ray_accelerator_type({"accelerator_type:T4": 0.0}) is None


def test_local_nodes_per_declared_detected_or_default_type() -> None:
    assert plan_nodes(3, ["a100"]) == (False, [("local", DEFAULT_GPU_TYPE, [0, 1, 2])])
    assert plan_nodes({"a100": 2}, []) == (False, [("local", "a100", [0, 1])])
    assert plan_nodes({"a100": 1, "t4": 2}, ["x"] * 4) == (
        True,
        [("local-a100", "a100", [0]), ("local-t4", "t4", [1, 2])],
    )
    # Detected: devices grouped by type, keeping each device's index.
    assert plan_nodes(None, ["v100", "t4", "v100"]) == (
        True,
        [("local-v100", "v100", [0, 2]), ("local-t4", "t4", [1])],
    )
    assert plan_nodes(None, ["h100", "h100"]) == (True, [("local", "h100", [0, 1])])
    gpus, [(name, gpu_type, slots)] = plan_nodes(None, [])
    assert (gpus, name, gpu_type) == (False, "local", DEFAULT_GPU_TYPE) and slots
    with pytest.raises(ExecutorError, match=r"declares 4 GPUs .* this machine has 2"):
        plan_nodes({"a100": 4}, ["a100", "a100"])
    with pytest.raises(ExecutorError, match="invalid GPU type"):
        plan_nodes({"A 1": 1}, [])


def test_a_replica_on_the_second_types_node_sees_that_types_devices(tmp_path: Path) -> None:
    ex = LocalExecutor(
        slots={"a100": 1, "t4": 2},
        isolation=Isolation(),
        warm=False,
        device_types=["a100", "t4", "t4"],
    )
    assert ex.uses_gpus() and ex.slots() == 3
    assert [(n.name, n.slots, n.gpu_type) for n in ex.nodes()] == [
        ("local-a100", 1, "a100"),
        ("local-t4", 2, "t4"),
    ]
    out = tmp_path / "seen.json"
    code = "import json, os, sys\n"
    code += "json.dump(os.environ['CUDA_VISIBLE_DEVICES'], open(sys.argv[1], 'w'))"
    spec = ReplicaSpec(
        job_id="j",
        attempt=1,
        rank=0,
        world_size=1,
        argv=(sys.executable, "-c", code, str(out)),
        cwd=str(tmp_path),
        run_dir=str(tmp_path / "run"),
        log_path=str(tmp_path / "log.txt"),
        slot=1,
        env={"CUDA_VISIBLE_DEVICES": "1", "PATH": "/usr/bin:/bin"},
        node="local-t4",
    )
    handle = ex.launch(spec)
    deadline = time.monotonic() + 20
    while not ex.poll(handle).done and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ex.poll(handle).exit_code == 0, (tmp_path / "log.txt").read_text()
    assert json.loads(out.read_text()) == "2"  # slot 1 of the t4 node is device 2


def test_ray_nodes_carry_their_accelerator_type() -> None:
    """The Ray executor's inventory from ``ray.nodes()``-shaped records (unit level: a real
    cluster with GPUs of two types is not available to the tests)."""
    ray_executor = pytest.importorskip("coadapt.executors.ray_executor")

    class Listed(ray_executor.RayExecutor):  # type: ignore[name-defined]
        def _ray_nodes(self) -> list[dict[str, object]]:
            def node(ip: str, res: dict[str, float], alive: bool = True) -> dict[str, object]:
                return {
                    "NodeID": ip * 4,
                    "NodeManagerAddress": ip,
                    "Alive": alive,
                    "Resources": res,
                }

            return [
                node("10.0.0.1", {"GPU": 4.0, "CPU": 32.0, "accelerator_type:A100": 1.0}),
                node("10.0.0.2", {"GPU": 2.0, "CPU": 16.0, "accelerator_type:T4": 1.0}),
                node("10.0.0.3", {"CPU": 8.0}),  # no GPU: no slot
            ]

    ex = Listed(init=False)
    assert ex.shares_slots and ex.slot_resource == "GPU"  # a guest takes half a bundle
    assert [(n.slots, n.gpu_type) for n in ex.nodes()] == [(4, "a100"), (2, "t4")]
    assert ray_executor.node_gpu_type({"CPU": 8.0}) == DEFAULT_GPU_TYPE


def test_types_are_detected_from_the_driver_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``nvidia-smi`` stands in for a machine with two GPU types (this one has none)."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'test "$1" = "--query-gpu=name" || exit 3\n'
        "printf 'Tesla V100-SXM2-16GB\\nTesla T4\\nTesla V100-SXM2-16GB\\n'\n"
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert detect_gpu_types() == ["v100", "t4", "v100"]
    ex = LocalExecutor(isolation=Isolation(), warm=False)
    assert ex.uses_gpus()
    assert [(n.name, n.slots, n.gpu_type) for n in ex.nodes()] == [
        ("local-v100", 2, "v100"),
        ("local-t4", 1, "t4"),
    ]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")  # CUDA's 0 and 1 are devices 1 and 2
    assert detect_gpu_types() == ["t4", "v100"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1234")  # a UUID: the name is unknown
    assert detect_gpu_types() == [DEFAULT_GPU_TYPE]

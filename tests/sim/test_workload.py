"""Workload and cluster-spec parsing: errors name the file, line, value and accepted forms."""

from __future__ import annotations

from pathlib import Path

import pytest

from coadapt.sim.cluster import ClusterSpec, parse_cluster
from coadapt.sim.errors import SimInputError
from coadapt.sim.workload import BUNDLED_WORKLOADS, load_workload, parse_workload

HEADER = "name,time,application,num_replicas,batch_size\n"


def test_bundled_workloads_load() -> None:
    assert list(BUNDLED_WORKLOADS)[:8] == [f"pollux-{i}" for i in range(1, 9)]
    assert len(BUNDLED_WORKLOADS) == 32
    wl = load_workload("pollux-6")
    assert wl.name == "pollux-6" and len(wl.jobs) == 160
    apps = [j.application for j in wl.jobs]
    assert apps.count("cifar10") == 67 and apps.count("ncf") == 54
    first = wl.jobs[0]
    assert (first.name, first.submit_time, first.num_replicas, first.batch_size) == (
        "cifar10-0",
        53.0,
        6,
        2048,
    )


@pytest.mark.parametrize(("load", "jobs"), [("0.5", 80), ("1.5", 240), ("2.0", 320)])
def test_the_artifacts_other_job_loads_are_bundled(load: str, jobs: int) -> None:
    for i in range(1, 9):
        wl = load_workload(f"pollux-{i}@{load}")
        assert wl.name == f"pollux-{i}@{load}" and len(wl.jobs) == jobs
    with pytest.raises(SimInputError, match=r"pollux-N@1\.5"):
        load_workload("pollux-9@1.5")


def test_custom_file_loads(small_workload_path: Path) -> None:
    wl = load_workload(str(small_workload_path))
    assert wl.name == "small" and [j.name for j in wl.jobs][:2] == ["bert-0", "ncf-1"]


def test_unknown_application_names_file_line_value_and_accepted() -> None:
    text = HEADER + "a,0,cifar10,1,128\nb,5,resnet,1,128\n"
    with pytest.raises(SimInputError) as err:
        parse_workload(text, "jobs.csv")
    msg = str(err.value)
    assert "jobs.csv:3" in msg and "'resnet'" in msg and "cifar10" in msg and "yolov3" in msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ("a,0,cifar10,1\n", "has 4 fields"),
        ("a,soon,cifar10,1,128\n", "time 'soon'"),
        ("a,-5,cifar10,1,128\n", "time '-5'"),
        ("a,0,cifar10,two,128\n", "num_replicas 'two'"),
        ("a,0,cifar10,0,128\n", "num_replicas 0"),
        ("a,0,cifar10,1,99999\n", "batch_size 99999"),
    ],
)
def test_malformed_rows(row: str, needle: str) -> None:
    with pytest.raises(SimInputError, match=r"w\.csv:2") as err:
        parse_workload(HEADER + row, "w.csv")
    assert needle in str(err.value) and "accepted" in str(err.value)


def test_bad_header_and_duplicates() -> None:
    with pytest.raises(SimInputError, match=r"w\.csv:1: header .* lacks batch_size"):
        parse_workload("name,time,application,num_replicas\n", "w.csv")
    with pytest.raises(SimInputError, match=r"w\.csv:3: duplicate job name 'a'"):
        parse_workload(HEADER + "a,0,bert,1,12\na,1,bert,1,12\n", "w.csv")
    with pytest.raises(SimInputError, match="no jobs"):
        parse_workload(HEADER, "w.csv")


def test_missing_workload_lists_bundled_names() -> None:
    with pytest.raises(SimInputError, match="pollux-1"):
        load_workload("no/such/file.csv")


def test_rows_are_ordered_by_submission_time() -> None:
    wl = parse_workload(HEADER + "late,50,bert,1,12\nearly,10,bert,1,12\n", "w.csv")
    assert [j.name for j in wl.jobs] == ["early", "late"]


def test_cluster_spec() -> None:
    assert parse_cluster("16x4") == ClusterSpec(16, 4)
    assert parse_cluster(" 2X2 ").total_gpus == 4
    assert str(parse_cluster("16x4")) == "16x4"


@pytest.mark.parametrize("spec", ["16by4", "16x", "x4", "16x4x2", "0x4", "16x0", "16x8", ""])
def test_cluster_spec_typos(spec: str) -> None:
    with pytest.raises(SimInputError, match="accepted: NODESxGPUS") as err:
        parse_cluster(spec)
    assert repr(spec) in str(err.value)

"""The wire contract: replica environment round trip, record parsing, enums."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from coadapt.protocol import (
    RESERVED_ENV,
    STATE_KINDS,
    CancelCause,
    GoodputRecord,
    MetricReport,
    ProgressRecord,
    RecordError,
    ReplicaEnv,
    ReplicaEnvError,
    ReplicaStatus,
    param_env_name,
    parse_record,
)


def test_replica_env_round_trips_through_the_environment() -> None:
    env = ReplicaEnv(
        rank=3,
        world_size=4,
        local_rank=1,
        local_world_size=2,
        group_rank=1,
        master_addr="10.0.0.1",
        master_port=1234,
        job_id="j-1",
        num_nodes=2,
        node="b",
        tenant="alice",
        checkpoint_dir="/ck",
        metrics_url="http://127.0.0.1:1/m?token=t",
        job_token="t",
        restarts=2,
        attempt=3,
        batch_mode="fixed",
        checkpoint_every=10,
        checkpoint_interval=2.5,
        max_local_bsz=16,
    )
    wire = env.to_env()
    assert wire["RANK"] == "3" and wire["COADAPT_MAX_LOCAL_BSZ"] == "16"
    assert ReplicaEnv.from_env(wire) == env
    assert set(RESERVED_ENV) <= set(wire)


def test_unset_fields_stay_out_of_the_environment_and_read_back_as_defaults() -> None:
    wire = ReplicaEnv(rank=0, world_size=2, master_port=5000, job_id="j").to_env()
    assert "COADAPT_BATCH_MODE" not in wire and "COADAPT_MAX_LOCAL_BSZ" not in wire
    back = ReplicaEnv.from_env(wire)
    assert back.batch_mode is None and back.local_rank == 0 and back.restarts == 0
    assert ReplicaEnv.from_env({}) == ReplicaEnv()


@pytest.mark.parametrize(
    ("environ", "match"),
    [
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK < WORLD_SIZE"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
        ({"COADAPT_NUM_NODES": "3"}, "COADAPT_NUM_NODES"),
        ({"COADAPT_BATCH_MODE": "elastic"}, "adaptive, fixed_batch, fixed"),
        ({"COADAPT_MAX_LOCAL_BSZ": "-1"}, "COADAPT_MAX_LOCAL_BSZ must be >= 1"),
        ({"COADAPT_CHECKPOINT_INTERVAL": "inf"}, "finite number"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT"),
    ],
)
def test_bad_environments_name_the_variable(environ: dict[str, str], match: str) -> None:
    with pytest.raises(ReplicaEnvError, match=match):
        ReplicaEnv.from_env(environ)


def test_param_env_name() -> None:
    assert param_env_name("lr-max.1") == "COADAPT_PARAM_LR_MAX_1"


def test_records_round_trip_and_odd_fields_are_dropped_not_fatal() -> None:
    rec = ProgressRecord(step=5, epoch=1, loss=0.5, batch_size=64)
    assert parse_record(rec.to_json()) == rec
    odd = parse_record({"kind": "progress", "step": "five", "loss": math.inf, "epoch": True})
    assert odd == ProgressRecord()
    good = parse_record({"kind": "goodput", "profile": [{"m": 1}], "perf": [1], "time": 3})
    assert good == GoodputRecord(profile=[{"m": 1}], time=3.0)
    assert parse_record({"kind": "metric", "value": 2}) == MetricReport(value=2.0)
    assert parse_record({"kind": "from-the-future", "x": 1}) is None
    with pytest.raises(RecordError, match="kind"):
        parse_record({"step": 1})
    with pytest.raises(RecordError, match="object"):
        parse_record([1])
    assert {"progress", "goodput", "checkpoint"} == STATE_KINDS


def test_enums_keep_the_persisted_spelling() -> None:
    assert ReplicaStatus.LIVE == "live" and ReplicaStatus.STARTING.is_live
    assert not ReplicaStatus.LOST.is_live
    assert CancelCause("tune-pruned") is CancelCause.TUNE_PRUNED


def test_the_protocol_does_not_import_torch() -> None:
    """Every replica and the light launcher load it: no torch, numpy or Optuna."""
    code = (
        "import sys, coadapt.protocol; "
        "assert not {'torch', 'numpy', 'optuna'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

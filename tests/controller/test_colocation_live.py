"""GPU sharing switched on by a user: the ``packing_key`` spec field, the ``--colocation`` file,
and the default ``pollux`` packing two real jobs on one slot of a live controller."""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from coadapt.cli import main
from coadapt.controller.colocation import load_colocation, packing_note, parse_rows
from coadapt.controller.db import sqlite_url
from coadapt.controller.errors import SpecError
from coadapt.controller.reconciler import PACKING_KEY, Controller, ControllerConfig
from coadapt.controller.snapshot import build_snapshot
from coadapt.controller.spec import parse_spec
from coadapt.controller.states import JobState
from coadapt.controller.store import Store
from coadapt.executors import FakeExecutor, LocalExecutor
from coadapt.executors.sandbox import Isolation
from coadapt.policies import ClusterSnapshot, JobInfo, NodeInfo, make_policy
from coadapt.service import ServerOptions, build
from coadapt.sim.gpu_types import colocation_table
from tests.controller.test_api import SyncASGI

# Serial: a live packing round is timing-sensitive (`make test` runs it after the parallel
# part, alone).
pytestmark = [pytest.mark.timeout(60), pytest.mark.serial]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "colocation_gavel.json"
RNG = np.random.default_rng(0)


def _row(**over: Any) -> dict[str, Any]:
    return {"a": "cifar10", "b": "ncf", "a_fraction": 0.66, "b_fraction": 0.59, **over}


# -- the file -------------------------------------------------------------------------------
def test_a_row_gives_both_orders_of_its_pair() -> None:
    table = parse_rows([_row(), _row(a="bert", b="bert", a_fraction=0.8, b_fraction=0.8)])
    assert table == {
        ("cifar10", "ncf"): (0.66, 0.59),
        ("ncf", "cifar10"): (0.59, 0.66),
        ("bert", "bert"): (0.8, 0.8),
    }
    # The same pair again, in the other order and agreeing, is fine.
    again = _row(a="ncf", b="cifar10", a_fraction=0.59, b_fraction=0.66)
    assert parse_rows([_row(), again]) == parse_rows([_row()])


@pytest.mark.parametrize(
    ("row", "field", "words"),
    [
        (_row(a="bad key"), "a", "invalid packing key"),
        (_row(b=3), "b", "invalid packing key"),
        (_row(a_fraction=0), "a_fraction", "outside (0, 1]"),
        (_row(b_fraction=1.5), "b_fraction", "outside (0, 1]"),
        (_row(a_fraction=math.nan), "a_fraction", "outside (0, 1]"),
        (_row(b_fraction="fast"), "b_fraction", "not a number"),
        (_row(a_fraction=True), "a_fraction", "not a number"),
        ({"a": "x", "b": "y", "a_fraction": 0.5}, "b_fraction", "missing"),
        (_row(speed=1), "speed", "unknown field"),
        (_row(a="x", b="x", a_fraction=0.5, b_fraction=0.6), "b_fraction", "share alike"),
        ("cifar10,ncf,0.6,0.5", "row", "not a mapping"),
    ],
)
def test_a_bad_row_is_named_with_its_field(row: Any, field: str, words: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_rows([_row(a="ok", b="ok", a_fraction=0.5, b_fraction=0.5), row], "t.json")
    assert err.value.message.startswith(f"--colocation t.json: row 2, field {field}: ")
    assert words in err.value.message
    assert err.value.details[0]["field"] == field


def test_two_rows_that_disagree_are_refused() -> None:
    other = _row(a="ncf", b="cifar10", a_fraction=0.5, b_fraction=0.66)
    with pytest.raises(SpecError, match=r"row 2, .*disagrees with row 1"):
        parse_rows([_row(), other])


def test_json_and_csv_files(tmp_path: Path) -> None:
    rows = tmp_path / "c.json"
    rows.write_text(json.dumps({"rows": [_row()]}))
    csv = tmp_path / "c.csv"
    csv.write_text("a,b,a_fraction,b_fraction\ncifar10, ncf ,0.66,0.59\n")
    assert load_colocation(rows) == load_colocation(csv) == parse_rows([_row()])
    cases = {
        "bad.json": ("{not json", "not JSON"),
        "obj.json": (json.dumps({"a": 1}), "got a JSON dict"),
        "empty.json": ("[]", "no rows"),
        "head.csv": ("a,b,frac\n", "the CSV header is a,b,frac"),
        "row.csv": ("a,b,a_fraction,b_fraction\nx,y,0.5,2\n", "row 1, field b_fraction"),
    }
    for name, (text, words) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(SpecError, match=words) as err:
            load_colocation(tmp_path / name)
        assert str(tmp_path / name) in err.value.message
    with pytest.raises(SpecError, match="cannot read the file"):
        load_colocation(tmp_path / "missing.json")


def test_the_example_file_is_the_simulators_gavel_table() -> None:
    """One set of figures: the live example is what the simulator packs with (4 decimals)."""
    live = load_colocation(EXAMPLE)
    sim = colocation_table()
    assert set(live) == set(sim)
    for pair, (fa, fb) in sim.items():
        assert live[pair] == pytest.approx((fa, fb), abs=1e-4)


# -- the spec and the snapshot --------------------------------------------------------------
def _spec(name: str, key: object, **over: Any) -> dict[str, Any]:
    return {"name": name, "command": "true", "packing_key": key, **over}


def test_packing_key_is_validated_and_reaches_the_policy(tmp_path: Path) -> None:
    assert parse_spec(_spec("a", "resnet18")).packing_key == "resnet18"
    assert parse_spec(_spec("a", None)).packing_key is None
    for bad in ("", "two words", 7, "x" * 65, ["cifar10"]):
        with pytest.raises(SpecError) as err:
            parse_spec(_spec("a", bad))
        assert [d["field"] for d in err.value.details] == ["packing_key"]
        assert "letters, digits" in err.value.details[0]["accepted"]
    store = Store.open(sqlite_url(tmp_path / "c.db"))
    try:
        tenant = store.create_tenant("alice", 0.0)[0]
        jobs = [
            store.create_job(tenant, parse_spec(_spec("a", "cifar10")), 1.0),
            store.create_job(tenant, parse_spec(_spec("b", None)), 2.0),
        ]
        snap = build_snapshot(jobs, 1, 3.0, 30.0)
        assert [j.packing_key for j in snap.jobs.values()] == ["cifar10", None]
    finally:
        store.close()


def test_packing_note_says_why_a_job_never_packs() -> None:
    known = frozenset({"cifar10", "ncf"})
    assert packing_note(None, known, True) is None
    assert packing_note("cifar10", known, True) is None
    assert "not in the controller's co-location table" in str(packing_note("bert", known, True))
    assert "cifar10, ncf" in str(packing_note("bert", known, True))
    assert "no co-location table" in str(packing_note("bert", frozenset(), True))
    assert "cannot share a slot" in str(packing_note("cifar10", known, False))


# -- the policy ------------------------------------------------------------------------------
def test_a_young_packed_pair_stays_packed() -> None:
    """Regression: pollux read "does the guest stay on its GPU?" from the snapshot in which
    it had hidden the guest's allocation, so a pair younger than the restart delay δ (every
    pair, on its second round) was split up and re-packed every other round. The pair is
    cifar10 + ncf: one that also saves summed completion time (the default ``"jct"`` rule;
    two cifar10 jobs keep 1.08 GPUs between them, which does not)."""

    def job(name: str) -> JobInfo:
        key = "cifar10" if name == "host" else "ncf"
        return JobInfo(name, 0.0, min_replicas=1, max_replicas=1, max_gpus_held=1, packing_key=key)

    snap = ClusterSnapshot(
        now=2.0,
        nodes=(NodeInfo("local", 1),),
        jobs={"host": job("host"), "guest": job("guest")},
        current={"host": (1,), "guest": (1,)},
        restart_delay=30.0,
        colocation=load_colocation(EXAMPLE),
    )
    decision = make_policy("pollux").optimize(snap, {}, RNG)
    assert decision.packed == {"guest": "host"}
    assert decision.allocations == {"host": (1,), "guest": (1,)}
    first = make_policy("pollux").optimize(replace(snap, current={}), {}, RNG)
    assert first.packed == {"guest": "host"}  # both waiting: one runs, the other joins it


# -- a live controller ------------------------------------------------------------------------
# Records when it ran (in its job directory, its HOME), then sleeps.
JOB = """
import json, os, sys, time
start = time.time()
time.sleep(float(sys.argv[1]))
out = {"start": start, "end": time.time(), "pid": os.getpid(),
       "devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
with open(os.path.join(os.environ["HOME"], "ran.json"), "w") as f:
    json.dump(out, f)
"""


def test_pollux_packs_two_real_jobs_on_one_slot(tmp_path: Path) -> None:
    """The default policy with the example table, on a 1-slot local machine: two 1-slot
    jobs with packing keys run at the same time on slot 0, both succeed, one attempt each,
    and the packing is cleared once they are done."""
    store = Store.open(sqlite_url(tmp_path / "coadapt.db"))
    try:
        script = tmp_path / "sleeper.py"
        script.write_text(JOB)
        tenant = store.create_tenant("alice", time.time())[0]
        jobs = [
            store.create_job(
                tenant,
                parse_spec(
                    {
                        "name": name,
                        "command": [sys.executable, str(script), seconds],
                        "working_dir": str(tmp_path),
                        "min_replicas": 1,
                        "max_replicas": 1,
                        "max_restarts": 0,
                        "packing_key": key,
                    }
                ),
                time.time(),
            )
            for name, key, seconds in (("host", "cifar10", "2.0"), ("guest", "ncf", "3.0"))
        ]
        executor = LocalExecutor(slots=1, isolation=Isolation(), warm=False)
        config = ControllerConfig(
            state_dir=tmp_path / "state",
            interval=0.3,
            stop_grace=5.0,
            min_round_gap=0.0,
            colocation=load_colocation(EXAMPLE),
        )
        ctl = Controller(store, executor, make_policy("pollux"), config)
        packings = []
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            ctl.step()
            packings.append(ctl.packing())
            if all(store.get_job(j.id).state.is_terminal for j in jobs):
                break
            time.sleep(0.1)
        host, guest = jobs
        states = {j.name: store.get_job(j.id).state for j in jobs}
        assert states == {"host": JobState.SUCCEEDED, "guest": JobState.SUCCEEDED}
        assert {guest.id: host.id} in packings
        for j in jobs:  # one attempt each, on slot 0: packing is not a rescale
            assert [(r.attempt, r.node, r.slot) for r in store.replicas(j.id)] == [(1, "local", 0)]
        ran = {j.name: json.loads((ctl.job_dir(j.id) / "ran.json").read_text()) for j in jobs}
        assert ran["host"]["pid"] != ran["guest"]["pid"]  # two processes ...
        assert ran["guest"]["start"] < ran["host"]["end"]  # ... at the same time
        assert ran["host"]["start"] < ran["guest"]["end"]
        assert ran["host"]["devices"] == ran["guest"]["devices"]  # same GPUs, if any
        assert ctl.packing() == {} and json.loads(store.meta_get(PACKING_KEY) or "{}") == {}
    finally:
        store.close()


# -- the server ------------------------------------------------------------------------------
class _NoSharing(FakeExecutor):
    shares_slots = False


def test_the_server_hands_the_table_on_and_says_when_a_key_cannot_pack(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    table = load_colocation(EXAMPLE)
    options = ServerOptions(state_dir=tmp_path / "s", slots=1, isolation="none", colocation=table)
    app, ctl, store = build(options, executor=FakeExecutor(slots=1))
    try:
        assert ctl.config.colocation == table
        token = (tmp_path / "s" / "admin-token").read_text().strip()
        client = SyncASGI(app)
        auth = {"Authorization": f"Bearer {token}"}
        ids = {}
        for key in ("cifar10", "resnet18"):
            resp = client.post("/api/v1/jobs", json=_spec(key, key), headers=auth)
            assert resp.status_code == 201, resp.text
            ids[key] = resp.json()["id"]
        notes = {k: [e.message for e in store.events(i)] for k, i in ids.items()}
        assert not any("packing_key" in m for m in notes["cifar10"])
        assert any(
            "'resnet18' is not in the controller's co-location table" in m
            for m in notes["resnet18"]
        )
        bad = client.post("/api/v1/jobs", json=_spec("x", "not ok"), headers=auth)
        assert bad.status_code == 422 and bad.json()["details"][0]["field"] == "packing_key"
    finally:
        store.close()
    with caplog.at_level(logging.WARNING, logger="coadapt.controller"):
        _, _, store = build(replace(options, state_dir=tmp_path / "t"), executor=_NoSharing(1))
    store.close()
    assert "cannot share a slot" in caplog.text and "no job is packed" in caplog.text


def test_a_bad_file_stops_coadapt_server_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps([_row(), _row(a="bert", b_fraction=1.5)]))
    state = tmp_path / "state"
    assert main(["server", "--state-dir", str(state), "--colocation", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"--colocation {bad}: row 2, field b_fraction: 1.5 is outside (0, 1]" in err
    assert not state.exists()  # refused before anything started

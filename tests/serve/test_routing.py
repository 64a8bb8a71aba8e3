"""The controller <-> gateway contract: route tables on disk, stats, the demand window."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from coadapt.serve.routing import (
    ROUTES_FILE,
    Backend,
    GatewayStats,
    RouteError,
    RouteTable,
    SecondStats,
    demand_window,
)


def test_a_route_table_round_trips_through_its_file(tmp_path: Path) -> None:
    table = RouteTable(
        "web", "mlp", 3, (Backend("7", "127.0.0.1", 8001),), admit_rps=12.5, retry_after_s=9.0
    )
    table.write(tmp_path)
    assert RouteTable.read(tmp_path) == table
    assert not [p for p in tmp_path.iterdir() if p.name != ROUTES_FILE]  # no temp file left


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"generation": "3"}, "generation"),
        ({"backends": [{"replica": "1", "host": "127.0.0.1", "port": 0}]}, "port"),
        ({"admit_rps": -1}, "admit_rps"),
        ({"admit_rps": True}, "admit_rps"),
        ({"hold_s": 0}, "hold_s"),
        ({"slo_quantile": 1.0}, "slo_quantile"),
    ],
)
def test_a_bad_route_table_names_the_field(change: dict[str, object], field: str) -> None:
    good = RouteTable("web", "mlp", 1).to_json()
    with pytest.raises(RouteError, match=field):
        RouteTable.from_json({**good, **change})


def test_an_unreadable_file_is_a_route_error(tmp_path: Path) -> None:
    (tmp_path / ROUTES_FILE).write_text("{not json")
    with pytest.raises(RouteError, match="cannot read"):
        RouteTable.read(tmp_path)
    with pytest.raises(RouteError, match="missing"):
        RouteTable.from_json(json.loads('{"deployment": "web"}'))


def test_stats_round_trip() -> None:
    stats = GatewayStats(
        "web",
        4,
        1000.5,
        (SecondStats(999, offered=10, served=9, within_slo=9, shed=1, latency_q_s=0.02),),
        backends=2,
        cold_starts_s=(3.5,),
        totals={"offered": 10},
    )
    assert GatewayStats.from_json(json.loads(json.dumps(stats.to_json()))) == stats


def test_consecutive_windows_cover_every_second_exactly_once() -> None:
    seconds = [
        SecondStats(t, offered=t - 99, served=t - 99, latency_q_s=0.01, backends=1)
        for t in range(100, 112)
    ]
    cuts = [100.0, 103.4, 103.9, 107.2, 112.0]
    got: list[float] = []
    for a, b in itertools.pairwise(cuts):
        got.extend(demand_window(seconds, a, b, replicas=1).rates)
    assert got == [float(t - 99) for t in range(100, 112)]


def test_the_window_fills_silent_seconds_and_samples_only_served_ones() -> None:
    seconds = [
        SecondStats(10, offered=4, served=4, latency_q_s=0.03, backends=2),
        SecondStats(12, offered=5, served=0, held=5, backends=0),
    ]
    w = demand_window(seconds, 10.0, 13.0, replicas=0)
    assert w.rates == (4.0, 0.0, 5.0)
    assert [(s.load_rps, s.latency_s) for s in w.samples] == [(2.0, 0.03)]
    assert (w.end, w.replicas) == (13.0, 0)


def test_samples_carry_the_pool_that_served_them() -> None:
    """The gateway routes least-outstanding over all its backends: a second's latency is the
    pool's, so the sample says how many replicas shared the load (issue 17); a stats document
    without per-second backends (an older gateway) gives no sample rather than a guess."""
    seconds = [
        SecondStats(20, offered=90, served=90, latency_q_s=0.004, backends=3),
        SecondStats(21, offered=80, served=80, latency_q_s=0.004, backends=4),
    ]
    w = demand_window(seconds, 20.0, 22.0, replicas=4)
    assert [(s.load_rps, s.replicas, s.total_rps) for s in w.samples] == [
        (30.0, 3, 90.0),
        (20.0, 4, 80.0),
    ]
    old = {"deployment": "web", "generation": 1, "now": 22.0,
           "seconds": [{"t": 20, "offered": 9, "served": 9, "latency_q_s": 0.01}]}  # fmt: skip
    stats = GatewayStats.from_json(old)
    assert demand_window(stats.seconds, 20.0, 21.0, replicas=1).samples == ()

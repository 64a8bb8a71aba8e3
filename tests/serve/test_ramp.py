"""``benchmarks/serve/ramp.py``: the schedule's arrival times (pure), and a short open-loop ramp
against a real gateway in front of a real replica (served, then shed)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.serve.ramp import Phase, Schedule, arrivals, format_rows, main, run_ramp
from tests.serve.conftest import KW, Server, publish_mlp, start_server, stop_server
from tests.serve.test_gateway import Gw, start_gateway

BODY = json.dumps({"instances": [[0.1] * KW["in_features"]]}).encode()


def test_even_arrivals_follow_the_rate() -> None:
    s = Schedule.ramp(20, factor=5, warm_s=2, up_s=4, peak_s=1, down_s=4, cool_s=2)
    assert s.duration == 13 and s.expected() == 2 * 20 + 4 * 60 + 100 + 4 * 60 + 2 * 20
    times = arrivals(s)
    assert len(times) == s.expected()
    assert all(a < b for a, b in itertools.pairwise(times))
    per_second = [sum(1 for t in times if i <= t < i + 1) for i in range(13)]
    for i, n in enumerate(per_second):
        want = (s.rate_at(i) + s.rate_at(i + 1 - 1e-9)) / 2
        assert abs(n - want) <= 1, (i, n, want)
    assert arrivals(s, limit=7) == times[:7]
    assert Schedule.parse("0-10:2").expected() == 10 and arrivals(Schedule.parse("0:5")) == []


def test_poisson_arrivals_are_seeded_and_near_the_rate() -> None:
    s = Schedule((Phase(20, 50, 50),))
    a, b = arrivals(s, poisson=True, seed=3), arrivals(s, poisson=True, seed=3)
    assert a == b and a != arrivals(s, poisson=True, seed=4)
    assert abs(len(a) - 1000) < 4 * 1000**0.5  # four standard deviations


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Schedule(()), "at least one phase"),
        (lambda: Schedule((Phase(0, 1, 1),)), "seconds = 0"),
        (lambda: Schedule((Phase(1, -1, 1),)), "start_rps = -1"),
        (lambda: Schedule((Phase(4000, 1, 1),)), "at most 1800"),
        (lambda: Schedule.parse("20:ten"), "RATE[-RATE]:SECONDS"),
        (lambda: Schedule.parse("20"), "RATE[-RATE]:SECONDS"),
        (lambda: run_ramp("http://10.0.0.1:80", "m", b"", Schedule.parse("1:1")), "loopback"),
    ],
)
def test_bad_input_names_the_field(make: object, match: str) -> None:
    with pytest.raises(ValueError, match=match.replace("[", r"\[").replace("]", r"\]")):
        make()  # type: ignore[operator]


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("ramp-models") / "mlp"
    publish_mlp(root, seed=1)
    srv = start_server(root, "--workers", "1")
    try:
        yield srv
    finally:
        stop_server(srv.proc)


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Gw]:
    g = start_gateway(tmp_path / "gateway")
    try:
        yield g
    finally:
        stop_server(g.proc)


def test_a_short_ramp_through_the_gateway(replica: Server, gw: Gw) -> None:
    gw.route(1, replica)
    gw.wait_generation(1)
    schedule = Schedule.parse("20-60:3")
    result = run_ramp(f"http://127.0.0.1:{gw.port}", "mlp", BODY, schedule, timeout_s=10)
    assert len(result.samples) == 120 and result.errors == 0 and result.shed == 0
    rows = result.rows(every_s=1)
    assert [round(r["rate"]) for r in rows] == [27, 40, 53]  # the schedule's, not the server's
    assert all(r["ok"] == round(r["rate"]) and r["p99_ms"] >= r["p50_ms"] > 0 for r in rows)
    assert result.slo_attainment(60.0) == 1.0
    assert gw.stats().totals["served"] == 120  # the gateway counted the same requests
    assert "p99_ms" in format_rows(rows)


def test_a_ramp_over_admit_rps_is_shed_with_503(replica: Server, gw: Gw, tmp_path: Path) -> None:
    gw.route(1, replica, admit_rps=10.0, retry_after_s=5.0)
    gw.wait_generation(1)
    out = tmp_path / "ramp.json"
    code = main(["--url", f"http://127.0.0.1:{gw.port}", "--model", "mlp", "--schedule",
                 "40:2", "--features", str(KW["in_features"]), "--every-s", "1",
                 "--json", str(out)])  # fmt: skip
    doc = json.loads(out.read_text())
    assert code == 0 and doc["requests"] == 80 and doc["errors"] == 0
    served = doc["requests"] - doc["shed_503"]
    # admitted: the 10-request burst at least, about 10/s more (loose: arrivals may bunch or
    # stretch on a loaded machine); far below the 80 offered
    assert 10 <= served <= 45 and doc["shed_503"] == gw.stats().totals["shed"]
    assert [r["shed_503"] > 0 for r in doc["rows"]] == [True, True]

"""The live demo's table fits an 80-column terminal without mangling the job names."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from coadapt.controller.demo import DEFAULT_JOBS, _table


def _view(i: int, name: str, state: str) -> dict[str, Any]:
    return {
        "id": f"j-{i}",
        "name": name,
        "state": state,
        "batch_size": 2048,
        "local_bsz": 512,
        "accum_steps": 3,
        "goodput": 12345.6,
        "speedup": 3.99,
        "step": 123456,
        "epoch": 299,
        "metrics": {"accuracy": 0.97231},
        "restarts": 12,
    }


def test_live_table_fits_80_columns_with_wide_values() -> None:
    names = [j.name for j in DEFAULT_JOBS]
    states = ["RUNNING", "SUCCEEDED", "RESCALING", "PENDING"]
    views = [_view(i, n, s) for i, (n, s) in enumerate(zip(names, states, strict=True))]
    views.append(_view(9, "a-much-longer-job-name", "CANCELLED"))
    cluster = {"policy": "pollux", "used": 4, "slots": 4, "jobs": [{"id": "j-0", "slots": [0, 1]}]}
    console = Console(width=80, record=True, force_terminal=False, color_system=None)
    console.print(_table(views, cluster, 1234.0))
    lines = console.export_text().splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    body = [line for line in lines if line.startswith((*names, "a-much"))]
    assert len(body) == len(views)  # one line per job: nothing wrapped
    for name in names:  # the demo's names whole, a long one cut but recognisable
        assert any(line.startswith(name + " ") for line in body)
    assert any(line.startswith("a-much-lon") for line in body)
    assert "…" not in "".join(lines[:3])  # no header or title cut
    row = next(line for line in body if line.startswith(names[0]))
    for cell in ("running", "2048 (512×4)", "12346", "3.99", "123456", "299", "0.972", "12"):
        assert f" {cell}" in row, (cell, row)

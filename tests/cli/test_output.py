"""Tables and help are plain text in a pipe, styled on a terminal, colourless with NO_COLOR."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from coadapt.cli.output import fmt, table

ROOT = Path(__file__).resolve().parents[2]
SGR = re.compile(r"\x1b\[([0-9;]*)m")


def colours(text: str) -> set[str]:
    """The colour parameters (30-38, 40-48, 90-107) of every SGR escape in ``text``."""
    found: set[str] = set()
    for params in SGR.findall(text):
        for p in params.split(";"):
            if p.isdigit() and (30 <= int(p) <= 48 or 90 <= int(p) <= 107):
                found.add(p)
    return found


def test_a_piped_table_is_plain_one_line_per_row(capsys: pytest.CaptureFixture[str]) -> None:
    wide = "x" * 300  # wider than any terminal: still one line in a pipe
    table([["job-1", "RUNNING", wide], ["job-22", "-", "y"]], ["ID", "STATE", "NOTE"])
    lines = capsys.readouterr().out.splitlines()
    assert "\x1b" not in "".join(lines)
    assert len(lines) == 3
    assert lines[0].split() == ["ID", "STATE", "NOTE"]
    assert lines[1].split() == ["job-1", "RUNNING", wide]
    assert lines[2].split() == ["job-22", "-", "y"]
    # Columns are aligned: every row's second cell starts where its header does.
    assert lines[1].index("RUNNING") == lines[0].index("STATE") == lines[2].index(" - ") + 1


def test_an_empty_table_is_its_header_line(capsys: pytest.CaptureFixture[str]) -> None:
    table([], ["ID", "NAME"])
    assert capsys.readouterr().out.splitlines() == ["ID  NAME"]


def test_fmt() -> None:
    assert fmt(None) == "-" and fmt(1.25, 1) == "1.2" and fmt(3) == "3" and fmt("a") == "a"


def _render(env: dict[str, str]) -> str:
    """`coadapt --help` and a table, rendered in a child with ``env`` (rich reads it)."""
    code = (
        "from coadapt.cli import main\nfrom coadapt.cli.output import table\n"
        "main(['ls', '--help'])\ntable([['a', 'b']], ['ID', 'STATE'])\n"
    )
    base = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**base, "PYTHONPATH": str(ROOT), "TERM": "xterm-256color", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_a_terminal_gets_styles_and_no_color_removes_the_colours() -> None:
    piped = _render({})
    assert "\x1b" not in piped
    terminal = _render({"FORCE_COLOR": "1"})  # as if stdout were a terminal
    assert colours(terminal), "a terminal's help is coloured"
    assert "\x1b[1mID" in terminal  # the table's header is bold
    no_color = _render({"FORCE_COLOR": "1", "NO_COLOR": "1"})
    assert not colours(no_color), sorted(colours(no_color))
    assert SGR.sub("", no_color) == SGR.sub("", terminal)  # same text, only the colour goes

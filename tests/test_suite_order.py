"""The suite's collection order (tests/conftest.py): the longest files go first."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import LONGEST_FIRST

ROOT = Path(__file__).resolve().parents[1]


def test_every_file_in_the_longest_first_list_exists_once() -> None:
    missing = [path for path in LONGEST_FIRST if not (ROOT / path).is_file()]
    assert not missing, f"remove or rename these entries of LONGEST_FIRST: {missing}"
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)


def test_the_session_runs_the_listed_files_first(request: pytest.FixtureRequest) -> None:
    files = [item.path.relative_to(ROOT).as_posix() for item in request.session.items]
    assert files, "the session collected nothing"
    ranks = [LONGEST_FIRST.index(f) if f in LONGEST_FIRST else len(LONGEST_FIRST) for f in files]
    assert ranks == sorted(ranks), files[:5]

"""Skip a test for a missing service or tool only outside CI.

On a developer's machine a missing PostgreSQL or namespace support skips with the reason;
under CI (``CI=true``, or ``COADAPT_REQUIRE_ALL=1``) it fails instead, because `.ci/run`
installs and starts everything the suite needs and a silent skip would hide a broken install.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def strict() -> bool:
    """True where every requirement must be met (CI)."""
    return os.environ.get("CI", "").lower() == "true" or os.environ.get(
        "COADAPT_REQUIRE_ALL", ""
    ) not in ("", "0")


def unavailable(why: str) -> NoReturn:
    """Skip with the reason, or fail under CI where `.ci/run` should have provided it."""
    if strict():
        pytest.fail(f"required under CI but unavailable: {why}", pytrace=False)
    pytest.skip(why)

"""Suite-wide collection order: the longest test files first.

`make test` spreads whole files over two pytest-xdist workers (``--dist loadfile``) in
collection order. Alphabetical order left the longest file (the Ray scenario, ~90 s) for the
end, where one worker ran it alone while the other sat idle. Handing out the longest files
first (the LPT rule) keeps both workers busy to the end. The list is measured, not guessed:

    pytest -n 2 --dist loadfile -m "not serial" --junitxml=OUT.xml

then sum each file's test times (2026-11-29, 2-core VM). A file missing from the list only
runs later; a stale entry costs nothing.
"""

from __future__ import annotations

import pytest

#: Test files of more than ~20 s in a parallel run, longest first.
LONGEST_FIRST = (
    "tests/executors/test_ray.py",
    "tests/controller/test_integration.py",
    "tests/deploy/test_live.py",
    "tests/sparse/test_bench_sections.py",
    "tests/tune/test_samplers.py",
    "tests/deploy/test_plane_ray.py",
    "tests/tune/test_live.py",
    "tests/serve/test_table_shards.py",
    "tests/cli/test_model.py",
    "tests/registry/test_gates.py",
    "tests/train/test_model.py",
    "tests/executors/test_conformance.py",
    "tests/registry/test_runner.py",
    "tests/controller/test_api_fuzz.py",
    "tests/controller/test_client_retry.py",
    "tests/controller/test_sparse_job.py",
    "tests/serve/test_gateway.py",
    "tests/executors/test_ray_packing.py",
    "tests/deploy/test_plane.py",
    "tests/sparse/test_models.py",
    "tests/controller/test_final_step.py",
)
_RANK = {path: i for i, path in enumerate(LONGEST_FIRST)}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Stable sort by file rank: the listed files first, in list order, then the rest as
    collected (tests within a file keep their order, so module fixtures still start once)."""
    root = config.rootpath
    items.sort(key=lambda item: _RANK.get(item.path.relative_to(root).as_posix(), len(_RANK)))

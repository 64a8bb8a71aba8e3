"""The sparse jobs' panel (``dashboard/static/sparse.js``) rendered by headless Chromium from a
job view shaped like ``GET /api/v1/ui/jobs/{id}``: cards, one table row and one plotted series
per shard, and the per-shard series kept out of the generic user-metric plots. Skipped like
the other browser tests when Chromium or Playwright is missing."""

from __future__ import annotations

from typing import Any

import pytest

from coadapt.controller.dashboard.routes import STATIC
from tests.controller.test_dashboard_browser import CHROMIUM, CHROMIUM_ARGS, SKIP

pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

VIEW: dict[str, Any] = {
    "now": 200.0,
    "job": {
        "id": "j1",
        "submit_time": 100.0,
        "finished_at": None,
        "spec": {"sparse": {"servers": 2}},
        "metrics": {
            "samples_per_s": 5120.5,
            "window_auc": 0.7712,
            "sparse/rows": 30.0,
            "sparse/rows/shard0": 12.0,
            "sparse/rows/shard1": 18.0,
            "sparse/pushed_bytes": 123_456_789.0,
        },
    },
    "user_metrics": {
        "samples_per_s": [[110.0, 4000.0, 1], [150.0, 5120.0, 2]],
        "sparse/rows/shard0": [[110.0, 5.0, 1], [150.0, 12.0, 2]],
        "sparse/rows/shard1": [[110.0, 8.0, 1], [150.0, 18.0, 2]],
    },
}

PROBE = """(d) => {
  const el = sparsePanel(d, '#1f6feb');
  document.body.append(el);
  return {
    shards: [...document.querySelectorAll('#sparse-shards tr[data-shard]')].map(
      (r) => r.textContent),
    paths: document.querySelectorAll('#sparse-panel svg path').length,
    cards: document.querySelector('#sparse-panel .cards').textContent,
    owns: [sparseOwns('sparse/rows/shard3'), sparseOwns('samples_per_s')],
  };
}"""


def test_sparse_panel_renders_rows_per_shard_and_throughput() -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_content("<html><body><main id='main'></main></body></html>")
            page.add_script_tag(content=(STATIC / "app.js").read_text())  # h, plot, card, fmt
            page.add_script_tag(content=(STATIC / "sparse.js").read_text())
            got = page.evaluate(PROBE, VIEW)
        finally:
            browser.close()
    assert got["shards"] == ["01240 %", "11860 %"]  # shard, rows, share
    assert got["paths"] >= 3  # two shard series and the throughput line
    assert "5121" in got["cards"] and "123 MB" in got["cards"] and "0.7712" in got["cards"]
    assert got["owns"] == [True, False]

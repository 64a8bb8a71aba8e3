"""``/metrics`` series of sparse jobs: throughput, rows per shard, push bytes."""

from __future__ import annotations

from coadapt.controller.prom_sparse import SPARSE_PREFIX
from coadapt.controller.states import JobState
from coadapt.sparse.client import SPARSE_METRIC_PREFIX
from tests.controller.test_api import Api, submit
from tests.controller.test_prom import api, scrape  # noqa: F401  (the fixture)


def test_the_prefix_is_the_one_workers_report() -> None:
    assert SPARSE_PREFIX == SPARSE_METRIC_PREFIX


def test_sparse_job_metrics_become_series(api: Api) -> None:  # noqa: F811
    a = submit(api, "alice", name="ctr")
    b = submit(api, "bob", name="dense")
    fams = scrape(api)
    for name in ("coadapt_job_samples_per_s", "coadapt_sparse_rows", "coadapt_sparse_pushed_bytes"):
        assert name in fams and fams[name] == []  # announced, no samples yet
    api.store.update_job(a, 1.0, state=JobState.RUNNING, replicas=1)
    metrics = {
        "samples_per_s": 5120.5,
        "window_auc": 0.77,
        "sparse/rows": 30.0,
        "sparse/rows/shard0": 12.0,
        "sparse/rows/shard1": 18.0,
        "sparse/rows/shardx": 1.0,  # not a shard number: ignored
        "sparse/pushed_bytes": 4096.0,
    }
    api.store.merge_report(a, {"metrics": metrics})
    api.store.merge_report(b, {"metrics": {"samples_per_s": float("nan")}})  # not finite: left out
    fams = scrape(api)
    [rate] = fams["coadapt_job_samples_per_s"]
    assert (rate.labels, rate.value) == ({"job": a, "tenant": "alice"}, 5120.5)
    rows = {s.labels["shard"]: s.value for s in fams["coadapt_sparse_rows"]}
    assert rows == {"0": 12.0, "1": 18.0}
    assert [s.value for s in fams["coadapt_sparse_pushed_bytes"]] == [4096.0]

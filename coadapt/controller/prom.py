"""Prometheus exposition of the controller's state (``GET /metrics``, see :mod:`.api`).

Level-triggered: a :class:`StoreCollector` reads the store at every scrape and reports what
is there now, so nothing is counted in-process and nothing drifts across restarts or between
several API processes over one database. Each app gets its own :class:`CollectorRegistry`
(never the global default one), so apps and tests don't collide.

Cluster series: ``coadapt_slots_total``, ``coadapt_slots_allocated`` (replicas starting or
live, as ``/api/v1/cluster`` counts them), ``coadapt_jobs{state}`` (one sample per
:class:`JobState`, zeros included) and ``coadapt_scheduling_rounds_total`` (the policy round
count the reconciler persists in the store's ``policy_round`` meta key). Per GPU type
(``gpu_type`` label, one sample per type the cluster has): ``coadapt_slots`` (slots of the
type) and ``coadapt_slots_used`` (slots of the type holding at least one starting or live
replica; two packed jobs on one slot use it once).

Per-job series, labelled ``job`` (id) and ``tenant`` (name), for active jobs only (PENDING,
RUNNING, RESCALING; finished jobs would otherwise grow the series without bound):
``coadapt_job_replicas``, ``coadapt_job_restarts``, ``coadapt_job_batch_size`` (the last
reported batch size, else the submitted one), ``coadapt_job_goodput`` (last reported current
goodput) and ``coadapt_job_speedup`` (as the API computes it). A value the job has not
reported (or that is not finite) is left out rather than invented.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from coadapt.controller.prom_sparse import add_sparse_samples, sparse_families
from coadapt.controller.snapshot import speedup
from coadapt.controller.states import ACTIVE, JobState
from coadapt.controller.store import Job, Store

JOB_LABELS = ("job", "tenant")


def _finite(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def _families() -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
    """Empty families, in exposition order (``describe`` and ``collect`` share them)."""
    gauges = {
        "slots_total": "Slots (GPUs) the controller schedules.",
        "slots_allocated": "Slots held by starting or live replicas.",
    }
    fams: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
        k: GaugeMetricFamily(f"coadapt_{k}", doc) for k, doc in gauges.items()
    }
    fams["slots"] = GaugeMetricFamily(
        "coadapt_slots", "Slots (GPUs) of each GPU type.", labels=["gpu_type"]
    )
    fams["slots_used"] = GaugeMetricFamily(
        "coadapt_slots_used", "Slots of each GPU type held by replicas.", labels=["gpu_type"]
    )
    fams["jobs"] = GaugeMetricFamily("coadapt_jobs", "Jobs by state.", labels=["state"])
    fams["rounds"] = CounterMetricFamily(
        "coadapt_scheduling_rounds", "Policy (scheduling) rounds run so far."
    )
    per_job = {
        "replicas": "Replicas the job runs on now.",
        "batch_size": "The job's current total batch size.",
        "goodput": "The job's last reported goodput (examples/s, statistically adjusted).",
        "speedup": "Predicted goodput on its replicas over goodput on one replica.",
        "restarts": "Times the job was restarted (rescaled or retried).",
    }
    for k, doc in per_job.items():
        fams[f"job_{k}"] = GaugeMetricFamily(f"coadapt_job_{k}", doc, labels=list(JOB_LABELS))
    fams.update(sparse_families())  # throughput, rows per shard, push bytes (prom_sparse)
    return fams


def _job_values(job: Job) -> dict[str, float | None]:
    report = job.report or {}
    good = report.get("goodput")
    return {
        "job_replicas": float(job.replicas),
        "job_restarts": float(job.num_restarts),
        "job_batch_size": _finite(report.get("batch_size", job.spec.get("batch_size"))),
        "job_goodput": _finite(good.get("current_goodput")) if isinstance(good, dict) else None,
        "job_speedup": _finite(speedup(job, job.replicas)) if job.replicas > 0 else None,
    }


class StoreCollector(Collector):
    """Reads the controller's current state from ``store`` at scrape time."""

    def __init__(
        self,
        store: Store,
        slots: Callable[[], int],
        nodes: Callable[[], Sequence[tuple[str, int, str]]] | None = None,
    ) -> None:
        self.store = store
        self.slots = slots  # read at scrape time: nodes join and leave
        self.nodes = nodes  # (name, slots, GPU type) of each node; None: no per-type series

    def describe(self) -> Iterable[Metric]:
        return list(_families().values())

    def collect(self) -> Iterable[Metric]:
        return list(self._collect())

    def _collect(self) -> Iterator[Metric]:
        fams = _families()
        store = self.store
        fams["slots_total"].add_metric([], float(self.slots()))
        live = store.replicas(statuses=("starting", "live"))
        fams["slots_allocated"].add_metric([], float(len(live)))
        if self.nodes is not None:
            inventory = list(self.nodes())
            type_of = {name: t for name, _, t in inventory}
            per_type: dict[str, float] = {}
            for _, n, t in inventory:
                per_type[t] = per_type.get(t, 0.0) + n
            used: dict[str, set[tuple[str, int]]] = {t: set() for t in per_type}
            for rep in live:
                held = type_of.get(rep.node)
                if held is not None:
                    used[held].add((rep.node, rep.slot))
            for t in sorted(per_type):
                fams["slots"].add_metric([t], per_type[t])
                fams["slots_used"].add_metric([t], float(len(used[t])))
        jobs = store.list_jobs()
        counts = dict.fromkeys(JobState, 0)
        for job in jobs:
            counts[job.state] += 1
        for state, n in counts.items():
            fams["jobs"].add_metric([state.value], float(n))
        rounds = store.meta_get("policy_round")
        fams["rounds"].add_metric([], float(int(rounds)) if rounds else 0.0)
        tenants = {t.id: t.name for t in store.tenants()}
        for job in jobs:
            if job.state not in ACTIVE:
                continue
            labels = [job.id, tenants.get(job.tenant_id, job.tenant_id)]
            for key, value in _job_values(job).items():
                if value is not None:
                    fams[key].add_metric(labels, value)
            add_sparse_samples(fams, (job.report or {}).get("metrics"), labels)
        yield from fams.values()


def metrics_registry(
    store: Store,
    slots: Callable[[], int],
    nodes: Callable[[], Sequence[tuple[str, int, str]]] | None = None,
) -> CollectorRegistry:
    """A fresh registry holding only this controller's :class:`StoreCollector`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, slots, nodes))
    return registry

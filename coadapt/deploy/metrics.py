"""``/metrics`` series of deployments: replicas from the store, load and latency from the
gateways.

Level-triggered like :mod:`coadapt.controller.prom`: a :class:`DeploymentCollector` reads the
deployment and replica rows at every scrape and asks each gateway for its figures (all at once,
:data:`~coadapt.deploy.live.STATS_TIMEOUT_S` at most), so nothing is counted in this process.
Labelled ``deployment`` (the scheduling name: unique across tenants), for deployments being
served or deleted:

* ``coadapt_deployment_replicas{deployment,state}`` — replicas per state (starting, ready,
  draining, stopping; zeros included);
* ``coadapt_deployment_replicas_desired{deployment}`` — what its autoscaler asked for in the
  last co-scheduling round (absent before one);
* ``coadapt_deployment_slo_seconds{deployment}`` — the latency SLO;
* from the gateway, absent while it does not answer:
  ``coadapt_deployment_requests_per_s`` (offered, mean over the last 10 s),
  ``coadapt_deployment_latency_p99_seconds`` (the SLO quantile, worst second of the last 10 s),
  ``coadapt_deployment_shed_total`` (503 + Retry-After) and ``coadapt_deployment_errors_total``
  (counters since the gateway started).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from coadapt.deploy.api import replica_counts, reservations
from coadapt.deploy.live import live_figures
from coadapt.deploy.store import (
    DeploymentState,
    DeploymentStore,
    ServingReplicaRecord,
    scheduling_names,
)

__all__ = ["DeploymentCollector"]


def _families() -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
    one = ["deployment"]
    return {
        "replicas": GaugeMetricFamily(
            "coadapt_deployment_replicas",
            "Serving replicas of a deployment per state.",
            labels=["deployment", "state"],
        ),
        "desired": GaugeMetricFamily(
            "coadapt_deployment_replicas_desired",
            "Replicas the deployment's autoscaler asked for in the last round.",
            labels=one,
        ),
        "slo": GaugeMetricFamily(
            "coadapt_deployment_slo_seconds", "The deployment's latency SLO.", labels=one
        ),
        "rps": GaugeMetricFamily(
            "coadapt_deployment_requests_per_s",
            "Requests/s offered to the deployment's gateway (mean over the last 10 s).",
            labels=one,
        ),
        "p99": GaugeMetricFamily(
            "coadapt_deployment_latency_p99_seconds",
            "The SLO quantile of latency at the gateway (worst second of the last 10 s).",
            labels=one,
        ),
        "shed": CounterMetricFamily(
            "coadapt_deployment_shed",
            "Requests the gateway answered 503 + Retry-After since it started.",
            labels=one,
        ),
        "errors": CounterMetricFamily(
            "coadapt_deployment_errors",
            "Requests a replica failed or answered 5xx since the gateway started.",
            labels=one,
        ),
    }


class DeploymentCollector(Collector):
    """Reads the deployments' state from the store and their gateways at scrape time."""

    def __init__(self, deploys: DeploymentStore) -> None:
        self.deploys = deploys

    def describe(self) -> Iterable[Metric]:
        return list(_families().values())

    def collect(self) -> Iterable[Metric]:
        return list(self._collect())

    def _collect(self) -> Iterator[Metric]:
        fams = _families()
        store = self.deploys.store
        records = self.deploys.list()
        names = scheduling_names(records, {t.id: t.name for t in store.tenants()})
        reserved = reservations(store)
        rows: dict[int, list[ServingReplicaRecord]] = {}
        for r in self.deploys.replicas():
            rows.setdefault(r.deployment_id, []).append(r)
        active = {r.id: r.gateway_port for r in records if r.state is DeploymentState.ACTIVE}
        live = live_figures(active)
        for rec in records:
            name = names[rec.id]
            for state, n in replica_counts(rows.get(rec.id, [])).items():
                fams["replicas"].add_metric([name, state], float(n))
            if name in reserved:
                fams["desired"].add_metric([name], float(reserved[name].desired))
            fams["slo"].add_metric([name], rec.spec.slo_ms / 1000.0)
            figures = live.get(rec.id)
            if figures is None:
                continue
            fams["rps"].add_metric([name], figures.requests_per_s)
            if figures.latency_q_s is not None:
                fams["p99"].add_metric([name], figures.latency_q_s)
            fams["shed"].add_metric([name], float(figures.shed_total))
            fams["errors"].add_metric([name], float(figures.errors_total))
        yield from fams.values()

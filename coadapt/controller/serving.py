"""The serving half of the cluster, as the control loop sees it (issue 17).

The controller knows nothing of models, gateways or HTTP: it asks a :class:`ServingPlane` for
the deployments to schedule and where their demand comes from, runs one
:class:`~coadapt.policies.coschedule.CoSchedulePolicy` round over serving and training
together, and each tick hands the plane the reservations of the last round plus the slots that
training replicas still hold. The plane (:mod:`coadapt.deploy.plane`, above the controller)
starts and stops replica processes to match, level-triggered like the training side, and tells
each deployment's gateway where its ready replicas are.

Two kinds of round:

* a *full* round (every ``ControllerConfig.interval``, or promptly on a change) decides serving
  and training together;
* a *serving* round (every ``ControllerConfig.serving_interval`` while deployments exist) asks
  only the autoscalers; if what they want fits beside what training holds now it is applied
  at once, and if it needs training's slots (or gives slots back) a full round follows at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from typing import Protocol, runtime_checkable

from coadapt.policies.autoscale import Autoscaler, DemandSource, Deployment
from coadapt.policies.coschedule import Reservation

#: Meta key of the serving part of the co-scheduling state (the training policy's own state
#: stays under ``policy_state:<name>``, so turning serving on or off never loses it).
SERVING_STATE_KEY = "serving_state"

Slot = tuple[str, int]  # (node name, slot index)


@runtime_checkable
class ServingPlane(Protocol):
    """What the control loop needs from the serving side."""

    def deployments(self) -> Sequence[Deployment]:
        """The deployments to schedule now (not those being deleted), as the policies see
        them; an empty sequence means serving takes nothing."""
        ...

    def demand(self) -> DemandSource:
        """Measured demand and latencies per deployment (the gateways' figures)."""
        ...

    def autoscaler(self) -> Autoscaler:
        """The autoscaler every deployment is decided by (``slo`` by default)."""
        ...

    def occupied(self) -> Set[Slot]:
        """Slots held by this plane's replica processes that are alive (starting, ready or
        stopping): training never launches onto them."""
        ...

    def run_dirs(self) -> Set[str]:
        """Run directories of replicas that may be alive, which the loop keeps when it tells
        the executor to release finished attempts (on Ray, placement groups)."""
        ...

    def reconcile(
        self, reservations: Mapping[str, Reservation], busy: Set[Slot], now: float
    ) -> None:
        """Make the replicas match ``reservations`` (deployment name -> what it holds for the
        round): start replicas on granted slots not in ``busy`` (training replicas still on
        them: wait for the next tick), stop replicas beyond the grant (drained first: the
        gateway stops sending to them before they get SIGTERM), stop everything of deployments
        absent from ``reservations`` or deleted, keep each gateway's route table current.
        Level-triggered and idempotent: called every tick; errors are logged and events
        written, never raised for one bad deployment."""
        ...

"""The six measured applications of the Pollux artifact: throughput and statistical traces.

Each application bundles what the simulator needs to play a job back without running it:

* ``placements.csv``/``scalability.csv`` give the true step and gradient-sync time of one
  iteration for a placement (GPUs per node) and per-GPU batch. Listed placements are
  interpolated along the batch only; other placements are interpolated linearly in
  (nodes, replicas, batch) over the per-shape averages plus the large-scale measurements.
* ``validation-<B>.csv`` give, per epoch and for a few total batch sizes B, the cumulative
  statistical progress (in M0-equivalent iterations), the iteration count and the gradient
  statistics; other batch sizes are interpolated linearly between the two nearest B.

Lookups are memoised per application (the simulator asks the same questions millions of
times) and the 3-D interpolator is built once, on first use.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from importlib import resources
from importlib.abc import Traversable

import numpy as np
from numpy.typing import NDArray
from scipy.interpolate import LinearNDInterpolator

from coadapt.sim.errors import SimulationError

FloatArray = NDArray[np.float64]
Placement = tuple[int, ...]

#: Node count beyond which the scalability traces stop; larger placements are looked up there.
_MAX_TRACED_NODES = 16
_EPS = 1e-8


@dataclass(frozen=True)
class AppSpec:
    """What the artifact configures per application on top of its traces.

    ``adaptive_batch``/``elastic_max_replicas`` express that ncf trains at a pinned batch on
    one GPU under policies that choose GPUs themselves (its traces end there), so the
    mechanism needs no per-name checks.
    """

    name: str
    max_epochs: int
    max_local_bsz: int | None = None  # overrides the largest traced per-GPU batch
    adaptive_batch: int | None = None  # batch pinned under ADAPTIVE batch mode
    elastic_max_replicas: int | None = None  # cap on GPUs when the policy picks the count


APP_SPECS: dict[str, AppSpec] = {
    spec.name: spec
    for spec in (
        AppSpec("bert", max_epochs=2),
        AppSpec("cifar10", max_epochs=100),
        AppSpec("ncf", max_epochs=10, adaptive_batch=32768, elastic_max_replicas=1),
        AppSpec("imagenet", max_epochs=90),
        AppSpec("deepspeech2", max_epochs=80),
        AppSpec("yolov3", max_epochs=50, max_local_bsz=8),
    )
}

APPLICATION_NAMES: tuple[str, ...] = tuple(APP_SPECS)


def _trace_dir(name: str) -> Traversable:
    return resources.files("coadapt.sim").joinpath("data").joinpath("traces").joinpath(name)


def _read_csv(name: str, filename: str) -> list[dict[str, str]]:
    text = _trace_dir(name).joinpath(filename).read_text(encoding="utf-8")
    return list(csv.DictReader(io.StringIO(text)))


def _trace_files(name: str) -> list[str]:
    return sorted(p.name for p in _trace_dir(name).iterdir() if p.name.endswith(".csv"))


def canonical_placement(placement: Placement) -> Placement:
    """Drop empty nodes and rotate to the lexicographically smallest rotation.

    A ring all-reduce does not care where the ring starts, so the traces list each ring once.
    """
    p = tuple(int(x) for x in placement if x)
    if not p:
        return p
    return min(p[i:] + p[:i] for i in range(len(p)))


class Application:
    """Trace-driven ground truth of one application (see the module docstring)."""

    def __init__(self, spec: AppSpec) -> None:
        self.spec = spec
        self.name = spec.name
        # Validation traces, one per total batch size, in increasing batch order.
        batches: list[int] = []
        progress: list[list[float]] = []
        iters: list[list[float]] = []
        sqr: list[list[float]] = []
        var: list[list[float]] = []
        for fname in _trace_files(spec.name):
            if not fname.startswith("validation-"):
                continue
            batches.append(int(fname[len("validation-") : -len(".csv")]))
            rows = _read_csv(spec.name, fname)
            progress.append([float(r["progress"]) for r in rows])
            iters.append([float(r["iteration"]) for r in rows])
            sqr.append([float(r["grad_sqr"]) for r in rows])
            var.append([float(r["grad_var"]) for r in rows])
        order = np.argsort(batches)
        rows_min = min(len(p) for p in progress)
        if spec.max_epochs > rows_min:
            raise SimulationError(
                f"{spec.name}: max_epochs {spec.max_epochs} exceeds the {rows_min} traced epochs"
            )
        self._val_bsz = np.asarray(batches, dtype=np.int64)[order]
        self._iters = np.asarray([iters[i][:rows_min] for i in order])
        self._sqr = np.asarray([sqr[i][:rows_min] for i in order])
        self._var = np.asarray([var[i][:rows_min] for i in order])
        prog = np.asarray([progress[i][:rows_min] for i in order])
        # Epoch e ends when progress reaches the smallest end-of-epoch progress of any trace.
        self._epoch_end = np.concatenate([[0.0], prog.min(axis=0)])

        # Throughput traces.
        rows = _read_csv(spec.name, "placements.csv")
        per_place: dict[Placement, list[tuple[float, float, float]]] = defaultdict(list)
        per_shape: dict[tuple[int, int, int], list[tuple[float, float]]] = defaultdict(list)
        for r in rows:
            place = tuple(int(c) for c in r["placement"])
            bsz = int(r["local_bsz"])
            step, sync = float(r["step_time"]), float(r["sync_time"])
            per_place[place].append((bsz, step, sync))
            per_shape[len(place), sum(place), bsz].append((step, sync))
        self._placements: dict[Placement, FloatArray] = {
            p: np.asarray(sorted(v), dtype=np.float64) for p, v in per_place.items()
        }
        points = [
            (*key, float(np.mean([v[0] for v in vals])), float(np.mean([v[1] for v in vals])))
            for key, vals in sorted(per_shape.items())
        ]
        for r in _read_csv(spec.name, "scalability.csv"):
            points.append(
                (
                    int(r["num_nodes"]),
                    int(r["num_replicas"]),
                    int(r["local_bsz"]),
                    float(r["step_time"]),
                    float(r["sync_time"]),
                )
            )
        self._shape_points = np.asarray(points, dtype=np.float64)
        self._interp: LinearNDInterpolator | None = None

        all_bsz = [int(r["local_bsz"]) for r in rows]
        self.init_batch_size = int(self._val_bsz[0])  # M0: the smallest validated batch
        self.max_batch_size = int(self._val_bsz[-1])
        self.min_local_bsz = min(all_bsz)
        self.max_local_bsz = spec.max_local_bsz or max(all_bsz)
        self.max_epochs = spec.max_epochs
        self._throughput_memo: dict[tuple[Placement, int], tuple[float, float]] = {}
        self._grad_memo: dict[tuple[int, int], tuple[float, float]] = {}

    def __repr__(self) -> str:
        return f"Application({self.name!r})"

    @property
    def completion_epoch(self) -> int:
        """The job completes once its epoch counter exceeds this (i.e. after max_epochs)."""
        return self.max_epochs - 1

    # -- throughput -------------------------------------------------------------------------

    def throughput(self, placement: Placement, local_bsz: int) -> tuple[float, float]:
        """True (step_time, sync_time) in seconds of one iteration at a per-GPU batch."""
        key = (tuple(placement), int(local_bsz))
        hit = self._throughput_memo.get(key)
        if hit is not None:
            return hit
        place = canonical_placement(placement)
        if not place:
            raise SimulationError(f"{self.name}: throughput of an empty placement")
        table = self._placements.get(place)
        bsz = float(local_bsz)
        if table is not None and table[0, 0] <= bsz <= table[-1, 0]:
            step = float(np.interp(bsz, table[:, 0], table[:, 1]))
            sync = float(np.interp(bsz, table[:, 0], table[:, 2]))
        else:
            if self._interp is None:
                pts = self._shape_points
                self._interp = LinearNDInterpolator(pts[:, :3], pts[:, 3:])
            nodes = min(len(place), _MAX_TRACED_NODES)
            out = self._interp(np.array([[nodes, sum(place), bsz]], dtype=np.float64))[0]
            step, sync = float(out[0]), float(out[1])
        if not (np.isfinite(step) and np.isfinite(sync)):
            raise SimulationError(
                f"{self.name}: no throughput trace covers placement {place} at local batch "
                f"{local_bsz}"
            )
        self._throughput_memo[key] = (step, sync)
        return step, sync

    # -- statistical efficiency ----------------------------------------------------------------

    def _bracket(self, batch_size: float) -> tuple[int, int, float]:
        """Indices of the validated batches around ``batch_size`` and the weight of the upper."""
        b = self._val_bsz
        if batch_size < b[0] - _EPS or batch_size > b[-1] + _EPS:
            raise SimulationError(
                f"{self.name}: batch size {batch_size} outside the traced range {b[0]}..{b[-1]}"
            )
        hi = int(np.searchsorted(b, batch_size, side="left"))
        hi = min(hi, b.size - 1)
        if b[hi] == batch_size or hi == 0:
            return hi, hi, 0.0
        lo = hi - 1
        return lo, hi, float((batch_size - b[lo]) / (b[hi] - b[lo]))

    def grad_stats(self, batch_size: int, epoch: int) -> tuple[float, float]:
        """(grad_sqr, grad_var) during ``epoch`` at total batch ``batch_size``."""
        key = (int(batch_size), int(epoch))
        hit = self._grad_memo.get(key)
        if hit is not None:
            return hit
        lo, hi, w = self._bracket(batch_size)
        sqr = (1 - w) * self._sqr[lo, epoch] + w * self._sqr[hi, epoch]
        var = (1 - w) * self._var[lo, epoch] + w * self._var[hi, epoch]
        out = (float(sqr), float(var))
        self._grad_memo[key] = out
        return out

    def progress_at(self, epoch: int) -> float:
        """Statistical progress (M0-equivalent iterations) at the end of ``epoch - 1``."""
        return float(self._epoch_end[epoch])

    def iterations(self, batch_size: int, epoch: int) -> float:
        """Cumulative optimizer iterations after finishing ``epoch`` at a fixed batch."""
        lo, hi, w = self._bracket(batch_size)
        return float((1 - w) * self._iters[lo, epoch] + w * self._iters[hi, epoch])

    @property
    def validated_batch_sizes(self) -> tuple[int, ...]:
        return tuple(int(b) for b in self._val_bsz)


@cache
def get_application(name: str) -> Application:
    """The (shared, memoised) application of that name; KeyError if unknown."""
    return Application(APP_SPECS[name])

"""The validation gates of one version, run in a process of their own.

``python -m coadapt.registry.gates REQUEST`` (REQUEST: JSON with ``root``, ``version``,
``live`` and the model's ``gates``, see :class:`~coadapt.registry.config.GateConfig`) prints
one JSON line, ``{"passed": bool, "reason": str | null, "checks": [...]}``, each check
``{"name", "status": passed|failed|skipped, "value", "bound", "reason"}``:

1. ``integrity``: the version is rebuilt exactly as a server would
   (:func:`coadapt.serve.artifacts.build_model`: every file's size and sha256, tensor shapes,
   NaN/Inf, the factory, ``load_state_dict(strict=True)``; a sparse version through
   :mod:`coadapt.serve.sparse_artifacts`, and without a replay only its files, dense part and
   delta chain are checked, so its tables are not loaded just for that);
2. ``metric:NAME``: the recorded requests (``replay``, an ``.npz`` with ``inputs``, or a
   sparse model's named arrays, and ``labels``) are predicted; the metric must meet its bound;
3. ``drift:STAT``: the same inputs through the live version; the statistic of |Δ| must stay
   within its bound (skipped when nothing is live yet).

Why a process: a version's factory is the tenant's code. The controller never imports it;
:mod:`coadapt.registry.validate` starts this module with a clean environment, a timeout and,
where the server confines jobs, the job sandbox.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from coadapt.registry.config import GateConfig
from coadapt.registry.metrics import METRIC_FUNCTIONS, MetricError, drift

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
PREDICT_ROWS = 4096  # rows per forward while replaying


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    value: float | None = None
    bound: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class GateReport:
    passed: bool
    reason: str | None
    checks: tuple[Check, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "reason": self.reason,
            "checks": [asdict(c) for c in self.checks],
        }


def _bound(lo: float | None, hi: float | None) -> str:
    parts = ([f">= {lo:g}"] if lo is not None else []) + ([f"<= {hi:g}"] if hi is not None else [])
    return " and ".join(parts)


Arrays = list[np.ndarray[Any, Any]]


def _predict(module: Any, inputs: Arrays) -> np.ndarray[Any, Any]:
    """The module's outputs on the replayed rows, as float64 ``[rows, outputs]``; a sparse
    model takes its arrays in order (as the server calls it)."""
    import torch

    outs = []
    rows = len(inputs[0])
    with torch.inference_mode():
        for i in range(0, rows, PREDICT_ROWS):
            part = [torch.from_numpy(np.ascontiguousarray(a[i : i + PREDICT_ROWS])) for a in inputs]
            out = module(*part)
            outs.append(out.detach().to(torch.float64).numpy().reshape(len(part[0]), -1))
    return np.concatenate(outs) if outs else np.zeros((0, 1))


def _specs(manifest: Any) -> list[tuple[str, str, tuple[int, ...]]]:
    """What a request row holds: ``(name, dtype, shape)`` per array (a dense model: one,
    named ``inputs``; a sparse one: its manifest's named arrays)."""
    if manifest.sparse is None:
        return [("inputs", manifest.inputs.dtype, tuple(manifest.inputs.shape))]
    return [(str(d["name"]), str(d["dtype"]), tuple(int(x) for x in d["shape"]))
            for d in manifest.sparse["inputs"]]  # fmt: skip


def _load_replay(path: str, manifest: Any) -> tuple[Arrays, Any]:
    """The replayed inputs (as the version takes them) and the labels, if recorded."""
    specs = _specs(manifest)
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [name for name, _, _ in specs if name not in data]
            if missing:
                raise MetricError(f"{path} holds no array {missing} (it has {sorted(data)})")
            arrays = [data[name] for name, _, _ in specs]
            labels = data.get("labels", None)
    except (OSError, ValueError) as exc:
        raise MetricError(f"cannot read the replay file {path}: {exc}") from exc
    out = []
    for (name, dtype, shape), arr in zip(specs, arrays, strict=True):
        if (
            arr.ndim != 1 + len(shape)
            or tuple(arr.shape[1:]) != shape
            or len(arr) != len(arrays[0])
        ):
            raise MetricError(
                f"replay array {name!r} has shape {list(arr.shape)}; the version takes "
                f"[{len(arrays[0])} rows, {', '.join(map(str, shape))}]"
            )
        # feature IDs go in as int64 (the same bits for uint64), as the server passes them
        out.append(arr.astype(np.float32 if dtype == "float32" else np.int64, copy=False))
    if labels is not None and len(labels) != len(out[0]):
        raise MetricError(f"{len(labels)} labels for {len(out[0])} replayed inputs")
    return out, labels


def _build(root: str, version: str) -> tuple[Any, Any]:
    """The version's serving module and manifest, dense or sparse, rebuilt from its files."""
    from coadapt.serve import artifacts

    manifest = artifacts.read_manifest(root, version)
    if manifest.sparse is None:
        module, manifest, _ = artifacts.build_model(root, version)
        return module, manifest
    from coadapt.serve import sparse_artifacts

    return sparse_artifacts.build_sparse_model(root, version).module, manifest


def _integrity(root: str, version: str, replay: bool) -> tuple[Any, Any, str]:
    """Check the version; rebuild it when the replay needs it. A sparse version without a
    replay is checked without loading its tables (every file's sha256, the dense part, the
    delta chain): a huge model is not loaded twice just to be checked."""
    from coadapt.serve import artifacts

    manifest = artifacts.read_manifest(root, version)
    if manifest.sparse is not None and not replay:
        from coadapt.serve import sparse_artifacts

        info = sparse_artifacts.verify_version(root, version)
        return None, manifest, f"{info['files']} files, {info['bytes']} bytes, chain, dense part"
    module, manifest = _build(root, version)
    return module, manifest, "checksums, shapes, finite values, factory"


def run(root: str, version: str, live: str | None, gates: GateConfig) -> GateReport:
    """Every gate of ``version``, stopping at the first one that cannot run at all."""
    from coadapt.serve import artifacts

    checks: list[Check] = []

    def done(reason: str | None = None) -> GateReport:
        failed = [c for c in checks if c.status == FAILED]
        why = reason or (f"{failed[0].name}: {failed[0].reason}" if failed else None)
        return GateReport(not failed and reason is None, why, tuple(checks))

    try:
        module, manifest, what = _integrity(root, version, gates.replay is not None)
    except artifacts.ArtifactError as exc:
        checks.append(Check("integrity", FAILED, reason=str(exc)))
        return done()
    except Exception as exc:  # the tenant's factory raised: the version cannot serve
        checks.append(Check("integrity", FAILED, reason=f"the factory raised {exc!r}"))
        return done()
    checks.append(Check("integrity", PASSED, reason=what))
    if gates.replay is None:
        return done()
    try:
        inputs, labels = _load_replay(gates.replay, manifest)
        pred = _predict(module, inputs)
    except (MetricError, RuntimeError) as exc:
        checks.append(Check("replay", FAILED, reason=str(exc)))
        return done()
    for g in gates.metrics:
        name, bound = f"metric:{g.metric}", _bound(g.min, g.max)
        if labels is None:
            checks.append(Check(name, FAILED, None, bound, "the replay file has no 'labels'"))
            continue
        try:
            value = METRIC_FUNCTIONS[g.metric](pred, labels, gates.logits)
        except MetricError as exc:
            checks.append(Check(name, FAILED, None, bound, str(exc)))
            continue
        ok = (g.min is None or value >= g.min) and (g.max is None or value <= g.max)
        why = None if ok else f"{g.metric} = {value:.6g}, needs {bound}"
        checks.append(Check(name, PASSED if ok else FAILED, value, bound, why))
    if gates.drift:
        live_pred, why = None, None
        if live is None or live == version:
            why = "no other live version to compare with"
        else:
            try:
                live_module, _ = _build(root, live)
                live_pred = _predict(live_module, inputs)
            except Exception as exc:  # the live version's own problem: reported, not ours
                why = f"the live version {live} cannot be rebuilt ({exc})"
        for d in gates.drift:
            name, bound = f"drift:{d.stat}", _bound(None, d.max)
            if live_pred is None:
                checks.append(Check(name, SKIPPED, None, bound, why))
                continue
            try:
                value = drift(pred, live_pred, d.stat)
            except MetricError as exc:
                checks.append(Check(name, FAILED, None, bound, str(exc)))
                continue
            ok = value <= d.max
            reason = None if ok else f"{d.stat} |Δ| vs live {live} = {value:.6g}, needs {bound}"
            checks.append(Check(name, PASSED if ok else FAILED, value, bound, reason))
    return done()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m coadapt.registry.gates REQUEST_JSON", file=sys.stderr)
        return 2
    req = json.loads(argv[0])
    gates = GateConfig.model_validate(req["gates"])
    sys.path[:0] = list(gates.pythonpath)
    report = run(req["root"], req["version"], req.get("live"), gates)
    print(json.dumps(report.to_json()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

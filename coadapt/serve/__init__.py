"""Model versions and online serving (issue 16).

- :mod:`coadapt.serve.artifacts`: versions on disk (full snapshots and incremental deltas,
  manifest written last, checksums, lineage); :func:`publish` from a training script.
- :mod:`coadapt.serve.runtime`, :mod:`~coadapt.serve.workers`: the server (HTTP/JSON and a
  binary batch format, SLO-driven dynamic batching, worker processes, hot swap, /metrics).
- :mod:`coadapt.serve.sparse_artifacts`, :mod:`~coadapt.serve.sparse_model`: sparse models
  (tables on parameter-server shards + a dense part): one file per shard, full and incremental
  versions, deltas applied live while serving.
- ``python -m coadapt.serve``: run it; see docs/serve.md.

Needs the ``train`` extra (torch). The names below are imported on first use, so the
supervisor process (``python -m coadapt.serve``) never loads torch; its workers do.
"""

from typing import Any

__all__ = [
    "ArtifactError",
    "IntegrityError",
    "Lineage",
    "Manifest",
    "list_versions",
    "live_version",
    "load_state",
    "publish",
    "read_manifest",
    "set_live",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from coadapt.serve import artifacts

        return getattr(artifacts, name)
    raise AttributeError(f"module 'coadapt.serve' has no attribute {name!r}")

"""Huge sparse CTR models: dynamic embedding tables, parameter servers, online training.

The parameter-server names are imported on first use: the torch modules
(``SparseEmbedding``, ``SparseEmbeddingCollection``) so that ``import coadapt.sparse`` works
without the ``train`` extra, and the server so that ``python -m coadapt.sparse.server`` does not
find its own module already imported.
"""

from typing import Any

from coadapt.sparse.datasets import GenerationResult, PlantedConfig, generate, iter_planted
from coadapt.sparse.table import CountMinSketch, EmbeddingTable, TableFullError

__all__ = [
    "CountMinSketch",
    "EmbeddingTable",
    "GenerationResult",
    "LocalStore",
    "PSClient",
    "PlantedConfig",
    "ShardState",
    "SparseEmbedding",
    "SparseEmbeddingCollection",
    "TableFullError",
    "TableSpec",
    "generate",
    "iter_planted",
    "launch_servers",
    "running_servers",
    "shard_of",
]

_LAZY = {
    "LocalStore": "client",
    "PSClient": "client",
    "ShardState": "server",
    "TableSpec": "server",
    "launch_servers": "server",
    "running_servers": "server",
    "shard_of": "server",
    "SparseEmbedding": "embedding",
    "SparseEmbeddingCollection": "embedding",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'coadapt.sparse' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"coadapt.sparse.{mod}"), name)

"""Huge sparse CTR models: dynamic embedding tables, parameter servers, online training."""

from coadapt.sparse.datasets import GenerationResult, PlantedConfig, generate, iter_planted
from coadapt.sparse.table import CountMinSketch, EmbeddingTable, TableFullError

__all__ = [
    "CountMinSketch",
    "EmbeddingTable",
    "GenerationResult",
    "PlantedConfig",
    "TableFullError",
    "generate",
    "iter_planted",
]

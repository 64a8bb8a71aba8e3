"""Sections of ``benchmarks/sparse_bench.py`` that train models (split out to keep it short)."""

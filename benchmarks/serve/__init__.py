"""Serving benchmark sections (the CTR / sparse part of ``benchmarks/serve_bench.py``)."""

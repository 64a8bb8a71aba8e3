"""Huge sparse CTR models: dynamic embedding tables, parameter servers, online training."""

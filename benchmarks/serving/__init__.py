"""Serving benchmark: this service against `mlflow models serve` for the same registered model.

Run `python -m benchmarks.serving` (see `__main__.py` for the options).
"""

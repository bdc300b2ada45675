"""Benchmarks are programs, not tests: speed (runtime, http) and robustness; each prints JSON and markdown."""

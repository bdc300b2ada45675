"""Speed benchmarks, programs not tests: runtime, HTTP, hostile clients, corpus scoring (JSON and markdown).

The robustness evaluation (functional suites, AAA, rounds, context) is :mod:`dialogue_safety.evaluation`.
"""

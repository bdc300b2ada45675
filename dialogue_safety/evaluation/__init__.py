"""Robustness evaluation of a model: functional suites, AAA, adversarial rounds, context; the report.

``dialogue-safety evaluate MODEL`` (:mod:`dialogue_safety.evaluation.evaluate`) runs the suites on a model
directory or a checkpoint (:mod:`dialogue_safety.evaluation.scorers`), beside the TF-IDF baseline and the peer
row, and writes ``results.json``, ``report.md`` and plots. Speed lives in :mod:`lab.bench`.
"""

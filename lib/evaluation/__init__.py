"""Evaluation: metrics, scoring every task type, baselines, size and speed, the report."""

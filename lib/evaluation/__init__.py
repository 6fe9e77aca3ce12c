"""Evaluation: scoring every task type, the zero-shot LM baseline, size and speed, the report."""

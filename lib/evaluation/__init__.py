"""Evaluation: every task type evaluated one way (its scores through lib/tasks/scoring.py, ONNX and int8
too), the zero-shot LM baseline, size and speed, the typed result (result.py) and the report."""

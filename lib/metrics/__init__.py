"""Metric functions (scores.py) and the train-only baselines each task type reads against (baselines.py):
pure functions of predictions and items, which every package above may use."""

"""Metric functions (scores.py; generation.py for generated text, with its two baselines) and the train-only
baselines each task type reads against (baselines.py): pure functions of predictions and items, which every
package above may use."""

"""Scoring, as pure functions of predictions and gold labels; every score is a fraction, not a percent.

`compute_metrics` gives a classification task's accuracy, F1 and MCC from a confusion matrix.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def compute_metrics(names: Sequence[str], predictions, labels, n_classes: int) -> dict[str, float]:
    """{name: value} for each of `names` (accuracy, f1, mcc), as fractions, not percent.

    f1 is the F1 of class 1 for a binary task (GLUE's MRPC convention) and the macro average over the
    classes that occur in labels or predictions otherwise (scikit-learn's default). mcc is Matthews'
    correlation in its multiclass form (Gorodkin 2004), equal to the usual one for two classes; 0 where
    it is undefined, e.g. a constant prediction."""
    unknown = [name for name in names if name not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric '{unknown[0]}'; known: {', '.join(METRICS)}")
    confusion = confusion_matrix(predictions, labels, n_classes)
    return {name: float(METRICS[name](confusion.astype(np.float64))) for name in names}


def confusion_matrix(predictions, labels, n_classes: int) -> np.ndarray:
    """n_classes x n_classes counts, rows = true class, columns = predicted class."""
    predicted, true = _as_array(predictions), _as_array(labels)
    if predicted.shape != true.shape or predicted.ndim != 1 or not len(true):
        raise ValueError(f"need two non-empty 1-D sequences of the same length, got {predicted.shape}, {true.shape}")
    if min(predicted.min(), true.min()) < 0 or max(predicted.max(), true.max()) >= n_classes:
        raise ValueError(f"class indices must be in 0..{n_classes - 1}")
    return np.bincount(true * n_classes + predicted, minlength=n_classes**2).reshape(n_classes, n_classes)


def _as_array(values) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=np.int64)


def _accuracy(confusion: np.ndarray) -> float:
    return np.trace(confusion) / confusion.sum()


def _f1(confusion: np.ndarray) -> float:
    tp = np.diag(confusion)
    denominator = confusion.sum(axis=0) + confusion.sum(axis=1)  # 2tp + fp + fn
    f1 = np.divide(2 * tp, denominator, out=np.zeros_like(tp), where=denominator > 0)
    if len(confusion) == 2:
        return f1[1]
    return f1[denominator > 0].mean()


def _mcc(confusion: np.ndarray) -> float:
    total, correct = confusion.sum(), np.trace(confusion)
    true, predicted = confusion.sum(axis=1), confusion.sum(axis=0)
    denominator = np.sqrt((total**2 - predicted @ predicted) * (total**2 - true @ true))
    return (correct * total - true @ predicted) / denominator if denominator > 0 else 0.0


METRICS = {"accuracy": _accuracy, "f1": _f1, "mcc": _mcc}

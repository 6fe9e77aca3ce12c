"""Scoring: classification metrics."""
from __future__ import annotations

import math

import pytest
import torch

from lib.metrics import compute_metrics


# compute_metrics ------------------------------------------------------------------------------------

def test_binary_metrics_from_a_known_confusion_matrix():
    labels = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
    predictions = [1, 1, 1, 0, 1, 1, 0, 0, 0, 0]  # tp 3, fn 1, fp 2, tn 4
    metrics = compute_metrics(["accuracy", "f1", "mcc"], predictions, labels, 2)
    assert metrics == pytest.approx({"accuracy": 0.7, "f1": 6 / 9, "mcc": (3 * 4 - 2 * 1) / math.sqrt(5 * 4 * 6 * 5)})
    assert compute_metrics(["mcc"], torch.tensor(labels), torch.tensor(labels), 2) == {"mcc": 1.0}
    inverted = [1 - y for y in labels]
    assert compute_metrics(["mcc", "f1"], inverted, labels, 2) == pytest.approx({"mcc": -1.0, "f1": 0.0})


def test_constant_prediction_has_mcc_zero():
    labels = [0, 1, 1, 0, 1]
    assert compute_metrics(["accuracy", "f1", "mcc"], [1] * 5, labels, 2) == pytest.approx(
        {"accuracy": 0.6, "f1": 0.75, "mcc": 0.0})
    assert compute_metrics(["f1", "mcc"], [0] * 5, labels, 2) == {"f1": 0.0, "mcc": 0.0}


def test_multiclass_metrics():
    labels, predictions = [0, 0, 1, 1, 2, 2], [0, 1, 1, 1, 2, 0]  # confusion [[1,1,0],[0,2,0],[1,0,1]]
    metrics = compute_metrics(["accuracy", "f1", "mcc"], predictions, labels, 3)
    macro_f1 = (2 / 4 + 4 / 5 + 2 / 3) / 3
    mcc = (4 * 6 - (2 * 2 + 2 * 3 + 2 * 1)) / math.sqrt((36 - (4 + 9 + 1)) * (36 - 12))
    assert metrics == pytest.approx({"accuracy": 4 / 6, "f1": macro_f1, "mcc": mcc})
    # a class absent from labels and predictions does not drag the macro average down
    assert compute_metrics(["f1"], [0, 1, 0], [0, 1, 0], 4) == {"f1": 1.0}


def test_bad_metric_inputs():
    with pytest.raises(ValueError, match="unknown metric"):
        compute_metrics(["auc"], [0], [0], 2)
    with pytest.raises(ValueError, match="same length"):
        compute_metrics(["accuracy"], [0, 1], [0], 2)
    with pytest.raises(ValueError, match="0..1"):
        compute_metrics(["accuracy"], [0, 2], [0, 1], 2)

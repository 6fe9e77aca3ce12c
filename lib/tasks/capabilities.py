"""The optional parts of a task type: capabilities a type declares by subclassing them beside TaskType
(`class SpanQA(TaskType, Baselined, Calibrated, Reported)`), rather than members every type carries.
Whoever uses one asks `isinstance(kind, Capability)`; a type without it is left out of what it does,
and the stage says so where a user would look for it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from lib.config.params import EvaluateConfig
from lib.tasks.base import TaskData


# evaluation side: baselines, calibration, zero-shot, report
class Baselined:
    """A train-only baseline (lib.metrics.baselines) the evaluation scores beside the models, fit on the
    train items finetuning learned from and on all of train."""

    baseline: str  # the name the evaluation reports the type's train-only baseline under
    baseline_label: str  # and how the report shows it

    def baseline_scores(self, task: TaskData, train: list, metrics: list[str],
                        settings: EvaluateConfig) -> tuple[dict[str, float], dict[str, Any]]:
        """(scores, extras as `score` gives them) of the type's baseline fit on the `train` items (tuned
        on task's dev items where it has a setting to choose), on task's evaluation items."""
        raise NotImplementedError


class Calibrated:
    """`score` of the evaluation split takes a setting picked on dev's predictions: the extras of `score`
    on dev are the `calibration` of every other split (SQuAD 2.0's no-answer threshold)."""


class ZeroShot:
    """evaluate.zero_shot may prompt the LM for it, with a label word per class."""


# How the report draws a plot (lib.evaluation.report draws each kind for any type)
MATRIX = "matrix"  # a count per (true, predicted) class, a panel per model
BARS = "bars"  # a value per key (entity type), a bar per model in each key's group
SCATTER = "scatter"  # [gold, predicted] pairs, a panel per model


@dataclass(frozen=True)
class Plot:
    """DVC plot data of a kept extra (a CSV per task and model, `<folder>/<task>_<model>.csv` under the
    evaluate stage's plots) and its figure in the report (`<folder>_<task>.png`, drawn as `drawing` says)."""

    folder: str
    columns: tuple[str, str]
    rows: Callable[[Any, list[str]], list]  # (one model's value, the task's class names) -> the CSV's rows
    drawing: str  # MATRIX, BARS or SCATTER


def _as_is(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Extra:
    """One extra of a type's `score` (beside its metrics) that the evaluation keeps, per model scored."""

    name: str  # its key in what `score` returns and in metrics/evaluate.json
    per_split: bool = False  # kept for every split; else the first split's only, once per task
    saved: bool = True  # written to metrics/evaluate.json; else kept for the plots and figures only
    plot: Plot | None = None
    as_json: Callable[[Any], Any] = _as_is  # the value as metrics/evaluate.json holds it


def _confusion_rows(matrix: list[list[int]], class_names: list[str]) -> list[list[str]]:
    """One row per item: its (actual, predicted) class names."""
    return [[class_names[i], class_names[j]] for i, row in enumerate(matrix) for j, n in enumerate(row)
            for _ in range(n)]


# The confusion matrix (rows: true class) of a type that picks one of `class_names` per item; its folder is
# a declared output of the evaluate stage, there even where no task has one
CONFUSION = Extra("confusion", saved=False, plot=Plot("confusion", ("actual", "predicted"), _confusion_rows, MATRIX))


class Reported:
    """What a type adds to the evaluation's result and report beside its metrics: the extras of its `score`
    the evaluation keeps (`kept_extras`), extras of a model's predictions (`prediction_extras`), and its
    own section of the report."""

    kept_extras: tuple[Extra, ...] = ()

    def class_names(self, task: TaskData) -> list[str] | None:
        """The rows and columns of the confusion matrix `score` gives, None where it gives none."""
        return None

    def prediction_extras(self, task: TaskData, predictions: list) -> dict[str, Any]:
        """Extras of a model's (not a baseline's) predictions on the evaluation split that `score` does not
        give, by the name of one of `kept_extras` (regression's predicted vs gold pairs)."""
        return {}

    def report_section(self, result: Any, row_label: Callable[[str, Any], str]) -> list[str]:
        """Markdown lines of the type's own part of a task's report, after its scores table, from `result`
        (lib.evaluation.result.TaskEvaluation); `row_label(model, split)` names a model in a table row as
        the report does (split: the SplitEvaluation it was scored on)."""
        return []

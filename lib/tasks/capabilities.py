"""What a task type may have beyond what every type has (lib/tasks/base.py's TaskType): each capability is a
small class that a type declares by inheriting it beside TaskType, holding the members only types with that
capability have, and the code that uses one asks `isinstance(kind, Exported)`, never a type's name:

    class Classification(Exported, Served, UnlabeledTransfer, Baselined, ZeroShot, Reported, TaskType): ...

A type declares what it offers and nothing else: a type that generates text from an encoder-decoder need
not carry an export shape, a raw-text encoding or a soft loss it does not have.

Two training extras stay flags on TaskType rather than capabilities: `aux_lm` (finetune.aux_lm_weight's
auxiliary LM loss on the task's texts) and `logistic_probe` (the frozen variant fits scikit-learn's logistic
regression rather than L-BFGS on the type's loss). Each is a yes or no with no member behind it, and its
default (no) is a true answer for any type, one that generates too: a capability with nothing to hold would
be the same flag spelled as a base class.

This module imports nothing of lib.tasks: lib.tasks.model reads it (Exported), and lib.tasks.base builds the
types' models with lib.tasks.model, so an import of lib.tasks.base here would close a cycle.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn.functional as F

from lib.config.params import EvaluateConfig, TaskConfig

if TYPE_CHECKING:  # annotations only: see above
    from lib.tasks.base import TaskData


# model side: export, serving, distillation

class Exported:
    """transformers has a task model of the type's shape: where a family computes the type's head, the
    saved folder is that model (lib.tasks.model.save_task_model; each family names its class of the shape,
    lib.models.families.base), and its card names the hub's task. A type without it keeps its head in
    head.safetensors, and classifier.json's "transformers" says why."""

    # the shape of transformers' task model the type exports as (SEQUENCE_CLASSIFICATION, ...)
    task_model: str
    pipeline_tag: str  # the hub's task of that model (a model card's pipeline_tag)

    def export_config(self, label_names: list[str]) -> dict[str, Any]:
        """The keys of transformers' config.json that make an exported model this type's model."""
        return {}

    def export_output(self, layer: dict[str, torch.Tensor], info: dict[str, Any],
                      inverse: bool = False) -> dict[str, torch.Tensor]:
        """The head's output layer ({"weight", "bias" where it has one}) as transformers' model of this type
        reads it, or with `inverse` the one it came from (`info`: the task's, as saved with the model)."""
        return layer


class Served:
    """lib/serving predicts it from raw text (TextClassifier, ONNX Runtime, MLflow pyfunc), so evaluate also
    runs its models in ONNX Runtime and logs them as pyfunc models."""

    def encode_texts(self, texts: list[str], text_pairs: list[str] | None, encoding, tokenizer,
                     special: dict[str, int]) -> list:
        """Model inputs of raw texts (and their second texts), as training encoded the task's: `encoding` has
        the task's max_len, truncation and text_pair_field (a TaskConfig, or what classifier.json saved)."""
        raise NotImplementedError


class Distilled:
    """lib/training/distill trains a student on its teacher's outputs: what it keeps of them, how it batches
    them and the loss against them, by default a type's output vector per example (or per token, where the
    type's `per_token`) and the KL of the tempered distributions over its last dimension."""

    # The type writes its outputs with a decoder (seq2seq): the state losses compare the decoder's states at
    # the target's positions, the teacher can write the student's targets (distill.targets: teacher), and
    # there is no summary state for Patient-KD
    generates = False

    def kept_outputs(self, outputs: torch.Tensor, examples: list, top_k: int) -> list[torch.Tensor]:
        """What distillation keeps of the teacher's outputs (float32, on the CPU) on a batch of `examples`,
        one tensor per example: its row, or a per-token type's rows of the example's tokens. `top_k`: see
        DistillConfig (a vocabulary's distribution is kept as its likeliest tokens)."""
        if self.per_token:  # TaskType's, beside which a type declares the capability
            return [row[:len(e.ids)] for row, e in zip(outputs, examples)]
        return list(outputs)

    def batch_targets(self, kept: list[torch.Tensor], length: int) -> torch.Tensor:
        """The kept outputs of a batch's examples as soft_loss reads them: stacked, or for a per-token type
        (B, length, n_outputs), padded with 0."""
        if not self.per_token:
            return torch.stack(kept)
        target = torch.zeros(len(kept), length, kept[0].shape[-1])
        for row, out in enumerate(kept):
            target[row, :len(out)] = out
        return target

    def state_mask(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(sequences, T) True where the state losses compare states: the real tokens of the sequences the
        model runs, a multiple-choice batch's (B, n_choices, T) flattened as its type's forward flattens it."""
        mask = batch["attention_mask"]
        return mask.flatten(0, 1) if mask.dim() == 3 else mask

    def soft_loss(self, student: torch.Tensor, teacher: torch.Tensor, batch: dict[str, torch.Tensor],
                  temperature: float) -> torch.Tensor:
        """The student's loss against the teacher's outputs on a batch (as batch_targets gives them), a mean
        over the units TaskType.units counts: by default KL over the last dimension (classes, choices)."""
        return soft_loss(student, teacher, temperature)

    def with_targets(self, examples: list, written: list, task: TaskData) -> list:
        """A generating type's `examples` with the teacher's predictions (`written`) as their targets."""
        raise NotImplementedError


class UnlabeledTransfer(Distilled):
    """distill.unlabeled: in-domain texts the teacher labels for the student, beside the task's train rows."""

    def read_unlabeled(self, cfg: TaskConfig, split: str, limit: int | None, exclude: set[int],
                       key: str) -> tuple[list, dict[str, int]]:
        """(items with the UNLABELED label, skipped rows by reason): at most `limit` texts of `split` for a
        teacher to label, none whose text_hash(hash_text) is in `exclude`."""
        raise NotImplementedError


def soft_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(teacher_T || student_T) averaged over the batch, times T^2 (the distributions over the last dim)."""
    return F.kl_div(F.log_softmax(student_logits / temperature, -1), F.log_softmax(teacher_logits / temperature, -1),
                    log_target=True, reduction="batchmean") * temperature**2


# evaluation side: baselines, calibration, zero-shot, report
class Baselined:
    """A train-only baseline (lib.metrics.baselines) the evaluation scores beside the models, fit on the
    train items finetuning learned from and on all of train."""

    baseline: str  # the name the evaluation reports the type's train-only baseline under
    baseline_label: str  # and how the report shows it
    # whether it learns from train; one that does not (copying the source) is scored once, not per train size
    baseline_fits: bool = True

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


def kept_extras(kind: object) -> tuple[Extra, ...]:
    """The extras of its scores that a task type keeps: its Reported.kept_extras, none without the capability."""
    return kind.kept_extras if isinstance(kind, Reported) else ()

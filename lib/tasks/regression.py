"""Sentence(-pair) regression, as BERT finetunes STS-B: a similarity score from one linear output.

- Rows become `Scored(a, b, value)`. A label that is not a finite number (null, NaN, a bool, a string
  that does not parse as one) is skipped and counted by reason, never a traceback: one bad line should
  not stop a run, and the counts say how many there were. -1 is GLUE's mark of an unlabeled test
  row (lib.tasks.base.UNLABELED) and is skipped as "unlabeled"; pass unlabeled=None where -1 is a score.
- Texts are laid out as lib.data.encoding lays out every pair, by `lib.data.encoding.encode`:
  `[bos] a [eos] b [eos]`, segment 0 then 1, cut longest-first to max_len.
- The model is the task's sequence model (lib.tasks.model.TaskModel) with one output, read as a
  standardised score: prediction = output * std + mean, with the train targets' mean and std kept in
  the task's info and saved with the model (classifier.json). A freshly initialised head then
  predicts about the mean, and its weights need the same small scale as a classifier's to reach ±1
  std, so the learning rate that finetunes a classifier also fits 0-5 targets. Unstandardised, the
  head starts near 0, and at 2e-5 AdamW moves its bias by at most about 2e-5 a step: the encoder
  must bend to reach train's mean of 2.7. Measured on STS-B (MiniLM-L6's [CLS] state, 100 steps of 32
  pairs at 2e-5, one seed): validation Pearson 0.809 / Spearman 0.816 / RMSE 0.96 standardised, 0.673
  / 0.576 / 1.23 not. The loss is the MSE in standardised units.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple, Sequence

import torch
import torch.nn.functional as F

from lib.config.errors import UserError
from lib.config.params import EvaluateConfig, TaskConfig
from lib.data.encoding import encode as encode_texts
from lib.data.encoding import padded
from lib.metrics.baselines import tfidf_similarity
from lib.metrics.scores import pearson, spearman
from lib.models.families.base import SEQUENCE_CLASSIFICATION
from lib.tasks.base import TaskType, read_split
from lib.tasks.base import UNLABELED, TaskData
from lib.tasks.capabilities import SCATTER, Baselined, Distilled, Exported, Extra, Plot, Reported


def _pairs(pairs: list[list[float]], class_names: list[str]) -> list[list[float]]:
    return pairs


# [gold, predicted] per evaluation item of a model (a baseline has no predictions of its own to keep): the
# report draws one against the other
PREDICTED_VS_GOLD = Extra("scatter", saved=False,
                          plot=Plot("predicted_vs_gold", ("gold", "predicted"), _pairs, SCATTER))


class Scored(NamedTuple):
    a: str
    b: str | None  # None for a single-text task
    value: float  # the gold score, in label units


@dataclass
class Example:
    ids: list[int]  # token ids, special tokens included
    segments: list[int]  # 0 for [bos] a [eos], 1 for b [eos]
    value: float


def read_rows(rows: Iterable[dict[str, Any]], *, text_field: str = "sentence1",
              text_pair_field: str | None = "sentence2", label_field: str = "label",
              unlabeled: float | None = UNLABELED) -> tuple[list[Scored], Counter]:
    """(items, skipped rows by reason): the rows with text and a finite numeric label. Reasons: empty_text,
    unlabeled (the label equals `unlabeled`), label_missing (null), label_not_a_number (a bool, a list, a
    string that does not parse), label_not_finite (NaN, inf)."""
    items, skipped = [], Counter()
    for row in rows:
        a, b = row.get(text_field), None if text_pair_field is None else row.get(text_pair_field)
        texts = (a,) if text_pair_field is None else (a, b)
        if not all(isinstance(text, str) and text.strip() for text in texts):
            skipped["empty_text"] += 1
            continue
        value, reason = parse_score(row.get(label_field))
        if reason is None and unlabeled is not None and value == unlabeled:
            reason = "unlabeled"
        if reason is not None:
            skipped[reason] += 1
            continue
        items.append(Scored(a, b, value))
    return items, skipped


def parse_score(label: Any) -> tuple[float, str | None]:
    """(value, None) for a finite number or a string holding one, else (nan, the reason it is not one)."""
    if label is None:
        return math.nan, "label_missing"
    if isinstance(label, bool) or not isinstance(label, (int, float, str)):
        return math.nan, "label_not_a_number"  # True == 1 in Python, but a true/false label is the wrong field
    try:
        value = float(label)
    except ValueError:
        return math.nan, "label_not_a_number"
    except OverflowError:  # an int beyond float's range
        return math.nan, "label_not_finite"
    return (value, None) if math.isfinite(value) else (math.nan, "label_not_finite")


def target_scale(items: list[Scored], key: str) -> tuple[float, float]:
    """(mean, std) of the train items' scores, for `Head`. `key` (the task's params key) is named in
    the UserError raised when there is nothing to learn: no items, or all of one score."""
    if not items:
        raise UserError(f"{key}: no train row has a numeric label; check label_field")
    values = torch.tensor([item.value for item in items], dtype=torch.float64)
    std = float(values.std(correction=0))
    if std == 0:
        raise UserError(f"{key}: every train label is {items[0].value}; regression needs labels that vary")
    return float(values.mean()), std


def encode(items: list[Scored], tokenizer, special: dict[str, int], max_len: int,
           truncation: str) -> tuple[list[Example], int]:
    """(examples, number truncated): each item laid out by lib.data.encoding.encode (`special`: role -> id)."""
    pair = bool(items) and items[0].b is not None
    ids, segments, truncated = encode_texts(tokenizer, [item.a for item in items],
                                            [item.b for item in items] if pair else None,
                                            max_len, truncation, special["bos"], special["eos"])
    return [Example(i, s, item.value) for i, s, item in zip(ids, segments, items)], truncated


def collate(examples: list[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """One batch padded on the right to its longest example: input_ids, segment_ids (B, T) long,
    attention_mask (B, T) bool, labels (B,) float32 scores."""
    input_ids, segment_ids, attention_mask = padded([(e.ids, e.segments) for e in examples], pad_id)
    labels = torch.tensor([e.value for e in examples], dtype=torch.float32)
    return {"input_ids": input_ids, "segment_ids": segment_ids, "attention_mask": attention_mask, "labels": labels}


class Regression(Exported, Distilled, Baselined, Reported, TaskType):
    """The model puts out a standardised score (z = (score - mean) / std of the train scores, kept in the
    task's info and saved with the model), learnt by MSE in those units; predictions are z * std + mean."""

    name = "regression"
    metrics = ("pearson", "spearman")
    default_metrics = ("pearson", "spearman")
    task_model = SEQUENCE_CLASSIFICATION  # one output, problem_type "regression"
    pipeline_tag = "text-classification"
    baseline = "tfidf_similarity"
    baseline_label = "TF-IDF cosine"
    timed = "one sentence pair of {seq_len} tokens per call"
    kept_extras = (PREDICTED_VS_GOLD,)

    def read(self, cfg: TaskConfig, split: str, key: str, train: list | None) -> tuple[list[Scored], dict[str, int]]:
        fields = {"a": "text_field", "label": "label_field", **({"b": "text_pair_field"} if cfg.text_pair_field else {})}
        undecodable = Counter()
        items, skipped = read_rows(read_split(cfg, split, key, fields, undecodable), text_field="a",
                                   text_pair_field="b" if cfg.text_pair_field else None)
        return items, {**undecodable, **skipped}

    def hash_text(self, item: Scored) -> str:
        return item.a if item.b is None else f"{item.a}\t{item.b}"

    def fit(self, cfg: TaskConfig, train: list[Scored], key: str) -> dict[str, Any]:
        mean, std = target_scale(train, f"{key}.label_field")
        return {"mean": mean, "std": std}

    def encode(self, items, cfg, tokenizer, special, label_names, info, key,
               causal=False) -> tuple[list[Example], int]:
        return encode(items, tokenizer, special, cfg.max_len, cfg.truncation)

    def n_outputs(self, task: TaskData) -> int:
        return 1

    def export_config(self, label_names: list[str]) -> dict[str, Any]:
        return {"num_labels": 1, "problem_type": "regression"}

    def export_output(self, layer: dict[str, torch.Tensor], info: dict[str, Any],
                      inverse: bool = False) -> dict[str, torch.Tensor]:
        """The output layer whose output is `std * ours + mean`: the score in label units, what
        transformers' regression model should give."""
        weight, bias, mean, std = layer["weight"], layer["bias"], info["mean"], info["std"]
        if inverse:
            return {"weight": weight / std, "bias": (bias - mean) / std}
        return {"weight": weight * std, "bias": bias * std + mean}

    def collate(self, examples: Sequence[Example], pad_id: int, task: TaskData) -> dict[str, torch.Tensor]:
        return collate(list(examples), pad_id)

    def loss(self, outputs: torch.Tensor, batch: dict[str, torch.Tensor], task: TaskData) -> torch.Tensor:
        target = (batch["labels"] - task.info["mean"]) / task.info["std"]
        return F.mse_loss(outputs[:, 0].float(), target)

    def predict(self, outputs: torch.Tensor, examples: Sequence[Example], task: TaskData) -> list[float]:
        return (outputs[:, 0].float() * task.info["std"] + task.info["mean"]).tolist()

    def score(self, task: TaskData, split: str, predictions: list[float], metrics: list[str],
              calibration: dict[str, Any] | None = None) -> tuple[dict[str, float], dict[str, Any]]:
        gold = [e.value for e in (task.dev if split == "dev" else task.eval)]
        functions = {"pearson": pearson, "spearman": spearman}
        return {m: functions[m](predictions, gold) for m in metrics}, {}

    def prediction_extras(self, task: TaskData, predictions: list[float]) -> dict[str, Any]:
        pairs = [[item.value, value] for item, value in zip(task.references["eval"], predictions)]
        return {PREDICTED_VS_GOLD.name: pairs}

    def soft_loss(self, student: torch.Tensor, teacher: torch.Tensor, batch: dict[str, torch.Tensor],
                  temperature: float) -> torch.Tensor:
        """The mean squared difference of the standardised scores (the loss, with the teacher's score for
        the gold one)."""
        return F.mse_loss(student, teacher)

    def baseline_scores(self, task: TaskData, train: list[Scored], metrics: list[str], settings: EvaluateConfig):
        return self.score(task, "eval", tfidf_similarity(train, task.references["eval"]), metrics)


TYPE = Regression()

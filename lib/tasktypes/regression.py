"""Sentence(-pair) regression, as BERT finetunes STS-B: a similarity score from one linear output.

- Rows become `Scored(a, b, value)`. A label that is not a finite number (null, NaN, a bool, a string
  that does not parse as one) is skipped and counted by reason, never a traceback: one bad line should
  not stop a run, and the counts say how many there were. -1 is GLUE's mark of an unlabeled test
  row (lib.tasks.UNLABELED) and is skipped as "unlabeled"; pass unlabeled=None where -1 is a score.
- Texts are laid out as lib.tasks lays out classification inputs, by `lib.tasks.encode`:
  `[bos] a [eos] b [eos]`, segment 0 then 1, cut longest-first to max_len.
- The head is one linear layer d -> 1 over the pooled state of the sequence (the caller pools, as it
  does for classification). Its raw output is read as a standardised score: prediction = raw * std +
  mean, with the train targets' mean and std stored in the head. A freshly initialised head then
  predicts about the mean, and its weights need the same small scale as a classifier's to reach ±1
  std, so the learning rate that finetunes a classifier also fits 0-5 targets. Unstandardised, the
  head starts near 0, and at 2e-5 AdamW moves its bias by at most about 2e-5 a step: the encoder
  must bend to reach train's mean of 2.7. Measured on STS-B (MiniLM-L6's [CLS] state, 100 steps of 32 pairs at 2e-5,
  one seed): validation Pearson 0.809 / Spearman 0.816 / RMSE 0.96 standardised, 0.673 / 0.576 / 1.23
  not. The loss is MSE in label units; AdamW normalises the gradient's scale, so standardising the
  loss as well would change little but its printed value (and how soon clip_norm clips).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from lib.errors import UserError
from lib.tasks import UNLABELED, padded
from lib.tasks import encode as encode_texts


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
    """(examples, number truncated): each item laid out by lib.tasks.encode (`special`: role -> id)."""
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


class Head(nn.Module):
    """Dropout and a linear layer d -> 1 on the pooled state (B, d); -> (B,) scores in label units.
    mean and std (`target_scale`) are buffers, saved with the weights, so a loaded head predicts on
    the scale it was trained on."""

    def __init__(self, d_model: int, mean: float = 0.0, std: float = 1.0, dropout: float = 0.1):
        super().__init__()
        if not std > 0:
            raise ValueError(f"std must be positive, got {std}")
        self.dropout = nn.Dropout(dropout)
        self.linear = nn.Linear(d_model, 1)
        self.register_buffer("mean", torch.tensor(float(mean)))
        self.register_buffer("std", torch.tensor(float(std)))

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        standardised = self.linear(self.dropout(pooled)).squeeze(-1)
        return standardised * self.std + self.mean


def loss(scores: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean squared error in label units (in float32, whatever the autocast dtype)."""
    return F.mse_loss(scores.float(), batch["labels"].float())


def decode(scores: torch.Tensor) -> list[float]:
    """The predicted scores, for lib.metrics.pearson / spearman."""
    return scores.detach().float().cpu().tolist()

"""Multiple choice, as BERT finetunes SWAG: score each (context, ending) sequence, softmax over the endings.

- Rows become `Question(context, endings, label)`. Every question of a task has the same number of
  endings, `n_choices`: given, or the most common count of the rows read (the caller passes the train
  split's count on to its evaluation splits; the first row's count would let one malformed first row
  drop every other). A row with another count, a label that is not an index of its
  endings, or an empty text is skipped and counted by reason: one malformed row should not stop a run,
  and a ragged batch could not be a (B, n_choices, T) tensor.
- Each choice is encoded as its own pair by `lib.data.encoding.encode`, `[bos] context [eos] ending [eos]`,
  segment 0 then 1, cut longest-first to max_len (so a long context gives way before a short ending).
  A feature holds its question's n_choices sequences; a batch pads all of them to its longest one.
- The type's forward runs the model on the (B * n_choices, T) flattened batch, its head (one output)
  scoring each sequence's pooled state as for classification, viewed back as (B, n_choices); the loss is
  cross-entropy over a question's scores (B, n_choices): the choices compete, as in BERT's SWAG head
  (Devlin et al. 2019, section 4.4), rather than each being judged right or wrong on its own.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple, Sequence

import torch
import torch.nn.functional as F

from lib.config.params import EvaluateConfig, TaskConfig
from lib.data.encoding import encode as encode_texts
from lib.data.encoding import padded
from lib.metrics.baselines import tfidf_choice_scores
from lib.metrics.scores import choice_accuracy, confusion_matrix
from lib.models.families.base import MULTIPLE_CHOICE
from lib.tasks.base import TaskData
from lib.tasks.base import TaskType, read_split
from lib.tasks.capabilities import CONFUSION, Baselined, Distilled, Exported, Reported


class Question(NamedTuple):
    context: str
    endings: list[str]
    label: int  # index of the right ending


@dataclass
class Choices:
    ids: list[list[int]]  # per choice: token ids, special tokens included
    segments: list[list[int]]  # per choice: 0 for [bos] context [eos], 1 for ending [eos]
    label: int


def read_rows(rows: Iterable[dict[str, Any]], n_choices: int | None = None, *, context_field: str = "startphrase",
              endings_field: str = "endings", label_field: str = "label") -> tuple[list[Question], Counter]:
    """(items, skipped rows by reason). n_choices None takes the most common count of endings (the first
    such on a tie). Reasons: empty_text (the context or an ending is not a non-empty string), endings_not_a_list,
    n_choices (another number of endings), label_not_an_int (null, bool, float, string), label_out_of_range."""
    items, skipped = [], Counter()
    if n_choices is None:
        rows = list(rows)
        counts = Counter(len(row[endings_field]) for row in rows if isinstance(row.get(endings_field), list))
        n_choices = counts.most_common(1)[0][0] if counts else 0
    for row in rows:
        context, endings, label = row.get(context_field), row.get(endings_field), row.get(label_field)
        if not isinstance(endings, list):
            skipped["endings_not_a_list"] += 1
            continue
        if len(endings) != n_choices:
            skipped["n_choices"] += 1
        elif not all(isinstance(text, str) and text.strip() for text in (context, *endings)):
            skipped["empty_text"] += 1
        elif type(label) is not int:  # not isinstance: True is an int, and "1" is likely the wrong field
            skipped["label_not_an_int"] += 1
        elif not 0 <= label < n_choices:
            skipped["label_out_of_range"] += 1
        else:
            items.append(Question(context, endings, label))
    return items, skipped


def encode(items: list[Question], tokenizer, special: dict[str, int], max_len: int,
           truncation: str) -> tuple[list[Choices], int]:
    """(features, number of choice sequences truncated): each (context, ending) pair laid out by
    lib.data.encoding.encode (`special`: role -> id), grouped per question in the order of its endings. One
    encode call for all pairs: the tokenizer batches them across threads."""
    contexts = [item.context for item in items for _ in item.endings]
    endings = [ending for item in items for ending in item.endings]
    ids, segments, truncated = encode_texts(tokenizer, contexts, endings, max_len, truncation,
                                            special["bos"], special["eos"])
    features, start = [], 0
    for item in items:
        end = start + len(item.endings)
        features.append(Choices(ids[start:end], segments[start:end], item.label))
        start = end
    return features, truncated


def collate(features: list[Choices], pad_id: int) -> dict[str, torch.Tensor]:
    """One batch, every choice padded on the right to the batch's longest sequence: input_ids,
    segment_ids (B, n_choices, T) long, attention_mask (B, n_choices, T) bool, labels (B,) long."""
    n_choices = len(features[0].ids)
    if any(len(f.ids) != n_choices for f in features):
        raise ValueError(f"every question of a batch needs {n_choices} choices")
    flat = padded([pair for f in features for pair in zip(f.ids, f.segments)], pad_id)
    input_ids, segment_ids, attention_mask = (t.view(len(features), n_choices, -1) for t in flat)
    labels = torch.tensor([f.label for f in features], dtype=torch.long)
    return {"input_ids": input_ids, "segment_ids": segment_ids, "attention_mask": attention_mask, "labels": labels}


def loss(scores: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy of the right choice among each question's choices (in float32)."""
    return F.cross_entropy(scores.float(), batch["labels"])


class MultipleChoice(Exported, Distilled, Baselined, Reported, TaskType):
    """The encoder runs over every (context, ending) sequence of a batch, (B * n_choices, T); the head
    scores each sequence's summary state (one output), viewed back as (B, n_choices)."""

    name = "multiple_choice"
    metrics = default_metrics = ("accuracy",)
    pair_role = "list of endings"
    # Each ending completes the context (text_field) into the text a document would hold ("The chicken
    # cannot fly. It" + " " + "crosses the road."): an ending alone is a fragment, mostly shorter than
    # the words decontamination matches on, and as generic.
    field_kinds = {"text_pair_field": "endings"}
    # the pooled state (the base model's pooler: dense + tanh on the first token), dropout, a linear layer
    # to one score per choice
    task_model = MULTIPLE_CHOICE
    pipeline_tag = "multiple-choice"
    baseline = "tfidf_choice"
    baseline_label = "TF-IDF ending cosine"
    timed = ("one question per call: its {n} (context, ending) sequences of {seq_len} tokens as one batch of {n}; "
             "throughput in sequences/s (÷ {n} for questions/s)")
    kept_extras = (CONFUSION,)  # over the endings: whether a model favours a position

    def read(self, cfg: TaskConfig, split: str, key: str, train: list | None) -> tuple[list[Question], dict[str, int]]:
        undecodable = Counter()
        rows = read_split(cfg, split, key, {"context": "text_field", "endings": "text_pair_field",
                                            "label": "label_field"}, undecodable)
        items, skipped = read_rows(rows, None if train is None else len(train[0].endings), context_field="context",
                                   endings_field="endings", label_field="label")
        return items, {**undecodable, **skipped}

    def hash_text(self, item: Question) -> str:
        return "\t".join([item.context, *item.endings])

    def prepare(self, cfg: TaskConfig, train: list[Question], key: str) -> tuple[list[str], dict[str, Any]]:
        return [], {"n_choices": len(train[0].endings)}

    def encode(self, items, cfg, tokenizer, special, label_names, info, key,
               causal=False) -> tuple[list[Choices], int]:
        return encode(items, tokenizer, special, cfg.max_len, cfg.truncation)

    def n_outputs(self, task: TaskData) -> int:
        return 1

    def collate(self, examples: Sequence[Choices], pad_id: int, task: TaskData) -> dict[str, torch.Tensor]:
        return collate(list(examples), pad_id)

    def inputs(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return tuple(batch[k].flatten(0, 1) for k in ("input_ids", "segment_ids", "attention_mask"))

    def shape(self, outputs: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return outputs.view(batch["input_ids"].shape[:2])

    def loss(self, outputs: torch.Tensor, batch: dict[str, torch.Tensor], task: TaskData) -> torch.Tensor:
        return loss(outputs, batch)

    def predict(self, outputs: torch.Tensor, examples: Sequence[Choices], task: TaskData) -> list[list[float]]:
        return outputs.float().tolist()

    def score(self, task: TaskData, split: str, predictions: list[list[float]], metrics: list[str],
              calibration: dict[str, Any] | None = None) -> tuple[dict[str, float], dict[str, Any]]:
        labels = [e.label for e in (task.dev if split == "dev" else task.eval)]
        chosen = [max(range(len(scores)), key=scores.__getitem__) for scores in predictions]  # the first on a tie
        return ({"accuracy": choice_accuracy(predictions, labels)},
                {CONFUSION.name: confusion_matrix(chosen, labels, task.info["n_choices"]).tolist()})

    def class_names(self, task: TaskData) -> list[str]:
        return [f"ending {i}" for i in range(task.info["n_choices"])]

    def baseline_scores(self, task: TaskData, train: list[Question], metrics: list[str], settings: EvaluateConfig):
        return self.score(task, "eval", tfidf_choice_scores(train, task.references["eval"]).tolist(), metrics)

    def latency_batch(self, info: dict[str, Any]) -> int:
        return info["n_choices"]


TYPE = MultipleChoice()

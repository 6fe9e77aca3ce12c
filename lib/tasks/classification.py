"""Classification of one text or a pair: cross-entropy over the classes; accuracy, F1 and MCC with the
confusion matrix.

`load_task` turns a task's train split and its first evaluation split into token-id examples:
- Labels come from the data. The class set is the train split's labels, sorted (ints as ints,
  strings as strings), unless `label_names` fixes the names and so the indices. Every train row must
  be labeled; an evaluation split whose labels are all missing (GLUE marks them -1) is an unlabeled
  test split and gives no evaluation examples rather than an error.
- Dev is hashed out of train by the example's text (both texts of a pair) as lib/tasks/base.py says,
  ties between identical texts broken by the label; texts are laid out and cut as lib/data/encoding.py
  says.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import torch
import torch.nn.functional as F

from lib.config.params import TaskConfig
from lib.core.errors import UserError
from lib.data.encoding import encode, padded
from lib.data.sources import read_rows, split_columns
from lib.evaluation.metrics import compute_metrics, confusion_matrix
from lib.models.hf import SEQUENCE_CLASSIFIERS
from lib.tasks.base import (UNLABELED, TaskData, TaskType, hashed_split, hashed_subset, label_config, smallest_hashes,
                            text_hash)


@dataclass
class Example:
    ids: list[int]  # token ids, special tokens included
    segments: list[int]  # 0 for [bos] a [eos], 1 for b [eos]
    label: int  # class index 0..n-1


class Row(NamedTuple):
    a: str
    b: str | None
    label: Any  # as read; an index once labels are mapped


def example_hash(row: Row) -> int:
    """A 64-bit hash of the example's text (read as a fraction of 2**64, uniform in [0, 1)): both
    texts of a pair, so the same sentence in two pairs is two examples."""
    return text_hash(row.a if row.b is None else f"{row.a}\t{row.b}")


@dataclass
class TaskRows:
    """A task's texts and label indices, selected as load_task selects them (for text baselines)."""
    name: str
    label_names: list[str]
    train: list[Row]
    dev: list[Row]
    eval: list[Row] | None  # None when the evaluation split has no labels
    eval_split: str
    skipped: dict[str, int]


def read_task(name: str, cfg: TaskConfig, *, dev_fraction: float, dev_max: int, max_train: int | None = None,
              max_eval: int | None = None, eval_split: str | None = None) -> TaskRows:
    """Read task `name`: train and dev rows from cfg.train_split, eval rows from `eval_split` (default
    cfg.eval_splits[0]), labels as class indices. Raises UserError on unusable data."""
    key = f"tasks.{name}"
    eval_split = eval_split or cfg.eval_splits[0]
    skipped: dict[str, int] = {}
    train_rows = _read_split(cfg, cfg.train_split, "train", key, skipped)
    # a split without the label field (GLUE's test_unlabeled) is read as unlabeled: no evaluation examples
    labeled = cfg.label_field in split_columns(cfg.source, eval_split, key)
    eval_rows = _read_split(cfg, eval_split, "eval", key, skipped, labeled=labeled)
    label_names, index = _label_index(cfg, train_rows, key)
    train_rows = [row._replace(label=index[row.label]) for row in train_rows]

    train_ids, dev_ids = hashed_split([example_hash(row) for row in train_rows], [row.label for row in train_rows],
                                      key, dev_fraction=dev_fraction, dev_max=dev_max, max_train=max_train)
    evaluation = None
    if not all(_unlabeled(row.label) for row in eval_rows):
        eval_rows = [row._replace(label=_eval_index(row.label, index, eval_split, key)) for row in eval_rows]
        kept = hashed_subset([example_hash(row) for row in eval_rows], [row.label for row in eval_rows], max_eval)
        evaluation = [eval_rows[i] for i in kept]
    return TaskRows(name=name, label_names=label_names, train=[train_rows[i] for i in train_ids],
                    dev=[train_rows[i] for i in dev_ids], eval=evaluation, eval_split=eval_split,
                    skipped=skipped)


def load_task(name: str, cfg: TaskConfig, tokenizer, special: dict[str, int], *, dev_fraction: float,
              dev_max: int, max_train: int | None = None, max_eval: int | None = None) -> TaskData:
    """read_task's rows encoded with `tokenizer` (`special`: role -> id, as lib.data.tokenizer.special_ids)."""
    rows = read_task(name, cfg, dev_fraction=dev_fraction, dev_max=dev_max, max_train=max_train, max_eval=max_eval)
    return encode_task(rows, cfg, tokenizer, special)


def encode_task(rows: TaskRows, cfg: TaskConfig, tokenizer, special: dict[str, int]) -> TaskData:
    """A task's selected rows as token-id examples."""
    train, train_cut = encode_rows(rows.train, cfg, tokenizer, special)
    dev, dev_cut = encode_rows(rows.dev, cfg, tokenizer, special)
    evaluation, eval_cut = encode_rows(rows.eval, cfg, tokenizer, special) if rows.eval is not None else (None, 0)
    return TaskData(name=rows.name, label_names=rows.label_names, train=train, dev=dev, eval=evaluation,
                    eval_split=rows.eval_split, skipped=rows.skipped,
                    truncated={"train": train_cut + dev_cut, "eval": eval_cut})


def encode_rows(rows: list[Row], cfg: TaskConfig, tokenizer, special: dict[str, int]) -> tuple[list[Example], int]:
    """(examples, number truncated): rows encoded as the task's config says."""
    ids, segments, truncated = encode(
        tokenizer, [row.a for row in rows], None if cfg.text_pair_field is None else [row.b for row in rows],
        cfg.max_len, cfg.truncation, special["bos"], special["eos"])
    return [Example(i, s, row.label) for i, s, row in zip(ids, segments, rows)], truncated


def read_unlabeled(name: str, cfg: TaskConfig, split: str, limit: int | None,
                   exclude: set[int]) -> tuple[list[Row], dict[str, int]]:
    """(rows, skipped rows by reason): the texts of `split` of the task's source with label UNLABELED, at most
    `limit` of smallest hash, none whose hash is in `exclude` (the dev and evaluation texts, which a
    teacher-labeled copy would leak into training). Empty texts are skipped and counted."""
    skipped: dict[str, int] = {}
    rows = _read_split(cfg, split, "unlabeled", f"tasks.{name}", skipped, labeled=False)
    hashes = [example_hash(row) for row in rows]
    fresh = [i for i, h in enumerate(hashes) if h not in exclude]
    kept = smallest_hashes(fresh, hashes, [0] * len(rows), limit)
    skipped["unlabeled.overlap"] = len(rows) - len(fresh)
    return [rows[i] for i in kept], skipped


def _read_split(cfg: TaskConfig, split: str, role: str, key: str, skipped: dict[str, int],
                labeled: bool = True) -> list[Row]:
    """The rows of `split` that have text (both texts of a pair); the others are counted in `skipped`.
    labeled=False reads the texts only, each with the label UNLABELED."""
    fields = {"a": cfg.text_field, **({"label": cfg.label_field} if labeled else {})}
    if cfg.text_pair_field is not None:
        fields["b"] = cfg.text_pair_field
    rows, empty = [], 0
    field_keys = {"a": f"{key}.text_field", "b": f"{key}.text_pair_field", "label": f"{key}.label_field"}
    for row in read_rows(cfg.source, split, fields, key, field_keys=field_keys):
        for out, field in (("a", cfg.text_field), ("b", cfg.text_pair_field)):
            value = row.get(out)
            if value is not None and not isinstance(value, str):
                which = "text_field" if out == "a" else "text_pair_field"
                raise UserError(f"{key}.{which}: field '{field}' of split '{split}' holds {type(value).__name__} "
                                "values, not text; name a text field")
        texts = (row["a"], row["b"]) if cfg.text_pair_field is not None else (row["a"],)
        if any(text is None or not text.strip() for text in texts):
            empty += 1
            continue
        rows.append(Row(row["a"], row.get("b"), row["label"] if labeled else UNLABELED))
    skipped[f"{role}.empty_text"] = empty
    if not rows:
        raise UserError(f"{key}.text_field: split '{split}' has no row with text ({empty} empty)")
    return rows


def _unlabeled(label: Any) -> bool:
    return label is None or (type(label) is int and label == UNLABELED)


def _label_index(cfg: TaskConfig, rows: list[Row], key: str) -> tuple[list[str], dict[Any, int]]:
    """(label names by index, train label value -> index), from the labels of the train rows."""
    field = f"{key}.label_field"
    values = set()
    for n, row in enumerate(rows):
        if _unlabeled(row.label):
            raise UserError(f"{field}: split '{cfg.train_split}' has an unlabeled row ({row.label!r}, row {n} "
                            "with text); finetuning needs every train row labeled")
        # bool is an int in Python, but a true/false label is more likely a wrong field than class ids
        if type(row.label) not in (int, str):
            raise UserError(f"{field}: '{cfg.label_field}' holds {type(row.label).__name__} values "
                            f"({row.label!r}); labels must be integers or strings")
        values.add(row.label)
    if len({type(v) for v in values}) > 1:
        raise UserError(f"{field}: '{cfg.label_field}' of split '{cfg.train_split}' has mixed types "
                        "(integers and strings); use one type for all labels")
    classes = sorted(values)
    if len(classes) < 2:
        raise UserError(f"{field}: split '{cfg.train_split}' has one class ({classes[0]!r}); "
                        "a classifier needs at least 2")
    if cfg.label_names is None:
        return [str(c) for c in classes], {c: i for i, c in enumerate(classes)}
    names = cfg.label_names
    if isinstance(classes[0], int):
        outside = [c for c in classes if not 0 <= c < len(names)]
        if outside:
            raise UserError(f"{key}.label_names: train label {outside[0]} has no name: integer labels index "
                            f"label_names, which has {len(names)}")
        return list(names), {c: c for c in classes}
    unnamed = [c for c in classes if c not in names]
    if unnamed:
        raise UserError(f"{key}.label_names: train label {unnamed[0]!r} is not in {names}")
    return list(names), {c: names.index(c) for c in classes}


def _eval_index(label: Any, index: dict[Any, int], split: str, key: str) -> int:
    # type() keeps True from matching the class 1 (True == 1 and hashes alike)
    if type(label) not in (int, str) or label not in index:
        raise UserError(f"{key}.label_field: split '{split}' has label {label!r}, which is not a train label "
                        f"({', '.join(map(repr, index))}); evaluation needs labels the model was trained on")
    return index[label]


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, T) long, padded with pad_id
    segment_ids: torch.Tensor  # (B, T) long, 0 at padding
    attention_mask: torch.Tensor  # (B, T) bool, True at real tokens
    labels: torch.Tensor  # (B,) long


def collate(examples: Sequence[Example], pad_id: int) -> Batch:
    """One batch, padded on the right to its longest example."""
    input_ids, segment_ids, attention_mask = padded([(e.ids, e.segments) for e in examples], pad_id)
    return Batch(input_ids, segment_ids, attention_mask, torch.tensor([e.label for e in examples], dtype=torch.long))


class Classification(TaskType):
    name = "classification"
    metrics = ("accuracy", "f1", "mcc")
    default_metrics = ("accuracy",)
    named_labels = True
    exports = SEQUENCE_CLASSIFIERS
    baseline = "tfidf"
    baseline_label = "TF-IDF + LR"
    timed = "one text of {seq_len} tokens per call"
    aux_lm = True
    logistic_probe = True
    unlabeled_transfer = True
    served = True

    def load(self, name: str, cfg: TaskConfig, tokenizer, special: dict[str, int], *, dev_fraction: float,
             dev_max: int, max_train: int | None = None, max_eval: int | None = None,
             causal: bool = False) -> TaskData:
        return load_task(name, cfg, tokenizer, special, dev_fraction=dev_fraction, dev_max=dev_max,
                         max_train=max_train, max_eval=max_eval)

    def n_outputs(self, task: TaskData) -> int:
        return len(task.label_names)

    def export_config(self, label_names: list[str]) -> dict[str, Any]:
        return {**label_config(label_names), "problem_type": "single_label_classification"}

    def collate(self, examples: Sequence[Example], pad_id: int, task: TaskData) -> dict[str, torch.Tensor]:
        return vars(collate(examples, pad_id))

    def class_names(self, task: TaskData) -> list[str]:
        return task.label_names

    def loss(self, outputs: torch.Tensor, batch: dict[str, torch.Tensor], task: TaskData) -> torch.Tensor:
        return F.cross_entropy(outputs.float(), batch["labels"])

    def predict(self, outputs: torch.Tensor, examples: Sequence[Example], task: TaskData) -> list[int]:
        return outputs.argmax(-1).tolist()

    def score(self, task: TaskData, split: str, predictions: list[int], metrics: list[str],
              calibration: dict[str, Any] | None = None) -> tuple[dict[str, float], dict[str, Any]]:
        examples = task.dev if split == "dev" else task.eval
        return scores_of(torch.tensor(predictions), torch.tensor([e.label for e in examples]), metrics,
                         len(task.label_names))


def scores_of(predicted: torch.Tensor, labels: torch.Tensor, metrics: list[str],
              n_classes: int) -> tuple[dict[str, float], dict[str, Any]]:
    """(metrics, {"confusion": matrix, rows = true class}) of predicted classes."""
    return (compute_metrics(metrics, predicted, labels, n_classes),
            {"confusion": confusion_matrix(predicted, labels, n_classes).tolist()})


TYPE = Classification()

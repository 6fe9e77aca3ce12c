"""Classification of one text or a pair: cross-entropy over the classes; accuracy, F1 and MCC with the
confusion matrix.

Read and selected as lib/tasks/base.py's `select` reads every type:
- Labels come from the data. The class set is the train split's labels, sorted (ints as ints,
  strings as strings, stripped of surrounding whitespace; two that differ only by case are an error),
  unless `label_names` fixes the names and so the indices. Every train row must be labeled; an
  evaluation split whose labels are all missing (GLUE marks them -1) is an unlabeled test split and
  gives no evaluation examples rather than an error.
- Dev is hashed out of train by the example's text (both texts of a pair), ties between identical
  texts broken by the class index; texts are laid out and cut as lib/data/encoding.py says.
- For distillation, unlabeled in-domain texts (`read_unlabeled`) that the teacher alone labels.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import torch
import torch.nn.functional as F

from lib.config.errors import UserError
from lib.config.params import EvaluateConfig, TaskConfig
from lib.data.encoding import encode, padded
from lib.metrics.baselines import tfidf_baseline
from lib.metrics.scores import compute_metrics, confusion_matrix
from lib.models.families.base import SEQUENCE_CLASSIFICATION
from lib.tasks.base import UNLABELED, TaskData, TaskType, label_config, read_split, smallest_hashes, text_hash
from lib.tasks.capabilities import CONFUSION, Baselined, Exported, Reported, Served, UnlabeledTransfer, ZeroShot


@dataclass
class Example:
    ids: list[int]  # token ids, special tokens included
    segments: list[int]  # 0 for [bos] a [eos], 1 for b [eos]
    label: int  # class index 0..n-1


class Row(NamedTuple):
    a: str
    b: str | None
    label: Any  # as read; an index once labels are mapped


def encode_rows(rows: list[Row], cfg: TaskConfig, tokenizer, special: dict[str, int]) -> tuple[list[Example], int]:
    """(examples, number truncated): rows encoded as the task's config says."""
    ids, segments, truncated = encode(
        tokenizer, [row.a for row in rows], None if cfg.text_pair_field is None else [row.b for row in rows],
        cfg.max_len, cfg.truncation, special["bos"], special["eos"])
    return [Example(i, s, row.label) for i, s, row in zip(ids, segments, rows)], truncated


def hash_text(row: Row) -> str:
    """Both texts of a pair, so the same sentence in two pairs is two items."""
    return row.a if row.b is None else f"{row.a}\t{row.b}"


def read_unlabeled(cfg: TaskConfig, split: str, limit: int | None, exclude: set[int],
                   key: str) -> tuple[list[Row], dict[str, int]]:
    """(rows, skipped rows by reason): the texts of `split` of the task's source with label UNLABELED, at most
    `limit` of smallest hash, none whose hash is in `exclude` (the dev and evaluation texts, which a
    teacher-labeled copy would leak into training). Empty texts are skipped and counted."""
    skipped: dict[str, int] = {}
    rows = _read_split(cfg, split, "unlabeled", key, skipped, labeled=False)
    hashes = [text_hash(hash_text(row)) for row in rows]
    fresh = [i for i, h in enumerate(hashes) if h not in exclude]
    kept = smallest_hashes(fresh, hashes, [0] * len(rows), limit)
    skipped["unlabeled.overlap"] = len(rows) - len(fresh)
    return [rows[i] for i in kept], skipped


def _read_split(cfg: TaskConfig, split: str, role: str, key: str, skipped: dict[str, int],
                labeled: bool = True) -> list[Row]:
    """The rows of `split` that decoded and have text (both texts of a pair); the others are counted in
    `skipped` under `role`. labeled=False reads the texts only, each with the label UNLABELED."""
    fields = {"a": "text_field", **({"label": "label_field"} if labeled else {})}
    if cfg.text_pair_field is not None:
        fields["b"] = "text_pair_field"
    rows, empty, undecodable = [], 0, Counter()
    for row in read_split(cfg, split, key, fields, undecodable):
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
        rows.append(Row(row["a"], row.get("b"), _stripped(row["label"]) if labeled else UNLABELED))
    skipped.update({f"{role}.{reason}": n for reason, n in undecodable.items()})
    skipped[f"{role}.empty_text"] = empty
    if not rows:
        raise UserError(f"{key}.text_field: split '{split}' has no row with text ({empty} empty)")
    return rows


def _stripped(label: Any) -> Any:
    """A string label without surrounding whitespace ('pos ' is class 'pos'; a blank one is missing)."""
    return (label.strip() or None) if isinstance(label, str) else label


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
    spellings: dict[str, str] = {}  # a class by its casefolded name: 'Pos' beside 'pos' is a typo, not a class
    for c in classes:
        if isinstance(c, str) and spellings.setdefault(c.casefold(), c) != c:
            raise UserError(f"{field}: split '{cfg.train_split}' has labels {spellings[c.casefold()]!r} and {c!r}, "
                            "which differ only by case; write each class one way")
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


class Classification(Exported, Served, UnlabeledTransfer, Baselined, ZeroShot, Reported, TaskType):
    name = "classification"
    metrics = ("accuracy", "f1", "mcc")
    default_metrics = ("accuracy",)
    named_labels = True
    task_model = SEQUENCE_CLASSIFICATION
    pipeline_tag = "text-classification"
    baseline = "tfidf"
    baseline_label = "TF-IDF + LR"
    timed = "one text of {seq_len} tokens per call"
    aux_lm = True
    logistic_probe = True
    kept_extras = (CONFUSION,)

    def read(self, cfg: TaskConfig, split: str, key: str, train: list | None) -> tuple[list[Row], dict[str, int]]:
        """The rows with text, labels as read. An evaluation split whose labels are all missing (GLUE marks
        them -1) is unlabeled: no items; otherwise each of its labels must be a train label (label_ids)."""
        skipped: dict[str, int] = {}
        rows = _read_split(cfg, split, "split", key, skipped)
        counts = {reason.removeprefix("split."): n for reason, n in skipped.items()}
        if train is not None and all(_unlabeled(row.label) for row in rows):
            return [], {**counts, "unlabeled": len(rows)}
        return rows, counts

    def hash_text(self, item: Row) -> str:
        return hash_text(item)

    def tie(self, item: Row) -> int:
        return item.label  # the class index, by then (label_ids)

    def prepare(self, cfg: TaskConfig, train: list[Row], key: str) -> tuple[list[str], dict[str, Any]]:
        return _label_index(cfg, train, key)[0], {}

    def label_ids(self, cfg: TaskConfig, train: list[Row], evaluation: list[Row], eval_split: str,
                  key: str) -> tuple[list[Row], list[Row]]:
        _, index = _label_index(cfg, train, key)
        return ([row._replace(label=index[row.label]) for row in train],
                [row._replace(label=_eval_index(row.label, index, eval_split, key)) for row in evaluation])

    def encode(self, items, cfg, tokenizer, special, label_names, info, key,
               causal=False) -> tuple[list[Example], int]:
        return encode_rows(items, cfg, tokenizer, special)

    def read_unlabeled(self, cfg: TaskConfig, split: str, limit: int | None, exclude: set[int],
                       key: str) -> tuple[list[Row], dict[str, int]]:
        return read_unlabeled(cfg, split, limit, exclude, key)

    def encode_texts(self, texts: list[str], text_pairs: list[str] | None, encoding, tokenizer,
                     special: dict[str, int]) -> list[Example]:
        rows = [Row(a, b, UNLABELED) for a, b in zip(texts, text_pairs or [None] * len(texts))]
        return encode_rows(rows, encoding, tokenizer, special)[0]

    def n_outputs(self, task: TaskData) -> int:
        return len(task.label_names)

    def export_config(self, label_names: list[str]) -> dict[str, Any]:
        return {**label_config(label_names), "problem_type": "single_label_classification"}

    def collate(self, examples: Sequence[Example], pad_id: int, task: TaskData) -> dict[str, torch.Tensor]:
        return vars(collate(examples, pad_id))

    def class_names(self, task: TaskData) -> list[str]:
        return task.label_names

    def baseline_scores(self, task: TaskData, train: list[Row], metrics: list[str], settings: EvaluateConfig):
        """TF-IDF + logistic regression, its C picked on dev among evaluate.tfidf_c."""
        fit = tfidf_baseline(train, task.references["dev"], task.references["eval"], len(task.label_names), metrics,
                             c_grid=tuple(settings.tfidf_c))
        return {**fit["eval"], "c": fit["c"], "seconds": fit["seconds"]}, {CONFUSION.name: fit["confusion"]}

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
            {CONFUSION.name: confusion_matrix(predicted, labels, n_classes).tolist()})


TYPE = Classification()

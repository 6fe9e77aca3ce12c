"""Labeled classification tasks for the finetune stage: read, label, split, encode, batch.

`load_task` turns a task's train split and its first evaluation split into token-id examples:

- Labels come from the data. The class set is the train split's labels, sorted (ints as ints,
  strings as strings), unless `label_names` fixes the names and so the indices. Every train row must
  be labeled; an evaluation split whose labels are all missing (GLUE marks them -1) is an unlabeled
  test split and gives no evaluation examples rather than an error.
- The dev set that picks the best epoch is carved out of train by a hash of each example's text, not
  by position or a seeded shuffle: the same rows land in dev whatever the row order, the seed or the
  variant, so every run of a task is selected on the same examples, and identical texts fall on the
  same side, so a duplicate in train can not leak a dev example's label. `max_train`/`max_eval` keep
  the examples of smallest hash for the same reasons: a quick run's subset is fixed, and the dev set
  does not change with max_train (runs with different training sizes are compared on the same dev).
- Texts are encoded without the tokenizer's post-processor and laid out here as `[bos] a [eos]` or
  `[bos] a [eos] b [eos]`, with segment ids 0 up to the first eos and 1 after, so the layout does not
  depend on how a tokenizer was saved. A text longer than `max_len` (specials included) keeps its
  head, its tail, or both: `head_tail` keeps the first quarter and the last three quarters of the
  budget, Sun et al. (2019)'s best split for long reviews (head 128 + tail 382 of 512), since the end
  of a review often sums it up. Pairs are cut longest-first, each side in the same mode.

`batches` pads each batch to its own longest example and groups examples of similar length, so
little of a batch is padding (scoring is lib.evaluation.metrics').
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any, Iterator, NamedTuple, Sequence

import torch

from lib.config.params import TaskConfig
from lib.core.errors import UserError
from lib.data.sources import read_rows, split_columns
from lib.data.tokenizer import check_plain

TRUNCATIONS = ("head", "tail", "head_tail")
SORT_CHUNK = 50  # shuffled batches sort by length within chunks of this many batches
UNLABELED = -1  # GLUE's label of an unlabeled test row (null also counts)


@dataclass
class Example:
    ids: list[int]  # token ids, special tokens included
    segments: list[int]  # 0 for [bos] a [eos], 1 for b [eos]
    label: int  # class index 0..n-1


@dataclass
class TaskData:
    """A task's model inputs. Classification's are `Example`s; the other types (lib/tasks) keep
    their own examples here, each with the `ids` that batches sort by length."""
    name: str
    label_names: list[str]  # index -> name (tagging: the tags; [] where a type has no classes)
    train: list[Example]
    dev: list[Example]  # carved from train by hash; picks the best epoch
    eval: list[Example] | None  # the first of cfg.eval_splits; None when that split has no labels
    eval_split: str
    skipped: dict[str, int]  # dropped rows per "<train|eval>.<reason>"
    truncated: dict[str, int]  # examples cut to max_len per split: "train" (train + dev) and "eval"
    type: str = "classification"
    info: dict[str, Any] = field(default_factory=dict)  # what a type's model needs besides labels, saved with it
    references: dict[str, list] = field(default_factory=dict)  # per split: the rows a type reads (and scores against)

    def size(self, split: str) -> int:
        """How many items `split` ("train", "dev", "eval") holds: rows, not model inputs (a question of
        span QA may be several windows)."""
        if split in self.references:
            return len(self.references[split])
        examples = {"train": self.train, "dev": self.dev, "eval": self.eval}[split]
        return len(examples) if examples is not None else 0


class Row(NamedTuple):
    a: str
    b: str | None
    label: Any  # as read; an index once labels are mapped


def encode(tokenizer, texts_a: list[str], texts_b: list[str] | None, max_len: int, truncation: str,
           bos_id: int, eos_id: int) -> tuple[list[list[int]], list[list[int]], int]:
    """-> (ids, segments, number of examples truncated). Single: [bos] a [eos]; pair: [bos] a [eos] b [eos],
    segment 0 up to and including the first eos, 1 after. At most `max_len` tokens, specials included;
    a pair is cut longest-first: tokens leave the longer side until it fits (the first side keeps the
    odd one when both are cut to the same length), each side cut by `truncation`."""
    if truncation not in TRUNCATIONS:
        raise ValueError(f"truncation '{truncation}' is not one of {TRUNCATIONS}")
    check_plain(tokenizer)
    # Special tokens are placed here rather than by the tokenizer's post-processor, whose template
    # would count towards no budget and may differ between tokenizers.
    encoded_a = [e.ids for e in tokenizer.encode_batch(texts_a, add_special_tokens=False)]
    if texts_b is None:
        ids, segments, truncated = [], [], 0
        for a in encoded_a:
            keep = _cut(a, max_len - 2, truncation)
            truncated += len(keep) < len(a)
            ids.append([bos_id, *keep, eos_id])
            segments.append([0] * len(ids[-1]))
        return ids, segments, truncated
    encoded_b = [e.ids for e in tokenizer.encode_batch(texts_b, add_special_tokens=False)]
    ids, segments, truncated = [], [], 0
    for a, b in zip(encoded_a, encoded_b, strict=True):
        len_a, len_b = _pair_lengths(len(a), len(b), max_len - 3)
        truncated += (len_a, len_b) != (len(a), len(b))
        first = [bos_id, *_cut(a, len_a, truncation), eos_id]
        second = [*_cut(b, len_b, truncation), eos_id]
        ids.append(first + second)
        segments.append([0] * len(first) + [1] * len(second))
    return ids, segments, truncated


def _pair_lengths(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """Lengths after removing one token at a time from the longer side (from b on a tie) until the
    two fit in `budget`, in closed form: long texts (IMDb) would take thousands of steps."""
    if len_a + len_b <= budget:
        return len_a, len_b
    half_a, half_b = (budget + 1) // 2, budget // 2
    if len_b <= half_b:  # cutting a alone fits before a gets shorter than b
        return budget - len_b, len_b
    if len_a <= half_a:
        return len_a, budget - len_a
    return half_a, half_b


def _cut(ids: list[int], n: int, truncation: str) -> list[int]:
    """The `n` tokens of `ids` that `truncation` keeps."""
    if len(ids) <= n:
        return ids
    if truncation == "head":
        return ids[:n]
    if truncation == "tail":
        return ids[len(ids) - n:]
    head = -(-n // 4)  # rounded up: 128 + 382 of the 510 text tokens of a 512-token input, as Sun et al.
    return ids[:head] + ids[len(ids) - (n - head):]


def example_hash(row: Row) -> int:
    """A 64-bit hash of the example's text (read as a fraction of 2**64, uniform in [0, 1)): both
    texts of a pair, so the same sentence in two pairs is two examples."""
    return text_hash(row.a if row.b is None else f"{row.a}\t{row.b}")


def text_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def hashed_split(hashes: list[int], ties: list, key: str, *, dev_fraction: float, dev_max: int,
                 max_train: int | None) -> tuple[list[int], list[int]]:
    """(train indices, dev indices) of train items with these hashes: dev is the hash range below
    dev_fraction (at most dev_max items), train the rest, at most max_train of smallest hash (`ties`
    breaks equal hashes). Raises UserError naming `key` when either side is empty."""
    dev_ids = _carve_dev(hashes, dev_fraction, dev_max)
    train_ids = [i for i in range(len(hashes)) if i not in dev_ids]
    if not dev_ids or not train_ids:
        side = "dev" if not dev_ids else "train"
        raise UserError(f"{key}: no {side} examples left after hashing finetune.dev_fraction = {dev_fraction} "
                        f"of the {len(hashes)} train rows into dev; use more data or change dev_fraction")
    return _smallest(train_ids, hashes, ties, max_train), sorted(dev_ids)


def hashed_subset(hashes: list[int], ties: list, limit: int | None) -> list[int]:
    """The indices of at most `limit` items of smallest hash, in their order."""
    return _smallest(list(range(len(hashes))), hashes, ties, limit)


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
    kept = _smallest(fresh, hashes, [0] * len(rows), limit)
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


def _carve_dev(hashes: list[int], fraction: float, dev_max: int) -> set[int]:
    """Indices whose hash is below `fraction` of the hash range, at most `dev_max` of the smallest."""
    dev = [i for i, h in enumerate(hashes) if h < fraction * 2**64]
    if len(dev) > dev_max:
        # Cut at a hash, not a count: identical texts (equal hashes) on the boundary all leave dev.
        cutoff = sorted(hashes[i] for i in dev)[dev_max]
        dev = [i for i in dev if hashes[i] < cutoff]
    return set(dev)


def _smallest(ids: list[int], hashes: list[int], labels: list[int], limit: int | None) -> list[int]:
    """The `limit` of `ids` with the smallest hash, in their original order. The label breaks ties
    (identical texts), so the choice does not depend on row order."""
    if limit is None or len(ids) <= limit:
        return ids
    kept = set(sorted(ids, key=lambda i: (hashes[i], labels[i]))[:limit])
    return [i for i in ids if i in kept]


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, T) long, padded with pad_id
    segment_ids: torch.Tensor  # (B, T) long, 0 at padding
    attention_mask: torch.Tensor  # (B, T) bool, True at real tokens
    labels: torch.Tensor  # (B,) long

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(t.to(device, non_blocking=True)
                       for t in (self.input_ids, self.segment_ids, self.attention_mask, self.labels)))


def batches(examples: list[Example], batch_size: int, pad_id: int, seed: int | None = None) -> Iterator[Batch]:
    """Batches of examples of similar length, each padded to its own longest example.

    seed None (evaluation): all examples sorted by length, longest first; labels travel with their
    batch, so metrics do not depend on the order. seed int (training): shuffled with random.Random(seed),
    sorted by length within chunks of SORT_CHUNK batches (little padding, still random), and the batch
    order shuffled again: the same seed gives the same batches."""
    for group in batch_indices(examples, batch_size, seed):
        yield collate([examples[i] for i in group], pad_id)


def batch_indices(examples: list[Example], batch_size: int, seed: int | None = None) -> list[list[int]]:
    """The example indices of each batch `batches` makes, in its order (to pair batches with per-example data)."""
    def length(i: int) -> int:
        return -len(examples[i].ids)

    order = list(range(len(examples)))
    if seed is None:
        return _chunks(sorted(order, key=length), batch_size)
    rng = random.Random(seed)
    rng.shuffle(order)
    groups = [group for chunk in _chunks(order, SORT_CHUNK * batch_size)
              for group in _chunks(sorted(chunk, key=length), batch_size)]
    rng.shuffle(groups)
    return groups


def _chunks(items: list[int], size: int) -> list[list[int]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def collate(examples: Sequence[Example], pad_id: int) -> Batch:
    """One batch, padded on the right to its longest example."""
    input_ids, segment_ids, attention_mask = padded([(e.ids, e.segments) for e in examples], pad_id)
    return Batch(input_ids, segment_ids, attention_mask, torch.tensor([e.label for e in examples], dtype=torch.long))


def padded(sequences: Sequence[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, ...]:
    """(input_ids, segment_ids (N, T) long, attention_mask (N, T) bool) of (ids, segments) pairs, padded
    on the right to the longest."""
    width = max(len(ids) for ids, _ in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    segment_ids = torch.zeros((len(sequences), width), dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.bool)
    for row, (ids, segments) in enumerate(sequences):
        input_ids[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        segment_ids[row, :len(ids)] = torch.tensor(segments, dtype=torch.long)
        attention_mask[row, :len(ids)] = True
    return input_ids, segment_ids, attention_mask

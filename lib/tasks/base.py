"""The task type interface (see lib/tasks/__init__.py) and the parts every type shares: TaskData, and
the dev set hashed out of train.

The dev set that picks the best epoch is carved out of train by a hash of each item's text, not by
position or a seeded shuffle: the same rows land in dev whatever the row order, the seed or the
variant, so every run of a task is selected on the same items, and identical texts fall on the same
side, so a duplicate in train can not leak a dev item's label. `max_train`/`max_eval` keep the items
of smallest hash for the same reasons: a quick run's subset is fixed, and the dev set does not change
with max_train (runs with different training sizes are compared on the same dev).
"""
from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from lib.config.errors import UserError
from lib.config.params import FinetuneConfig, ParamsError, TaskConfig
from lib.data.sources import drop_undecodable, read_rows, split_columns
from lib.models.architectures import EncoderDecoder, Transformer, text_encoder
from lib.models.config import TransformerConfig
from lib.tasks.capabilities import Exported
from lib.tasks.model import HeadConfig, HeadStyle, TaskModel, plain_head, read_task_model, write_task_model

UNLABELED = -1  # GLUE's label of an unlabeled test row (null also counts)


@dataclass
class TaskData:
    """A task's model inputs: each type's own examples, each with the `ids` that batches sort by length."""
    name: str
    label_names: list[str]  # index -> name (tagging: the tags; [] where a type has no classes)
    train: list
    dev: list  # carved from train by hash; picks the best epoch
    eval: list | None  # the first of cfg.eval_splits; None when that split has no labels
    eval_split: str
    skipped: dict[str, int]  # dropped rows per "<train|eval>.<reason>"
    truncated: dict[str, int]  # examples cut to max_len per split: "train" (train + dev) and "eval"
    type: str = "classification"
    info: dict[str, Any] = field(default_factory=dict)  # what a type's model needs besides labels, saved with it
    references: dict[str, list] = field(default_factory=dict)  # per split: the rows a type reads (and scores against)
    language: str | None = None  # the language of its text (TaskConfig.language), which the model reads it as
    # what its texts were encoded with: what a type that writes text decodes its outputs with and stops at
    tokenizer: Any = None
    special: dict[str, int] = field(default_factory=dict)

    def size(self, split: str) -> int:
        """How many items `split` ("train", "dev", "eval") holds: rows, not model inputs (a question of
        span QA may be several windows)."""
        if split in self.references:
            return len(self.references[split])
        examples = {"train": self.train, "dev": self.dev, "eval": self.eval}[split]
        return len(examples) if examples is not None else 0


@dataclass
class TaskItems:
    """A task's items as a type reads them, selected as its `load` selects them, before encoding (what
    text baselines and the evaluation read)."""
    label_names: list[str]
    info: dict[str, Any]
    train: list
    dev: list
    eval: list  # [] when the evaluation split has no labels
    eval_split: str
    skipped: dict[str, int]  # dropped rows per "<train|eval>.<reason>"


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
    return smallest_hashes(train_ids, hashes, ties, max_train), sorted(dev_ids)


def hashed_subset(hashes: list[int], ties: list, limit: int | None) -> list[int]:
    """The indices of at most `limit` items of smallest hash, in their order."""
    return smallest_hashes(list(range(len(hashes))), hashes, ties, limit)


def _carve_dev(hashes: list[int], fraction: float, dev_max: int) -> set[int]:
    """Indices whose hash is below `fraction` of the hash range, at most `dev_max` of the smallest."""
    dev = [i for i, h in enumerate(hashes) if h < fraction * 2**64]
    if len(dev) > dev_max:
        # Cut at a hash, not a count: identical texts (equal hashes) on the boundary all leave dev.
        cutoff = sorted(hashes[i] for i in dev)[dev_max]
        dev = [i for i in dev if hashes[i] < cutoff]
    return set(dev)


def smallest_hashes(ids: list[int], hashes: list[int], ties: list, limit: int | None) -> list[int]:
    """The `limit` of `ids` with the smallest hash, in their original order. `ties` (a type's `tie`:
    classification's class index) orders identical texts, so the choice does not depend on row order."""
    if limit is None or len(ids) <= limit:
        return ids
    kept = set(sorted(ids, key=lambda i: (hashes[i], ties[i]))[:limit])
    return [i for i in ids if i in kept]


class TaskType:
    """The common parts; a type overrides what its rows, model and scores need, and declares what else it
    offers by inheriting capabilities (lib/tasks/capabilities.py)."""

    name: str
    metrics: tuple[str, ...]  # what `score` computes: the names tasks.<name>.metrics may list
    default_metrics: tuple[str, ...]  # where tasks.<name>.metrics is null
    named_labels = False  # whether tasks.<name>.label_names names its classes (and fixes their order)
    pair_role: str | None = None  # what text_pair_field holds where the type needs one (None: optional)
    # What a task's field holds where it is not one text per row (lib.data.raw's decontamination spec)
    field_kinds: dict[str, str] = {}
    per_token = False  # the head reads every position's state, not the sequence's summary
    head_dropout = True  # dropout before the output layer of the plain head (BERT's QA head has none)
    timed: str  # what one timed call of a model is, for the report ({seq_len}: evaluate.latency_seq_len)
    # flags, not capabilities (lib/tasks/capabilities.py says why)
    aux_lm = False  # finetune.aux_lm_weight: an auxiliary LM loss on the task's texts
    # the frozen variant's probe: scikit-learn's logistic regression on the features (its cross-entropy is
    # the type's loss), else L-BFGS on the type's own loss
    logistic_probe = False
    # its model writes text with the pretrained model's own LM head: no head on the states, so no variant
    # that trains one on fixed or mixed states (Variant.needs_head)
    headless = False

    # params -------------------------------------------------------------------------------------
    def check(self, cfg: TaskConfig, key: str) -> None:
        """Raise ParamsError naming the key of `cfg` (tasks.<name>, `key`) that this type can not use."""
        if cfg.metrics == []:
            raise ParamsError(f"{key}.metrics: empty; name at least one of {', '.join(self.metrics)}")
        unknown = [m for m in cfg.metrics or () if m not in self.metrics]
        if unknown:
            raise ParamsError(f"{key}.metrics: '{unknown[0]}' is not a {self.name} metric; "
                              f"use {', '.join(self.metrics)}")
        if cfg.label_names is not None and not self.named_labels:
            raise ParamsError(f"{key}.label_names: a {self.name} task has no label names; remove it")
        if self.pair_role and cfg.text_pair_field is None:
            raise ParamsError(f"{key}.text_pair_field: a {self.name} task needs the field of its {self.pair_role}")

    # reading -------------------------------------------------------------------------------------
    def read(self, cfg: TaskConfig, split: str, key: str, train: list | None) -> tuple[list, dict[str, int]]:
        """(items, skipped rows by reason) of `split`, its rows read by `read_split` (which drops and counts those
        that did not decode); `train`: the train split's items when reading an evaluation split."""
        raise NotImplementedError

    def hash_text(self, item: Any) -> str:
        """The text that decides on which side of the dev carve an item falls."""
        raise NotImplementedError

    def prepare(self, cfg: TaskConfig, train: list, key: str) -> tuple[list[str], dict[str, Any]]:
        """(label names, info) from the train items (all of them, dev included)."""
        return [], {}

    def encode(self, items: list, cfg: TaskConfig, tokenizer, special: dict[str, int], label_names: list[str],
               info: dict[str, Any], key: str, causal: bool = False) -> tuple[list, int]:
        """(examples, number truncated); `causal`: whether the model reads each position's left context only."""
        raise NotImplementedError

    def select(self, name: str, cfg: TaskConfig, *, dev_fraction: float, dev_max: int, max_train: int | None = None,
               max_eval: int | None = None, train_from: tuple[str, TaskConfig] | None = None) -> TaskItems:
        """The task's items: train and dev (hashed out of train) from cfg.train_split, at most max_train
        of train; the evaluation items of cfg.eval_splits[0], at most max_eval. A transfer task takes its
        train, dev, label names and info from the task it transfers from, `train_from` (name, config):
        what the models it is scored with learned from; its evaluation labels map onto those classes."""
        key = f"tasks.{name}"
        source_name, source = train_from or (name, cfg)
        source_key = f"tasks.{source_name}"
        eval_split = cfg.eval_splits[0]
        train_items, train_skipped = self.read(source, source.train_split, source_key, None)
        if not train_items:
            raise UserError(f"{source_key}: split '{source.train_split}' has no usable row (skipped: {train_skipped}); "
                            "check the task's fields and type")
        labeled = has_label_field(cfg, eval_split, key)
        eval_items, eval_skipped = self.read(cfg, eval_split, key, train_items) if labeled else ([], {})
        if labeled and not eval_items and not self.unlabeled(eval_skipped):
            raise UserError(f"{key}: split '{eval_split}' has no usable row (skipped: {eval_skipped})")
        label_names, info = self.prepare(source, train_items, source_key)
        train_items, eval_items = self.label_ids(source, train_items, eval_items, eval_split, key)
        train, dev = self.split_train(train_items, source_key, dev_fraction=dev_fraction, dev_max=dev_max,
                                      max_train=max_train)
        if eval_items:
            kept = hashed_subset([text_hash(self.hash_text(item)) for item in eval_items],
                                 [self.tie(item) for item in eval_items], max_eval)
            eval_items = [eval_items[i] for i in kept]
        return TaskItems(label_names, {**info, **self.fit(source, train, source_key)}, train, dev, eval_items,
                         eval_split, {**{f"train.{k}": v for k, v in train_skipped.items()},
                                      **{f"eval.{k}": v for k, v in eval_skipped.items()}})

    def load(self, name: str, cfg: TaskConfig, tokenizer, special: dict[str, int], *, dev_fraction: float,
             dev_max: int, max_train: int | None = None, max_eval: int | None = None,
             causal: bool = False, train_from: tuple[str, TaskConfig] | None = None) -> TaskData:
        """The task's items (`select`) encoded for a causal model (`causal`) or one that attends both ways."""
        items = self.select(name, cfg, dev_fraction=dev_fraction, dev_max=dev_max, max_train=max_train,
                            max_eval=max_eval, train_from=train_from)
        encoded, truncated = {}, {}
        for split in ("train", "dev", "eval"):
            encoded[split], truncated[split] = self.encode(getattr(items, split), cfg, tokenizer, special,
                                                           items.label_names, items.info, f"tasks.{name}", causal)
        return TaskData(
            name=name, label_names=items.label_names, train=encoded["train"], dev=encoded["dev"],
            eval=encoded["eval"] or None, eval_split=items.eval_split, skipped=items.skipped,
            truncated={"train": truncated["train"] + truncated["dev"], "eval": truncated["eval"]},
            type=self.name, info=items.info, references={"train": items.train, "dev": items.dev, "eval": items.eval},
            language=cfg.language, tokenizer=tokenizer, special=special)

    def split_train(self, items: list, key: str, *, dev_fraction: float, dev_max: int,
                    max_train: int | None) -> tuple[list, list]:
        """(train items, dev items) of the train split's items: dev hashed out by `hash_text`, at most
        max_train of the rest (hashed_split)."""
        hashes = [text_hash(self.hash_text(item)) for item in items]
        train_ids, dev_ids = hashed_split(hashes, [self.tie(item) for item in items], key, dev_fraction=dev_fraction,
                                          dev_max=dev_max, max_train=max_train)
        return [items[i] for i in train_ids], [items[i] for i in dev_ids]

    def tie(self, item: Any) -> Any:
        """What orders items of equal hash (identical texts) when a limit cuts between them."""
        return text_hash(repr(item))

    def label_ids(self, cfg: TaskConfig, train: list, evaluation: list, eval_split: str,
                  key: str) -> tuple[list, list]:
        """(train, evaluation) items with their labels as the model's targets, where a type maps them
        (classification: to class indices, the train split's classes)."""
        return train, evaluation

    def unlabeled(self, skipped: dict[str, int]) -> bool:
        """Whether an evaluation split that gave no items is an unlabeled one (GLUE's -1 or null labels),
        which gives no evaluation rather than an error."""
        return bool(skipped.get("unlabeled") or skipped.get("label_missing"))

    def fit(self, cfg: TaskConfig, train: list, key: str) -> dict[str, Any]:
        """Info taken from the selected train items (regression's target scale)."""
        return {}

    # model ---------------------------------------------------------------------------------------
    def head(self, style: HeadStyle, backbone: TransformerConfig, n_outputs: int, cfg: FinetuneConfig) -> HeadConfig:
        """The head of `style` a finetune variant puts on `backbone` for this type, of n_outputs outputs per
        sequence or, for a per-token type, per position: "block", ULMFiT's classifier block (cfg.head_hidden,
        cfg.head_dropout), and "probe", one linear layer without dropout (the frozen variant's), both on
        concat pooling or every position's state; "transformers", the head transformers' model of the
        backbone's family has for the type (for a sequence-level type lib.tasks.model.plain_head: BERT's
        pooler + linear layer on [CLS], GPT-2's bias-free linear layer on the last token; for a per-token
        type a linear layer on every position, as BERT's token-classification and QA heads)."""
        features = "tokens" if self.per_token else "concat"
        if style == "block":
            return HeadConfig(n_outputs, features, block=True, hidden=cfg.head_hidden, dropout=cfg.head_dropout)
        if style == "probe":
            return HeadConfig(n_outputs, features, block=False, dropout=0.0)
        if self.per_token:
            return HeadConfig(n_outputs, "tokens", block=False, dropout=cfg.head_dropout if self.head_dropout else 0.0)
        return plain_head(backbone, n_outputs, cfg.head_dropout)

    def backbone(self, model: Transformer | EncoderDecoder, key: str) -> Transformer | EncoderDecoder:
        """What of the pretrained `model` this type's models are built on (`key`: tasks.<name>, named in
        errors): the stack its head reads (an encoder-decoder's encoder), by default."""
        return text_encoder(model)

    def build_model(self, backbone: Transformer, head: HeadConfig) -> nn.Module:
        """The model the type trains on `backbone`: by default the backbone and `head`
        (lib.tasks.model.TaskModel). A type whose model is not a head on the backbone's states (an
        encoder-decoder that generates) builds its own here, and reads it back in `read_model`."""
        return TaskModel(backbone, head)

    def read_model(self, folder: Path, info: dict[str, Any]) -> nn.Module:
        """The model `build_model` built, from the folder lib.tasks.model.save_task_model wrote (`info`: its
        classifier.json): in lib's layout, or an Exported type's in transformers' layout."""
        return read_task_model(folder, info, self if isinstance(self, Exported) else None)

    def write_model(self, model: nn.Module, folder: Path, meta: dict[str, Any]) -> str:
        """Write the model `build_model` built into `folder` (a model folder being written, its tokenizer
        files in it), for `read_model`; returns one line saying in which layout (classifier.json's
        "transformers"). By default lib.tasks.model.write_task_model's TaskModel."""
        return write_task_model(model, folder, meta)

    # training ------------------------------------------------------------------------------------
    def n_outputs(self, task: TaskData) -> int:
        raise NotImplementedError

    def collate(self, examples: Sequence, pad_id: int, task: TaskData) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def units(self, example: Any) -> int:
        """How many terms of the loss's mean this example gives."""
        return 1

    def inputs(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input_ids, segment_ids, attention_mask), (N, T) each, as the model reads them."""
        return batch["input_ids"], batch["segment_ids"], batch["attention_mask"]

    def shape(self, outputs: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The head's outputs on `inputs(batch)` as the loss and predictions take them."""
        return outputs

    def forward(self, model: nn.Module, batch: dict[str, torch.Tensor], output_hidden_states: bool = False):
        """(outputs, hidden states) of `model` (a lib.tasks.model.TaskModel) on `batch`."""
        outputs, hidden = model(*self.inputs(batch), output_hidden_states=output_hidden_states)
        return self.shape(outputs, batch), hidden

    def loss(self, outputs: torch.Tensor, batch: dict[str, torch.Tensor], task: TaskData) -> torch.Tensor:
        raise NotImplementedError

    # scoring -------------------------------------------------------------------------------------
    def predict(self, outputs: torch.Tensor, examples: Sequence, task: TaskData) -> list:
        """One prediction per example of a batch, on the CPU."""
        raise NotImplementedError

    def predict_batch(self, model: nn.Module, batch: dict[str, torch.Tensor], examples: Sequence,
                      task: TaskData) -> list:
        """One prediction per example of a collated batch (on the model's device), on the CPU: what
        lib.tasks.scoring runs per batch, at the run's precision. By default the forward pass read by
        `predict`; a type that generates its predictions (rather than reading them off one forward pass)
        generates here, and is still batched, spread over ranks and scored as every type is."""
        outputs, _ = self.forward(model, batch)
        return self.predict(outputs.cpu(), examples, task)

    def score(self, task: TaskData, split: str, predictions: list, metrics: list[str],
              calibration: dict[str, Any] | None = None) -> tuple[dict[str, float], dict[str, Any]]:
        """({metric: value} of `predictions` (one per example of task.<split>), extras: what the
        evaluation split takes from dev's (`calibration`, a Calibrated type's), a confusion matrix, a
        breakdown; those the evaluation keeps, a Reported type declares)."""
        raise NotImplementedError

    def check_labels(self, saved: list[str], task: TaskData, where: str) -> None:
        """Raise UserError (naming `where`, a saved model) when the model's label names `saved` do not fit
        the task's data."""

    # evaluation -----------------------------------------------------------------------------------
    def timed_call(self, model: nn.Module, task: TaskData) -> Callable[..., object]:
        """What one timed call of `model` runs on (input_ids, segment_ids, attention_mask) of random tokens
        (lib.evaluation.efficiency): its forward pass, by default; a type that generates generates."""
        return model

    def written_tokens(self, task: TaskData) -> int | None:
        """The tokens one timed call writes per sequence, for a type that generates; None for one that
        writes none."""
        return None

    def latency_batch(self, info: dict[str, Any]) -> int:
        """The sequences one timed call runs (multiple choice: every choice of a question)."""
        return 1


def label_config(names: list[str]) -> dict[str, Any]:
    """transformers' config.json keys for the classes `names` (index order)."""
    return dict(num_labels=len(names), id2label={str(i): name for i, name in enumerate(names)},
                label2id={name: i for i, name in enumerate(names)})


def has_label_field(cfg: TaskConfig, split: str, key: str) -> bool:
    """Whether `split` has the task's label field. A split without it (GLUE's test_unlabeled) is unlabeled,
    unless it has a field of the same name spelled otherwise ('Label' for 'label'): a renamed field, which
    is a UserError naming both, for its labels would be silently left unread."""
    columns = split_columns(cfg.source, split, key)
    if cfg.label_field in columns:
        return True
    alike = [c for c in columns if _spelling(c) == _spelling(cfg.label_field)]
    if alike:
        raise UserError(f"{key}.label_field: split '{split}' has no field '{cfg.label_field}' but has '{alike[0]}'; "
                        f"name the label field '{cfg.label_field}' in every split (a split without labels has none)")
    return False


def _spelling(name: str) -> str:
    """A field name as it reads whatever its case and separators: 'Label', 'LABEL' and 'label_' alike."""
    return "".join(ch for ch in name.casefold() if ch.isalnum())


def read_split(cfg: TaskConfig, split: str, key: str, fields: dict[str, str], skipped: Counter,
               also: Sequence[str] = ()) -> Iterator[dict[str, Any]]:
    """The rows of `split` with `fields` (our name -> the params key that names the source field) and
    the source fields `also` under their own names: every task row any stage reads. Those whose bytes
    were not UTF-8 are dropped and counted in `skipped` (drop_undecodable: a split mostly so stops)."""
    rows = read_rows(cfg.source, split, {**{ours: getattr(cfg, which) for ours, which in fields.items()},
                                         **{name: name for name in also}}, key,
                     field_keys={ours: f"{key}.{which}" for ours, which in fields.items()})
    return drop_undecodable(rows, cfg.source, split, f"{key}.source", skipped)


def move(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}

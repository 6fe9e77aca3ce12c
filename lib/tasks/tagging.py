"""Token tagging (CoNLL-2003 NER): a tag per word, predicted from the word's first subword as BERT, or
from its last on a causal model, which sees the whole word only there.

- Rows hold words (`tokens`) and one IOB2 tag per word (`ner_tags`). A row without words, with a tag
  count that differs from its word count, with a word that is not a string or a tag that is not IOB2
  (O, B-<type>, I-<type>) is skipped and counted by reason, never a traceback: one broken sentence
  should not stop a run.
- The tag set is "O", then B-<type> and I-<type> for every entity type of the train sentences, sorted
  (`tag_set`): both tags of a type even where a small train subset lacks one of them. An evaluation
  tag outside the set is a UserError rather than a skip, since a type the model never saw means the
  splits differ in scheme (another type set, IOB1); dropping those sentences would change what the
  score measures.
- Words are encoded as pre-tokenized input, one word at a time, without the tokenizer's specials, and
  laid out `[bos] w1 ... wn [eos]` with segment 0. A byte-level BPE tokenizer (ours, GPT-2's) sees a
  word's leading space as part of it: non-first words get one, so they split as in running text
  (WordPiece and sentencepiece-style tokenizers need and take none). A word that yields no subword
  (a lone control character) gets [unk], so every word has a position that carries its tag.
- The first subword of each word carries the tag's index, every other position -100 (ignored by the
  cross-entropy). Where BPE has no merge of the space with the word's start, the space is a piece of
  its own ("Ġ", the same for every word): then the piece after it carries the tag. A causal model's
  state at the first subword has not read the rest of the word ("Wash" of "Washington"): there the
  word's last subword carries it, as a left-to-right tagger reads words. A sentence longer
  than `max_len` (specials included) keeps its whole words that fit and is counted; its cut words
  are predicted "O" at decoding, so scoring still covers every gold word (a cut entity counts as
  missed). With MiniLM's tokenizer and max_len 128, CoNLL-2003 cuts 1 train sentence of 14,041, 3
  validation of 3,250 and 1 test of 3,453 (perfect predictions then score entity F1 0.9994 on
  validation, 0.9998 on test); at max_len 256 none. Sliding windows would gain that little.
- Decoding takes the tag of highest logit at each word's tag-carrying subword and gives word-level IOB2
  strings, scored by lib.metrics.scores.entity_scores (seqeval's default mode) against `Sentence.tags`.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch
import torch.nn.functional as F

from lib.config.errors import UserError
from lib.config.params import EvaluateConfig, TaskConfig
from lib.data.tokenizer import check_plain
from lib.metrics.baselines import lexicon_tags
from lib.metrics.scores import confusion_matrix, entity_scores
from lib.models.families.base import TOKEN_CLASSIFICATION
from lib.tasks.base import TaskData
from lib.tasks.base import TaskType, label_config, read_split
from lib.tasks.capabilities import BARS, CONFUSION, Baselined, Distilled, Exported, Extra, Plot, Reported, soft_loss

IGNORE = -100  # the label of positions without a tag: cross_entropy's ignore_index


def _entity_rows(f1: dict[str, float], class_names: list[str]) -> list[tuple[str, float]]:
    return sorted(f1.items())


# F1 per entity type (first split), in metrics/evaluate.json and drawn as a bar per model for each type
ENTITY_F1 = Extra("per_type", plot=Plot("entity_f1", ("entity_type", "f1"), _entity_rows, BARS))
OUTSIDE = "O"


@dataclass
class Sentence:
    words: list[str]
    tags: list[str]  # one IOB2 tag per word


@dataclass
class Features:
    ids: list[int]  # [bos] subwords [eos]
    labels: list[int]  # tag index at each kept word's first subword, IGNORE elsewhere
    word_starts: list[int]  # position of each kept word's tag-carrying subword (first non-space; causal: last)
    n_words: int  # words in the sentence; those past len(word_starts) were cut by max_len


def read_rows(rows: Iterable[dict[str, Any]], words_field: str = "tokens",
              tags_field: str = "ner_tags") -> tuple[list[Sentence], Counter]:
    """(sentences, skipped rows by reason: "empty", "length_mismatch", "not_text" (a word that is not a
    string), "bad_tag" (a tag that is not IOB2))."""
    sentences, skipped = [], Counter()
    for row in rows:
        words, tags = row.get(words_field) or [], row.get(tags_field) or []
        if not words:
            skipped["empty"] += 1
        elif len(words) != len(tags):
            skipped["length_mismatch"] += 1
        elif not all(isinstance(word, str) for word in words):
            skipped["not_text"] += 1
        elif not all(map(_is_iob2, tags)):
            skipped["bad_tag"] += 1
        else:
            sentences.append(Sentence(list(words), list(tags)))
    return sentences, skipped


def _is_iob2(tag: Any) -> bool:
    return tag == OUTSIDE or (isinstance(tag, str) and tag[:2] in ("B-", "I-") and len(tag) > 2)


def tag_set(sentences: Iterable[Sentence]) -> list[str]:
    """Index -> tag: "O", then B- and I- of each entity type in `sentences`, types sorted."""
    types = sorted({tag[2:] for sentence in sentences for tag in sentence.tags if tag != OUTSIDE})
    return [OUTSIDE, *(f"{prefix}-{kind}" for kind in types for prefix in "BI")]


def encode(sentences: Sequence[Sentence], tokenizer, special: dict[str, int], max_len: int, tag_names: list[str],
           key: str = "tagging", causal: bool = False) -> tuple[list[Features], Counter]:
    """(features, counts: "sentences", "words", "truncated" sentences, "cut_words", "unk_words" without a
    subword of their own). `tag_names`: index -> tag, the tag_set of the train sentences or names fixed by
    the task's config. `causal`: the tag on each word's last subword. Raises UserError, naming `key`, on a
    tag outside `tag_names`."""
    check_plain(tokenizer)
    index = {tag: i for i, tag in enumerate(tag_names)}
    spaced = _byte_level(tokenizer)
    words = [[word if i == 0 or not spaced else f" {word}" for i, word in enumerate(s.words)] for s in sentences]
    encodings = tokenizer.encode_batch(words, is_pretokenized=True, add_special_tokens=False)
    features, counts = [], Counter(sentences=len(sentences))
    for n, (sentence, encoding) in enumerate(zip(sentences, encodings)):
        pieces: list[list[int]] = [[] for _ in sentence.words]
        heads = [None] * len(sentence.words)  # the piece that carries the word's tag: its first one past the space
        for token_id, word, (_, end) in zip(encoding.ids, encoding.word_ids, encoding.offsets):
            if heads[word] is None and end > (spaced and word > 0):
                heads[word] = len(pieces[word])
            pieces[word].append(token_id)
        unknown = [tag for tag in sentence.tags if tag not in index]
        if unknown:
            raise UserError(f"{key}: tag {unknown[0]!r} of sentence {n} is not in the tag set "
                            f"({', '.join(tag_names)}); its type never occurs in the train split: check that the "
                            "splits use the same tags")
        counts["unk_words"] += sum(not word_pieces for word_pieces in pieces)
        ids, labels, starts = [special["bos"]], [IGNORE], []
        for word_pieces, head, tag in zip(pieces, heads, sentence.tags):
            word_pieces, head = (word_pieces, head or 0) if word_pieces else ([special["unk"]], 0)
            if causal:
                head = len(word_pieces) - 1
            if len(ids) + len(word_pieces) > max_len - 1:
                break
            starts.append(len(ids) + head)
            ids += word_pieces
            labels += [IGNORE] * head + [index[tag]] + [IGNORE] * (len(word_pieces) - head - 1)
        ids.append(special["eos"])
        labels.append(IGNORE)
        features.append(Features(ids, labels, starts, len(sentence.words)))
        counts["words"] += len(sentence.words)
        counts["cut_words"] += len(sentence.words) - len(starts)
        counts["truncated"] += len(starts) < len(sentence.words)
    return features, counts


def _byte_level(tokenizer) -> bool:
    """Whether the tokenizer's pre-tokenizer is (or contains) ByteLevel, which keeps a word's leading space."""
    def has(node: Any) -> bool:
        return isinstance(node, dict) and (node.get("type") == "ByteLevel" or any(
            has(child) for child in node.get("pretokenizers", [])))
    return has(json.loads(tokenizer.to_str())["pre_tokenizer"])


def collate(features: Sequence[Features], pad_id: int) -> dict[str, torch.Tensor]:
    """input_ids, segment_ids (all 0), attention_mask (bool) and labels, padded to the longest of the batch
    (labels with IGNORE)."""
    longest = max(len(f.ids) for f in features)
    input_ids = torch.full((len(features), longest), pad_id, dtype=torch.long)
    labels = torch.full((len(features), longest), IGNORE, dtype=torch.long)
    for row, f in enumerate(features):
        input_ids[row, :len(f.ids)] = torch.tensor(f.ids)
        labels[row, :len(f.labels)] = torch.tensor(f.labels)
    attention_mask = torch.arange(longest) < torch.tensor([len(f.ids) for f in features])[:, None]
    return {"input_ids": input_ids, "segment_ids": torch.zeros_like(input_ids), "attention_mask": attention_mask,
            "labels": labels}


def loss(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy over the positions that carry a tag (first subwords); 0 for a batch without
    one (every word cut by max_len), whose mean would be nan."""
    labels = batch["labels"].flatten()
    if not (labels != IGNORE).any():
        return logits.sum() * 0.0
    return F.cross_entropy(logits.flatten(0, 1).float(), labels, ignore_index=IGNORE)


def decode(logits: Sequence[torch.Tensor], features: Sequence[Features], tag_names: list[str]) -> list[list[str]]:
    """Word-level tags, one list per sentence: `logits[i]` is feature i's (T, n_tags) logits (rows of a
    padded batch will do: positions past the feature's length are not read); words cut by max_len get "O"."""
    predicted = []
    for sentence_logits, f in zip(logits, features, strict=True):
        best = sentence_logits[f.word_starts].argmax(-1).tolist()
        predicted.append([tag_names[i] for i in best] + [OUTSIDE] * (f.n_words - len(f.word_starts)))
    return predicted


class Tagging(Exported, Distilled, Baselined, Reported, TaskType):
    """A tag per word from the head's outputs at the word's tag-carrying subword; the loss's mean is over
    the tagged positions, so `units` counts them."""

    name = "tagging"
    metrics = ("f1", "precision", "recall")
    default_metrics = ("f1",)
    named_labels = True
    field_kinds = {"text_field": "words"}  # a list of words, which a document holds joined by spaces
    per_token = True
    task_model = TOKEN_CLASSIFICATION  # a linear layer on every state
    pipeline_tag = "token-classification"
    baseline = "lexicon"
    baseline_label = "lexicon tagger"
    timed = "one sentence of {seq_len} tokens per call, a tag per token"
    kept_extras = (ENTITY_F1, CONFUSION)  # the confusion matrix over the tags of words

    def read(self, cfg: TaskConfig, split: str, key: str, train: list | None) -> tuple[list[Sentence], dict[str, int]]:
        undecodable = Counter()
        sentences, skipped = read_rows(read_split(cfg, split, key, {"tokens": "text_field", "tags": "label_field"},
                                                  undecodable), "tokens", "tags")
        return sentences, {**undecodable, **skipped}

    def hash_text(self, item: Sentence) -> str:
        return " ".join(item.words)

    def prepare(self, cfg: TaskConfig, train: list[Sentence], key: str) -> tuple[list[str], dict[str, Any]]:
        return list(cfg.label_names) if cfg.label_names else tag_set(train), {}

    def encode(self, items, cfg, tokenizer, special, label_names, info, key,
               causal=False) -> tuple[list[Features], int]:
        features, counts = encode(items, tokenizer, special, cfg.max_len, label_names, f"{key}.label_field", causal)
        return features, counts["truncated"]

    def class_names(self, task: TaskData) -> list[str]:
        return task.label_names

    def export_config(self, label_names: list[str]) -> dict[str, Any]:
        return label_config(label_names)

    def n_outputs(self, task: TaskData) -> int:
        return len(task.label_names)

    def collate(self, examples: Sequence[Features], pad_id: int, task: TaskData) -> dict[str, torch.Tensor]:
        return collate(examples, pad_id)

    def units(self, example: Features) -> int:
        return len(example.word_starts)

    def loss(self, outputs: torch.Tensor, batch: dict[str, torch.Tensor], task: TaskData) -> torch.Tensor:
        return loss(outputs, batch)

    def predict(self, outputs: torch.Tensor, examples: Sequence[Features], task: TaskData) -> list[list[str]]:
        return decode(list(outputs.float().cpu()), examples, task.label_names)

    def score(self, task: TaskData, split: str, predictions: list[list[str]], metrics: list[str],
              calibration: dict[str, Any] | None = None) -> tuple[dict[str, float], dict[str, Any]]:
        gold = [s.tags for s in task.references[split]]
        scores = entity_scores(gold, predictions)
        index = {tag: i for i, tag in enumerate(task.label_names)}
        words = [(index[g], index[p]) for gold_tags, tags in zip(gold, predictions) for g, p in zip(gold_tags, tags)]
        confusion = confusion_matrix([p for _, p in words], [g for g, _ in words], len(task.label_names))
        return {m: scores[m] for m in metrics}, {ENTITY_F1.name: scores["per_type"], CONFUSION.name: confusion.tolist()}

    def check_labels(self, saved: list[str], task: TaskData, where: str) -> None:
        if sorted(saved) != sorted(task.label_names):
            raise UserError(f"{where}: tags {saved} but the task's data has {task.label_names}; finetune again "
                            "(dvc repro)")

    def soft_loss(self, student: torch.Tensor, teacher: torch.Tensor, batch: dict[str, torch.Tensor],
                  temperature: float) -> torch.Tensor:
        """KL over the tags at each tagged position, averaged over those positions; 0 (with a gradient
        path) where there is none."""
        positions = batch["labels"] != IGNORE
        if not positions.any():
            return student.sum() * 0.0
        return soft_loss(student[positions], teacher[positions], temperature)

    def baseline_scores(self, task: TaskData, train: list[Sentence], metrics: list[str], settings: EvaluateConfig):
        predicted = lexicon_tags(train, [s.words for s in task.references["eval"]])
        return self.score(task, "eval", predicted, metrics)


TYPE = Tagging()

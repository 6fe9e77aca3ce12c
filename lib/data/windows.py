"""Batches of token windows read from packed token files (lib/data/packed.py), never the corpus in RAM.

Training windows start at random offsets drawn from a generator seeded by (seed, step, micro-batch):
the batch of a step is a pure function of its number, so a resumed run reads exactly the batches
an uninterrupted run would, without replaying any data. Windows cross document boundaries; the eos
token that ends each document in the packed stream separates them.

Beside the tokens a batch carries word-start flags, or, with `units` (an objective's knowledge units,
lib/data/knowledge.py), unit-start flags in their place: a token starts a "word" only where it starts
a unit of each kind named, so masking takes every phrase or entity whole. With `languages`
(model.languages, for XLM's corpora of several languages) a batch is `TaggedWindows`, which carry
each token's language too.

Batches are dataclasses of named tensors (`Batch`): an objective's forward reads the fields it names.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, Self

import numpy as np
import torch
from torch import Tensor

from lib.config.errors import UserError
from lib.data.packed import PackedTokens, packed_path


class Batch:
    """Base of the batch dataclasses: fields of tensors (or None, or nested batches), rows first."""

    def to(self, device: torch.device, non_blocking: bool = False) -> Self:
        """The batch with every tensor on `device`."""
        moved = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            moved[f.name] = None if value is None else value.to(device, non_blocking=non_blocking)
        return dataclasses.replace(self, **moved)

    def __len__(self) -> int:
        """Rows: what a validation batch's metrics are weighted by."""
        return len(getattr(self, dataclasses.fields(self)[0].name))


class BatchStream(Protocol):
    """Training batches by step: the batch of a step and micro-batch is a pure function of them."""

    def batch(self, step: int, micro: int = 0) -> Batch: ...


@dataclass
class Windows(Batch):
    """Windows of the packed token stream, W = seq_len + 1 tokens each."""

    tokens: Tensor  # (B, W) long
    word_starts: Tensor  # (B, W) bool: word starts, or where each of the knowledge units asked for starts


@dataclass
class TaggedWindows(Windows):
    """Windows of text whose tokens carry their language (XLM)."""

    # (B, W) long: each token's row of model.languages; None for untagged text (no corpora.parallel),
    # whose every token reads the model's first language
    language_ids: Tensor | None = None


class WindowBatches:
    """Random windows of `window` tokens (with their word- or unit-start flags) from one packed split."""

    def __init__(self, packed: PackedTokens, window: int, batch_size: int, seed: int, name: str = "train",
                 rows: slice = slice(None), units: Sequence[str] = (), languages: Sequence[str] | None = None):
        """`rows`: the part of every batch this process reads (its rank's share under torchrun).
        `languages`: None for Windows; model.languages for TaggedWindows ([] for untagged text)."""
        if packed.n_tokens < window:
            raise UserError(f"{name}: {packed.n_tokens} tokens, fewer than one window of {window}; "
                            "use more data or a smaller seq_len")
        self.packed, self.window, self.batch_size, self.seed, self.rows = packed, window, batch_size, seed, rows
        self.flags = start_flags(packed, units)
        self.tagged, self.languages = languages is not None, token_languages(packed, languages or ())

    def batch(self, step: int, micro: int = 0) -> Windows:
        rng = np.random.default_rng([self.seed, step, micro])
        starts = rng.integers(0, self.packed.n_tokens - self.window + 1, size=self.batch_size)
        return windows(self.packed.tokens, self.flags, starts[self.rows], self.window, self.tagged, self.languages)


def fixed_windows(packed: PackedTokens, window: int, batch_size: int, n_batches: int,
                  units: Sequence[str] = (), languages: Sequence[str] | None = None) -> list[Windows]:
    """A fixed validation set: up to n_batches batches of non-overlapping windows spread evenly over
    the split, the same in every run, so validation losses compare across runs. `languages` as for
    WindowBatches."""
    available = packed.n_tokens // window
    if available == 0:
        raise UserError(f"validation split: {packed.n_tokens} tokens, fewer than one window of {window}")
    count = min(available, n_batches * batch_size)
    starts = (np.linspace(0, available - 1, count).round().astype(np.int64)) * window
    flags, tags = start_flags(packed, units), token_languages(packed, languages or ())
    return [windows(packed.tokens, flags, starts[i:i + batch_size], window, languages is not None, tags)
            for i in range(0, count, batch_size)]


def start_flags(packed: PackedTokens, units: Sequence[str]) -> list[np.ndarray]:
    """The flag arrays whose AND a batch carries: the word starts, or those of each unit."""
    return [packed.unit_starts(unit) for unit in units] or [packed.word_starts]


def language_map(packed: PackedTokens, languages: Sequence[str]) -> np.ndarray:
    """The model's language row (an index into `languages`, model.languages) of each language id of
    `packed`; a language the model lacks is a UserError."""
    missing = [code for code in packed.languages if code not in languages]
    if missing or packed.language_ids is None:
        raise UserError(f"{packed_path(packed.prefix, '.json')}: languages {packed.languages or 'none'}, but "
                        f"model.languages is {list(languages)}; list every language of the corpora there "
                        f"(and rerun the tokenizer stage if the token files predate corpora.parallel)")
    return np.array([list(languages).index(code) for code in packed.languages], np.int64)


TokenLanguages = tuple[np.ndarray, np.ndarray]  # each token's language id in a split, the model's row of each id


def token_languages(packed: PackedTokens, languages: Sequence[str]) -> TokenLanguages | None:
    """(each token's language id in `packed`, the model's row of each id), or None without `languages`."""
    return (packed.language_ids, language_map(packed, languages)) if languages else None


def windows(tokens: np.ndarray, flags: list[np.ndarray], starts: np.ndarray, window: int, tagged: bool = False,
            languages: TokenLanguages | None = None) -> Windows:
    """The windows (len(starts), window) at `starts`, copied out of the memmaps: their tokens and start
    flags; `tagged`, TaggedWindows, with the language ids of `languages` (None without)."""
    index = starts[:, None] + np.arange(window)[None, :]
    batch = torch.from_numpy(tokens[index].astype(np.int64))
    word_starts = torch.from_numpy(np.logical_and.reduce([f[index] for f in flags]).astype(bool))
    if not tagged:
        return Windows(batch, word_starts)
    if languages is None:
        return TaggedWindows(batch, word_starts)
    ids, rows = languages
    return TaggedWindows(batch, word_starts, torch.from_numpy(rows[ids[index]]))

"""Batches of token windows read from packed token files (lib/data/packed.py), never the corpus in RAM.

Training windows start at random offsets drawn from a generator seeded by (seed, step, micro-batch):
the batch of a step is a pure function of its number, so a resumed run reads exactly the batches
an uninterrupted run would, without replaying any data. Windows cross document boundaries; the eos
token that ends each document in the packed stream separates them.

Beside the tokens a batch carries word-start flags, or, with `units` (an objective's knowledge units,
lib/data/knowledge.py), unit-start flags in their place: a token starts a "word" only where it starts
a unit of each kind named, so masking takes every phrase or entity whole. With `languages`
(model.languages, for XLM's corpora of several languages) a batch carries each token's language too.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from lib.core.errors import UserError
from lib.data.packed import PackedTokens
from lib.data.pairs import language_map


class WindowBatches:
    """Random windows of `window` tokens (with their word- or unit-start flags) from one packed split."""

    def __init__(self, packed: PackedTokens, window: int, batch_size: int, seed: int, name: str = "train",
                 rows: slice = slice(None), units: Sequence[str] = (), languages: Sequence[str] = ()):
        """`rows`: the part of every batch this process reads (its rank's share under torchrun)."""
        if packed.n_tokens < window:
            raise UserError(f"{name}: {packed.n_tokens} tokens, fewer than one window of {window}; "
                            "use more data or a smaller seq_len")
        self.packed, self.window, self.batch_size, self.seed, self.rows = packed, window, batch_size, seed, rows
        self.flags = start_flags(packed, units)
        self.languages = token_languages(packed, languages)

    def batch(self, step: int, micro: int = 0) -> tuple[torch.Tensor, ...]:
        rng = np.random.default_rng([self.seed, step, micro])
        starts = rng.integers(0, self.packed.n_tokens - self.window + 1, size=self.batch_size)
        return windows(self.packed.tokens, self.flags, starts[self.rows], self.window, self.languages)


def fixed_windows(packed: PackedTokens, window: int, batch_size: int, n_batches: int,
                  units: Sequence[str] = (), languages: Sequence[str] = ()) -> list[tuple[torch.Tensor, ...]]:
    """A fixed validation set: up to n_batches batches of non-overlapping windows spread evenly over
    the split, the same in every run, so validation losses compare across runs."""
    available = packed.n_tokens // window
    if available == 0:
        raise UserError(f"validation split: {packed.n_tokens} tokens, fewer than one window of {window}")
    count = min(available, n_batches * batch_size)
    starts = (np.linspace(0, available - 1, count).round().astype(np.int64)) * window
    flags, languages = start_flags(packed, units), token_languages(packed, languages)
    return [windows(packed.tokens, flags, starts[i:i + batch_size], window, languages)
            for i in range(0, count, batch_size)]


def start_flags(packed: PackedTokens, units: Sequence[str]) -> list[np.ndarray]:
    """The flag arrays whose AND a batch carries: the word starts, or those of each unit."""
    return [packed.unit_starts(unit) for unit in units] or [packed.word_starts]


def token_languages(packed: PackedTokens, languages: Sequence[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """(each token's language id in `packed`, the model's row of each id), or None without `languages`."""
    return (packed.language_ids, language_map(packed, languages)) if languages else None


def windows(tokens: np.ndarray, flags: list[np.ndarray], starts: np.ndarray, window: int,
            languages: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[torch.Tensor, ...]:
    """(tokens int64, start flags bool[, language ids int64]), each (len(starts), window), copied out
    of the memmaps."""
    index = starts[:, None] + np.arange(window)[None, :]
    batch = torch.from_numpy(tokens[index].astype(np.int64))
    word_starts = torch.from_numpy(np.logical_and.reduce([f[index] for f in flags]).astype(bool))
    if languages is None:
        return batch, word_starts
    ids, rows = languages
    return batch, word_starts, torch.from_numpy(rows[ids[index]])

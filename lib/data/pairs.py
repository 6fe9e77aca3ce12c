"""Batches of translation pairs for XLM's translation LM (Lample & Conneau 2019), read from packed files.

The tokenizer stage packs every parallel corpus so that documents 2i and 2i + 1 are the two sides of
pair i (lib/data/packed.py; each side ends with its eos and carries its language in P.lang). A row of a
batch is one pair, [side a ; eos ; side b ; eos], with positions restarting at side b (so a word and its
translation sit at similar positions) and each token's language, padded on the right to the batch's
longest pair. Each side keeps at most half of `max_len` tokens. As with token windows
(lib/data/windows.py), the pairs of a training step are a pure function of its number, so a resumed
run reads the batches an uninterrupted one would.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from lib.config.errors import UserError
from lib.data.packed import PackedTokens
from lib.data.windows import Batch, language_map


@dataclass
class TranslationPairs(Batch):
    """Rows of pairs, each (B, L), padded on the right."""

    tokens: Tensor  # long: [side a ; eos ; side b ; eos], then pad
    word_starts: Tensor  # bool
    language_ids: Tensor  # long: each token's row of model.languages
    position_ids: Tensor  # long: restarting at side b
    attention_mask: Tensor  # bool: True at real tokens


class PairBatches:
    """Random translation pairs of one packed split, `batch_size` per step."""

    def __init__(self, packed: PackedTokens, languages: Sequence[str], batch_size: int, max_len: int, seed: int,
                 pad_id: int, name: str = "pairs", rows: slice = slice(None)):
        """`rows`: the part of every batch this process reads (its rank's share under torchrun)."""
        if packed.n_docs < 2 or packed.n_docs % 2:
            raise UserError(f"{name}: {packed.n_docs} documents; translation pairs need an even number, at least 2 "
                            "(rerun the tokenizer stage with corpora.parallel set)")
        self.packed, self.batch_size, self.seed, self.rows = packed, batch_size, seed, rows
        self.side_len, self.pad_id = max_len // 2, pad_id
        self.to_model = language_map(packed, languages)

    @property
    def n_pairs(self) -> int:
        return self.packed.n_docs // 2

    def mean_tokens(self) -> float:
        """Tokens in the average row (both sides and their eos, as truncated): what a pair costs."""
        lengths = np.diff(self.packed.doc_offsets)
        return float(np.minimum(lengths, self.side_len).reshape(-1, 2).sum(1).mean())

    def batch(self, step: int, micro: int = 0) -> TranslationPairs:
        rng = np.random.default_rng([self.seed, step, micro, 1])  # 1: not the window stream's draws
        pairs = rng.integers(0, self.n_pairs, size=self.batch_size)
        return self.rows_of(pairs[self.rows])

    def fixed(self, n_batches: int) -> list[TranslationPairs]:
        """A fixed validation set: up to n_batches batches of pairs spread evenly over the split."""
        count = min(self.n_pairs, n_batches * self.batch_size)
        pairs = np.linspace(0, self.n_pairs - 1, count).round().astype(np.int64)
        return [self.rows_of(pairs[i:i + self.batch_size]) for i in range(0, count, self.batch_size)]

    def rows_of(self, pairs: np.ndarray) -> TranslationPairs:
        """The padded rows of the given pair indices."""
        packed, offsets = self.packed, self.packed.doc_offsets
        sides = [(self.side(offsets[2 * p], offsets[2 * p + 1]), self.side(offsets[2 * p + 1], offsets[2 * p + 2]))
                 for p in pairs]
        width = max(len(a) + len(b) for a, b in sides)
        tokens = np.full((len(pairs), width), self.pad_id, np.int64)
        word_starts, mask = np.zeros((2, len(pairs), width), bool)
        languages, positions = np.zeros((2, len(pairs), width), np.int64)
        for row, (a, b) in enumerate(sides):
            index = np.concatenate([a, b])
            cells = slice(0, len(index))
            tokens[row, cells] = packed.tokens[index]
            word_starts[row, cells] = packed.word_starts[index]
            languages[row, cells] = self.to_model[packed.language_ids[index]]
            positions[row, cells] = np.concatenate([np.arange(len(a)), np.arange(len(b))])
            mask[row, cells] = True
        return TranslationPairs(*(torch.from_numpy(t) for t in (tokens, word_starts, languages, positions, mask)))

    def side(self, start: int, stop: int) -> np.ndarray:
        """The token indices of one side, its eos last, cut to side_len (the eos kept)."""
        if stop - start <= self.side_len:
            return np.arange(start, stop)
        return np.r_[start:start + self.side_len - 1, stop - 1]


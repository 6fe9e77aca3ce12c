"""MLM masking statistics: rates, the 80/10/10 split, special tokens, whole words, spans, dynamic masks."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from lib.config.params import MLMConfig
from lib.objectives.masking import IGNORE_INDEX, mask_tokens, span_lengths, span_mean, word_index

SPECIAL = {"pad": 0, "unk": 1, "bos": 2, "eos": 3, "mask": 4}
VOCAB = 60
MODES = {"token": {}, "whole_word": {"whole_word": True}, "span": {"span": True}}


def batch(rows: int = 256, length: int = 512, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of packed text: words of 1-4 tokens, eos every ~60 tokens, a few [UNK]/[CLS]."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(5, VOCAB, (rows, length), generator=g)
    u = torch.rand(rows, length, generator=g)
    tokens[u < 1 / 60] = SPECIAL["eos"]
    tokens[(u > 0.5) & (u < 0.505)] = SPECIAL["unk"]
    tokens[(u > 0.6) & (u < 0.602)] = SPECIAL["bos"]
    word_starts = torch.rand(rows, length, generator=g) < 0.4
    word_starts |= tokens < 5  # special tokens start words, as the tokenizer flags them
    return tokens, word_starts


def is_special(tokens: torch.Tensor) -> torch.Tensor:
    return tokens < 5


@pytest.fixture(scope="module")
def data():
    return batch()


@pytest.mark.parametrize("mode", MODES)
def test_selection_rate_and_split(data, mode):
    tokens, word_starts = data
    cfg = MLMConfig(**MODES[mode])
    torch.manual_seed(1)
    masked = mask_tokens(tokens, word_starts, SPECIAL, VOCAB, cfg)
    selected = masked.selected
    assert tokens.numel() >= 100_000
    assert not (selected & is_special(tokens)).any()  # special tokens are never selected
    assert selected.float().sum() / (~is_special(tokens)).sum() == pytest.approx(cfg.mask_rate, abs=0.005)

    chosen_in, chosen_orig = masked.inputs[selected], tokens[selected]
    became_mask = (chosen_in == SPECIAL["mask"]).float().mean()
    became_random = ((chosen_in != chosen_orig) & (chosen_in != SPECIAL["mask"])).float().mean()
    # a random replacement equal to the original (1 in 55) is indistinguishable from "kept"
    assert became_mask == pytest.approx(cfg.mask_token, abs=0.015)
    assert became_random == pytest.approx(cfg.random_token * (1 - 1 / 55), abs=0.015)
    assert not is_special(masked.inputs[selected & (masked.inputs != SPECIAL["mask"])]).any()
    assert torch.equal(masked.inputs[~selected], tokens[~selected])  # unselected positions untouched
    assert torch.equal(masked.labels[selected], chosen_orig)
    assert (masked.labels[~selected] == IGNORE_INDEX).all()


def test_random_replacements_are_never_special():
    tokens, word_starts = batch(rows=64, length=256)
    cfg = MLMConfig(mask_token=0.0, random_token=1.0)
    torch.manual_seed(0)
    masked = mask_tokens(tokens, word_starts, SPECIAL, VOCAB, cfg)
    replaced = masked.inputs[masked.selected]
    assert not is_special(replaced).any()
    assert set(replaced.tolist()) == set(range(5, VOCAB))  # uniform over all non-special ids


def reference_words(tokens: torch.Tensor, word_starts: torch.Tensor) -> list[list[list[int]]]:
    """Per row, the positions of each non-special word, by a plain loop."""
    rows = []
    for toks, flags in zip(tokens.tolist(), word_starts.tolist()):
        words, current = [], []
        for i, (tok, flag) in enumerate(zip(toks, flags)):
            if tok < 5:
                words.append(current) if current else None
                current = []
                continue
            if (flag or i == 0) and current:
                words.append(current)
                current = []
            current.append(i)
        words.append(current) if current else None
        rows.append(words)
    return rows


@pytest.mark.parametrize("mode", ["whole_word", "span"])
def test_whole_words_are_selected_whole(mode):
    tokens, word_starts = batch(rows=32, length=256, seed=3)
    word_starts[:, 0] = False  # a window that begins mid-word
    torch.manual_seed(2)
    selected = mask_tokens(tokens, word_starts, SPECIAL, VOCAB, MLMConfig(**MODES[mode])).selected
    n_selected_words = 0
    for row, words in enumerate(reference_words(tokens, word_starts)):
        covered = 0
        for positions in words:
            flags = selected[row, positions]
            assert flags.all() or not flags.any(), f"word {positions} of row {row} partly selected"
            covered += len(positions) if flags.all() else 0
            n_selected_words += int(flags.all())
        assert covered == selected[row].sum()  # nothing selected outside whole words
    assert n_selected_words > 100


def test_word_index_starts_words_at_specials_and_window_start():
    tokens = torch.tensor([[7, 8, 3, 9, 10, 11]])
    starts = torch.tensor([[False, False, False, False, True, False]])
    special = tokens < 5
    assert word_index(starts, special).tolist() == [[0, 0, 1, 2, 3, 3]]


def test_span_length_distribution():
    torch.manual_seed(0)
    lengths = span_lengths(200_000, p=0.2, max_len=10)
    assert lengths.min() == 1 and lengths.max() == 10
    assert span_mean(0.2, 10) == pytest.approx(3.8, abs=0.01)  # SpanBERT's reported mean
    assert lengths.float().mean() == pytest.approx(span_mean(0.2, 10), rel=0.02)


def test_span_masks_have_the_span_length_mean():
    """With one token per word and a low rate, spans rarely touch: runs of selected tokens ~ span lengths."""
    rows, length = 64, 2048
    tokens = torch.randint(5, VOCAB, (rows, length), generator=torch.Generator().manual_seed(0))
    cfg = MLMConfig(mask_rate=0.03, span=True, span_p=0.3, span_max=6)
    torch.manual_seed(0)
    selected = mask_tokens(tokens, torch.ones_like(tokens, dtype=torch.bool), SPECIAL, VOCAB, cfg).selected
    runs = []
    for row in selected.numpy():
        edges = np.flatnonzero(np.diff(np.concatenate([[0], row.astype(np.int8), [0]])))
        runs.extend(edges[1::2] - edges[::2])
    assert len(runs) > 500
    assert np.mean(runs) == pytest.approx(span_mean(0.3, 6), rel=0.05)
    assert max(runs) <= 2 * cfg.span_max  # only touching spans exceed span_max


def test_spans_do_not_cross_special_tokens():
    tokens = torch.full((200, 40), 9)
    tokens[:, 20] = SPECIAL["eos"]
    cfg = MLMConfig(mask_rate=0.05, span=True, span_p=0.01, span_max=10)  # spans of ~10 words
    torch.manual_seed(0)
    selected = mask_tokens(tokens, torch.ones_like(tokens, dtype=torch.bool), SPECIAL, VOCAB, cfg).selected
    counts = selected.sum(1)
    assert (counts == 2).float().mean() > 0.2  # budget 0.05 * 39 = 1.95 tokens per row
    assert not selected[:, 20].any()


@pytest.mark.parametrize("mode", MODES)
def test_masks_are_dynamic_and_seeded(mode):
    tokens, word_starts = batch(rows=8, length=128)
    cfg = MLMConfig(**MODES[mode])
    torch.manual_seed(5)
    first = mask_tokens(tokens, word_starts, SPECIAL, VOCAB, cfg)
    second = mask_tokens(tokens, word_starts, SPECIAL, VOCAB, cfg)
    assert not torch.equal(first.selected, second.selected)  # new masks on every call
    torch.manual_seed(5)
    again = mask_tokens(tokens, word_starts, SPECIAL, VOCAB, cfg)
    assert torch.equal(first.selected, again.selected) and torch.equal(first.inputs, again.inputs)


def test_mask_rate_follows_config_and_no_candidates_selects_nothing():
    tokens, word_starts = batch(rows=128, length=256)
    for rate in (0.05, 0.4):
        torch.manual_seed(0)
        cfg = dataclasses.replace(MLMConfig(), mask_rate=rate)
        selected = mask_tokens(tokens, word_starts, SPECIAL, VOCAB, cfg).selected
        assert selected.float().sum() / (~is_special(tokens)).sum() == pytest.approx(rate, abs=0.005)
    only_special = torch.full((2, 16), SPECIAL["eos"])
    for mode in MODES:
        masked = mask_tokens(only_special, torch.ones_like(only_special, dtype=torch.bool), SPECIAL, VOCAB,
                             MLMConfig(**MODES[mode]))
        assert not masked.selected.any() and torch.equal(masked.inputs, only_special)


def test_knowledge_units_are_selected_whole():
    """ERNIE: with mlm.knowledge the flags are unit starts (a phrase is one word), and selection takes
    every unit whole, though whole_word is off; whole-word masking on the same text cuts units apart."""
    tokens, word_starts = batch(rows=32, length=256, seed=4)
    g = torch.Generator().manual_seed(5)
    unit_starts = word_starts & ((torch.rand(word_starts.shape, generator=g) < 0.5) | is_special(tokens))
    units = [[unit for unit in row if word_starts[r, unit].sum() > 1]  # the units of several words
             for r, row in enumerate(reference_words(tokens, unit_starts))]
    assert sum(map(len, units)) > 500

    def partly_selected(selected: torch.Tensor) -> int:
        return sum(0 < selected[r, unit].sum() < len(unit) for r, row in enumerate(units) for unit in row)

    torch.manual_seed(6)
    knowledge = mask_tokens(tokens, unit_starts, SPECIAL, VOCAB, MLMConfig(knowledge="phrase")).selected
    whole_word = mask_tokens(tokens, word_starts, SPECIAL, VOCAB, MLMConfig(whole_word=True)).selected
    assert partly_selected(knowledge) == 0
    assert sum(bool(knowledge[r, unit].all()) for r, row in enumerate(units) for unit in row) > 100
    assert partly_selected(whole_word) > 100
    assert knowledge.sum() / (~is_special(tokens)).sum() == pytest.approx(0.15, abs=0.01)

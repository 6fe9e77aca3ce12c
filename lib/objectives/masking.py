"""Masked-LM corruption as pure tensor functions: BERT tokens, whole words, SpanBERT spans, ERNIE units.

`mask_tokens` picks about `mask_rate` of the non-special tokens of every row, then corrupts the picked
positions BERT-style: `mask_token` of them become [MASK], `random_token` of them a uniform random
non-special id, the rest stay as they are. It is called on every batch, so a sequence gets new masks
each time it is seen (RoBERTa's dynamic masking).

Selection works on words in all modes (in per-token mode every token is a word):
- per token (BERT, Devlin et al. 2019);
- `whole_word`: whole words (BERT's whole-word masking), from the tokenizer's word-start flags;
- `knowledge` (ERNIE 1.0, Sun et al. 2019): whole phrases and named entities, selected like whole words:
  the batch's flags are then unit starts (lib/data/knowledge.py), where a phrase or entity is one word;
- `span`: SpanBERT (Joshi et al. 2020): spans of whole words whose length in words follows SpanBERT's
  length distribution, a geometric Geo(span_p) truncated to 1..span_max and renormalised, as the
  SpanBERT code draws it (mean 3.8 words for p=0.2, max 10); a span starts at a word not yet picked and
  stops at a special token (a document boundary).
Special tokens are never picked and each counts as a word of its own. The first token of a row starts
a word even when its flag says otherwise (a window can begin mid-word). Words are added in random order
until the row's budget, mask_rate x its non-special tokens, is reached; the word that crosses the
budget is kept with probability (budget left / its length), so the expected count is the budget exactly.

All randomness comes from torch's global RNG on the tokens' device (the CUDA generator on a GPU), so
seeding torch fixes the masks.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from lib.config.params import MLMConfig

IGNORE_INDEX = -100  # labels at positions that are not predicted (torch's cross_entropy default)


@dataclass
class Masked:
    inputs: Tensor  # (B, T) long: the corrupted tokens the model reads
    selected: Tensor  # (B, T) bool: the positions to predict
    labels: Tensor  # (B, T) long: the original ids at selected positions, IGNORE_INDEX elsewhere


def mask_tokens(tokens: Tensor, word_starts: Tensor | None, special_ids: dict[str, int], vocab_size: int,
                cfg: MLMConfig) -> Masked:
    """Select and corrupt positions of `tokens` (B, T) for masked-LM; `special_ids` must name 'mask'."""
    special = special_mask(tokens, special_ids.values())
    by_words = cfg.whole_word or cfg.span or cfg.knowledge != "none"
    starts = word_starts if by_words and word_starts is not None else torch.ones_like(special)
    words = word_index(starts, special)
    word_len, candidate = word_table(words, special)
    target = cfg.mask_rate * (word_len * candidate).sum(1).float()
    if cfg.span:
        chosen = select_spans(word_len, candidate, target, cfg.span_p, cfg.span_max)
    else:
        chosen = select_words(word_len, candidate, target)
    selected = chosen.gather(1, words) & ~special
    inputs = corrupt(tokens, selected, special_ids["mask"], vocab_size, special_ids.values(),
                     cfg.mask_token, cfg.random_token)
    return Masked(inputs, selected, tokens.masked_fill(~selected, IGNORE_INDEX))


def special_mask(tokens: Tensor, special_ids: Iterable[int]) -> Tensor:
    """True where a token is one of `special_ids`."""
    ids = torch.tensor(sorted(set(special_ids)), dtype=tokens.dtype, device=tokens.device)
    return torch.isin(tokens, ids)


def word_index(word_starts: Tensor, special: Tensor) -> Tensor:
    """(B, T) long: the word of each token, numbered 0, 1, ... along each row. A word begins at a
    flagged start, at the first position, at a special token and right after one."""
    starts = word_starts.bool() | special
    starts[:, 1:] |= special[:, :-1]
    starts[:, 0] = True
    return starts.long().cumsum(1) - 1


def word_table(words: Tensor, special: Tensor) -> tuple[Tensor, Tensor]:
    """Per word slot (B, T): its length in tokens (0 past the row's last word) and whether it may be
    picked (a real word that is not a special token)."""
    word_len = torch.zeros_like(words).scatter_add_(1, words, torch.ones_like(words))
    word_special = torch.zeros_like(words).scatter_add_(1, words, special.long()) > 0
    return word_len, (word_len > 0) & ~word_special


def select_words(word_len: Tensor, candidate: Tensor, target: Tensor) -> Tensor:
    """(B, W) bool: candidate words in random order, taken until each row's `target` token count."""
    order = torch.rand(candidate.shape, device=candidate.device).masked_fill(~candidate, 2.0).argsort(1)
    lens = (word_len * candidate).gather(1, order)
    take = budget_take(lens, torch.zeros_like(target), target)
    return torch.zeros_like(candidate).scatter(1, order, take)


def budget_take(lens: Tensor, count: Tensor, target: Tensor) -> Tensor:
    """Which of the words with lengths `lens` (B, W), taken in order after `count` tokens, fit the
    budget `target`: all that fit, and the one that crosses it with probability (left / its length)."""
    cum = lens.cumsum(1) + count[:, None]
    before = cum - lens
    left = target[:, None] - before
    u = torch.rand(lens.shape[0], 1, device=lens.device)
    return (lens > 0) & ((cum <= target[:, None]) | ((left > 0) & (u * lens < left)))


def span_lengths(n: int, p: float, max_len: int, device: torch.device | str = "cpu") -> Tensor:
    """n span lengths in 1..max_len, P(l) proportional to p (1-p)^(l-1) (SpanBERT's distribution)."""
    lengths = torch.arange(1, max_len + 1, device=device, dtype=torch.float64)
    probs = p * (1 - p) ** (lengths - 1)
    return torch.multinomial(probs.float(), n, replacement=True) + 1


def span_mean(p: float, max_len: int) -> float:
    """The mean of `span_lengths` (3.8 for SpanBERT's p=0.2, max 10)."""
    weights = [p * (1 - p) ** (k - 1) for k in range(1, max_len + 1)]
    return sum(k * w for k, w in enumerate(weights, 1)) / sum(weights)


def select_spans(word_len: Tensor, candidate: Tensor, target: Tensor, p: float, max_len: int) -> Tensor:
    """(B, W) bool: SpanBERT spans of whole words, one span per row per round, until each row's
    `target` token count. A span starts at an unpicked candidate word and covers the next l words of
    the same segment (special tokens split segments), skipping words already picked."""
    B, W = candidate.shape
    device = candidate.device
    chosen = torch.zeros_like(candidate)
    count = torch.zeros_like(target)
    done = count >= target
    segment = (~candidate & (word_len > 0)).long().cumsum(1)
    slots = torch.arange(W, device=device)
    while True:
        eligible = candidate & ~chosen & ~done[:, None]
        done |= ~eligible.any(1)
        if bool(done.all()):
            return chosen
        anchor = torch.rand(B, W, device=device).masked_fill(~eligible, -1.0).argmax(1, keepdim=True)
        length = span_lengths(B, p, max_len, device)[:, None]
        in_span = ((slots >= anchor) & (slots < anchor + length) & (segment == segment.gather(1, anchor))
                   & candidate & ~chosen & ~done[:, None])
        lens = word_len * in_span
        take = in_span & budget_take(lens, count, target)
        crossed = (in_span & (lens.cumsum(1) + count[:, None] > target[:, None])).any(1)
        chosen |= take
        count = count + (lens * take).sum(1)
        done |= crossed | (count >= target)


def corrupt(tokens: Tensor, selected: Tensor, mask_id: int, vocab_size: int, special_ids: Iterable[int],
            mask_share: float, random_share: float) -> Tensor:
    """Selected positions: `mask_share` -> mask_id, `random_share` -> a uniform non-special id, rest kept."""
    u = torch.rand(tokens.shape, device=tokens.device)
    to_mask = selected & (u < mask_share)
    to_random = selected & (u >= mask_share) & (u < mask_share + random_share)
    allowed = torch.arange(vocab_size, device=tokens.device)
    allowed = allowed[~special_mask(allowed, special_ids)]
    random_ids = allowed[torch.randint(len(allowed), tokens.shape, device=tokens.device)].to(tokens.dtype)
    return torch.where(to_random, random_ids, tokens.masked_fill(to_mask, mask_id))

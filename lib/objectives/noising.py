"""Encoder-decoder pretraining corruption as pure tensor functions: T5's span corruption, BART's noising.

Both read windows of packed text (B, L) and return a `Noised` batch: what the encoder reads and what the
decoder predicts. Rows may hold any id, 0 and special tokens included: removed tokens are tracked with
boolean masks, never by overwriting them with a marker id.

`span_corruption` (T5, Raffel et al. 2020) follows T5's `random_spans_noise_mask` and seqio's noising:
round(L x noise_density) tokens of each row (at least 1, at most L-1) are noise, cut into
round(noise / mean_span_length) spans (at least 1, and no more spans than noise or kept tokens). The noise
and the kept tokens are each split into that many non-empty runs, a uniformly random composition (T5's
`_random_segmentation`), interleaved kept-first. The mask is then rolled by a uniform offset in [0, L)
(seqio's `random_roll`): without the roll the last token of every row is always noise and the first never
is. After the roll a noise span may wrap around the row's end, so a row has num_spans or num_spans + 1
spans. The inputs are the row with noise span i (in position order) replaced by sentinel i, then eos; the
targets are, for each span i in order, sentinel i then the span's tokens, then eos. The targets are built
from the spans directly, not by inverting the mask as T5's reference code does, which gives the targets
the wrong sentinels once a row may start with noise.

`denoise` (BART, Lewis et al. 2020) follows fairseq's `fairseq/data/denoising_dataset.py` per row and in
its order: sentence permutation, masking, insertion, rotation. The decoder reconstructs the original row.
The defaults are the BART paper's: 30% of the words masked in spans of Poisson(3) words, one mask per
span (text infilling), and all sentences permuted. As in fairseq:
- the mask budget is ceil(mask_ratio x the row's words); `span` lengths are drawn until they reach it and
  the last is cut to fit; a span of 0 words inserts one mask (fairseq: at a random position; here: before
  a random word, so an insertion never splits a word); spans start at distinct random words and may
  overlap, and overlapping spans make one masked stretch with one mask;
- `replace_length` 1 keeps one mask per span, 0 deletes the span, -1 masks each of its tokens;
- `insert_ratio` adds ceil(insert_ratio x length) masks at random places; `random_ratio` of the masks (of
  the spans and of the insertions) are a random token instead;
- sentences end after an end-of-sentence token (a run of them ends one sentence), ceil(share x count) of
  them are shuffled among their places; rotation starts the row at a uniformly chosen token.
Where this differs from fairseq: special tokens are never picked and a span stops at one (fairseq only
keeps the row's own bos and eos unmasked); random replacements are drawn per mask, uniformly over the
non-special ids (fairseq: per span, over every id but pad).
transformers' Flax example (examples/flax/language-modeling/run_bart_dlm_flax.py) differs more: it splits
sentences with nltk and joins them with the pad token, which is then the only sentence end; its spans are
of tokens, not words, with the budget counted over the whole batch and cut to the nearest cumulative
length; it drops 0-length spans (no insertions), and has no random tokens, insertion or rotation.

All randomness comes from torch's global RNG, so seeding torch fixes the noise. The functions work row by
row in Python, as fairseq does per example: they are meant for CPU tensors in the data loader.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer
from torch import Tensor

from lib.config.params import DenoisingConfig, SpanCorruptionConfig
from lib.data.encoding import pad_rows
from lib.objectives.masking import IGNORE_INDEX, special_mask, word_index, word_table

SENTENCE_END_MARKS = (".", "!", "?")


@dataclass
class Noised:
    inputs: Tensor  # (B, S) long: the encoder's input ids, right-padded with the pad id
    input_mask: Tensor  # (B, S) bool: True at real tokens
    targets: Tensor  # (B, D) long: what the decoder predicts, IGNORE_INDEX at padding
    decoder_inputs: Tensor  # (B, D) long: decoder_start followed by targets[:, :-1] (padding positions: the pad id)


def span_corruption(tokens: Tensor, sentinels: Tensor, eos: int, pad: int, decoder_start: int,
                    cfg: SpanCorruptionConfig) -> Noised:
    """T5 span corruption of each row of `tokens` (B, L); `sentinels` holds <extra_id_0>, <extra_id_1>, ..."""
    length = tokens.shape[1]
    if length < 2:
        raise ValueError(f"span corruption needs rows of at least 2 tokens, got {length}")
    num_noise, num_spans = span_counts(length, cfg)
    needed = sentinels_needed(length, cfg)
    if needed > len(sentinels):
        raise ValueError(f"span corruption of rows of {length} tokens needs up to {needed} sentinels "
                         f"({num_spans} noise spans, one more when a span wraps around the row's end), "
                         f"got {len(sentinels)}")
    inputs, targets = [], []
    for row in tokens:
        noise = noise_mask(length, num_noise, num_spans).to(row.device)
        span_start = noise & ~torch.cat([noise.new_zeros(1), noise[:-1]])
        span = span_start.cumsum(0) - 1  # the noise span each position is in or after; -1 before the first
        sentinel = sentinels.to(row)[span.clamp(min=0)]
        # each position offers its span's sentinel, then its token; inputs and targets pick from these pairs
        offered = torch.stack([sentinel, row], 1).flatten()
        end = row.new_full((1,), eos)
        inputs.append(torch.cat([offered[torch.stack([span_start, ~noise], 1).flatten()], end]))
        targets.append(torch.cat([offered[torch.stack([span_start, noise], 1).flatten()], end]))
    return assemble(inputs, targets, pad, decoder_start)


def span_counts(length: int, cfg: SpanCorruptionConfig) -> tuple[int, int]:
    """(noise tokens, noise spans) of a row of `length` tokens, as T5's `random_spans_noise_mask` counts."""
    num_noise = min(max(round(length * cfg.noise_density), 1), length - 1)
    num_spans = max(1, round(num_noise / cfg.mean_span_length))
    return num_noise, min(num_spans, num_noise, length - num_noise)


def sentinels_needed(length: int, cfg: SpanCorruptionConfig) -> int:
    """The most sentinels a row of `length` tokens takes: one per noise span, and one more where a span of 2
    or more tokens wraps around the row's end and becomes two."""
    num_noise, num_spans = span_counts(length, cfg)
    return num_spans + (num_noise > num_spans)


def span_corruption_lengths(length: int, cfg: SpanCorruptionConfig) -> tuple[int, int]:
    """(input length, target length) of a corrupted row of `length` tokens whose spans do not wrap, eos
    included; a wrapped span adds one sentinel to each."""
    num_noise, num_spans = span_counts(length, cfg)
    return length - num_noise + num_spans + 1, num_noise + num_spans + 1


def noise_mask(length: int, num_noise: int, num_spans: int) -> Tensor:
    """(length,) bool: kept runs and noise spans interleaved kept-first, rolled by a random offset."""
    noise_lengths = random_segmentation(num_noise, num_spans)
    kept_lengths = random_segmentation(length - num_noise, num_spans)
    run_lengths = torch.stack([kept_lengths, noise_lengths], 1).flatten()
    is_noise = torch.tensor([False, True]).repeat(num_spans)
    return is_noise.repeat_interleave(run_lengths).roll(int(torch.randint(length, ())))


def random_segmentation(num_items: int, num_segments: int) -> Tensor:
    """(num_segments,) long: positive lengths adding up to num_items, each composition equally likely."""
    cuts = torch.randperm(num_items - 1)[:num_segments - 1].sort().values + 1
    bounds = torch.cat([torch.tensor([0]), cuts, torch.tensor([num_items])])
    return bounds.diff()


def denoise(tokens: Tensor, word_starts: Tensor, sentence_ends: Tensor | None, special_ids: dict[str, int],
            vocab_size: int, decoder_start: int, cfg: DenoisingConfig) -> Noised:
    """BART noising of each row of `tokens` (B, L). `word_starts` (B, L) flags word starts; `sentence_ends`
    (vocab_size,) flags the ids that end a sentence (None: only eos does); `special_ids` names pad, unk,
    bos, eos and mask."""
    eos = special_ids["eos"]
    special = special_mask(tokens, special_ids.values())
    ends = tokens == eos
    if sentence_ends is not None:
        ends |= sentence_ends.to(tokens.device)[tokens]
    starts = torch.ones_like(special) if cfg.mask_unit == "token" else word_starts.bool().clone()
    starts[:, 0] = True  # a window may begin mid-word
    ids = torch.arange(vocab_size, device=tokens.device)
    fill = Replacements(special_ids["mask"], ids[~special_mask(ids, special_ids.values())], cfg.random_ratio)
    inputs = []
    for row in range(tokens.shape[0]):
        row_tokens, row_starts, row_special = tokens[row], starts[row], special[row]
        if cfg.permute_sentences > 0:
            order, sentence_first = permuted_sentences(ends[row], cfg.permute_sentences)
            # a sentence's first token starts a word wherever the sentence lands
            row_starts = (row_starts | sentence_first)[order]
            row_tokens, row_special = row_tokens[order], row_special[order]
        if cfg.mask_ratio > 0:
            row_tokens = mask_words(row_tokens, row_starts, row_special, fill, cfg)
        if cfg.insert_ratio > 0:
            row_tokens = insert_noise(row_tokens, math.ceil(len(row_tokens) * cfg.insert_ratio), fill)
        if len(row_tokens) > 0 and cfg.rotate > 0 and torch.rand(()) < cfg.rotate:
            row_tokens = row_tokens.roll(-int(torch.randint(len(row_tokens), ())))
        inputs.append(torch.cat([row_tokens, row_tokens.new_full((1,), eos)]))
    targets = torch.cat([tokens, tokens.new_full((tokens.shape[0], 1), eos)], 1)
    return assemble(inputs, list(targets), special_ids["pad"], decoder_start)


@dataclass
class Replacements:
    """What replaces masked text and fills insertions: the mask id, or with probability `random_ratio`
    a uniform draw from `random_ids`."""

    mask_id: int
    random_ids: Tensor
    random_ratio: float

    def draw(self, n: int) -> Tensor:
        ids = torch.full((n,), self.mask_id, dtype=torch.long, device=self.random_ids.device)
        is_random = torch.rand(n, device=ids.device) < self.random_ratio
        picks = torch.randint(len(self.random_ids), (int(is_random.sum()),), device=ids.device)
        ids[is_random] = self.random_ids[picks]
        return ids


def permuted_sentences(ends: Tensor, share: float) -> tuple[Tensor, Tensor]:
    """The row's positions (L,) long in a new order, ceil(share x its sentences) of its sentences shuffled
    among their places, and (L,) bool flags of each sentence's first token. A sentence ends after a run of
    end tokens (`ends`), or at the row's end."""
    length = len(ends)
    run_end = ends & ~torch.cat([ends[1:], ends.new_zeros(1)])
    bounds = torch.cat([ends.new_zeros(1, dtype=torch.long), run_end.nonzero().flatten() + 1])
    bounds = torch.cat([bounds, bounds.new_tensor([length])]).unique_consecutive()
    first = torch.zeros_like(ends)
    first[bounds[:-1]] = True
    count = len(bounds) - 1
    chosen = torch.randperm(count)[:math.ceil(count * share)]
    order = torch.arange(count)
    order[chosen] = chosen[torch.randperm(len(chosen))]
    positions = torch.cat([torch.arange(int(bounds[i]), int(bounds[i + 1]), device=ends.device) for i in order])
    return positions, first


def mask_words(tokens: Tensor, starts: Tensor, special: Tensor, fill: Replacements, cfg: DenoisingConfig) -> Tensor:
    """fairseq's `add_whole_word_mask` over one row: spans of whole words picked until ceil(mask_ratio x
    the row's words), replaced as `cfg.replace_length` says; 0-word spans insert a mask before a random word."""
    words = word_index(starts[None], special[None])[0]
    candidate = word_table(words[None], special[None])[1]
    candidates = candidate[0].nonzero().flatten()
    budget = math.ceil(len(candidates) * cfg.mask_ratio)
    if budget == 0:
        return tokens
    if cfg.mask_unit == "span":
        lengths = poisson_lengths(budget, cfg.poisson_lambda)
    else:
        lengths = torch.ones(budget, dtype=torch.long)
    spans = lengths[lengths > 0]
    first = candidates[torch.randperm(len(candidates))[:len(spans)]]
    # a span covers its words up to the next special token (its own word) or the row's end
    num_words = int(words[-1]) + 1
    blocked = torch.where(candidate[0, :num_words], num_words, torch.arange(num_words))
    next_blocked = blocked.flip(0).cummin(0).values.flip(0)
    stop = torch.minimum(first + spans, next_blocked[first])
    covered = coverage(first, stop, num_words)
    inside = coverage(first + 1, stop, num_words)  # covered past a span's first word
    word_first_token = torch.cat([torch.ones(1, dtype=torch.bool), words[1:] != words[:-1]])
    span_first = torch.zeros(num_words, dtype=torch.bool)
    span_first[first] = True
    picked = covered[words]
    if cfg.replace_length == -1:
        masked, keep = picked, torch.ones_like(picked)
    elif cfg.replace_length == 1:
        # overlapping spans make one stretch: the first token of its first span is masked, the rest deleted
        masked = (span_first & ~inside)[words] & word_first_token
        keep = ~picked | masked
    else:
        masked, keep = torch.zeros_like(picked), ~picked
    tokens = tokens.clone()
    tokens[masked] = fill.draw(int(masked.sum())).to(tokens)
    inserts = candidates[torch.randint(len(candidates), (len(lengths) - len(spans),))]
    inserts_before = torch.bincount(word_first_token.nonzero().flatten()[inserts], minlength=len(tokens) + 1)
    return rebuild(tokens, keep, inserts_before, fill)


def poisson_lengths(budget: int, poisson_lambda: float) -> Tensor:
    """Span lengths in words, Poisson(poisson_lambda), drawn until they add up to `budget`, the last cut
    so that they add up to it exactly (fairseq's way)."""
    lengths = torch.poisson(torch.full((budget,), poisson_lambda)).long()
    while lengths.sum() < budget:
        lengths = torch.cat([lengths, torch.poisson(torch.full((budget,), poisson_lambda)).long()])
    total = lengths.cumsum(0)
    last = int((total >= budget).nonzero()[0])
    lengths[last] -= int(total[last]) - budget
    return lengths[:last + 1]


def coverage(first: Tensor, stop: Tensor, size: int) -> Tensor:
    """(size,) bool: True at indices inside any of the ranges [first, stop)."""
    edges = torch.zeros(size + 1, dtype=torch.long)
    edges.index_add_(0, first, torch.ones_like(first))
    edges.index_add_(0, stop, -torch.ones_like(stop))
    return edges.cumsum(0)[:size] > 0


def insert_noise(tokens: Tensor, n: int, fill: Replacements) -> Tensor:
    """`tokens` with `n` replacement tokens inserted at uniformly random places (fairseq's
    `add_insertion_noise`)."""
    inserts_before = torch.bincount(torch.randint(len(tokens) + 1, (n,)), minlength=len(tokens) + 1)
    return rebuild(tokens, torch.ones_like(tokens, dtype=torch.bool), inserts_before, fill)


def rebuild(tokens: Tensor, keep: Tensor, inserts_before: Tensor, fill: Replacements) -> Tensor:
    """The kept tokens in order, with inserts_before[i] replacement tokens before token i (i = len: at
    the end)."""
    per_place = inserts_before.clone()
    per_place[:-1] += keep
    out_length = int(per_place.sum())
    is_inserted = torch.ones(out_length, dtype=torch.bool)
    # a kept token is the last of its place's share of the output
    is_inserted[per_place.cumsum(0)[:-1][keep] - 1] = False
    out = torch.empty(out_length, dtype=tokens.dtype, device=tokens.device)
    out[~is_inserted] = tokens[keep]
    out[is_inserted] = fill.draw(int(is_inserted.sum())).to(tokens)
    return out


def assemble(inputs: list[Tensor], targets: list[Tensor], pad: int, decoder_start: int) -> Noised:
    """A `Noised` batch from the rows' inputs and targets, each padded to its longest row."""
    inputs_padded, input_mask = pad_rows(inputs, pad)
    targets_padded, target_mask = pad_rows(targets, IGNORE_INDEX)
    shifted = targets_padded.masked_fill(~target_mask, pad)[:, :-1]
    start = shifted.new_full((len(targets), 1), decoder_start)
    return Noised(inputs_padded, input_mask, targets_padded, torch.cat([start, shifted], 1))


def sentence_end_table(tokenizer: Tokenizer, vocab_size: int) -> Tensor:
    """(vocab_size,) bool: True for the ids whose token text ends a sentence ('.', '!' or '?' last). A
    byte-level BPE 'Ġ' or wordpiece '##' prefix is at the other end of the text, so it needs no stripping;
    ids the tokenizer lacks are False."""
    table = torch.zeros(vocab_size, dtype=torch.bool)
    for token_id in range(vocab_size):
        text = tokenizer.id_to_token(token_id)
        table[token_id] = text is not None and text.endswith(SENTENCE_END_MARKS)
    return table

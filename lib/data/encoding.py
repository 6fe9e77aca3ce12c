"""Task texts as model inputs, for every task type: token ids with the special tokens laid out here,
truncation, and batches of similar length padded to their longest.

Texts are encoded without the tokenizer's post-processor and laid out as `[bos] a [eos]` or
`[bos] a [eos] b [eos]`, with segment ids 0 up to the first eos and 1 after, so the layout does not
depend on how a tokenizer was saved. A text longer than `max_len` (specials included) keeps its head,
its tail, or both: `head_tail` keeps the first quarter and the last three quarters of the budget, Sun
et al. (2019)'s best split for long reviews (head 128 + tail 382 of 512), since the end of a review
often sums it up. Pairs are cut longest-first, each side in the same mode.

`batch_indices` groups examples of similar length, so that each batch, padded to its own longest
example (`padded`), holds little padding.
"""
from __future__ import annotations

import random
from typing import Sequence

import torch

from lib.data.tokenizer import check_plain

TRUNCATIONS = ("head", "tail", "head_tail")


SORT_CHUNK = 50  # shuffled batches sort by length within chunks of this many batches


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
            keep = cut(a, max_len - 2, truncation)
            truncated += len(keep) < len(a)
            ids.append([bos_id, *keep, eos_id])
            segments.append([0] * len(ids[-1]))
        return ids, segments, truncated
    encoded_b = [e.ids for e in tokenizer.encode_batch(texts_b, add_special_tokens=False)]
    ids, segments, truncated = [], [], 0
    for a, b in zip(encoded_a, encoded_b, strict=True):
        len_a, len_b = pair_lengths(len(a), len(b), max_len - 3)
        truncated += (len_a, len_b) != (len(a), len(b))
        first = [bos_id, *cut(a, len_a, truncation), eos_id]
        second = [*cut(b, len_b, truncation), eos_id]
        ids.append(first + second)
        segments.append([0] * len(first) + [1] * len(second))
    return ids, segments, truncated


def pair_lengths(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
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


def cut(ids: list[int], n: int, truncation: str) -> list[int]:
    """The `n` tokens of `ids` that `truncation` keeps."""
    if len(ids) <= n:
        return ids
    if truncation == "head":
        return ids[:n]
    if truncation == "tail":
        return ids[len(ids) - n:]
    head = -(-n // 4)  # rounded up: 128 + 382 of the 510 text tokens of a 512-token input, as Sun et al.
    return ids[:head] + ids[len(ids) - (n - head):]


def batch_indices(examples: Sequence, batch_size: int, seed: int | None = None) -> list[list[int]]:
    """The example indices (examples with `ids`) of each batch, in batch order.

    seed None (evaluation): all examples sorted by length, longest first. seed int (training):
    shuffled with random.Random(seed), sorted by length within chunks of SORT_CHUNK batches (little
    padding, still random), and the batch order shuffled again: the same seed gives the same batches."""
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


def pad_rows(rows: list[torch.Tensor], value: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, longest) rows right-padded with `value`, and a (B, longest) bool mask of the real tokens."""
    padded = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=value)
    lengths = torch.tensor([len(row) for row in rows], device=padded.device)
    return padded, torch.arange(padded.shape[1], device=padded.device) < lengths[:, None]

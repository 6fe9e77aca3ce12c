"""Sentence-level tasks on top of masked LM: ALBERT's sentence-order prediction (SOP, Lan et al. 2020)
and BERT's next-sentence prediction (NSP, Devlin et al. 2019).

Each training window of the packed stream (documents separated by eos) becomes a pair
`[bos] A [eos] B [eos]`, padded to the window, with segment ids 0 up to the first eos and 1 after.
A and B are consecutive pieces of one document: the longest stretch of the window between document
boundaries, cut at a uniformly random point, so a pair never straddles two documents.
- SOP: half the pairs are swapped to `B A`; label 1 = swapped. Both pieces come from the same
  document, so the task is about order and coherence, not topic (ALBERT's case against NSP).
- NSP: half the pairs get, as B, the start of the longest stretch of the next row of the batch
  (another stretch of the corpus, nearly always another document); label 1 = not the next piece.
A window whose longest stretch has fewer than 2 tokens cannot be cut: it is kept as `[bos] A [eos]`
for masked LM, with no sentence label (IGNORE_INDEX). Randomness comes from torch's global CPU RNG,
which the trainer checkpoints and seeds for validation.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lib.objectives.masking import IGNORE_INDEX

SENTENCE_TASKS = ("sop", "nsp")


@dataclass
class Pairs:
    tokens: Tensor  # (B, T) long: [bos] A [eos] B [eos], then pad
    word_starts: Tensor  # (B, T) bool, carried from the packed stream (False at specials and padding)
    segments: Tensor  # (B, T) long: 0 up to the first eos, 1 after (0 at padding)
    attention_mask: Tensor  # (B, T) bool: True at real tokens
    labels: Tensor  # (B,) long: 0 in order / next, 1 swapped / random, IGNORE_INDEX without a pair


def longest_stretch(row: list[int], eos: int) -> tuple[int, int]:
    """(start, end) of the longest run of `row` without an eos token."""
    best, start = (0, 0), 0
    for i, token in enumerate([*row, eos]):
        if token == eos:
            if i - start > best[1] - best[0]:
                best = (start, i)
            start = i + 1
    return best


def sentence_pairs(tokens: Tensor, word_starts: Tensor, task: str, special_ids: dict[str, int],
                   length: int) -> Pairs:
    """Pairs of `length` tokens for `task` (sop | nsp) from windows `tokens` (B, W) of the packed stream."""
    if task not in SENTENCE_TASKS:
        raise ValueError(f"sentence task {task!r}: expected one of {SENTENCE_TASKS}")
    bos, eos, pad = special_ids["bos"], special_ids["eos"], special_ids["pad"]
    rows, starts = tokens.tolist(), word_starts.tolist()
    budget = length - 3  # room for the text of A and B beside [bos], [eos], [eos]
    stretches = [longest_stretch(row, eos) for row in rows]
    n = len(rows)
    out = torch.full((n, length), pad, dtype=torch.long)
    out_starts = torch.zeros((n, length), dtype=torch.bool)
    segments = torch.zeros((n, length), dtype=torch.long)
    mask = torch.zeros((n, length), dtype=torch.bool)
    labels = torch.full((n,), IGNORE_INDEX, dtype=torch.long)
    flips = torch.rand(n) < 0.5
    for r, (row, flags) in enumerate(zip(rows, starts)):
        start, end = stretches[r]
        end = min(end, start + budget)
        if end - start < 2:  # nothing to cut: masked LM only
            pieces = [(row[start:end], flags[start:end])]
        else:
            cut = start + int(torch.randint(1, end - start, (1,)))
            a, b = (row[start:cut], flags[start:cut]), (row[cut:end], flags[cut:end])
            labels[r] = int(flips[r])
            if flips[r] and task == "sop":
                a, b = b, a
            elif flips[r]:  # nsp: B from the next row's stretch, as long as the B it replaces (or shorter)
                other_start, other_end = stretches[(r + 1) % n]
                other_end = min(other_end, other_start + len(b[0]))
                if other_end == other_start or n == 1:
                    labels[r] = 0  # no other stretch to draw from: keep the true next piece
                else:
                    b = (rows[(r + 1) % n][other_start:other_end], starts[(r + 1) % n][other_start:other_end])
            pieces = [a, b]
        ids, flags_out, segment = [bos], [False], [0]
        for k, (piece, piece_flags) in enumerate(pieces):
            ids += [*piece, eos]
            flags_out += [*piece_flags, False]
            segment += [k] * (len(piece) + 1)
        out[r, : len(ids)] = torch.tensor(ids)
        out_starts[r, : len(ids)] = torch.tensor(flags_out)
        segments[r, : len(ids)] = torch.tensor(segment)
        mask[r, : len(ids)] = True
    return Pairs(out, out_starts, segments, mask, labels)

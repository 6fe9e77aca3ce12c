"""The zero-shot baseline of a classification task, GPT-2's recipe (Radford et al., 2019): put the text
in a prompt ("{text} It was") and predict the label word (" terrible" / " great") the causal LM finds most
likely after it. It measures what pretraining alone put into the model, before any labeled example is seen.
"""
from __future__ import annotations

import re
from typing import Sequence

import torch

from lib.data.encoding import TRUNCATIONS, cut, pair_lengths
from lib.models.architectures import Transformer

FIELDS = re.compile(r"(\{text\}|\{text_pair\})")  # the placeholders of a zero-shot template


def zero_shot_problem(task: str, label_words: list[str], label_names: list[str]) -> str | None:
    """Why evaluate.zero_shot.<task> cannot score the task, or None. Zero-shot predicts the likelier
    label word, so each class needs its own: with fewer, the classes without one are never predicted."""
    if len(label_words) == len(label_names):
        return None
    return (f"Zero-shot not scored: evaluate.zero_shot.{task}.label_words has {len(label_words)} words for "
            f"{len(label_names)} classes; give one word per class, in label order.")


def zero_shot(lm: Transformer, tokenizer, special: dict[str, int], rows: Sequence, *, template: str,
              label_words: list[str], max_len: int, truncation: str, batch_size: int = 32,
              device: str | torch.device = "cpu") -> list[int]:
    """The index of the label word each row's prompt makes most likely (see `label_scores`)."""
    scores = label_scores(lm, tokenizer, special, rows, template=template, label_words=label_words,
                          max_len=max_len, truncation=truncation, batch_size=batch_size, device=device)
    return scores.argmax(-1).tolist()


def label_scores(lm: Transformer, tokenizer, special: dict[str, int], rows: Sequence, *, template: str,
                 label_words: list[str], max_len: int, truncation: str, batch_size: int = 32,
                 device: str | torch.device = "cpu") -> torch.Tensor:
    """(len(rows), len(label_words)) float32: log P(label word | [bos] prompt) under the causal `lm`,
    summed over the word's tokens.

    The prompt is `template` with "{text}" replaced by row.a and "{text_pair}" by row.b (required for
    pair rows). The template's pieces and the texts are encoded separately without special tokens,
    so only the texts are cut (`truncation`, as lib.data.encoding cuts task inputs; a pair longest-first)
    until [bos] + prompt + the longest label word fit `max_len`. `lm` must already be on `device`;
    it runs in eval mode (its mode is restored afterwards), `batch_size` sequences at a time."""
    if not lm.cfg.causal:
        raise ValueError("zero-shot scoring needs a causal LM (objective: clm); this model is bidirectional")
    if truncation not in TRUNCATIONS:
        raise ValueError(f"truncation '{truncation}' is not one of {TRUNCATIONS}")
    labels = [tokenizer.encode(word, add_special_tokens=False).ids for word in label_words]
    if len(labels) < 2 or not all(labels):
        raise ValueError(f"need at least 2 label words, each encoding to a token: {label_words}")
    prompts = _prompts(tokenizer, rows, template, max_len - 1 - max(map(len, labels)), truncation)

    # Label i is scored on any input that continues the prompt with its first len - 1 tokens: a causal
    # LM's logits there give the probability of each of its tokens. Label prefixes that are prefixes of
    # a longer one need no input of their own, so single-token label words share one forward per row.
    prefixes = {tuple(label[:-1]) for label in labels}
    continuations = sorted(c for c in prefixes if not any(len(o) > len(c) and o[:len(c)] == c for o in prefixes))
    covering = [next(j for j, c in enumerate(continuations) if c[:len(label) - 1] == tuple(label[:-1]))
                for label in labels]
    width = max(map(len, labels))
    targets = torch.tensor([label + [0] * (width - len(label)) for label in labels], device=device)  # (L, K)
    valid = torch.tensor([[k < len(label) for k in range(width)] for label in labels], device=device)

    # Every (row, continuation) input, longest first so each batch pads little.
    inputs = [(r, j) for r in range(len(rows)) for j in range(len(continuations))]
    inputs.sort(key=lambda item: -(len(prompts[item[0]]) + len(continuations[item[1]])))
    scores = torch.empty(len(rows), len(labels))
    training = lm.training
    lm.eval()
    try:
        with torch.inference_mode():
            for start in range(0, len(inputs), batch_size):
                chunk = inputs[start:start + batch_size]
                sequences = [[special["bos"], *prompts[r], *continuations[j]] for r, j in chunk]
                logp = _continuation_log_probs(lm, sequences, [len(prompts[r]) for r, _ in chunk], width,
                                               special["pad"], device)  # (B, K, V)
                per_label = logp.gather(2, targets.T[None].expand(len(chunk), -1, -1))  # (B, K, L)
                summed = per_label.masked_fill(~valid.T[None], 0.0).sum(1).float().cpu()  # (B, L)
                for n, (r, j) in enumerate(chunk):
                    for i, c in enumerate(covering):
                        if c == j:
                            scores[r, i] = summed[n, i]
    finally:
        lm.train(training)
    return scores


def _continuation_log_probs(lm: Transformer, sequences: list[list[int]], prompt_lengths: list[int], width: int,
                            pad_id: int, device: str | torch.device) -> torch.Tensor:
    """(B, width, vocab) log-probabilities predicted at the last prompt token ([bos] at 0, so position
    prompt_length) and the `width - 1` positions after it. Right padding is invisible to real tokens of
    a causal model; positions past a sequence's end read padding and are masked by the caller."""
    T = max(map(len, sequences))
    input_ids = torch.full((len(sequences), T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), T), dtype=torch.bool)
    for n, ids in enumerate(sequences):
        input_ids[n, :len(ids)] = torch.tensor(ids)
        attention_mask[n, :len(ids)] = True
    hidden = lm(input_ids.to(device), None, attention_mask.to(device))  # no segment ids: all 0, as in pretraining
    positions = (torch.tensor(prompt_lengths)[:, None] + torch.arange(width)[None]).clamp(max=T - 1).to(device)
    # the LM head only where a label token is predicted: (B, T, vocab) logits would not fit large batches
    picked = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
    return torch.log_softmax(lm.lm_logits(picked).float(), dim=-1)


def _prompts(tokenizer, rows: Sequence, template: str, budget: int, truncation: str) -> list[list[int]]:
    """Each row's prompt token ids (no specials), its texts cut so that the whole is at most `budget`."""
    pieces = [piece for piece in FIELDS.split(template) if piece]
    if "{text}" not in pieces:
        raise ValueError(f"template {template!r} has no {{text}} placeholder")
    pair = "{text_pair}" in pieces
    if any((row.b is not None) != pair for row in rows):
        raise ValueError(f"template {template!r} {'has' if pair else 'lacks'} {{text_pair}}, but the rows are "
                         f"{'single texts' if pair else 'pairs'}: pair tasks need both placeholders")
    fixed = {piece: tokenizer.encode(piece, add_special_tokens=False).ids
             for piece in pieces if piece not in ("{text}", "{text_pair}")}
    room = budget - sum(len(fixed[piece]) for piece in pieces if piece in fixed)
    if room < (2 if pair else 1):
        raise ValueError(f"max_len leaves no room for the text after the template {template!r} and the label words")
    texts_a = [e.ids for e in tokenizer.encode_batch([row.a for row in rows], add_special_tokens=False)]
    texts_b = ([e.ids for e in tokenizer.encode_batch([row.b for row in rows], add_special_tokens=False)]
               if pair else [[] for _ in rows])
    prompts = []
    for a, b in zip(texts_a, texts_b):
        len_a, len_b = pair_lengths(len(a), len(b), room) if pair else (min(len(a), room), 0)
        text = {"{text}": cut(a, len_a, truncation), "{text_pair}": cut(b, len_b, truncation)}
        prompts.append([token for piece in pieces for token in (text[piece] if piece in text else fixed[piece])])
    return prompts

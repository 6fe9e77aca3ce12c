"""Generation with an encoder-decoder (lib/models/architectures/encoder_decoder.py): what a seq2seq task
(translation, summarization, generative QA) predicts.

    tokens = generate(model, input_ids, attention_mask, Decoding(num_beams=4), eos)

Each source row gets its own list of token ids: those the decoder writes after its start token, up to
and without the end token, at most `max_new_tokens`. The encoder runs once per source; the decoder runs
one token per step over a key/value cache (lib/models/blocks.py's KeyValues). Rows are independent: a
batch of sources padded to one length decodes as each row alone does.

Greedy decoding (num_beams 1) writes the most likely token at each step. Beam search (num_beams > 1)
follows transformers' `generate(num_beams=K, early_stopping=True)` (its `_beam_search`, transformers 5),
so that a model exported to transformers decodes there as here:
- each step keeps the 2K most likely continuations of the K running beams (summed log-probabilities);
  those among the first K that end (the end token, or max_new_tokens reached) become finished hypotheses,
  scored sum / length ** length_penalty, where length counts the tokens after the start token, the end
  token included; the K best that do not end run on;
- a source keeps its K best finished hypotheses and is done once it has K (early_stopping=True: no
  running beam is waited for, even one that might still score higher); decoding stops when every source
  is done or at max_new_tokens, where every beam ends;
- the answer is the best-scoring finished hypothesis.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lib.models.architectures.encoder_decoder import EncoderDecoder, memory_mask

ENDED = -1.0e9  # what transformers adds to the score of an ended beam so that it never runs on


@dataclass(frozen=True)
class Decoding:
    """How generate() decodes: greedily (num_beams 1) or by beam search over num_beams beams, whose
    finished hypotheses score sum of log-probs / length ** length_penalty (> 0 favours longer ones)."""

    num_beams: int = 1
    length_penalty: float = 1.0
    max_new_tokens: int = 64

    def __post_init__(self):
        if self.num_beams < 1:
            raise ValueError(f"num_beams {self.num_beams} must be >= 1")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens {self.max_new_tokens} must be >= 1")


@torch.inference_mode()
def generate(model: EncoderDecoder, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
             decoding: Decoding, eos: int | None) -> list[list[int]]:
    """input_ids (B, S) and attention_mask (B, S; nonzero at real tokens) -> per row, the tokens written
    after the decoder's start token, without the end token `eos` (None: no end token, every row writes
    max_new_tokens). The model decodes in the mode it is in: the caller sets eval() for predictions."""
    memory = model.encoder(input_ids, attention_mask=attention_mask)
    mask = memory_mask(attention_mask)
    if decoding.num_beams == 1:
        return greedy(model, memory, mask, decoding.max_new_tokens, eos)
    return beam_search(model, memory, mask, decoding, eos)


def greedy(model: EncoderDecoder, memory: torch.Tensor, mask: torch.Tensor | None, steps: int,
           eos: int | None) -> list[list[int]]:
    """Each row's most likely token after the source and those before it, for up to `steps` steps; a row
    that has written `eos` keeps decoding (the batch runs as one) until every row has, and is cut there."""
    rows = memory.shape[0]
    cache = model.decoder.new_cache()
    token = torch.full((rows, 1), model.cfg.decoder_start, dtype=torch.long, device=memory.device)
    done = torch.zeros(rows, dtype=torch.bool, device=memory.device)
    written = []
    for _ in range(steps):
        hidden = model.decoder(token, memory=memory, memory_mask=mask, cache=cache)
        token = model.lm_logits(hidden[:, -1]).argmax(-1, keepdim=True)
        written.append(token)
        if eos is not None:
            done |= token[:, 0] == eos
            if bool(done.all()):
                break
    return [until(row, eos) for row in torch.cat(written, dim=1).tolist()]


def beam_search(model: EncoderDecoder, memory: torch.Tensor, mask: torch.Tensor | None, decoding: Decoding,
                eos: int | None) -> list[list[int]]:
    """transformers' beam search with early_stopping=True (see the module docstring), batched: the running
    beams of the B sources are the decoder's B x K rows. The first step runs once per source (every beam
    starts from the same token), so the cross-attention's keys and values are computed once per source and
    then repeated for its beams; every step reorders the self-attention's cached keys and values by the
    beams that run on."""
    sources, beams, steps = memory.shape[0], decoding.num_beams, decoding.max_new_tokens
    device = memory.device
    cache = model.decoder.new_cache()
    token = torch.full((sources, 1), model.cfg.decoder_start, dtype=torch.long, device=device)
    scores = torch.zeros(sources, 1, device=device)  # (sources, running beams): summed log-probs
    prefixes = torch.zeros(sources, 1, 0, dtype=torch.long, device=device)  # (sources, running beams, step - 1)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(sources)]
    for step in range(1, steps + 1):
        hidden = model.decoder(token.view(-1, 1), memory=memory, memory_mask=mask, cache=cache)
        log_probs = F.log_softmax(model.lm_logits(hidden[:, -1]).float(), dim=-1)
        running, vocab = scores.shape[1], log_probs.shape[-1]
        total = (log_probs.view(sources, running, vocab) + scores[:, :, None]).view(sources, -1)
        top, index = total.topk(min(2 * beams, total.shape[1]), dim=1)  # best first
        beam, token = index // vocab, index % vocab
        candidates = torch.cat([prefixes.gather(1, beam[:, :, None].expand(-1, -1, step - 1)), token[:, :, None]], 2)
        if step == steps:
            ended = torch.ones_like(token, dtype=torch.bool)
        else:
            ended = token == eos if eos is not None else torch.zeros_like(token, dtype=torch.bool)
        keep_finished(finished, top[:, :beams] / step ** decoding.length_penalty, candidates[:, :beams],
                      ended[:, :beams], beams)
        if step == steps or all(len(hypotheses) == beams for hypotheses in finished):
            break
        scores, on = (top + ended.float() * ENDED).topk(min(beams, top.shape[1]), dim=1)
        token, prefixes = token.gather(1, on), candidates.gather(1, on[:, :, None].expand(-1, -1, step))
        rows = (beam.gather(1, on) + torch.arange(sources, device=device)[:, None] * running).view(-1)  # extended
        grown = on.shape[1] != running  # after the first step (or every step while 2K exceeds the candidates)
        for own, crossed in cache:
            own.k, own.v = own.k.index_select(0, rows), own.v.index_select(0, rows)
            if grown:  # each source's cross-attention keys and values, once per beam it now runs
                crossed.k, crossed.v = crossed.k.index_select(0, rows), crossed.v.index_select(0, rows)
        if grown:
            memory, mask = memory.index_select(0, rows), None if mask is None else mask.index_select(0, rows)
    return [until(hypotheses[0][1], eos) for hypotheses in finished]


def keep_finished(finished: list[list[tuple[float, list[int]]]], scores: torch.Tensor, candidates: torch.Tensor,
                  ended: torch.Tensor, beams: int) -> None:
    """Add the hypotheses that `ended` (sources, K) at this step, with their `scores` and tokens
    `candidates` (sources, K, step), to each source's `finished` ones, best first, keeping the `beams`
    best. A source that had `beams` already takes none: it is done (early_stopping=True)."""
    if not bool(ended.any()):
        return
    scores_of, tokens_of = scores.tolist(), candidates.tolist()
    full = [len(hypotheses) == beams for hypotheses in finished]
    for source, beam in ended.nonzero().tolist():
        if not full[source]:
            finished[source].append((scores_of[source][beam], tokens_of[source][beam]))
    for source, hypotheses in enumerate(finished):
        hypotheses.sort(key=lambda hypothesis: hypothesis[0], reverse=True)  # stable: earlier ones first on ties
        del hypotheses[beams:]


def until(tokens: list[int], eos: int | None) -> list[int]:
    """`tokens` up to their first `eos`, without it."""
    return tokens[: tokens.index(eos)] if eos in tokens else tokens

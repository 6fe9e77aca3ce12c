"""T5's span corruption (Raffel et al. 2020): an encoder-decoder reads each window with 15% of its tokens
dropped in spans of mean length 3, each span replaced by a sentinel token, and writes the dropped spans,
each after its sentinel (lib/objectives/noising.py: span_corruption, with seqio's roll). Every window of
seq_len tokens becomes a source and a target of fixed lengths (one longer where a span wraps around the
window's end), so packed windows waste almost no padding. The sentinels are tokens of the vocabulary
(<extra_id_0>, ...): the tokenizer stage reserves `tokenizer.sentinels` of them, and a published T5 has 100.
"""
from __future__ import annotations

import torch
from torch import Tensor

from lib.config.errors import UserError
from lib.config.params import Params
from lib.data.tokenizer import load_tokenizer, sentinel_tokens
from lib.models.config import TransformerConfig
from lib.objectives.base import BatchPlan, Batches, register
from lib.objectives.noising import Noised, sentinels_needed, span_corruption
from lib.objectives.seq2seq import Seq2SeqObjective


@register
class SpanCorruption(Seq2SeqObjective):
    name = "t5"
    shape = "t5"

    def __init__(self, params: Params, vocab_size: int, special_ids: dict[str, int],
                 arch: TransformerConfig | None = None):
        super().__init__(params, vocab_size, special_ids, arch)
        self.corruption = params.t5
        self.sentinel_ids: Tensor | None = None  # read from the tokenizer by batches()

    def batches(self, plan: BatchPlan) -> Batches:
        tokenizer = load_tokenizer(plan.tokenizer)
        self.sentinel_ids = torch.tensor([tokenizer.token_to_id(t) for t in sentinel_tokens(tokenizer)],
                                         dtype=torch.long)
        needed = sentinels_needed(plan.seq_len, self.corruption)
        if len(self.sentinel_ids) < needed:
            raise UserError(f"objective: t5 cuts windows of {plan.seq_len} tokens into up to {needed} spans, and the "
                            f"tokenizer in {plan.tokenizer} has {len(self.sentinel_ids)} sentinel tokens (<extra_id_0>, "
                            "...); raise tokenizer.sentinels (and rerun the tokenizer stage) or shorten seq_len")
        return super().batches(plan)

    def noise(self, tokens: Tensor, word_starts: Tensor) -> Noised:
        if self.sentinel_ids is None:
            raise RuntimeError("call batches() first: it reads the sentinel tokens from the tokenizer")
        return span_corruption(tokens, self.sentinel_ids, self.special_ids["eos"], self.special_ids["pad"],
                               self.model.cfg.decoder_start, self.corruption)

"""BART's denoising autoencoder (Lewis et al. 2020): an encoder-decoder reads each window noised by the
composable schemes of the BART paper's table (token masking, token deletion, text infilling, sentence
permutation, document rotation; `bart` in params.yaml, lib/objectives/noising.py: denoise, after
fairseq) and its decoder writes the whole original window. Sentences end at tokens ending in . ! or ?
of the tokenizer's vocabulary, and at the end-of-document token between packed documents.
"""
from __future__ import annotations

from torch import Tensor

from lib.config.params import Params
from lib.data.tokenizer import load_tokenizer
from lib.models.config import TransformerConfig
from lib.objectives.base import BatchPlan, Batches, register
from lib.objectives.noising import Noised, denoise, sentence_end_table
from lib.objectives.seq2seq import Seq2SeqObjective


@register
class Denoising(Seq2SeqObjective):
    name = "bart"
    shape = "bart"

    def __init__(self, params: Params, vocab_size: int, special_ids: dict[str, int],
                 arch: TransformerConfig | None = None):
        super().__init__(params, vocab_size, special_ids, arch)
        self.noising = params.bart
        self.sentence_ends: Tensor | None = None  # read from the tokenizer by batches()

    def batches(self, plan: BatchPlan) -> Batches:
        self.sentence_ends = sentence_end_table(load_tokenizer(plan.tokenizer), self.vocab_size)
        return super().batches(plan)

    def noise(self, tokens: Tensor, word_starts: Tensor) -> Noised:
        if self.sentence_ends is None:
            raise RuntimeError("call batches() first: it reads the sentence ends from the tokenizer")
        return denoise(tokens, word_starts, self.sentence_ends, self.special_ids, self.vocab_size,
                       self.model.cfg.decoder_start, self.noising)

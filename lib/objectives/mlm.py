"""Masked language modelling (BERT, Devlin et al. 2019; dynamic masking as in RoBERTa, Liu et al. 2019).

A bidirectional Transformer reads tokens[:, :-1] corrupted by `masking.mask_tokens` (per token, whole
words or SpanBERT spans, 80/10/10 by default; new masks on every call) and predicts the original ids
at the selected positions only: the hidden states there are gathered first, so the vocabulary
projection runs on ~15% of the positions. Metrics: loss and accuracy over the selected positions.
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from lib.config import Params
from lib.model import Transformer, TransformerConfig
from lib.objectives import Objective, register
from lib.objectives.masking import Masked, mask_tokens


@register
class MaskedLM(Objective):
    name = "mlm"
    causal = False

    def __init__(self, params: Params, vocab_size: int, special_ids: dict[str, int]):
        super().__init__(params, vocab_size, special_ids)
        self.masking = params.mlm
        self.model = Transformer(TransformerConfig.from_params(params.model, vocab_size, causal=self.causal))

    def forward(self, tokens: Tensor, word_starts: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        masked = mask_tokens(tokens[:, :-1], word_starts[:, :-1], self.special_ids, self.vocab_size, self.masking)
        loss, accuracy, _ = masked_lm_loss(self.model, self.model(masked.inputs), masked)
        return loss, {"loss": loss.detach(), "accuracy": accuracy}

    def backbone(self) -> Transformer:
        return self.model


def masked_lm_loss(model: Transformer, hidden: Tensor, masked: Masked) -> tuple[Tensor, Tensor, Tensor]:
    """Cross-entropy of `model`'s LM head at the selected positions only: (loss, detached accuracy,
    logits (N, vocab) of the N selected positions in row-major order). No selected position gives a
    zero loss that still backpropagates, and accuracy 0."""
    logits = model.lm_logits(hidden[masked.selected])
    labels = masked.labels[masked.selected]
    n = max(labels.numel(), 1)
    loss = F.cross_entropy(logits.float(), labels, reduction="sum") / n
    accuracy = (logits.argmax(-1) == labels).sum().float() / n
    return loss, accuracy.detach(), logits

"""Masked language modelling (BERT, Devlin et al. 2019; dynamic masking as in RoBERTa, Liu et al. 2019).

A bidirectional Transformer reads tokens[:, :-1] corrupted by `masking.mask_tokens` (per token, whole
words or SpanBERT spans, 80/10/10 by default; new masks on every call) and predicts the original ids
at the selected positions only: the hidden states there are gathered first, so the vocabulary
projection runs on ~15% of the positions. Metrics: loss and accuracy over the selected positions.

With `mlm.sentence` (sop | nsp) each window is first made a sentence pair (lib/objectives/sentence.py)
and a head on the [CLS] state (BERT's pooler: dense, tanh, then 2 classes) learns the sentence task;
the loss is the masked-LM loss + sentence_weight x the sentence loss. The head is part of the
objective, not of the backbone that later stages finetune.
"""
from __future__ import annotations

import dataclasses

import torch.nn.functional as F
from torch import Tensor, nn

from lib.config.params import Params
from lib.data.knowledge import knowledge_units
from lib.data.windows import TaggedWindows
from lib.models.architectures import Transformer, build_model
from lib.models.blocks import init_weights, matmul_weights
from lib.models.config import TransformerConfig
from lib.objectives.base import BatchPlan, Batches, Objective, register, window_batches
from lib.objectives.masking import IGNORE_INDEX, Masked, mask_tokens
from lib.objectives.sentence import Pairs, sentence_pairs


@register
class MaskedLM(Objective):
    name = "mlm"
    causal = False
    sentence_task = True
    reads = TaggedWindows  # with model.languages (XLM's MLM), each token's language

    def __init__(self, params: Params, vocab_size: int, special_ids: dict[str, int],
                 arch: TransformerConfig | None = None):
        super().__init__(params, vocab_size, special_ids, arch)
        self.masking = params.mlm
        self.units = knowledge_units(params.mlm.knowledge)
        self.model = build_model(self.arch)
        if self.masking.sentence != "none":
            width = self.model.cfg.d_model
            self.sentence_head = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 2))
            self.sentence_head.apply(init_weights)

    def batches(self, plan: BatchPlan) -> Batches:
        """TaggedWindows whose word starts are those of its knowledge units (mlm.knowledge), if any."""
        return window_batches(plan, self.units, self.arch.languages)

    def forward(self, batch: TaggedWindows) -> tuple[Tensor, dict[str, Tensor]]:
        tokens, word_starts = batch.tokens, batch.word_starts
        if self.masking.sentence == "none":
            masked = mask_tokens(tokens[:, :-1], word_starts[:, :-1], self.special_ids, self.vocab_size, self.masking)
            languages = None if batch.language_ids is None else batch.language_ids[:, :-1]
            loss, accuracy, _ = masked_lm_loss(self.model, self.model(masked.inputs, language_ids=languages), masked)
            return loss, {"loss": loss.detach(), "accuracy": accuracy}
        task = self.masking.sentence
        pairs = sentence_pairs(tokens.cpu(), word_starts.cpu(), task, self.special_ids, tokens.shape[1] - 1)
        pairs = Pairs(*(getattr(pairs, f.name).to(tokens.device, non_blocking=True) for f in dataclasses.fields(pairs)))
        masked = mask_tokens(pairs.tokens, pairs.word_starts, self.special_ids, self.vocab_size, self.masking)
        hidden = self.model(masked.inputs, pairs.segments, pairs.attention_mask)
        mlm_loss, accuracy, _ = masked_lm_loss(self.model, hidden, masked)
        logits = self.sentence_head(hidden[:, 0]).float()
        paired = pairs.labels != IGNORE_INDEX
        # a batch with no pair (every window too short to cut) still backpropagates through the head
        sentence_loss = F.cross_entropy(logits[paired], pairs.labels[paired]) if paired.any() else logits.sum() * 0
        sentence_accuracy = (logits[paired].argmax(-1) == pairs.labels[paired]).float().mean() if paired.any() \
            else logits.new_zeros(())
        loss = mlm_loss + self.masking.sentence_weight * sentence_loss
        return loss, {"loss": loss.detach(), "accuracy": accuracy, "mlm_loss": mlm_loss.detach(),
                      f"{task}_loss": sentence_loss.detach(), f"{task}_accuracy": sentence_accuracy.detach()}

    def backbone(self) -> Transformer:
        return self.model

    def flops_per_token(self, seq_len: int) -> float:
        """The vocabulary projection at the masked share of positions; the sentence head once a window."""
        sentence = 6.0 * matmul_weights(self.sentence_head) / seq_len if self.masking.sentence != "none" else 0.0
        return self.model.flops_per_token(seq_len, predicted=self.masking.mask_rate) + sentence


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

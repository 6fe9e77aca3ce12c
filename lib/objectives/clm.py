"""Causal language modelling (GPT; Radford et al. 2018, 2019).

A causal Transformer reads tokens[:, :-1] and predicts tokens[:, 1:] at every position, with
cross-entropy averaged over all of them. Windows cross document boundaries, so the model also learns
to predict the first token of a document after the eos that ends the previous one, as GPT-2 training
on packed text does. Metrics: loss and next-token accuracy (perplexity = exp(loss) is the trainer's).
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from lib.config.params import Params
from lib.data.windows import Windows
from lib.models.architectures import Transformer, build_model
from lib.models.config import TransformerConfig
from lib.objectives.base import Objective, register


@register
class CausalLM(Objective):
    name = "clm"
    causal = True

    def __init__(self, params: Params, vocab_size: int, special_ids: dict[str, int],
                 arch: TransformerConfig | None = None):
        super().__init__(params, vocab_size, special_ids, arch)
        self.model = build_model(self.arch)

    def forward(self, batch: Windows) -> tuple[Tensor, dict[str, Tensor]]:
        loss, accuracy = next_token_loss(self.model, batch.tokens)
        return loss, {"loss": loss.detach(), "accuracy": accuracy}

    def backbone(self) -> Transformer:
        return self.model


def next_token_loss(model: Transformer, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """(cross-entropy, detached accuracy) of `model` reading tokens[:, :-1] and predicting tokens[:, 1:]."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    logits = model.lm_logits(model(inputs))
    loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    return loss, (logits.argmax(-1) == targets).float().mean().detach()

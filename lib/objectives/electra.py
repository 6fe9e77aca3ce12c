"""ELECTRA: replaced-token detection (Clark et al. 2020, "ELECTRA: Pre-training Text Encoders as
Discriminators Rather Than Generators").

- Masking: the same as the mlm objective (`masking.mask_tokens` with params.mlm) on tokens[:, :-1].
- Generator: a narrower Transformer (`cfg.scaled(electra.generator_width)`, the paper's 1/4-1/3 width)
  that shares the discriminator's embeddings (token, position, segment; the paper ties token and
  position embeddings), trained with the MLM loss at the selected positions.
- Corruption: every selected position gets a token sampled from the generator's softmax (gumbel-max on
  detached logits, so no gradient flows through sampling; special ids are never sampled). A sample that
  equals the original counts as original, as in the paper.
- Discriminator: the full-size Transformer with ELECTRA's head (dense d_model -> d_model, the model's
  GELU, dense -> 1; transformers' ElectraForPreTraining, so a published discriminator brings its own)
  predicting, at every position (all tokens are real: windows have no padding), whether the token was
  replaced; BCE loss.
- Loss: gen_mlm + disc_weight * BCE (lambda = 50 in the paper). Only the discriminator is kept:
  `backbone()` returns it.

Unused parameters: the discriminator's own LM head (whatever `Transformer.lm_logits` uses beyond the
shared token embeddings) gets no gradient; its `.grad` stays None, which torch optimizers, weight
decay and `clip_grad_norm_` skip. DistributedDataParallel would need find_unused_parameters=True.
The generator's parameters are updated by its MLM loss only.
Metrics: loss, gen_loss, disc_loss, gen_accuracy (generator MLM accuracy at selected positions),
disc_accuracy (over all positions), replaced_recall (share of replaced positions flagged, p > 0.5)
and disc_auc (the chance that a replaced position scores above an original one). With ~10% of the
tokens replaced, a discriminator that ranks them well may still put few above p = 0.5: recall 0 and
a loss near the prior's do not by themselves say it learned nothing; an AUC near 0.5 does.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lib.config.params import Params
from lib.data.knowledge import knowledge_units
from lib.data.windows import Windows
from lib.models.architectures import Transformer, build_model
from lib.models.blocks import matmul_weights
from lib.models.config import ACTIVATIONS, TransformerConfig
from lib.models.hf import ImportedModel
from lib.objectives.base import BatchPlan, Batches, Objective, register, window_batches
from lib.objectives.masking import mask_tokens, special_mask
from lib.objectives.mlm import masked_lm_loss


@register
class Electra(Objective):
    name = "electra"
    causal = False

    def __init__(self, params: Params, vocab_size: int, special_ids: dict[str, int],
                 arch: TransformerConfig | None = None):
        super().__init__(params, vocab_size, special_ids, arch)
        self.masking = params.mlm
        self.units = knowledge_units(params.mlm.knowledge)
        self.disc_weight = params.electra.disc_weight
        cfg = self.arch
        self.discriminator = build_model(cfg)
        self.generator = build_model(cfg.scaled(params.electra.generator_width), embeddings=self.discriminator.embeddings)
        self.disc_head = DiscriminatorHead(cfg)
        never_sampled = special_mask(torch.arange(vocab_size), special_ids.values())
        self.register_buffer("never_sampled", never_sampled, persistent=False)

    def batches(self, plan: BatchPlan) -> Batches:
        """Windows whose word starts are those of its knowledge units (mlm.knowledge), if any."""
        return window_batches(plan, self.units)

    def forward(self, batch: Windows) -> tuple[Tensor, dict[str, Tensor]]:
        gen_loss, disc_loss, metrics = self.losses(batch)
        loss = gen_loss + self.disc_weight * disc_loss
        return loss, {"loss": loss.detach(), **metrics}

    def losses(self, batch: Windows) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """(generator MLM loss, discriminator BCE loss, detached metrics without "loss")."""
        original = batch.tokens[:, :-1]
        masked = mask_tokens(original, batch.word_starts[:, :-1], self.special_ids, self.vocab_size, self.masking)
        gen_loss, gen_accuracy, gen_logits = masked_lm_loss(self.generator, self.generator(masked.inputs), masked)

        with torch.no_grad():
            sampled = sample(gen_logits.detach().float().masked_fill(self.never_sampled, float("-inf")))
            corrupted = original.masked_scatter(masked.selected, sampled)
            replaced = corrupted != original

        disc_logits = self.disc_head(self.discriminator(corrupted))
        disc_loss = F.binary_cross_entropy_with_logits(disc_logits.float(), replaced.float())

        flagged = disc_logits.detach() > 0
        metrics = {
            "gen_loss": gen_loss.detach(),
            "disc_loss": disc_loss.detach(),
            "gen_accuracy": gen_accuracy,
            "disc_accuracy": (flagged == replaced).float().mean(),
            "replaced_recall": (flagged & replaced).sum().float() / replaced.sum().clamp(min=1),
            "disc_auc": roc_auc(disc_logits.detach().float(), replaced),
        }
        return gen_loss, disc_loss, metrics

    def backbone(self) -> Transformer:
        return self.discriminator

    def flops_per_token(self, seq_len: int) -> float:
        """The generator with its LM head at the masked share of positions, the discriminator without
        its LM head, and the replaced-token head at every position."""
        generator = self.generator.flops_per_token(seq_len, predicted=self.masking.mask_rate)
        discriminator = self.discriminator.flops_per_token(seq_len, predicted=0.0)
        return generator + discriminator + 6.0 * matmul_weights(self.disc_head)

    def start_from(self, imported: ImportedModel) -> None:
        """A published discriminator also brings its replaced-token head; none brings a generator."""
        super().start_from(imported)
        head = imported.discriminator_head()
        if head:
            self.disc_head.load_state_dict(head)
        fresh = "the generator starts" if head else "the generator and the replaced-token head start"
        print(f"electra: {fresh} fresh (the published model has {'no generator' if head else 'neither'})", flush=True)


class DiscriminatorHead(nn.Module):
    """Per position, the logit that the token was replaced."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.dense_prediction = nn.Linear(cfg.d_model, 1)
        self.approximate = ACTIVATIONS[cfg.activation]

    def forward(self, hidden: Tensor) -> Tensor:
        return self.dense_prediction(F.gelu(self.dense(hidden), approximate=self.approximate)).squeeze(-1)


def roc_auc(scores: Tensor, positive: Tensor) -> Tensor:
    """Area under the ROC curve of `scores` for telling the `positive` entries from the others: the
    Mann-Whitney U over the two groups' ranks (ties broken arbitrarily: scores are float logits).
    0.5 when either group is empty. No host sync, so it can be logged every step."""
    scores, positive = scores.flatten(), positive.flatten()
    ranks = torch.empty_like(scores)
    ranks[scores.argsort()] = torch.arange(1, len(scores) + 1, dtype=scores.dtype, device=scores.device)
    n_pos = positive.sum().to(scores.dtype)
    n_neg = len(scores) - n_pos
    u = ranks[positive].sum() - n_pos * (n_pos + 1) / 2
    return torch.where(n_pos * n_neg > 0, u / (n_pos * n_neg).clamp(min=1), torch.full_like(u, 0.5))


def sample(logits: Tensor) -> Tensor:
    """One id per row of `logits` (N, vocab), drawn from softmax(logits) by gumbel-max."""
    u = torch.rand_like(logits).clamp_(min=torch.finfo(logits.dtype).tiny)
    return (logits - torch.log(-torch.log(u))).argmax(-1)

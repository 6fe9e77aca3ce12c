"""XLM's translation language modelling (Lample & Conneau 2019): objective `tlm`.

One bidirectional model with language embeddings (model.languages) trains two masked-LM losses at
every step:
- MLM on the token windows, as `mlm` does: the pretraining stream holds the text of every language
  (the general corpus and each side of corpora.parallel), every token with its language embedding;
- TLM on translation pairs (lib/data/pairs.py): [a ; b] concatenated, positions restarting at b,
  each side with its language, masked alike on both sides, so a word masked in one language can be
  read from its translation in the other.
XLM alternates MLM and TLM batches; here both run in each step (tlm.pair_batch pairs beside the
windows) and their mean losses are added. The control that isolates TLM is `mlm` on the same stream
with the same languages (the sides then read as unpaired monolingual text) at the same FLOPs.
Metrics: `accuracy` and `mlm_loss` of the windows (as `mlm` reports them), `tlm_accuracy`, `tlm_loss`.
"""
from __future__ import annotations

from torch import Tensor

from lib.config.params import Params
from lib.models.transformer import TransformerConfig
from lib.objectives.base import register
from lib.objectives.masking import mask_tokens
from lib.objectives.mlm import MaskedLM, masked_lm_loss


@register
class TranslationLM(MaskedLM):
    """`mlm` on the windows (with their languages), plus translation LM on the pairs after them."""

    name = "tlm"
    sentence_task = False
    reads_pairs = True

    def __init__(self, params: Params, vocab_size: int, special_ids: dict[str, int],
                 arch: TransformerConfig | None = None):
        super().__init__(params, vocab_size, special_ids, arch)
        self.pair_tokens: float | None = None  # see read_pairs
        self.pairs_per_token: float | None = None

    def read_pairs(self, pair_tokens: float, pairs_per_token: float) -> None:
        """What the pair batches cost, for flops_per_token: the tokens of the average pair row, and
        the pairs each window token brings along (pairs per micro-batch / its window tokens)."""
        self.pair_tokens, self.pairs_per_token = pair_tokens, pairs_per_token

    def forward(self, tokens: Tensor, word_starts: Tensor, language_ids: Tensor, pair_tokens: Tensor,
                pair_starts: Tensor, pair_languages: Tensor, pair_positions: Tensor,
                pair_mask: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """The windows (B, T+1) with their languages, then a batch of pairs (lib/data/pairs.py)."""
        mlm_loss, metrics = super().forward(tokens, word_starts, language_ids)
        masked = mask_tokens(pair_tokens, pair_starts, self.special_ids, self.vocab_size, self.masking)
        hidden = self.model(masked.inputs, attention_mask=pair_mask, language_ids=pair_languages,
                            position_ids=pair_positions)
        tlm_loss, tlm_accuracy, _ = masked_lm_loss(self.model, hidden, masked)
        loss = mlm_loss + tlm_loss
        return loss, {"loss": loss.detach(), "accuracy": metrics["accuracy"], "mlm_loss": mlm_loss.detach(),
                      "tlm_loss": tlm_loss.detach(), "tlm_accuracy": tlm_accuracy}

    def flops_per_token(self, seq_len: int) -> float:
        """Per window token: its masked LM, plus the pair tokens it brings along, each at the cost of
        a masked LM over rows of the average pair's length."""
        if self.pair_tokens is None:
            raise RuntimeError("read_pairs() first: the cost of tlm depends on its pairs' lengths")
        per_pair_token = super().flops_per_token(round(self.pair_tokens))
        return super().flops_per_token(seq_len) + self.pairs_per_token * self.pair_tokens * per_pair_token

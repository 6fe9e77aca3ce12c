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

from dataclasses import dataclass, field

from torch import Tensor

from lib.config.params import Params
from lib.data.packed import PackedTokens
from lib.data.pairs import PairBatches, TranslationPairs
from lib.data.windows import BatchStream, TaggedWindows
from lib.models.config import TransformerConfig
from lib.objectives.base import BatchPlan, Batches, register
from lib.objectives.masking import mask_tokens
from lib.objectives.mlm import MaskedLM, masked_lm_loss


@dataclass
class WindowsAndPairs(TaggedWindows):
    """A micro-batch of tlm: the token windows with their languages, and translation pairs beside them."""

    pairs: TranslationPairs = field(kw_only=True)

    @classmethod
    def of(cls, windows: TaggedWindows, pairs: TranslationPairs) -> WindowsAndPairs:
        return cls(windows.tokens, windows.word_starts, windows.language_ids, pairs=pairs)


class WindowAndPairBatches:
    """The training batches of tlm: a step's windows and its pairs."""

    def __init__(self, windows: BatchStream, pairs: PairBatches):
        self.windows, self.pairs = windows, pairs

    def batch(self, step: int, micro: int = 0) -> WindowsAndPairs:
        return WindowsAndPairs.of(self.windows.batch(step, micro), self.pairs.batch(step, micro))


@register
class TranslationLM(MaskedLM):
    """`mlm` on the windows (with their languages), plus translation LM on the pairs beside them."""

    name = "tlm"
    sentence_task = False
    reads = WindowsAndPairs

    def __init__(self, params: Params, vocab_size: int, special_ids: dict[str, int],
                 arch: TransformerConfig | None = None):
        super().__init__(params, vocab_size, special_ids, arch)
        self.pair_batch = params.tlm.pair_batch
        self.pair_tokens: float | None = None  # see read_pairs
        self.pairs_per_token: float | None = None

    def batches(self, plan: BatchPlan) -> Batches:
        """mlm's windows, each micro-batch with tlm.pair_batch pairs of rows up to seq_len from the
        packed pairs beside the token stream (plan.parallel); learns what the pairs cost."""
        windows = super().batches(plan)
        splits = [PackedTokens(plan.parallel / "train"), PackedTokens(plan.parallel / "valid")]
        train, valid = (
            PairBatches(packed, self.arch.languages, self.pair_batch, plan.seq_len, plan.seed, self.special_ids["pad"],
                        name=str(packed.prefix), rows=plan.share(self.pair_batch, "tlm.pair_batch"))
            for packed in splits)
        self.read_pairs(train.mean_tokens(), self.pair_batch / (plan.batch_size * plan.seq_len))
        return Batches(WindowAndPairBatches(windows.train, train),
                       [WindowsAndPairs.of(w, p) for w, p in zip(windows.valid, valid.fixed(len(windows.valid)))],
                       windows.splits + splits)

    def read_pairs(self, pair_tokens: float, pairs_per_token: float) -> None:
        """What the pair batches cost, for flops_per_token: the tokens of the average pair row, and
        the pairs each window token brings along (pairs per micro-batch / its window tokens)."""
        self.pair_tokens, self.pairs_per_token = pair_tokens, pairs_per_token

    def forward(self, batch: WindowsAndPairs) -> tuple[Tensor, dict[str, Tensor]]:
        mlm_loss, metrics = super().forward(batch)
        pairs = batch.pairs
        masked = mask_tokens(pairs.tokens, pairs.word_starts, self.special_ids, self.vocab_size, self.masking)
        hidden = self.model(masked.inputs, attention_mask=pairs.attention_mask, language_ids=pairs.language_ids,
                            position_ids=pairs.position_ids)
        tlm_loss, tlm_accuracy, _ = masked_lm_loss(self.model, hidden, masked)
        loss = mlm_loss + tlm_loss
        return loss, {"loss": loss.detach(), "accuracy": metrics["accuracy"], "mlm_loss": mlm_loss.detach(),
                      "tlm_loss": tlm_loss.detach(), "tlm_accuracy": tlm_accuracy}

    def flops_per_token(self, seq_len: int) -> float:
        """Per window token: its masked LM, plus the pair tokens it brings along, each at the cost of
        a masked LM over rows of the average pair's length."""
        if self.pair_tokens is None:
            raise RuntimeError("batches() first: the cost of tlm depends on its pairs' lengths")
        per_pair_token = super().flops_per_token(round(self.pair_tokens))
        return super().flops_per_token(seq_len) + self.pairs_per_token * self.pair_tokens * per_pair_token

"""What the encoder-decoder objectives (t5.py, bart.py) share: the model they train, the loss of a
`Noised` batch (lib/objectives/noising.py), and FLOPs counted on the lengths their corruption makes.

Each reads windows of seq_len tokens of packed text, corrupts them on the CPU (its `noise`), lets the
encoder read the corrupted text and the decoder predict its targets, teacher-forced: cross-entropy
averaged over the target tokens. The model is params.yaml's model sizes in T5's or BART's shape
(`encoder_decoder.shape`: auto is the objective's own), or a published T5 or BART (init).
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from lib.config.params import Params
from lib.data.windows import Windows
from lib.models.architectures import EncoderDecoder, build_model
from lib.models.architectures.encoder_decoder import seq2seq_config
from lib.models.config import TransformerConfig
from lib.objectives.base import BatchPlan, Batches, Objective, window_batches
from lib.objectives.masking import IGNORE_INDEX
from lib.objectives.noising import Noised


class Seq2SeqObjective(Objective):
    """Base class: an objective that corrupts a window and has the decoder write its targets."""

    causal = False
    encoder_decoder = True
    shape: ClassVar[str]  # the model shape it builds by default: t5 or bart

    def __init__(self, params: Params, vocab_size: int, special_ids: dict[str, int],
                 arch: TransformerConfig | None = None):
        super().__init__(params, vocab_size, special_ids, arch)
        self.model: EncoderDecoder = build_model(self.arch)
        self.lengths: tuple[float, float] | None = None  # mean (source, target) lengths: measured by batches()

    @classmethod
    def model_config(cls, params: Params, vocab_size: int, special_ids: dict[str, int]) -> TransformerConfig:
        shape = cls.shape if params.encoder_decoder.shape == "auto" else params.encoder_decoder.shape
        return seq2seq_config(params.model, shape, params.encoder_decoder.decoder_layers, vocab_size, special_ids)

    def noise(self, tokens: Tensor, word_starts: Tensor) -> Noised:
        """Windows (B, L) on the CPU -> what the encoder reads and the decoder predicts."""
        raise NotImplementedError

    def batches(self, plan: BatchPlan) -> Batches:
        """Windows of seq_len + 1 tokens (the last is not read); the corruption's mean source and target
        lengths, padded as they are run, measured on the validation windows under a fixed seed."""
        batches = window_batches(plan)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(plan.seed)
            noised = [self.noised(batch) for batch in batches.valid]
        self.lengths = (sum(n.inputs.shape[1] for n in noised) / len(noised),
                        sum(n.targets.shape[1] for n in noised) / len(noised))
        return batches

    @torch.compiler.disable  # Python over CPU rows, a data loader's work: a compiled step runs it as it is
    def noised(self, batch: Windows) -> Noised:
        tokens, word_starts = batch.tokens[:, :-1], batch.word_starts[:, :-1]
        noised = self.noise(tokens.cpu(), word_starts.cpu())
        return Noised(*(getattr(noised, f.name).to(tokens.device, non_blocking=True)
                        for f in dataclasses.fields(noised)))

    def forward(self, batch: Windows) -> tuple[Tensor, dict[str, Tensor]]:
        noised = self.noised(batch)
        # the targets' padding is at the end, where the decoder's causal attention keeps it unread
        hidden = self.model(noised.inputs, noised.decoder_inputs, attention_mask=noised.input_mask)
        predicted = noised.targets != IGNORE_INDEX
        logits = self.model.lm_logits(hidden[predicted])
        labels = noised.targets[predicted]
        loss = F.cross_entropy(logits.float(), labels)
        accuracy = (logits.argmax(-1) == labels).float().mean()
        return loss, {"loss": loss.detach(), "accuracy": accuracy.detach()}

    def backbone(self) -> EncoderDecoder:
        return self.model

    def flops_per_token(self, seq_len: int) -> float:
        """Per window token: the encoder on the corrupted source, the decoder and its LM head on the
        targets, at the padded lengths batches() measured (the encoder-decoder's own count)."""
        if self.lengths is None:
            raise RuntimeError("call batches() first: the FLOPs depend on the lengths the corruption makes")
        return self.model.flops_per_sequence(*self.lengths) / seq_len

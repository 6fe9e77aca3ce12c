"""The encoder-decoder (T5, Raffel et al. 2020; BART, Lewis et al. 2020): an encoder stack reads the
corrupted text bidirectionally, a decoder stack writes the target left to right, each of its blocks
reading the encoder's output through a cross-attention sub-layer. One token table serves both stacks
and, tied, the LM head on the decoder.

Its config (Seq2SeqConfig) is the model's plus the decoder's depth, the token the decoder starts from
and `architecture`, which names it in config.json. Two shapes, both from params.yaml's model sizes
(`encoder_decoder.shape`), are the ones transformers computes exactly (lib/models/families/):
- t5: RMS norms without bias before each sub-layer, no linear biases, ReLU feed-forward, T5's relative
  position bias (bidirectional in the encoder, one-sided in the decoder), attention scores not scaled,
  the hidden state x d_model^-0.5 before the tied LM head; the decoder starts from the pad token.
- bart: post-LN, learned positions from row 2 (fairseq's offset), an embedding LayerNorm in each stack,
  GELU, biases; the decoder starts from the end-of-sequence token.
Both are initialised as the other architectures are (N(0, 0.02)), but T5's token table is N(0, 1) as in
T5, whose output rescaling assumes it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn as nn

from lib.config.params import ModelConfig
from lib.models.architectures.decoder import Decoder
from lib.models.architectures.encoder import Encoder
from lib.models.architectures.stack import each_once
from lib.models.blocks import Embeddings, matmul_weights
from lib.models.config import TransformerConfig

SHAPES = ("t5", "bart")
BART_POSITION_OFFSET = 2  # fairseq numbers real tokens' positions from padding_idx + 1 = 2


@dataclass(kw_only=True)
class Seq2SeqConfig(TransformerConfig):
    """An encoder-decoder's config: the encoder's fields (causal is False), plus the decoder's own."""

    architecture: str = "encoder_decoder"
    decoder_layers: int
    decoder_start: int  # the token id the decoder reads first (T5: pad; BART: eos)

    def __post_init__(self):
        super().__post_init__()
        if self.causal:
            raise ValueError("an encoder-decoder's config describes its encoder: causal must be false")
        if self.decoder_layers < 1:
            raise ValueError(f"decoder_layers {self.decoder_layers} must be >= 1")

    def stack(self, causal: bool) -> TransformerConfig:
        """The config of the encoder (causal false) or the decoder stack."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(TransformerConfig)}
        return TransformerConfig(**{**fields, "causal": causal,
                                    "n_layers": self.decoder_layers if causal else self.n_layers})


def seq2seq_config(model: ModelConfig, shape: str, decoder_layers: int | None, vocab_size: int,
                   special_ids: dict[str, int]) -> Seq2SeqConfig:
    """params.yaml's model sizes in T5's or BART's shape (see the module docstring)."""
    sizes = {f.name: getattr(model, f.name) for f in dataclasses.fields(ModelConfig)}
    sizes.update(segment_vocab=0, languages=[], embedding_size=None, share_layers=False, lm_head="linear",
                 decoder_layers=decoder_layers or model.n_layers, vocab_size=vocab_size)
    if shape == "t5":
        return Seq2SeqConfig(**{**sizes, "position": "t5", "norm": "pre", "rms_norm": True, "bias": False,
                                "activation": "relu", "scale_attention": False, "embedding_norm": False,
                                "rescale_output": model.tie_embeddings, "norm_eps": 1e-6,
                                "decoder_start": special_ids["pad"]})
    if shape == "bart":
        return Seq2SeqConfig(**{**sizes, "position": "learned", "norm": "post", "activation": "gelu",
                                "position_offset": BART_POSITION_OFFSET,
                                "max_positions": model.max_positions + BART_POSITION_OFFSET,
                                "decoder_start": special_ids["eos"]})
    raise ValueError(f"encoder-decoder shape {shape!r}: expected one of {', '.join(SHAPES)}")


class EncoderDecoder(nn.Module):
    """(input_ids (B, S), decoder_input_ids (B, T)) -> the decoder's hidden states (B, T, d_model);
    lm_logits turns them into next-token logits; lib/models/generation.py decodes with it. The encoder alone
    (`encoder`, an Encoder) is what the task heads read when the model is finetuned (text_encoder)."""

    name: ClassVar[str] = "encoder_decoder"
    causal: ClassVar[bool] = False

    def __init__(self, cfg: Seq2SeqConfig, embeddings: Embeddings | None = None):
        super().__init__()
        if embeddings is not None:
            raise ValueError("an encoder-decoder shares its token table between its own stacks only")
        self.cfg = cfg
        self.encoder = Encoder(cfg.stack(causal=False))
        self.decoder = Decoder(cfg.stack(causal=True), cross=True)
        self.decoder.embeddings.token = self.encoder.embeddings.token  # one table (BART keeps positions per stack)
        if cfg.tie_embeddings:
            self.decoder.head.decoder.weight = self.encoder.embeddings.token.weight
        self.encoder.head = self.decoder.head  # one LM head; the encoder alone has it too, for its folder
        if cfg.rescale_output:  # T5's N(0, 1) table, which its d_model^-0.5 output scaling assumes
            nn.init.normal_(self.encoder.embeddings.token.weight, std=1.0)

    def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None, decoder_attention_mask: torch.Tensor | None = None,
                output_hidden_states: bool = False):
        """attention_mask (B, S), decoder_attention_mask (B, T): True at real tokens. With
        output_hidden_states, (hidden, the encoder's hidden states + the decoder's)."""
        memory = self.encoder(input_ids, attention_mask=attention_mask, output_hidden_states=output_hidden_states)
        memory, states = memory if output_hidden_states else (memory, [])
        out = self.decoder(decoder_input_ids, attention_mask=decoder_attention_mask, memory=memory,
                           memory_mask=memory_mask(attention_mask), output_hidden_states=output_hidden_states)
        return (out[0], states + out[1]) if output_hidden_states else out

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder.lm_logits(hidden)

    def text_encoder(self) -> Encoder:
        """The stack a task head reads: the encoder."""
        return self.encoder

    def layer_groups(self) -> list[list[nn.Parameter]]:
        """Bottom to top: [the token table and each stack's embedding parts], the encoder's blocks, the
        decoder's blocks, [the final norms + LM head]. Each parameter appears once."""
        encoder, decoder = self.encoder.layer_groups(), self.decoder.layer_groups()
        return each_once([encoder[0] + decoder[0], *encoder[1:-1], *decoder[1:-1], encoder[-1] + decoder[-1]])

    def num_params(self, exclude_embeddings: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= sum(p.numel() for p in {id(p): p for stack in (self.encoder, self.decoder)
                                          for p in stack.embeddings.parameters()}.values())
        return n

    def flops_per_sequence(self, source_len: float, target_len: float, predicted: float = 1.0) -> float:
        """Training FLOPs of one example of `source_len` encoder and `target_len` decoder tokens (PaLM's
        count, as Transformer.flops_per_token: 6 x the matmul weights each token passes through, 12 x
        n_layers x d x the keys each query reads for attention): the encoder's blocks on the source; the
        decoder's on the target, but its cross-attention's key and value projections on the source; the
        LM head on `predicted` of the target."""
        cfg, enc, dec = self.cfg, self.encoder, self.decoder
        cross_kv = 2 * cfg.d_model * cfg.attention_width  # the key and value rows of its qkv
        padding = (cfg.padded_vocab - cfg.vocab_size) * cfg.embedding_dim
        encoder = source_len * cfg.n_layers * matmul_weights(enc.blocks[0])
        decoder = target_len * cfg.decoder_layers * (matmul_weights(dec.blocks[0]) - cross_kv)
        decoder += source_len * cfg.decoder_layers * cross_kv
        head = target_len * predicted * (matmul_weights(dec.head) - padding)
        attention = 12.0 * cfg.d_model * (cfg.n_layers * source_len ** 2
                                          + cfg.decoder_layers * (target_len ** 2 + target_len * source_len))
        return 6.0 * (encoder + decoder + head) + attention

    def flops_per_token(self, seq_len: int, predicted: float = 1.0) -> float:
        """Per token of an autoencoder's example: seq_len tokens in, the same seq_len out."""
        return self.flops_per_sequence(seq_len, seq_len, predicted) / seq_len


def memory_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The cross-attention's SDPA attn_mask (B, 1, 1, S) from the source's (B, S): its padding masked."""
    return None if attention_mask is None else attention_mask.bool()[:, None, None, :]

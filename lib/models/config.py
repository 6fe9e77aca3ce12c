"""The model's config: params.yaml's model section plus what the tokenizer, the objective and a published model decide.

Every architecture (lib/models/architectures/) is built from one, and the blocks it is made of
(lib/models/blocks.py) read their sizes and options from it. A model folder stores it as config.json
(lib/models/folder.py), so anything can rebuild the model.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from lib.config.params import ModelConfig, ParamsError

POSITIONS = ("learned", "sinusoidal", "rope", "alibi", "t5")
TABLELESS_POSITIONS = ("alibi", "t5")  # biases by distance: no table bounds the length a model reads
ACTIVATIONS = {"gelu": "none", "gelu_tanh": "tanh"}  # name -> F.gelu's `approximate` (GPT-2's "gelu_new" is tanh)
FEED_FORWARD_ACTIVATIONS = (*ACTIVATIONS, "relu")  # T5's feed-forward is ReLU; heads use the GELUs only
LM_HEADS = ("mlp", "linear")  # BERT's dense-GELU-LayerNorm-decoder, or GPT-2's decoder alone (no bias)
MIN_HEAD_SIZE = 16  # scaled(): narrower heads carry too little per head to attend usefully
# The embedding table and LM decoder get rows up to a multiple of this: a vocabulary like GPT-2's
# 50257 makes the largest matmul of the model misaligned for tensor cores (nanoGPT's 50304 trick).
# The extra rows are never looked up and their logits are sliced off, so the model is unchanged.
VOCAB_MULTIPLE = 64


@dataclass(kw_only=True)
class TransformerConfig(ModelConfig):
    """The model's params (ModelConfig, with its checks) plus what the tokenizer and objective decide."""

    vocab_size: int
    causal: bool = False  # causal attention (the decoder architecture) or bidirectional (the encoder)
    activation: str = "gelu"  # of the feed-forward layers and the LM head: gelu (exact) | gelu_tanh
    norm_eps: float = 1e-5  # every LayerNorm's epsilon (BERT's published models use 1e-12)
    embedding_norm: bool = True  # LayerNorm after the embeddings (BERT); GPT-2 has none
    position_offset: int = 0  # learned positions start at this row (RoBERTa: padding_idx + 1 = 2)
    pooler: bool = False  # BERT's pooler (dense + tanh on the [CLS] state), kept when a published model has one
    # T5's and BART's settings (lib/models/architectures/encoder_decoder.py names both shapes); the defaults
    # are every other model's
    rms_norm: bool = False  # T5's norm: RMS, a weight and no bias, no mean subtracted (else LayerNorm)
    bias: bool = True  # biases in attention and feed-forward layers (T5 has none)
    gated_mlp: bool = False  # T5 v1.1's feed-forward: act(fc1 x) * (up x), then fc2
    scale_attention: bool = True  # scores / sqrt(head size); T5 does not scale (its init scales the queries)
    head_dim: int | None = None  # each head's width where it is not d_model / n_heads (T5's d_kv)
    embedding_scale: bool = False  # token embeddings x sqrt(d_model) (BART's scale_embedding)
    rescale_output: bool = False  # the hidden state x d_model^-0.5 before the tied LM head (T5)
    relative_buckets: int = 32  # position "t5": buckets of query-key distance, each a learned bias per head
    relative_max_distance: int = 128  # ... log-spaced up to this distance, beyond which one bucket holds all

    def __post_init__(self):
        # params.yaml is checked with key names when it is loaded; this catches configs built in code
        if self.position not in POSITIONS:
            raise ValueError(f"position {self.position!r}: expected one of {', '.join(POSITIONS)}")
        if self.norm not in ("pre", "post"):
            raise ValueError(f"norm {self.norm!r}: expected pre or post")
        if self.activation not in FEED_FORWARD_ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r}: expected one of {', '.join(FEED_FORWARD_ACTIVATIONS)}")
        if self.lm_head not in LM_HEADS:
            raise ValueError(f"lm_head {self.lm_head!r}: expected one of {', '.join(LM_HEADS)}")
        if not 0 <= self.position_offset < self.max_positions:
            raise ValueError(f"position_offset {self.position_offset} must be in [0, max_positions)")
        try:
            self.validate("model")
        except ParamsError as err:
            raise ValueError(str(err)) from None

    def heads_fit(self) -> bool:
        return self.head_dim is not None or super().heads_fit()  # T5's d_kv sets the width itself

    @classmethod
    def from_params(cls, model: ModelConfig, vocab_size: int, causal: bool) -> TransformerConfig:
        return cls(vocab_size=vocab_size, causal=causal, **dataclasses.asdict(model))

    def scaled(self, width: float) -> TransformerConfig:
        """A narrower model (ELECTRA's generator) over the same embeddings: d_model and d_ff times
        `width`; fewer heads where needed to keep heads >= 16 wide, and d_model rounded to a multiple
        of the head count (an even head size for rope)."""
        n_heads = max(1, min(self.n_heads, round(self.d_model * width) // MIN_HEAD_SIZE))
        step = n_heads * (2 if self.position == "rope" else 1)
        d_model = max(step, round(self.d_model * width / step) * step)
        return dataclasses.replace(self, d_model=d_model, n_heads=n_heads, d_ff=max(1, round(self.d_ff * width)),
                                   embedding_size=self.embedding_dim)

    @property
    def embedding_dim(self) -> int:
        return self.embedding_size or self.d_model

    @property
    def padded_vocab(self) -> int:
        return -(-self.vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE

    @property
    def head_size(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def attention_width(self) -> int:
        """The width of all heads together: d_model, or n_heads x head_dim where T5 sets its own."""
        return self.n_heads * self.head_size

    @property
    def max_length(self) -> int:
        """The longest sequence the position table covers (ALiBi and T5's bias have none and extrapolate)."""
        return self.max_positions - self.position_offset

    def layer_norm(self, dim: int) -> nn.Module:
        """Every norm of the model: a LayerNorm, or T5's RMS norm (rms_norm)."""
        return nn.RMSNorm(dim, eps=self.norm_eps) if self.rms_norm else nn.LayerNorm(dim, eps=self.norm_eps)

    def act(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x) if self.activation == "relu" else F.gelu(x, approximate=ACTIVATIONS[self.activation])

"""The building blocks every architecture (lib/models/architectures/) is assembled from, nanoGPT-style:
embeddings, attention, the MLP, the block, the LM head, BERT's pooler, and the position helpers.

Positions are learned, sinusoidal (added to the embeddings), RoPE (rotating q and k), ALiBi (a
per-head distance bias on the attention scores) or T5's bias (a learned bias per head and bucket of
distance, RelativeBias). Attention is torch's scaled_dot_product_attention, so fused kernels are used
where they apply. It attends over its own input or, given a `context`, from its input's queries to
another sequence's keys and values: XLNet's query stream reads the content stream so
(lib/objectives/plm.py), and an encoder-decoder's cross-attention reads the encoder's output so. A
decoder generating token by token keeps each attention's keys and values in a KeyValues.
The names of the modules here are the state_dict's, which model folders and model families
(lib/models/families/) name: renaming one changes every saved model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from lib.models.config import TransformerConfig

ROPE_BASE = 10000.0


def init_weights(module: nn.Module) -> None:
    """BERT/GPT-2 init: N(0, 0.02) weights, zero biases (LayerNorm keeps its default 1 and 0)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def matmul_weights(module: nn.Module) -> int:
    """The weights of `module`'s Linear layers: multiply-adds per token through it."""
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, nn.Linear))


def sinusoids(length: int, dim: int) -> torch.Tensor:
    """Vaswani et al.'s fixed table: sin on even channels, cos on odd ones, wavelengths up to 10000*2pi."""
    angles = torch.arange(length)[:, None] * torch.exp(torch.arange(0, dim, 2) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : dim // 2])
    return table


def rope_cache(length: int, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (length, head_size) of RoPE's angles, laid out for the rotate-half convention."""
    inv_freq = ROPE_BASE ** (-torch.arange(0, head_size, 2) / head_size)
    angles = torch.arange(length)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x_i, x_{i+d/2}) of x (..., T, d) by its position's angle, so that q.k depends
    on positions only through their difference (Su et al.)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Press et al.'s geometric slopes 2^(-8i/n); for n not a power of 2, the 2^k closest below plus
    every other slope of 2^(k+1), as in their reference code."""
    closest = 2 ** math.floor(math.log2(n_heads))
    slopes = [2 ** (-8 * (i + 1) / closest) for i in range(closest)]
    slopes += [2 ** (-8 * (i + 1) / (2 * closest)) for i in range(0, 2 * (n_heads - closest), 2)]
    return torch.tensor(slopes)


def relative_buckets(distance: torch.Tensor, bidirectional: bool, n_buckets: int, max_distance: int) -> torch.Tensor:
    """T5's bucket of each key-minus-query `distance`: half the buckets exact (small distances), the rest
    log-spaced up to max_distance, the last holding all beyond; bidirectional splits the buckets between
    keys after the query and keys before it, one-sided (a decoder's) keeps only those before."""
    bucket = torch.zeros_like(distance)
    if bidirectional:
        n_buckets //= 2
        bucket = bucket + (distance > 0).long() * n_buckets
        distance = distance.abs()
    else:
        distance = (-distance).clamp(min=0)
    exact = n_buckets // 2
    spread = exact + (torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact)
                      * (n_buckets - exact)).long()
    return bucket + torch.where(distance < exact, distance, spread.clamp(max=n_buckets - 1))


class RelativeBias(nn.Module):
    """T5's relative position bias: a learned scalar per head and bucket of query-key distance, added to
    the attention scores of every block of a stack (the stack owns it; T5 keeps it in its first block)."""

    def __init__(self, cfg: TransformerConfig, bidirectional: bool):
        super().__init__()
        self.bidirectional, self.n_buckets, self.max_distance = bidirectional, cfg.relative_buckets, cfg.relative_max_distance
        self.bias = nn.Embedding(cfg.relative_buckets, cfg.n_heads)

    def forward(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """Positions (1 or B, T) of the queries and (1 or B, S) of the keys -> the bias (1 or B, H, T, S)."""
        buckets = relative_buckets(keys[:, None, :] - queries[:, :, None], self.bidirectional, self.n_buckets,
                                   self.max_distance)
        return self.bias(buckets).permute(0, 3, 1, 2)


@dataclass
class KeyValues:
    """One attention layer's keys and values (B, H, S, head_size) kept while a decoder generates: its
    self-attention's grow by each step's tokens, its cross-attention's are the encoder output's, computed once."""

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]


class Embeddings(nn.Module):
    """token (+ learned/sinusoidal positions) (+ segment) -> LayerNorm (unless embedding_norm is off)
    -> dropout, all of width E."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        dim = cfg.embedding_dim
        self.token = nn.Embedding(cfg.padded_vocab, dim)
        if cfg.position == "learned":
            self.position = nn.Embedding(cfg.max_positions, dim)
        elif cfg.position == "sinusoidal":  # fixed: a buffer, not a parameter, and not saved
            self.register_buffer("sinusoids", sinusoids(cfg.max_positions, dim), persistent=False)
        self.segment = nn.Embedding(cfg.segment_vocab, dim) if cfg.segment_vocab else None
        self.language = nn.Embedding(len(cfg.languages), dim) if cfg.languages else None
        self.norm = cfg.layer_norm(dim) if cfg.embedding_norm else nn.Identity()
        self.dropout = nn.Dropout(cfg.dropout)
        self.apply(init_weights)

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor | None = None,
                language_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """position_ids (B, T): each token's position, where they do not simply count from 0 (XLM's
        translation pairs restart at the second sentence); language_ids (B, T): rows of cfg.languages."""
        x = self.token(input_ids)
        if self.cfg.embedding_scale:
            x = x * math.sqrt(self.cfg.d_model)
        T = input_ids.shape[1]
        if self.cfg.position == "learned":
            offset = self.cfg.position_offset
            x = x + self.position(torch.arange(offset, offset + T, device=input_ids.device)
                                  if position_ids is None else position_ids + offset)
        elif self.cfg.position == "sinusoidal":
            x = x + (self.sinusoids[:T] if position_ids is None else self.sinusoids[position_ids])
        if self.segment is not None:  # no segment ids = all segment 0, as in BERT
            x = x + (self.segment.weight[0] if segment_ids is None else self.segment(segment_ids))
        elif segment_ids is not None:
            raise ValueError("segment_ids given but model.segment_vocab is 0 (no segment embeddings)")
        if self.language is not None:  # no language ids = the first language
            x = x + (self.language.weight[0] if language_ids is None else self.language(language_ids))
        elif language_ids is not None:
            raise ValueError("language_ids given but the model has no languages (model.languages is empty)")
        return self.finish(x)

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """What every embedded input goes through before the blocks: LayerNorm, then dropout."""
        return self.dropout(self.norm(x))


class Attention(nn.Module):
    """Multi-head attention: over x itself, or from x's queries to a `context`'s keys and values.
    `causal`: each position attends only to itself and those before it (a decoder's self-attention)."""

    def __init__(self, cfg: TransformerConfig, causal: bool):
        super().__init__()
        self.n_heads, self.causal, self.dropout = cfg.n_heads, causal, cfg.dropout
        self.scale = None if cfg.scale_attention else 1.0  # None: SDPA's 1/sqrt(head size)
        width = cfg.attention_width
        self.qkv = nn.Linear(cfg.d_model, 3 * width, bias=cfg.bias)
        self.proj = nn.Linear(width, cfg.d_model, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, rope: tuple | None,
                context: torch.Tensor | None = None, context_rope: tuple | None = None,
                cache: KeyValues | None = None) -> torch.Tensor:
        """Self-attention over x (B, T, C); with `context` (B, S, C), x's queries attend context's keys and
        values instead (qkv's query rows read x, its key and value rows the context), rotated by
        `context_rope` under rope. `mask`: SDPA's attn_mask, broadcastable to (B, H, T, keys). `cache`: a
        generating decoder's keys and values, which self-attention extends by x's and cross-attention
        computes from the context once, then reuses."""
        B, T, _ = x.shape
        width = self.proj.in_features
        heads = (self.n_heads, width // self.n_heads)
        if context is None:
            q, k, v = self.qkv(x).view(B, T, 3, *heads).permute(2, 0, 3, 1, 4).unbind(0)
            context_rope = rope
        else:
            weight, bias = self.qkv.weight, self.qkv.bias
            q = F.linear(x, weight[:width], None if bias is None else bias[:width]).view(B, T, *heads).transpose(1, 2)
            if cache is not None and cache.k is not None:
                k, v = cache.k, cache.v
            else:
                S = context.shape[1]
                k, v = F.linear(context, weight[width:], None if bias is None else bias[width:]) \
                    .view(B, S, 2, *heads).permute(2, 0, 3, 1, 4).unbind(0)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *context_rope)
        if cache is not None:
            if context is None and cache.k is not None:  # the keys so far, then this step's
                k, v = torch.cat([cache.k, k], dim=2), torch.cat([cache.v, v], dim=2)
            cache.k, cache.v = k, v
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=self.causal and mask is None and context is None and k.shape[2] == T,
                                           scale=self.scale)
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(B, T, width)))


class MLP(nn.Module):
    """fc2(act(fc1 x)), or T5 v1.1's gated form fc2(act(fc1 x) * up x) (gated_mlp)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias) if cfg.gated_mlp else None
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.cfg.act(self.fc1(x))
        if self.up is not None:
            hidden = hidden * self.up(x)
        return self.dropout(self.fc2(hidden))


class Block(nn.Module):
    """Attention then the MLP, each a residual branch. Pre-LN (GPT-2): x + f(ln(x)), stable without
    warmup tricks. Post-LN (BERT): ln(x + f(x)). With `cross` (an encoder-decoder's decoder), a
    cross-attention sub-layer between them, with its own norm, reads the encoder's output."""

    def __init__(self, cfg: TransformerConfig, causal: bool, cross: bool = False):
        super().__init__()
        self.pre_norm = cfg.norm == "pre"
        self.ln1 = cfg.layer_norm(cfg.d_model)
        self.attn = Attention(cfg, causal)
        if cross:
            self.ln_cross = cfg.layer_norm(cfg.d_model)
            self.cross = Attention(cfg, causal=False)
        self.ln2 = cfg.layer_norm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, rope: tuple | None,
                context: torch.Tensor | None = None, context_rope: tuple | None = None,
                memory: torch.Tensor | None = None, memory_mask: torch.Tensor | None = None,
                cache: tuple[KeyValues, KeyValues] | None = None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C). With `context`, the attention reads its keys and values through this
        block's own weights and LayerNorm: XLNet's query stream reading the content stream. `memory`
        (B, S, C): the encoder's output the cross-attention reads (masked by `memory_mask`, SDPA's
        attn_mask); `cache`: a generating decoder's (self-attention's, cross-attention's) keys and values."""
        own, crossed = cache if cache is not None else (None, None)
        if self.pre_norm:
            context = self.ln1(context) if context is not None else None
            x = x + self.attn(self.ln1(x), mask, rope, context, context_rope, own)
            if memory is not None:
                x = x + self.cross(self.ln_cross(x), memory_mask, None, memory, cache=crossed)
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.attn(x, mask, rope, context, context_rope, own))
        if memory is not None:
            x = self.ln_cross(x + self.cross(x, memory_mask, None, memory, cache=crossed))
        return self.ln2(x + self.mlp(x))


class LMHead(nn.Module):
    """BERT's prediction head (lm_head "mlp"): dense d_model->E, GELU, LayerNorm, then the decoder
    E->vocab (+ bias); or GPT-2's (lm_head "linear"): the decoder alone, no bias (T5's: after scaling
    the hidden state by d_model^-0.5, rescale_output)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        if cfg.lm_head == "mlp":
            self.dense = nn.Linear(cfg.d_model, cfg.embedding_dim)
            self.norm = cfg.layer_norm(cfg.embedding_dim)
        self.decoder = nn.Linear(cfg.embedding_dim, cfg.padded_vocab, bias=cfg.lm_head == "mlp")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cfg.lm_head == "mlp":
            x = self.norm(self.cfg.act(self.dense(x)))
        if self.cfg.rescale_output:
            x = x * self.cfg.d_model ** -0.5
        return self.decoder(x)


class Pooler(nn.Module):
    """BERT's pooler: dense + tanh on the first ([CLS]) state, what its sentence-level heads read."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))

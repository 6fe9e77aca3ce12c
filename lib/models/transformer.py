"""The transformer encoder/decoder shared by every objective (CLM, MLM, ELECTRA) and every stage.

One stack covers GPT-2 (causal, pre-LN), BERT (bidirectional, post-LN, segments) and ALBERT
(factorised embeddings, one shared block). The fields beyond params.yaml's model section (activation,
LayerNorm eps, an embedding LayerNorm or none, RoBERTa's position offset, BERT's pooler) let a published
BERT, RoBERTa, DistilBERT, ELECTRA or GPT-2 checkpoint load exactly (lib/models/hf.py). Positions are learned, sinusoidal (added to the
embeddings), RoPE (rotating q and k) or ALiBi (a per-head distance bias on the attention scores).
Attention is torch's scaled_dot_product_attention, so fused kernels are used where they apply.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from lib.config.params import ModelConfig, ParamsError

POSITIONS = ("learned", "sinusoidal", "rope", "alibi")
ACTIVATIONS = {"gelu": "none", "gelu_tanh": "tanh"}  # name -> F.gelu's `approximate` (GPT-2's "gelu_new" is tanh)
LM_HEADS = ("mlp", "linear")  # BERT's dense-GELU-LayerNorm-decoder, or GPT-2's decoder alone (no bias)
MIN_HEAD_SIZE = 16  # scaled(): narrower heads carry too little per head to attend usefully
ROPE_BASE = 10000.0
# The embedding table and LM decoder get rows up to a multiple of this: a vocabulary like GPT-2's
# 50257 makes the largest matmul of the model misaligned for tensor cores (nanoGPT's 50304 trick).
# The extra rows are never looked up and their logits are sliced off, so the model is unchanged.
VOCAB_MULTIPLE = 64


@dataclass(kw_only=True)
class TransformerConfig(ModelConfig):
    """The model's params (ModelConfig, with its checks) plus what the tokenizer and objective decide."""

    vocab_size: int
    causal: bool = False  # causal (CLM) or bidirectional attention
    activation: str = "gelu"  # of the feed-forward layers and the LM head: gelu (exact) | gelu_tanh
    norm_eps: float = 1e-5  # every LayerNorm's epsilon (BERT's checkpoints use 1e-12)
    embedding_norm: bool = True  # LayerNorm after the embeddings (BERT); GPT-2 has none
    position_offset: int = 0  # learned positions start at this row (RoBERTa: padding_idx + 1 = 2)
    pooler: bool = False  # BERT's pooler (dense + tanh on the [CLS] state), kept when a checkpoint has one

    def __post_init__(self):
        # params.yaml is checked with key names when it is loaded; this catches configs built in code
        if self.position not in POSITIONS:
            raise ValueError(f"position {self.position!r}: expected one of {', '.join(POSITIONS)}")
        if self.norm not in ("pre", "post"):
            raise ValueError(f"norm {self.norm!r}: expected pre or post")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r}: expected one of {', '.join(ACTIVATIONS)}")
        if self.lm_head not in LM_HEADS:
            raise ValueError(f"lm_head {self.lm_head!r}: expected one of {', '.join(LM_HEADS)}")
        if not 0 <= self.position_offset < self.max_positions:
            raise ValueError(f"position_offset {self.position_offset} must be in [0, max_positions)")
        try:
            self.validate("model")
        except ParamsError as err:
            raise ValueError(str(err)) from None

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
        return self.d_model // self.n_heads

    @property
    def max_length(self) -> int:
        """The longest sequence the position table covers (ALiBi has none and extrapolates)."""
        return self.max_positions - self.position_offset

    def layer_norm(self, dim: int) -> nn.LayerNorm:
        return nn.LayerNorm(dim, eps=self.norm_eps)

    def act(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate=ACTIVATIONS[self.activation])


def init_weights(module: nn.Module) -> None:
    """BERT/GPT-2 init: N(0, 0.02) weights, zero biases (LayerNorm keeps its default 1 and 0)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


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


class SelfAttention(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.n_heads, self.causal, self.dropout = cfg.n_heads, cfg.causal, cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, rope: tuple | None,
                context: torch.Tensor | None = None, context_rope: tuple | None = None) -> torch.Tensor:
        """Self-attention over x; with `context` (B, S, C), x's queries attend context's keys and values
        instead (XLNet's query stream reads the content stream so), rotated by `context_rope` under rope."""
        B, T, C = x.shape
        if context is None:
            q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, C // self.n_heads).permute(2, 0, 3, 1, 4).unbind(0)
            context_rope = rope
        else:
            weight, bias = self.qkv.weight, self.qkv.bias
            q = F.linear(x, weight[:C], bias[:C]).view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
            S = context.shape[1]
            k, v = F.linear(context, weight[C:], bias[C:]).view(B, S, 2, self.n_heads, C // self.n_heads) \
                .permute(2, 0, 3, 1, 4).unbind(0)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *context_rope)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=self.causal and mask is None and context is None)
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(B, T, C)))


class MLP(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc2(self.cfg.act(self.fc1(x))))


class Block(nn.Module):
    """Pre-LN (GPT-2): x + f(ln(x)), stable without warmup tricks. Post-LN (BERT): ln(x + f(x))."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.pre_norm = cfg.norm == "pre"
        self.ln1 = cfg.layer_norm(cfg.d_model)
        self.attn = SelfAttention(cfg)
        self.ln2 = cfg.layer_norm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, rope: tuple | None,
                context: torch.Tensor | None = None, context_rope: tuple | None = None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C); with `context`, attention reads its keys and values (SelfAttention)."""
        if self.pre_norm:
            context = self.ln1(context) if context is not None else None
            x = x + self.attn(self.ln1(x), mask, rope, context, context_rope)
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.attn(x, mask, rope, context, context_rope))
        return self.ln2(x + self.mlp(x))


class LMHead(nn.Module):
    """BERT's prediction head (lm_head "mlp"): dense d_model->E, GELU, LayerNorm, then the decoder
    E->vocab (+ bias); or GPT-2's (lm_head "linear"): the decoder alone, no bias."""

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
        return self.decoder(x)


class Pooler(nn.Module):
    """BERT's pooler: dense + tanh on the first ([CLS]) state, what its sentence-level heads read."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


class Transformer(nn.Module):
    def __init__(self, cfg: TransformerConfig, embeddings: Embeddings | None = None):
        super().__init__()
        self.cfg = cfg
        if embeddings is not None and (embeddings.token.num_embeddings, embeddings.token.embedding_dim) != (
                cfg.padded_vocab, cfg.embedding_dim):
            raise ValueError(f"shared embeddings are {tuple(embeddings.token.weight.shape)}, the config needs "
                             f"({cfg.padded_vocab}, {cfg.embedding_dim})")
        self.embeddings = embeddings if embeddings is not None else Embeddings(cfg)
        self.project = nn.Linear(cfg.embedding_dim, cfg.d_model) if cfg.embedding_dim != cfg.d_model else nn.Identity()
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(1 if cfg.share_layers else cfg.n_layers))
        self.norm = cfg.layer_norm(cfg.d_model) if cfg.norm == "pre" else nn.Identity()  # post-LN ends normed
        self.head = LMHead(cfg)
        self.pooler = Pooler(cfg) if cfg.pooler else None
        if cfg.position == "rope":
            cos, sin = rope_cache(cfg.max_positions, cfg.head_size)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        elif cfg.position == "alibi":
            self.register_buffer("alibi_slopes", alibi_slopes(cfg.n_heads), persistent=False)

        # Initialise what this model owns; shared embeddings keep their (possibly trained) weights.
        for module in (self.project, self.blocks, self.head, self.pooler):
            if module is not None:
                module.apply(init_weights)
        for block in self.blocks:  # GPT-2: each residual branch adds variance; 2 branches per layer
            for proj in (block.attn.proj, block.mlp.fc2):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * cfg.n_layers))
        if cfg.tie_embeddings:  # after init, so tying never re-initialises shared embeddings
            self.head.decoder.weight = self.embeddings.token.weight

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, output_hidden_states: bool = False,
                language_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None):
        """input_ids (B, T) -> hidden (B, T, d_model). attention_mask (B, T): True at real tokens.
        language_ids and position_ids (B, T): see Embeddings. With output_hidden_states, also the
        embedding output and each layer's output (before the final norm of pre-LN), n_layers + 1 tensors."""
        T = input_ids.shape[1]
        longest = T if position_ids is None else int(position_ids.max()) + 1
        if longest > self.cfg.max_length and self.cfg.position != "alibi":  # ALiBi extrapolates; the rest have tables
            raise ValueError(f"sequence length {longest} > the {self.cfg.max_length} positions of the model "
                             f"for {self.cfg.position} positions; shorten the sequences or raise model.max_positions")
        x = self.project(self.embeddings(input_ids, segment_ids, language_ids, position_ids))
        mask = self.attention_bias(attention_mask, T, position_ids)
        rope = self.rope(T, position_ids)
        hidden_states = [x]
        for i in range(self.cfg.n_layers):
            x = self.blocks[i % len(self.blocks)](x, mask, rope)  # one block n_layers times when shared
            hidden_states.append(x)
        x = self.norm(x)
        return (x, hidden_states) if output_hidden_states else x

    def rope(self, T: int, position_ids: torch.Tensor | None = None) -> tuple | None:
        """RoPE's (cos, sin) for positions 0..T-1, (T, head_size) each, or for position_ids (B, 1, T,
        head_size); None without rope."""
        if self.cfg.position != "rope":
            return None
        if position_ids is None:
            return self.rope_cos[:T], self.rope_sin[:T]
        return self.rope_cos[position_ids][:, None], self.rope_sin[position_ids][:, None]

    def attention_bias(self, attention_mask: torch.Tensor | None, T: int,
                       position_ids: torch.Tensor | None = None) -> torch.Tensor | None:
        """One SDPA attn_mask broadcastable to (B, H, T, T): bool (True = may attend) for causal and
        padding, float with -inf where masked when ALiBi adds its bias (by the distance of
        position_ids where given). None when SDPA's own is_causal (or no mask at all) is enough, which
        lets it pick its fused kernels."""
        alibi = self.cfg.position == "alibi"
        if attention_mask is None and not alibi:
            return None
        device = self.embeddings.token.weight.device
        pos = torch.arange(T, device=device)
        if self.cfg.causal:
            allowed = (pos[:, None] >= pos[None, :])[None, None]
        else:
            allowed = torch.ones(1, 1, T, T, dtype=torch.bool, device=device)
        if attention_mask is not None:
            # padding keys are masked out; every query still sees itself, so padding queries never
            # have an all-masked row (NaN) and real tokens, which always see themselves, are unaffected
            keys = attention_mask.bool()[:, None, None, :]
            allowed = allowed & (keys | torch.eye(T, dtype=torch.bool, device=device))
        if not alibi:
            return allowed
        # symmetric |i - j| for bidirectional models; for causal ones the future is masked anyway
        at = pos[None] if position_ids is None else position_ids  # (1 or B, T)
        distance = (at[:, None, :] - at[:, :, None]).abs()[:, None]  # (1 or B, 1, T, T)
        bias = -self.alibi_slopes[None, :, None, None] * distance
        return bias.masked_fill(~allowed, float("-inf"))

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., d_model) -> (..., vocab): MLM gathers the masked positions first and pays only for those."""
        logits = self.head(hidden)
        return logits[..., : self.cfg.vocab_size] if self.cfg.padded_vocab != self.cfg.vocab_size else logits

    def layer_groups(self) -> list[list[nn.Parameter]]:
        """Bottom to top: [embeddings + projection], one group per block, [final norm + LM head].
        Each parameter appears once (the tied decoder weight sits with the embeddings)."""
        groups = [[*self.embeddings.parameters(), *self.project.parameters()]]
        groups += [list(block.parameters()) for block in self.blocks]
        groups.append([*self.norm.parameters(), *self.head.parameters(),
                       *(self.pooler.parameters() if self.pooler is not None else ())])
        seen: set[int] = set()
        unique = []
        for group in groups:
            unique.append([p for p in group if id(p) not in seen])
            seen.update(id(p) for p in group)
        return unique

    def num_params(self, exclude_embeddings: bool = False) -> int:
        """Parameters counted once (parameters() skips tied and shared tensors). exclude_embeddings
        drops the Embeddings module (token, position, segment, its LayerNorm), as Kaplan et al. do."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= sum(p.numel() for p in self.embeddings.parameters())
        return n

    def flops_per_token(self, seq_len: int, predicted: float = 1.0) -> float:
        """Training FLOPs per token (forward + backward = 3 x 2 per multiply-add), PaLM appendix B:
        6 x the matmul weights a token passes through (a shared block counts n_layers times; the LM
        head's decoder counts though it may be tied, since FLOPs are about compute) + 12 x n_layers x
        d_model x seq_len for attention scores and values. `predicted`: the share of positions the LM
        head runs on (MLM gathers the masked ones first; ELECTRA's discriminator runs it on none).
        The attention term is not halved for causal models: PaLM's formula, itself for causal models,
        does not, so MFU stays comparable."""
        cfg = self.cfg
        padding = (cfg.padded_vocab - cfg.vocab_size) * cfg.embedding_dim  # computed, but not the model's work
        body = cfg.n_layers * matmul_weights(self.blocks[0]) + matmul_weights(self.project)
        head = matmul_weights(self.head) - padding
        return 6.0 * (body + predicted * head) + 12.0 * cfg.n_layers * cfg.d_model * seq_len


def matmul_weights(module: nn.Module) -> int:
    """The weights of `module`'s Linear layers: multiply-adds per token through it."""
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, nn.Linear))

"""The stack today's encoder and decoder share: embeddings, a stack of blocks, a final norm, the LM head.

One stack covers GPT-2 (causal, pre-LN), BERT (bidirectional, post-LN, segments) and ALBERT (factorised
embeddings, one shared block). The config's fields beyond params.yaml's model section (activation,
LayerNorm eps, an embedding LayerNorm or none, RoBERTa's position offset, BERT's pooler) let a published
BERT, RoBERTa, DistilBERT, ELECTRA, GPT-2, ESM or XLM model load exactly (lib/models/hf.py). The
architectures subclass it (encoder.py, decoder.py) and differ in their attention's mask alone.
"""
from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn as nn

from lib.models.blocks import (Block, Embeddings, KeyValues, LMHead, Pooler, RelativeBias, alibi_slopes, init_weights,
                               matmul_weights, rope_cache)
from lib.models.config import TABLELESS_POSITIONS
from lib.models.config import TransformerConfig


class Transformer(nn.Module):
    """input_ids (B, T) -> hidden states (B, T, d_model); lm_logits turns them into next-token (decoder) or
    masked-token (encoder) logits. Built through lib.models.architectures.build_model, which picks the
    subclass the config names."""

    name: ClassVar[str]  # the architecture's (lib/models/architectures/)
    causal: ClassVar[bool]  # each position attends only to itself and those before it

    def __init__(self, cfg: TransformerConfig, embeddings: Embeddings | None = None, cross: bool = False):
        """`embeddings`: another model's, shared (ELECTRA's generator and discriminator, ELMo's two stacks).
        `cross`: each block reads an encoder's output too (an encoder-decoder's decoder)."""
        super().__init__()
        if cfg.causal != self.causal:
            raise ValueError(f"the {self.name} architecture has causal={self.causal}, the config causal={cfg.causal} "
                             "(build_model picks the architecture the config names)")
        self.cfg = cfg
        if embeddings is not None and (embeddings.token.num_embeddings, embeddings.token.embedding_dim) != (
                cfg.padded_vocab, cfg.embedding_dim):
            raise ValueError(f"shared embeddings are {tuple(embeddings.token.weight.shape)}, the config needs "
                             f"({cfg.padded_vocab}, {cfg.embedding_dim})")
        self.embeddings = embeddings if embeddings is not None else Embeddings(cfg)
        self.project = nn.Linear(cfg.embedding_dim, cfg.d_model) if cfg.embedding_dim != cfg.d_model else nn.Identity()
        self.blocks = nn.ModuleList(Block(cfg, self.causal, cross)
                                    for _ in range(1 if cfg.share_layers else cfg.n_layers))
        self.norm = cfg.layer_norm(cfg.d_model) if cfg.norm == "pre" else nn.Identity()  # post-LN ends normed
        self.head = LMHead(cfg)
        self.pooler = Pooler(cfg) if cfg.pooler else None
        if cfg.position == "rope":
            cos, sin = rope_cache(cfg.max_positions, cfg.head_size)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        elif cfg.position == "alibi":
            self.register_buffer("alibi_slopes", alibi_slopes(cfg.n_heads), persistent=False)
        self.relative_bias = RelativeBias(cfg, bidirectional=not self.causal) if cfg.position == "t5" else None

        # Initialise what this model owns; shared embeddings keep their (possibly trained) weights.
        for module in (self.project, self.blocks, self.head, self.pooler, self.relative_bias):
            if module is not None:
                module.apply(init_weights)
        branches = 3 if cross else 2
        for block in self.blocks:  # GPT-2: each residual branch adds variance; 2 branches per layer (3 with cross)
            for proj in (block.attn.proj, block.mlp.fc2, *((block.cross.proj,) if cross else ())):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(branches * cfg.n_layers))
        if cfg.tie_embeddings:  # after init, so tying never re-initialises shared embeddings
            self.head.decoder.weight = self.embeddings.token.weight

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, output_hidden_states: bool = False,
                language_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                memory: torch.Tensor | None = None, memory_mask: torch.Tensor | None = None,
                cache: list[tuple[KeyValues, KeyValues]] | None = None):
        """input_ids (B, T) -> hidden (B, T, d_model). attention_mask (B, T): True at real tokens.
        language_ids and position_ids (B, T): see Embeddings. With output_hidden_states, also the
        embedding output and each layer's output (before the final norm of pre-LN), n_layers + 1 tensors.
        An encoder-decoder's decoder also reads `memory` (B, S, d_model), the encoder's output, through
        its blocks' cross-attention, masked by `memory_mask` (SDPA's attn_mask: True at real tokens);
        generating, `cache` (new_cache()) holds the keys and values of the tokens before input_ids."""
        T = input_ids.shape[1]
        past = cache[0][0].length if cache is not None else 0
        if past:
            if position_ids is not None or attention_mask is not None:
                raise ValueError("a cached decoder step takes neither position_ids nor an attention_mask")
            position_ids = torch.arange(past, past + T, device=input_ids.device)[None]
        longest = T if position_ids is None else int(position_ids.max()) + 1
        if longest > self.cfg.max_length and self.cfg.position not in TABLELESS_POSITIONS:
            raise ValueError(f"sequence length {longest} > the {self.cfg.max_length} positions of the model "
                             f"for {self.cfg.position} positions; shorten the sequences or raise model.max_positions")
        x = self.project(self.embeddings(input_ids, segment_ids, language_ids, position_ids))
        mask = self.attention_bias(attention_mask, T, position_ids, past)
        rope = self.rope(T, position_ids)
        hidden_states = [x]
        for i in range(self.cfg.n_layers):  # one block n_layers times when shared
            x = self.blocks[i % len(self.blocks)](x, mask, rope, memory=memory, memory_mask=memory_mask,
                                                  cache=cache[i] if cache is not None else None)
            hidden_states.append(x)
        x = self.norm(x)
        return (x, hidden_states) if output_hidden_states else x

    def new_cache(self) -> list[tuple[KeyValues, KeyValues]]:
        """Empty keys and values for each layer's self- and cross-attention, for decoding token by token."""
        return [(KeyValues(), KeyValues()) for _ in range(self.cfg.n_layers)]

    def rope(self, T: int, position_ids: torch.Tensor | None = None) -> tuple | None:
        """RoPE's (cos, sin) for positions 0..T-1, (T, head_size) each, or for position_ids (B, 1, T,
        head_size); None without rope."""
        if self.cfg.position != "rope":
            return None
        if position_ids is None:
            return self.rope_cos[:T], self.rope_sin[:T]
        return self.rope_cos[position_ids][:, None], self.rope_sin[position_ids][:, None]

    def attention_bias(self, attention_mask: torch.Tensor | None, T: int,
                       position_ids: torch.Tensor | None = None, past: int = 0) -> torch.Tensor | None:
        """One SDPA attn_mask broadcastable to (B, H, T, past + T) for T queries after `past` cached
        tokens: bool (True = may attend) for causal and padding, float with -inf where masked when ALiBi
        or T5's bias adds to the scores (by the distance of position_ids where given). None when SDPA's
        own is_causal (or no mask at all) is enough, which lets it pick its fused kernels."""
        biased = self.cfg.position in TABLELESS_POSITIONS
        if attention_mask is None and not biased and (past == 0 or T == 1 or not self.causal):
            return None
        device = self.embeddings.token.weight.device
        keys_at, queries_at = torch.arange(past + T, device=device), torch.arange(past, past + T, device=device)
        if self.causal:
            allowed = (queries_at[:, None] >= keys_at[None, :])[None, None]
        else:
            allowed = torch.ones(1, 1, T, past + T, dtype=torch.bool, device=device)
        if attention_mask is not None:
            # padding keys are masked out; every query still sees itself, so padding queries never
            # have an all-masked row (NaN) and real tokens, which always see themselves, are unaffected
            keys = attention_mask.bool()[:, None, None, :]
            allowed = allowed & (keys | torch.eye(T, dtype=torch.bool, device=device))
        if not biased:
            return allowed
        if position_ids is not None and not past:  # the positions given, for queries and keys alike
            keys_at = queries_at = position_ids  # (1 or B, T)
        else:
            keys_at, queries_at = keys_at[None], queries_at[None]
        if self.relative_bias is not None:
            bias = self.relative_bias(queries_at, keys_at)
        else:  # ALiBi: symmetric |i - j| for bidirectional models; for causal ones the future is masked anyway
            distance = (keys_at[:, None, :] - queries_at[:, :, None]).abs()[:, None]  # (1 or B, 1, T, S)
            bias = -self.alibi_slopes[None, :, None, None] * distance
        return bias.masked_fill(~allowed, float("-inf"))

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., d_model) -> (..., vocab): MLM gathers the masked positions first and pays only for those."""
        logits = self.head(hidden)
        return logits[..., : self.cfg.vocab_size] if self.cfg.padded_vocab != self.cfg.vocab_size else logits

    def layer_groups(self) -> list[list[nn.Parameter]]:
        """Bottom to top: [embeddings + projection (+ T5's position bias)], one group per block, [final norm
        + LM head]. Each parameter appears once (the tied decoder weight sits with the embeddings)."""
        groups = [[*self.embeddings.parameters(), *self.project.parameters(),
                   *(self.relative_bias.parameters() if self.relative_bias is not None else ())]]
        groups += [list(block.parameters()) for block in self.blocks]
        groups.append([*self.norm.parameters(), *self.head.parameters(),
                       *(self.pooler.parameters() if self.pooler is not None else ())])
        return each_once(groups)

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


def each_once(groups: list[list[nn.Parameter]]) -> list[list[nn.Parameter]]:
    """`groups` with every parameter kept in the first group, and the first place, it appears (a tied or
    shared tensor is one parameter, trained at one LR)."""
    seen: set[int] = set()
    unique = []
    for group in groups:
        unique.append([])
        for p in group:
            if id(p) not in seen:
                unique[-1].append(p)
                seen.add(id(p))
    return unique

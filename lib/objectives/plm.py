"""Permutation language modelling (XLNet, Yang et al. 2019).

Each window gets its own random factorisation order z, a permutation of its T positions, and the model
predicts tokens autoregressively in that order: x_{z_t} from x_{z_<t}. Over all orders every token is
predicted from context on both sides, as in MLM, yet no [MASK] token is ever read, as in CLM.

Two-stream self-attention makes this one pass. Every layer runs two streams with the same weights:
- the content stream h, a Transformer over the tokens in which position i attends to the positions
  at or before it in the order (itself included): h_i encodes x_i and its context;
- the query stream g, which starts from one learned vector at every position and whose position i
  attends to the content states strictly before i in the order: it knows where it is (through the
  positions of its queries and keys) and what came before, never its own token, which it predicts.
Partial prediction: only the last 1/K of each order (`plm.partial_k`) is predicted, where the context is
long enough to learn from; the query stream runs on those positions alone, so it costs 1/K of a stack.

Positions must be relative (rope or alibi): a query then knows its own position through how it attends,
which the query stream needs since its input carries no position. XLNet uses Transformer-XL's relative
encodings; RoPE and ALiBi serve the same purpose here and also serve the backbone that later stages
finetune. That backbone is the content stream with nothing masked: an ordinary bidirectional Transformer,
so finetuning, distillation and the HF export see a model like MLM's (its BERT-shaped export, not
transformers' XLNet, whose relative attention and biases are another computation).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lib.config.errors import UserError
from lib.config.params import Params
from lib.data.windows import Windows
from lib.models.architectures import Transformer, build_model
from lib.models.blocks import matmul_weights
from lib.models.config import TransformerConfig
from lib.objectives.base import Objective, register

RELATIVE_POSITIONS = ("rope", "alibi")


def factorisation_order(batch: int, length: int, device: torch.device | str = "cpu") -> Tensor:
    """(B, T) long: a uniform random permutation of the positions per row, first to last in the order."""
    return torch.rand(batch, length, device=device).argsort(1)


def two_stream_masks(order: Tensor, n_predict: int) -> tuple[Tensor, Tensor, Tensor]:
    """For orders (B, T): the content stream's (B, T, T) and the query stream's (B, P, T) attention
    masks (True = may attend), and the P = n_predict target positions (B, P), the last of each order.
    Content: i attends j when j is at or before i in the order. Query: target t attends j when j is
    strictly before t, so never t itself."""
    T = order.shape[1]
    rank = order.argsort(1)  # rank[b, i]: where position i comes in row b's order
    content = rank[:, None, :] <= rank[:, :, None]
    targets = order[:, T - n_predict:]
    query = rank[:, None, :] < rank.gather(1, targets)[:, :, None]
    return content, query, targets


@register
class PermutationLM(Objective):
    name = "plm"
    causal = False

    def __init__(self, params: Params, vocab_size: int, special_ids: dict[str, int],
                 arch: TransformerConfig | None = None):
        super().__init__(params, vocab_size, special_ids, arch)
        if self.arch.position not in RELATIVE_POSITIONS:
            raise UserError(f"model.position: objective plm needs relative positions ({' or '.join(RELATIVE_POSITIONS)}), "
                            f"not {self.arch.position}: its query stream has no input that says where it is")
        self.partial_k = params.plm.partial_k
        self.model = build_model(self.arch)
        # the query stream's input at every position: XLNet's trainable mask embedding w, a row of the
        # token embeddings' width that takes their path into the blocks (see query_inputs)
        self.query_start = nn.Parameter(torch.randn(self.arch.embedding_dim) * 0.02)

    def forward(self, batch: Windows) -> tuple[Tensor, dict[str, Tensor]]:
        inputs = batch.tokens[:, :-1]
        order = factorisation_order(*inputs.shape, device=inputs.device)
        logits, targets = self.predict(inputs, order)
        labels = inputs.gather(1, targets)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        accuracy = (logits.argmax(-1) == labels).float().mean()
        return loss, {"loss": loss.detach(), "accuracy": accuracy.detach()}

    def n_predict(self, length: int) -> int:
        return max(1, length // self.partial_k)

    def predict(self, inputs: Tensor, order: Tensor) -> tuple[Tensor, Tensor]:
        """Logits (B, P, vocab) of the query stream at the targets (B, P) of the given orders."""
        model = self.model
        B, T = inputs.shape
        content_allowed, query_allowed, targets = two_stream_masks(order, self.n_predict(T))
        content_mask = self.attention_mask(content_allowed, torch.arange(T, device=inputs.device).expand(B, T))
        query_mask = self.attention_mask(query_allowed, targets)
        rope, query_rope = model.rope(T), model.rope(T, targets)  # query_rope (B, 1, P, d): at the targets
        h = model.project(model.embeddings(inputs))
        g = self.query_inputs(B, targets.shape[1])
        for i in range(model.cfg.n_layers):
            block = model.blocks[i % len(model.blocks)]
            h, g = block(h, content_mask, rope), block(g, query_mask, query_rope, context=h, context_rope=rope)
        return model.lm_logits(model.norm(g)), targets

    def query_inputs(self, batch: int, n_predict: int) -> Tensor:
        """(batch, n_predict, d_model): w through the embeddings' LayerNorm, dropout and projection, as
        every token is, so that the two streams, which share every block, start at one scale (without
        the LayerNorm, w's 0.02 init would start the query stream 50 times below the normed tokens)."""
        start = self.query_start.expand(batch, n_predict, -1)
        return self.model.project(self.model.embeddings.finish(start))

    def attention_mask(self, allowed: Tensor, query_positions: Tensor) -> Tensor:
        """SDPA's attn_mask (B, 1 or H, Q, T) from `allowed` (B, Q, T): as it is, or under ALiBi its
        distance bias with -inf where not allowed."""
        if self.model.cfg.position != "alibi":
            return allowed[:, None]
        keys = torch.arange(allowed.shape[-1], device=allowed.device)
        distance = (query_positions[:, :, None] - keys).abs()  # (B, Q, T)
        bias = -self.model.alibi_slopes[None, :, None, None] * distance[:, None]
        return bias.masked_fill(~allowed[:, None], float("-inf"))

    def backbone(self) -> Transformer:
        return self.model

    def flops_per_token(self, seq_len: int) -> float:
        """The content stream at every position; at the predicted 1/K, the query stream (each block
        but the keys and values, which it reads from the content stream) and the LM head."""
        cfg = self.model.cfg
        share = self.n_predict(seq_len) / seq_len
        query_block = matmul_weights(self.model.blocks[0]) - 2 * cfg.d_model * cfg.d_model
        query = 6.0 * cfg.n_layers * query_block + 12.0 * cfg.n_layers * cfg.d_model * seq_len
        return self.model.flops_per_token(seq_len, predicted=share) + share * query

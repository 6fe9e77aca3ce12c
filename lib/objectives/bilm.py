"""Bidirectional language modelling (ELMo; Peters et al. 2018, "Deep contextualized word representations").

A forward LM predicts each token from the tokens before it, a backward LM from the tokens after it,
trained jointly. As in ELMo they are two causal stacks, each with its own blocks and final norm,
sharing the embeddings (token, position, segment) and the softmax (the whole LM head).

Two stacks, not one stack run with a left and then a right mask: ELMo's directions have their own
layers, so each specialises on its direction, and neither ever reads a state the other wrote, so
neither can see the token it predicts. It also keeps the forward stack a plain causal Transformer,
which every later stage, the model folder and the Hugging Face export already know (below). The price
is twice the blocks' parameters and compute.

The backward stack is a causal Transformer reading the window reversed: its next token is the
original's previous one. So one causal mask (SDPA's is_causal, with its fused kernels) serves both,
and its positions count from the window's end. `backward_states` turns its states back into the
original order, where the state at t has read tokens t.. and predicts token t-1.

Loss: the mean of the forward next-token and the backward previous-token cross-entropies (ELMo
maximises their sum; the mean keeps clm's scale, so perplexity = exp(loss) compares). Metrics: loss,
accuracy (both directions' predictions), and forward_/backward_ loss and accuracy.

What later stages finetune (`backbone()`): the forward stack, a causal model like clm's, so its
folder exports to transformers as a clm model of its shape does (GPT-2, or a causal ESM or
RoBERTa-PreLayerNorm; lib.models.hf.export_family). The backward stack is an objective extra
(objective.safetensors), which `adapt` loads to continue both directions. Not there yet: a finetuned
backbone that reads both directions (ELMo concatenates them per layer), which would need a two-stack
backbone that the model folder, every stage and the exports learn, and which no transformers class
computes.
"""
from __future__ import annotations

from torch import Tensor

from lib.config.params import Params
from lib.data.windows import Windows
from lib.models.architectures import Transformer, build_model
from lib.models.config import TransformerConfig
from lib.models.hf import ImportedModel
from lib.objectives.base import Objective, register
from lib.objectives.clm import next_token_loss


@register
class BidirectionalLM(Objective):
    name = "bilm"
    causal = True  # the backbone is the forward stack

    def __init__(self, params: Params, vocab_size: int, special_ids: dict[str, int],
                 arch: TransformerConfig | None = None):
        super().__init__(params, vocab_size, special_ids, arch)
        self.forward_stack = build_model(self.arch)
        self.backward_stack = build_model(self.arch, embeddings=self.forward_stack.embeddings)
        self.backward_stack.head = self.forward_stack.head  # the shared softmax

    def forward(self, batch: Windows) -> tuple[Tensor, dict[str, Tensor]]:
        forward_loss, forward_accuracy = next_token_loss(self.forward_stack, batch.tokens)
        backward_loss, backward_accuracy = next_token_loss(self.backward_stack, batch.tokens.flip(1))
        loss = (forward_loss + backward_loss) / 2
        return loss, {"loss": loss.detach(), "accuracy": (forward_accuracy + backward_accuracy) / 2,
                      "forward_loss": forward_loss.detach(), "backward_loss": backward_loss.detach(),
                      "forward_accuracy": forward_accuracy, "backward_accuracy": backward_accuracy}

    def backward_states(self, input_ids: Tensor) -> Tensor:
        """(B, T, d) the backward stack's states in the original order: the one at t has read tokens t.. only."""
        return self.backward_stack(input_ids.flip(1)).flip(1)

    def backbone(self) -> Transformer:
        return self.forward_stack

    def flops_per_token(self, seq_len: int) -> float:
        """Both stacks, each with the (shared) LM head at every position: the head runs twice."""
        return self.forward_stack.flops_per_token(seq_len) + self.backward_stack.flops_per_token(seq_len)

    def start_from(self, imported: ImportedModel) -> None:
        """A published causal model (GPT-2) is the forward stack, embeddings and LM head; no published one has a
        backward stack."""
        super().start_from(imported)
        print("bilm: the backward stack starts fresh (the published model has none)", flush=True)

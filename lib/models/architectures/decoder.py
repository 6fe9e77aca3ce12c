"""The decoder: the stack with causal attention, each position reading only itself and those before
it (GPT), so its LM head at position t predicts token t + 1 and it decodes left to right."""
from __future__ import annotations

import torch

from lib.models.architectures.stack import Transformer


class Decoder(Transformer):
    name = "decoder"
    causal = True

    @torch.no_grad()
    def greedy(self, input_ids: torch.Tensor, steps: int) -> torch.Tensor:
        """input_ids (B, T) followed by `steps` tokens, each the most likely after all before it. The rows
        are prompts of one length (no padding); the model decodes in the mode it is in (eval() for its
        predictions, without dropout). Each step reruns the whole prefix: without a KV cache a step costs
        a forward over all T + step tokens so far."""
        for _ in range(steps):
            logits = self.lm_logits(self(input_ids)[:, -1])
            input_ids = torch.cat([input_ids, logits.argmax(-1, keepdim=True)], dim=1)
        return input_ids

"""The decoder: the stack with causal attention, each position reading only itself and those before
it (GPT), so its LM head at position t predicts token t + 1 and it decodes left to right."""
from __future__ import annotations

from lib.models.architectures.stack import Transformer


class Decoder(Transformer):
    name = "decoder"
    causal = True

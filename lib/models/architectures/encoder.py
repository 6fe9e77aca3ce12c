"""The encoder: the stack with bidirectional attention, every position reading every other (BERT,
RoBERTa, ELECTRA, XLM). It predicts masked tokens in place and does not decode."""
from __future__ import annotations

from lib.models.architectures.stack import Transformer


class Encoder(Transformer):
    name = "encoder"
    causal = False

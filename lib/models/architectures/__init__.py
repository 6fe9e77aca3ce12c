"""Architectures by name: how a model is assembled from lib/models/blocks.py for a config
(lib/models/config.py). One module each, a model class (an nn.Module) with its `name`:

    model = build_model(cfg[, embeddings])         # the architecture the config names, initialised
    hidden = model(input_ids, ...)                 # and model.lm_logits(hidden)
    model.layer_groups()                           # bottom to top, for discriminative LRs and unfreezing
    model.flops_per_token(seq_len, predicted)      # training FLOPs, for budgets and MFU
    decoder.greedy(input_ids, steps)               # where the architecture decodes

Today's two are one stack (stack.py) that differ in their attention's mask: the encoder
(bidirectional) and the decoder (causal). Their configs name them by `causal` alone, so config.json
has no field for the name and every model folder reads as it was written.

An encoder-decoder (T5, BART) will be its module here, assembling the same blocks (its decoder's
blocks add an Attention reading the encoder's output as `context`), and its entry below. Its config
will be a TransformerConfig subclass with the fields it adds and an `architecture` field that names it
in config.json; lib/models/folder.py's read_config will build that class where config.json has the
key, and architecture_of will look a config with that field up by it.
"""
from __future__ import annotations

from lib.models.architectures import decoder, encoder
from lib.models.architectures.stack import Transformer
from lib.models.blocks import Embeddings
from lib.models.config import TransformerConfig

ARCHITECTURES: dict[str, type[Transformer]] = {cls.name: cls for cls in (encoder.Encoder, decoder.Decoder)}


def architecture_of(cfg: TransformerConfig) -> type[Transformer]:
    """The architecture `cfg` names: the stack whose attention is causal where cfg.causal is."""
    return next(cls for cls in ARCHITECTURES.values() if cls.causal == cfg.causal)


def build_model(cfg: TransformerConfig, embeddings: Embeddings | None = None) -> Transformer:
    """A freshly initialised model of the architecture `cfg` names; `embeddings`: another model's, shared."""
    return architecture_of(cfg)(cfg, embeddings)

"""Architectures by name: how a model is assembled from lib/models/blocks.py for a config
(lib/models/config.py). One module each, a model class (an nn.Module) with its `name`:

    model = build_model(cfg[, embeddings])         # the architecture the config names, initialised
    hidden = model(input_ids, ...)                 # and model.lm_logits(hidden)
    model.layer_groups()                           # bottom to top, for discriminative LRs and unfreezing
    model.flops_per_token(seq_len, predicted)      # training FLOPs, for budgets and MFU
    decoder.greedy(input_ids, steps)               # where the architecture decodes (an encoder-decoder's
                                                   # generation: lib/models/generation.py, KV-cached)
    text_encoder(model)                            # the stack task heads read

The encoder (bidirectional) and the decoder (causal) are one stack (stack.py) that differ in their
attention's mask; their configs name them by `causal` alone, so config.json has no field for the name
and every model folder reads as it was written. The encoder-decoder (T5, BART; encoder_decoder.py)
assembles an encoder and a decoder whose blocks also read the encoder's output; its config
(Seq2SeqConfig) names it by its `architecture` field, which lib/models/folder.py reads back.
"""
from __future__ import annotations

from lib.models.architectures import decoder, encoder, encoder_decoder
from lib.models.architectures.encoder_decoder import EncoderDecoder, Seq2SeqConfig
from lib.models.architectures.stack import Transformer
from lib.models.blocks import Embeddings
from lib.models.config import TransformerConfig

ARCHITECTURES: dict[str, type[Transformer] | type[EncoderDecoder]] = {
    cls.name: cls for cls in (encoder.Encoder, decoder.Decoder, encoder_decoder.EncoderDecoder)}


def architecture_of(cfg: TransformerConfig) -> type[Transformer] | type[EncoderDecoder]:
    """The architecture `cfg` names: by its `architecture` field where it has one (Seq2SeqConfig), else the
    stack whose attention is causal where cfg.causal is."""
    if isinstance(cfg, Seq2SeqConfig):
        return ARCHITECTURES[cfg.architecture]
    return next(cls for cls in (encoder.Encoder, decoder.Decoder) if cls.causal == cfg.causal)


def build_model(cfg: TransformerConfig, embeddings: Embeddings | None = None) -> Transformer | EncoderDecoder:
    """A freshly initialised model of the architecture `cfg` names; `embeddings`: another model's, shared."""
    return architecture_of(cfg)(cfg, embeddings)


def text_encoder(model: Transformer | EncoderDecoder) -> Transformer:
    """The stack a task head reads: the model itself, or an encoder-decoder's encoder."""
    return model.text_encoder() if isinstance(model, EncoderDecoder) else model

"""T5: an encoder-decoder (T5ForConditionalGeneration) of RMS norms before each sub-layer, no biases, unscaled
attention scores and a relative position bias per stack (kept in each stack's first block), one token table
(`shared`); the decoder starts from decoder_start_token_id (the pad token). v1.0 feeds forward with ReLU and ties
its LM head, scaling the decoder's output by d_model^-0.5 before it; v1.1 and Flan-T5 gate a tanh GELU
(feed_forward_proj gated-gelu), untie the head and do not scale; num_heads x d_kv may differ from d_model.
transformers 5 ties the head in every T5 but one saved with a head of its own, and says apart whether it scales."""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from lib.models.architectures.encoder_decoder import Seq2SeqConfig
from lib.models.config import TransformerConfig
from lib.models.families.base import ACTIVATIONS, EXPORTED_ACTIVATIONS, Family, Stack, head_is_table

# feed_forward_proj's activations -> ours, and back; "gated-gelu" is the one name T5 maps elsewhere (tanh GELU)
FEED_FORWARD = {**ACTIVATIONS, "relu": "relu"}
EXPORTED_FEED_FORWARD = {**EXPORTED_ACTIVATIONS, "relu": "relu"}
GATED_GELU = "gated-gelu"
NO_TABLE = 512  # T5 has no position table; our config's max_positions bounds nothing for its positions


def sublayer(index: int, names: dict[str, Any]) -> dict[str, Any]:
    """`names` inside a block's sub-layer `index` (layer.{index}.)."""
    return {k: tuple(f"layer.{index}.{n}" for n in v) if isinstance(v, tuple) else f"layer.{index}.{v}"
            for k, v in names.items()}


def attention(ours: str, theirs: str) -> dict[str, Any]:
    """An attention's names: q, k and v into our one qkv, o our proj."""
    return {f"{ours}.qkv": tuple(f"{theirs}.{x}" for x in "qkv"), f"{ours}.proj": f"{theirs}.o"}


class T5(Family):
    name, title, base = "t5", "T5", ""
    heads = [{"head.decoder": "lm_head"}]
    aliases = {"shared.weight": ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")}
    encoder_decoder, decoder_bias = True, False
    lm_classes = ("T5ForConditionalGeneration", None)

    def stacks(self, cfg: TransformerConfig) -> list[Stack]:
        mlp = ({"mlp.fc1": "DenseReluDense.wi_0", "mlp.up": "DenseReluDense.wi_1"} if cfg.gated_mlp
               else {"mlp.fc1": "DenseReluDense.wi"})
        mlp["mlp.fc2"] = "DenseReluDense.wo"
        own = sublayer(0, {"ln1": "layer_norm", **attention("attn", "SelfAttention")})
        cross = sublayer(1, {"ln_cross": "layer_norm", **attention("cross", "EncDecAttention")})
        encoder = {**own, **sublayer(1, {"ln2": "layer_norm", **mlp})}
        decoder = {**own, **cross, **sublayer(2, {"ln2": "layer_norm", **mlp})}
        # the stacks' prefixes are the same in both layouts
        return [Stack(stack, f"{stack}block", layer, {
            "embeddings.token": "shared", "norm": f"{stack}final_layer_norm",
            "relative_bias.bias": f"{stack}block.0.layer.0.SelfAttention.relative_attention_bias"}, depth)
            for stack, layer, depth in (("encoder.", encoder, cfg.n_layers), ("decoder.", decoder, cfg.decoder_layers))]

    def config(self, hf: dict) -> TransformerConfig:
        projection = hf.get("feed_forward_proj", "relu")
        gated, _, act = projection.rpartition("-")
        if gated not in ("", "gated"):
            raise ValueError(f"feed_forward_proj {projection} (expected <activation> or gated-<activation>)")
        if act not in FEED_FORWARD and projection != GATED_GELU:
            raise ValueError(f"feed_forward_proj {projection} (activations supported: {', '.join(FEED_FORWARD)})")
        tied = hf.get("tie_word_embeddings", True)
        d_model, n_heads, d_kv = hf["d_model"], hf["num_heads"], hf["d_kv"]
        return Seq2SeqConfig(
            vocab_size=hf["vocab_size"], d_model=d_model, n_layers=hf["num_layers"],
            decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"], n_heads=n_heads, d_ff=hf["d_ff"],
            head_dim=None if n_heads * d_kv == d_model else d_kv, dropout=hf.get("dropout_rate", 0.1),
            max_positions=NO_TABLE, position="t5", relative_buckets=hf.get("relative_attention_num_buckets", 32),
            relative_max_distance=hf.get("relative_attention_max_distance", 128), norm="pre", rms_norm=True,
            bias=False, scale_attention=False, embedding_norm=False, lm_head="linear", segment_vocab=0,
            activation="gelu_tanh" if projection == GATED_GELU else FEED_FORWARD[act], gated_mlp=bool(gated),
            norm_eps=hf.get("layer_norm_epsilon", 1e-6), tie_embeddings=tied,
            # transformers 4 scales exactly where the head is tied; 5 says so apart (weights_config: the head)
            rescale_output=hf.get("scale_decoder_outputs", tied),
            decoder_start=hf.get("decoder_start_token_id", hf.get("pad_token_id", 0)))

    def weights_config(self, cfg: TransformerConfig, theirs: dict[str, torch.Tensor]) -> TransformerConfig:
        return dataclasses.replace(cfg, tie_embeddings=head_is_table(
            theirs, ["shared.weight", *self.aliases["shared.weight"]], "lm_head.weight"))

    def covers(self, cfg: TransformerConfig) -> bool:
        return isinstance(cfg, Seq2SeqConfig) and cfg.position == "t5"

    def mismatch(self, cfg: TransformerConfig) -> str:
        needs = {"RMS norms before each sub-layer": cfg.rms_norm and cfg.norm == "pre",
                 "no biases": not cfg.bias, "unscaled attention scores": not cfg.scale_attention,
                 "no embedding norm or scaling": not cfg.embedding_norm and not cfg.embedding_scale,
                 "the LM head's decoder alone (lm_head: linear)": cfg.lm_head == "linear",
                 "no segment or language embeddings, no projection": (not cfg.segment_vocab and not cfg.languages
                                                                      and cfg.embedding_size is None),
                 "a feed-forward it names (gated: ReLU or tanh GELU)": feed_forward_proj(cfg) is not None,
                 "the output scaled exactly when the LM head is tied": cfg.rescale_output == cfg.tie_embeddings}
        missing = [need for need, met in needs.items() if not met]
        return f"T5 needs {', '.join(missing)}" if missing else ""

    def export_config(self, cfg: TransformerConfig, special_ids: dict[str, int], shift: int) -> dict:
        return dict(d_model=cfg.d_model, d_kv=cfg.head_size, d_ff=cfg.d_ff, num_layers=cfg.n_layers,
                    num_decoder_layers=cfg.decoder_layers, num_heads=cfg.n_heads,
                    relative_attention_num_buckets=cfg.relative_buckets,
                    relative_attention_max_distance=cfg.relative_max_distance, dropout_rate=cfg.dropout,
                    layer_norm_epsilon=cfg.norm_eps, feed_forward_proj=feed_forward_proj(cfg),
                    scale_decoder_outputs=cfg.rescale_output, is_encoder_decoder=True,
                    decoder_start_token_id=cfg.decoder_start)


def feed_forward_proj(cfg: TransformerConfig) -> str | None:
    """T5's name for the feed-forward of `cfg`; None where it has none (a gate on the exact GELU)."""
    if not cfg.gated_mlp:
        return EXPORTED_FEED_FORWARD[cfg.activation]
    return {"relu": "gated-relu", "gelu_tanh": GATED_GELU}.get(cfg.activation)


FAMILY = T5()

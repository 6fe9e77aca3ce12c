"""BART: an encoder-decoder (BartForConditionalGeneration) of post-LN layers with biases, learned positions from
row 2 and an embedding LayerNorm in each stack, one token table (`shared`), optionally scaled by sqrt(d_model)
(scale_embedding); the decoder starts from decoder_start_token_id (the end token). Its final_logits_bias is
zeros in BART's published models and ours. Refused: what its relatives add and we do not compute (mBART's
pre-LN layers and final LayerNorms, a logits bias of its own), and encoder and decoder layers of other widths
or head counts."""
from __future__ import annotations

import dataclasses

import torch

from lib.models.architectures.encoder_decoder import BART_POSITION_OFFSET, Seq2SeqConfig
from lib.models.config import TransformerConfig
from lib.models.families.base import ACTIVATIONS, EXPORTED_ACTIVATIONS, Family, Stack, head_is_table

FEED_FORWARD = {**ACTIVATIONS, "relu": "relu"}  # activation_function -> ours, and back
EXPORTED_FEED_FORWARD = {**EXPORTED_ACTIVATIONS, "relu": "relu"}
# config.json flags of its relatives (old BART configs carry them, false) -> what they add that we do not compute
UNSUPPORTED = {"normalize_before": "mBART's pre-LN layers", "add_final_layer_norm": "mBART's final LayerNorms",
               "add_bias_logits": "a learned logits bias", "static_position_embeddings": "sinusoidal positions"}
NORM_EPS = 1e-5  # BART's LayerNorms keep torch's default epsilon


def attention(ours: str, theirs: str) -> dict[str, str | tuple[str, ...]]:
    """An attention's names: q, k and v into our one qkv, out our proj."""
    return {f"{ours}.qkv": tuple(f"{theirs}.{x}_proj" for x in "qkv"), f"{ours}.proj": f"{theirs}.out_proj"}


class Bart(Family):
    name, title, base = "bart", "BART", "model."
    heads = [{"head.decoder": "lm_head"}]
    aliases = {"shared.weight": ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")}
    encoder_decoder, decoder_bias = True, False
    lm_classes = ("BartForConditionalGeneration", None)

    def stacks(self, cfg: TransformerConfig) -> list[Stack]:
        encoder = {"ln1": "self_attn_layer_norm", **attention("attn", "self_attn"), "mlp.fc1": "fc1", "mlp.fc2": "fc2",
                   "ln2": "final_layer_norm"}
        decoder = {**encoder, "ln_cross": "encoder_attn_layer_norm", **attention("cross", "encoder_attn")}
        # the stacks' prefixes are the same in both layouts
        return [Stack(stack, f"{stack}layers", layer, {
            "embeddings.token": "shared", "embeddings.position": f"{stack}embed_positions",
            "embeddings.norm": f"{stack}layernorm_embedding"}, depth)
            for stack, layer, depth in (("encoder.", encoder, cfg.n_layers), ("decoder.", decoder, cfg.decoder_layers))]

    def config(self, hf: dict) -> TransformerConfig:
        for flag, adds in UNSUPPORTED.items():
            if hf.get(flag):
                raise ValueError(f"{flag} is set ({adds}: not supported)")
        for part in ("attention_heads", "ffn_dim"):
            if hf[f"encoder_{part}"] != hf[f"decoder_{part}"]:
                raise ValueError(f"encoder_{part} {hf[f'encoder_{part}']} != decoder_{part} {hf[f'decoder_{part}']} "
                                 "(only one value for both stacks is supported)")
        act = hf.get("activation_function", "gelu")
        if act not in FEED_FORWARD:
            raise ValueError(f"activation_function {act} (supported: {', '.join(FEED_FORWARD)})")
        return Seq2SeqConfig(
            vocab_size=hf["vocab_size"], d_model=hf["d_model"], n_layers=hf["encoder_layers"],
            decoder_layers=hf["decoder_layers"], n_heads=hf["encoder_attention_heads"], d_ff=hf["encoder_ffn_dim"],
            dropout=hf.get("dropout", 0.1), max_positions=hf["max_position_embeddings"] + BART_POSITION_OFFSET,
            position="learned", position_offset=BART_POSITION_OFFSET, norm="post", segment_vocab=0,
            lm_head="linear", activation=FEED_FORWARD[act], norm_eps=NORM_EPS,
            embedding_scale=bool(hf.get("scale_embedding")), tie_embeddings=hf.get("tie_word_embeddings", True),
            decoder_start=hf.get("decoder_start_token_id", hf.get("eos_token_id", 2)))

    def weights_config(self, cfg: TransformerConfig, theirs: dict[str, torch.Tensor]) -> TransformerConfig:
        names = ("shared.weight", *self.aliases["shared.weight"])
        tables = [f"{base}{name}" for base in (self.base, "") for name in names]  # in a task model, or a bare one
        return dataclasses.replace(cfg, tie_embeddings=head_is_table(theirs, tables, "lm_head.weight"))

    def zero_tensors(self, cfg: TransformerConfig) -> dict[str, torch.Tensor]:
        return {"final_logits_bias": torch.zeros(1, cfg.vocab_size)}

    def covers(self, cfg: TransformerConfig) -> bool:
        return isinstance(cfg, Seq2SeqConfig) and cfg.position == "learned"

    def mismatch(self, cfg: TransformerConfig) -> str:
        needs = {"LayerNorms after each sub-layer": cfg.norm == "post" and not cfg.rms_norm,
                 f"LayerNorm epsilon {NORM_EPS}": cfg.norm_eps == NORM_EPS,
                 "an embedding LayerNorm": cfg.embedding_norm, "biases": cfg.bias,
                 f"positions from row {BART_POSITION_OFFSET}": cfg.position_offset == BART_POSITION_OFFSET,
                 "scaled attention, heads d_model / n_heads wide": cfg.scale_attention and cfg.head_dim in (
                     None, cfg.d_model // cfg.n_heads),
                 "an ungated feed-forward": not cfg.gated_mlp, "no output scaling": not cfg.rescale_output,
                 "the LM head's decoder alone (lm_head: linear)": cfg.lm_head == "linear",
                 "no segment or language embeddings, no projection": (not cfg.segment_vocab and not cfg.languages
                                                                      and cfg.embedding_size is None)}
        missing = [need for need, met in needs.items() if not met]
        return f"BART needs {', '.join(missing)}" if missing else ""

    def export_config(self, cfg: TransformerConfig, special_ids: dict[str, int], shift: int) -> dict:
        # dropout where ours has it (attention probabilities, each sub-layer's output), none after the activation;
        # no forced tokens: generate() then decodes as lib.models.generation.generate does
        return dict(d_model=cfg.d_model, encoder_layers=cfg.n_layers, decoder_layers=cfg.decoder_layers,
                    encoder_attention_heads=cfg.n_heads, decoder_attention_heads=cfg.n_heads,
                    encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
                    activation_function=EXPORTED_FEED_FORWARD[cfg.activation], dropout=cfg.dropout,
                    attention_dropout=cfg.dropout, activation_dropout=0.0,
                    max_position_embeddings=cfg.max_positions - BART_POSITION_OFFSET,
                    scale_embedding=cfg.embedding_scale, is_encoder_decoder=True,
                    decoder_start_token_id=cfg.decoder_start, forced_bos_token_id=None, forced_eos_token_id=None)


FAMILY = Bart()

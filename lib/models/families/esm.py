"""ESM: pre-LN with rotary positions (rotate-half, base 10000), an optional embedding LayerNorm, a final
LayerNorm, no token types, exact GELU, RoBERTa's LM head without a decoder bias of its own; causal with
`is_decoder`. ESM-2's token_dropout (masked embeddings zeroed and the rest rescaled) is refused.
transformers' one rotary family: every rotary model of ours is its to export."""
from __future__ import annotations

from lib.models.blocks import ROPE_BASE
from lib.models.config import TransformerConfig
from lib.models.families.base import LM_HEAD, SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION, Family, TaskClass
from lib.models.families.bert import LAYER


class Esm(Family):
    name, title, base = "esm", "ESM", "esm."
    layers, heads = "encoder.layer", [LM_HEAD]
    layer = {"ln1": "attention.LayerNorm", "attn.qkv": LAYER["attn.qkv"], "attn.proj": "attention.output.dense",
             "ln2": "LayerNorm", "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense"}
    top = {"embeddings.token": "embeddings.word_embeddings", "embeddings.norm": "embeddings.layer_norm",
           "norm": "encoder.emb_layer_norm_after"}
    decoder_bias = False
    # transformers has no causal ESM class: a causal model's EsmForMaskedLM (is_decoder) gives next-token
    # logits, without generate()
    lm_classes = ("EsmForMaskedLM", "EsmForMaskedLM")
    # transformers has no EsmForQuestionAnswering (nor a multiple-choice model)
    task_models = {SEQUENCE_CLASSIFICATION: TaskClass("EsmForSequenceClassification", "classifier.dense",
                                                      "classifier.out_proj"),
                   TOKEN_CLASSIFICATION: TaskClass("EsmForTokenClassification", None, "classifier")}

    def config(self, hf: dict) -> TransformerConfig:
        if hf.get("position_embedding_type") != "rotary":
            raise ValueError(f"position_embedding_type {hf.get('position_embedding_type')} (only rotary is supported)")
        if hf.get("token_dropout"):
            raise ValueError("token_dropout is set (ESM-2's rescaled mask embeddings are not supported)")
        if hf.get("rope_theta", ROPE_BASE) != ROPE_BASE:
            raise ValueError(f"rope_theta {hf['rope_theta']} (only {ROPE_BASE:g} is supported)")
        return TransformerConfig(
            vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
            n_heads=hf["num_attention_heads"], d_ff=hf["intermediate_size"],
            dropout=hf.get("hidden_dropout_prob", 0.1), max_positions=hf["max_position_embeddings"], position="rope",
            norm="pre", tie_embeddings=hf.get("tie_word_embeddings", True), segment_vocab=0,
            causal=bool(hf.get("is_decoder")), activation="gelu",  # ESM's GELU is the exact one, whatever hidden_act says
            norm_eps=hf.get("layer_norm_eps", 1e-12), embedding_norm=bool(hf.get("emb_layer_norm_before")))

    def covers(self, cfg: TransformerConfig) -> bool:
        return cfg.position == "rope" and not cfg.languages

    def mismatch(self, cfg: TransformerConfig) -> str:
        if cfg.norm != "pre":
            return "rope positions with post-LN layers"
        if cfg.segment_vocab:
            return "rope positions with segment embeddings (ESM, the pre-LN rotary family, has no token types; " \
                   "model.segment_vocab: 0 exports)"
        if cfg.embedding_size is not None or cfg.lm_head != "mlp" or cfg.activation != "gelu":
            return "rope positions with factorised embeddings, GPT-2's LM head or tanh GELU"
        return ""

    def export_config(self, cfg: TransformerConfig, special_ids: dict[str, int], shift: int) -> dict:
        return dict(hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                    intermediate_size=cfg.d_ff, hidden_dropout_prob=cfg.dropout,
                    attention_probs_dropout_prob=cfg.dropout, max_position_embeddings=cfg.max_positions,
                    layer_norm_eps=cfg.norm_eps, is_decoder=cfg.causal, position_embedding_type="rotary",
                    rope_theta=ROPE_BASE, emb_layer_norm_before=cfg.embedding_norm, token_dropout=False,
                    mask_token_id=special_ids.get("mask"))


FAMILY = Esm()

"""GPT-2: pre-LN, no embedding LayerNorm, tanh GELU, Conv1D weights stored transposed, the tied decoder
alone as its LM head; the one family whose task models are made for causal attention (they read the
last real token)."""
from __future__ import annotations

from lib.models.config import TransformerConfig
from lib.models.families.base import (EXPORTED_ACTIVATIONS, QUESTION_ANSWERING, SEQUENCE_CLASSIFICATION,
                                      TOKEN_CLASSIFICATION, Family, TaskClass, activation)


class GPT2(Family):
    name, title, base = "gpt2", "GPT-2", "transformer."
    layers, top, heads = "h", {"embeddings.token": "wte", "embeddings.position": "wpe", "norm": "ln_f"}, [
        {"head.decoder": "lm_head"}]
    layer = {"ln1": "ln_1", "attn.qkv": "attn.c_attn", "attn.proj": "attn.c_proj", "ln2": "ln_2",
             "mlp.fc1": "mlp.c_fc", "mlp.fc2": "mlp.c_proj"}
    conv1d, decoder_bias = True, False
    lm_classes = (None, "GPT2LMHeadModel")
    # its multiple-choice model is a double-heads LM, not our plain head
    task_models = {SEQUENCE_CLASSIFICATION: TaskClass("GPT2ForSequenceClassification", None, "score"),
                   TOKEN_CLASSIFICATION: TaskClass("GPT2ForTokenClassification", None, "classifier"),
                   QUESTION_ANSWERING: TaskClass("GPT2ForQuestionAnswering", None, "qa_outputs")}
    causal_task_models = True
    head_activation = None

    def config(self, hf: dict) -> TransformerConfig:
        for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if hf.get(flag):
                raise ValueError(f"{flag} is set (not supported)")
        return TransformerConfig(
            vocab_size=hf["vocab_size"], d_model=hf["n_embd"], n_layers=hf["n_layer"], n_heads=hf["n_head"],
            d_ff=hf.get("n_inner") or 4 * hf["n_embd"], dropout=hf.get("resid_pdrop", 0.1),
            max_positions=hf["n_positions"], position="learned", norm="pre",
            tie_embeddings=hf.get("tie_word_embeddings", True), segment_vocab=0, causal=True,
            activation=activation(hf.get("activation_function", "gelu_new")),
            norm_eps=hf.get("layer_norm_epsilon", 1e-5), embedding_norm=False, lm_head="linear")

    def covers(self, cfg: TransformerConfig) -> bool:
        return (cfg.position == "learned" and not cfg.languages and cfg.norm == "pre" and not cfg.embedding_norm
                and cfg.lm_head == "linear" and cfg.causal and not cfg.segment_vocab and cfg.embedding_size is None
                and not cfg.position_offset)

    def export_config(self, cfg: TransformerConfig, special_ids: dict[str, int], shift: int) -> dict:
        return dict(n_embd=cfg.d_model, n_layer=cfg.n_layers, n_head=cfg.n_heads, n_inner=cfg.d_ff,
                    activation_function=EXPORTED_ACTIVATIONS[cfg.activation], resid_pdrop=cfg.dropout,
                    embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout, n_positions=cfg.max_positions,
                    layer_norm_epsilon=cfg.norm_eps)

    def sequence_head_mismatch(self, pooler: str | None, bias: bool, special_ids: dict[str, int], cls: str) -> str:
        if pooler is not None or bias:
            return "GPT-2's sequence-classification head is one linear layer without bias; this head is not"
        if special_ids.get("pad") in (special_ids.get("eos"), None):
            return "the pad token is also the end token, which GPT-2's head would skip as padding"
        return ""


FAMILY = GPT2()

"""BERT (MiniLM is one): post-LN, learned positions, token types, q/k/v concatenated into one projection;
the pooler is kept; the masked-LM head `cls.predictions` when present. RoBERTa, ELECTRA and
RoBERTa-PreLayerNorm build on it."""
from __future__ import annotations

from lib.models.config import TransformerConfig
from lib.models.families.base import (CLS_PREDICTIONS, EXPORTED_ACTIVATIONS, MULTIPLE_CHOICE, QUESTION_ANSWERING,
                                      SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION, Family, TaskClass, activation,
                                      preferring)

LAYER = {"attn.qkv": ("attention.self.query", "attention.self.key", "attention.self.value"),
         "attn.proj": "attention.output.dense", "ln1": "attention.output.LayerNorm",
         "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense", "ln2": "output.LayerNorm"}
EMBEDDINGS = {"embeddings.token": "embeddings.word_embeddings", "embeddings.position": "embeddings.position_embeddings",
              "embeddings.segment": "embeddings.token_type_embeddings", "embeddings.norm": "embeddings.LayerNorm",
              "project": "embeddings_project", "pooler.dense": "pooler.dense"}


def bert_shaped(cfg: TransformerConfig) -> bool:
    """BERT's embeddings and LM head: learned positions, an embedding LayerNorm, the dense-GELU-LayerNorm
    head, no language embeddings (the shape the families built on BERT share)."""
    return cfg.position == "learned" and not cfg.languages and cfg.embedding_norm and cfg.lm_head == "mlp"


class Bert(Family):
    name, title, base = "bert", "BERT", "bert."
    layers, layer, top = "encoder.layer", LAYER, EMBEDDINGS
    heads = preferring(CLS_PREDICTIONS)
    lm_classes = ("BertForMaskedLM", "BertLMHeadModel")
    # the pooler (dense + tanh on [CLS]) and a linear layer; a linear layer on every state; the same
    # pooler scoring each choice
    task_models = {SEQUENCE_CLASSIFICATION: TaskClass("BertForSequenceClassification", "bert.pooler.dense", "classifier"),
                   TOKEN_CLASSIFICATION: TaskClass("BertForTokenClassification", None, "classifier"),
                   QUESTION_ANSWERING: TaskClass("BertForQuestionAnswering", None, "qa_outputs"),
                   MULTIPLE_CHOICE: TaskClass("BertForMultipleChoice", "bert.pooler.dense", "classifier")}

    def config(self, hf: dict) -> TransformerConfig:
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"position_embedding_type {hf['position_embedding_type']} (only absolute is supported)")
        embedding = hf.get("embedding_size", hf["hidden_size"])
        return TransformerConfig(
            vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
            n_heads=hf["num_attention_heads"], d_ff=hf["intermediate_size"],
            dropout=hf.get("hidden_dropout_prob", 0.1), max_positions=hf["max_position_embeddings"],
            position="learned", norm="post", tie_embeddings=hf.get("tie_word_embeddings", True),
            embedding_size=embedding if embedding != hf["hidden_size"] else None,
            segment_vocab=hf.get("type_vocab_size", 2),
            activation=activation(hf.get("hidden_act", "gelu")), norm_eps=hf.get("layer_norm_eps", 1e-12),
            position_offset=hf["pad_token_id"] + 1 if self.positions_after_padding else 0)

    def covers(self, cfg: TransformerConfig) -> bool:
        return (bert_shaped(cfg) and cfg.norm == "post" and cfg.embedding_size is None
                and bool(cfg.position_offset) == self.positions_after_padding)

    def export_config(self, cfg: TransformerConfig, special_ids: dict[str, int], shift: int) -> dict:
        hf = dict(hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                  intermediate_size=cfg.d_ff, hidden_act=EXPORTED_ACTIVATIONS[cfg.activation],
                  hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.dropout,
                  max_position_embeddings=cfg.max_positions + shift, type_vocab_size=max(cfg.segment_vocab, 1),
                  layer_norm_eps=cfg.norm_eps, is_decoder=cfg.causal, position_embedding_type="absolute")
        if cfg.embedding_size is not None:
            hf["embedding_size"] = cfg.embedding_size
        return hf


FAMILY = Bert()

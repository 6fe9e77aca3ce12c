"""DistilBERT: BERT without token types or pooler, under tensor names of its own; read, never written
(a model of its shape exports as a BERT)."""
from __future__ import annotations

from lib.models.config import TransformerConfig
from lib.models.families.base import MLM_HEADS, Family, activation
from lib.models.families.bert import EMBEDDINGS


class DistilBert(Family):
    name, title, base = "distilbert", "DistilBERT", "distilbert."
    layers, top, heads = "transformer.layer", EMBEDDINGS, MLM_HEADS
    layer = {"attn.qkv": ("attention.q_lin", "attention.k_lin", "attention.v_lin"), "attn.proj": "attention.out_lin",
             "ln1": "sa_layer_norm", "mlp.fc1": "ffn.lin1", "mlp.fc2": "ffn.lin2", "ln2": "output_layer_norm"}

    def config(self, hf: dict) -> TransformerConfig:
        return TransformerConfig(
            vocab_size=hf["vocab_size"], d_model=hf["dim"], n_layers=hf["n_layers"], n_heads=hf["n_heads"],
            d_ff=hf["hidden_dim"], dropout=hf.get("dropout", 0.1), max_positions=hf["max_position_embeddings"],
            position="learned", norm="post", tie_embeddings=hf.get("tie_word_embeddings", True), segment_vocab=0,
            activation=activation(hf.get("activation", "gelu")), norm_eps=1e-12)  # DistilBERT's eps is fixed in code


FAMILY = DistilBert()

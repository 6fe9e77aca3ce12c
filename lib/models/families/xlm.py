"""XLM: post-LN, learned positions, language embeddings, the FFN 4x wide, the decoder alone as its LM head
(with a bias, zero in what we export); read back from folders this pipeline exported (XLM's own
published models have no fast tokenizer). transformers' one family with language embeddings: every model of
ours with languages is its to export, and it has one shape of its own."""
from __future__ import annotations

import torch

from lib.models.config import TransformerConfig
from lib.models.families.base import (QUESTION_ANSWERING, SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION, Family,
                                      TaskClass)


class XLM(Family):
    name, title, base = "xlm", "XLM", "transformer."
    layers, heads = "", [{"head.decoder": "pred_layer.proj"}]
    layer = {"attn.qkv": ("attentions.{i}.q_lin", "attentions.{i}.k_lin", "attentions.{i}.v_lin"),
             "attn.proj": "attentions.{i}.out_lin", "ln1": "layer_norm1.{i}", "mlp.fc1": "ffns.{i}.lin1",
             "mlp.fc2": "ffns.{i}.lin2", "ln2": "layer_norm2.{i}"}
    top = {"embeddings.token": "embeddings", "embeddings.position": "position_embeddings",
           "embeddings.language": "lang_embeddings", "embeddings.norm": "layer_norm_emb"}
    lm_classes = ("XLMWithLMHeadModel", "XLMWithLMHeadModel")
    # its sequence head is a SequenceSummary: one linear layer on the first token, no dense; its
    # XLMForQuestionAnswering is a beam-search head, ...Simple the linear one
    task_models = {SEQUENCE_CLASSIFICATION: TaskClass("XLMForSequenceClassification", None, "sequence_summary.summary"),
                   TOKEN_CLASSIFICATION: TaskClass("XLMForTokenClassification", None, "classifier"),
                   QUESTION_ANSWERING: TaskClass("XLMForQuestionAnsweringSimple", None, "qa_outputs")}
    head_activation = None

    def config(self, hf: dict) -> TransformerConfig:
        for flag, supported in (("asm", False), ("sinusoidal_embeddings", False), ("gelu_activation", True),
                                ("use_lang_emb", True)):
            if hf.get(flag, supported) != supported:
                raise ValueError(f"{flag} is {hf[flag]} (only {supported} is supported)")
        id2lang = hf.get("id2lang") or {}
        return TransformerConfig(
            vocab_size=hf["vocab_size"], d_model=hf["emb_dim"], n_layers=hf["n_layers"], n_heads=hf["n_heads"],
            d_ff=4 * hf["emb_dim"], dropout=hf.get("dropout", 0.1), max_positions=hf["max_position_embeddings"],
            position="learned", norm="post", tie_embeddings=hf.get("tie_word_embeddings", True), segment_vocab=0,
            causal=bool(hf.get("causal")), activation="gelu", norm_eps=hf.get("layer_norm_eps", 1e-12),
            lm_head="linear", languages=[id2lang[str(i)] for i in range(hf["n_langs"])] if hf["n_langs"] > 1 else [])

    def covers(self, cfg: TransformerConfig) -> bool:
        return bool(cfg.languages)

    def mismatch(self, cfg: TransformerConfig) -> str:
        needs = {"model.position: learned": cfg.position == "learned", "model.norm: post": cfg.norm == "post",
                 "model.lm_head: linear": cfg.lm_head == "linear", "model.segment_vocab: 0": not cfg.segment_vocab,
                 f"model.d_ff: {4 * cfg.d_model} (4 x d_model)": cfg.d_ff == 4 * cfg.d_model,
                 "model.embedding_size: null": cfg.embedding_size is None,
                 "exact GELU, an embedding LayerNorm, positions from 0": (cfg.activation, cfg.embedding_norm,
                                                                         cfg.position_offset) == ("gelu", True, 0)}
        missing = [need for need, met in needs.items() if not met]
        return f"language embeddings (XLM); transformers' XLM needs {', '.join(missing)}" if missing else ""

    def fold_for_export(self, ours: dict[str, torch.Tensor], language: int | None) -> None:
        """Where ours reads a row when given no language ids (`language`, else the first), XLM adds none, so
        that row moves into every position's (and out of every language's): the same sums with language ids,
        and without them XLM reads that language as ours does."""
        row = ours["embeddings.language.weight"][language or 0]
        ours["embeddings.position.weight"] = ours["embeddings.position.weight"] + row
        ours["embeddings.language.weight"] = ours["embeddings.language.weight"] - row

    def export_config(self, cfg: TransformerConfig, special_ids: dict[str, int], shift: int) -> dict:
        index = {f"{role}_index": special_ids[role] for role in ("pad", "bos", "eos", "unk", "mask") if role in special_ids}
        return dict(emb_dim=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads, dropout=cfg.dropout,
                    attention_dropout=cfg.dropout, gelu_activation=True, sinusoidal_embeddings=False,
                    causal=cfg.causal, asm=False, n_langs=len(cfg.languages), use_lang_emb=True,
                    max_position_embeddings=cfg.max_positions, layer_norm_eps=cfg.norm_eps,
                    lang2id={code: i for i, code in enumerate(cfg.languages)},
                    id2lang=dict(enumerate(cfg.languages)), mask_token_id=special_ids.get("mask", 0), **index)


FAMILY = XLM()

"""RoBERTa-PreLayerNorm: RoBERTa's embeddings and positions, pre-LN layers and a final LayerNorm."""
from __future__ import annotations

import dataclasses

from lib.models.config import TransformerConfig
from lib.models.families.base import (LM_HEAD, MULTIPLE_CHOICE, QUESTION_ANSWERING, SEQUENCE_CLASSIFICATION,
                                      TOKEN_CLASSIFICATION, TaskClass)
from lib.models.families.bert import EMBEDDINGS, LAYER, bert_shaped
from lib.models.families.roberta import Roberta


class RobertaPreLayerNorm(Roberta):
    name, title, base = "roberta-prelayernorm", "RoBERTa-PreLayerNorm", "roberta_prelayernorm."
    layer = {"ln1": "attention.LayerNorm", "attn.qkv": LAYER["attn.qkv"], "attn.proj": "attention.output.dense",
             "ln2": "intermediate.LayerNorm", "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense"}
    top = {**EMBEDDINGS, "norm": "LayerNorm"}
    heads = [LM_HEAD]
    lm_classes = ("RobertaPreLayerNormForMaskedLM", "RobertaPreLayerNormForCausalLM")
    task_models = {
        SEQUENCE_CLASSIFICATION: TaskClass("RobertaPreLayerNormForSequenceClassification", "classifier.dense",
                                           "classifier.out_proj"),
        TOKEN_CLASSIFICATION: TaskClass("RobertaPreLayerNormForTokenClassification", None, "classifier"),
        QUESTION_ANSWERING: TaskClass("RobertaPreLayerNormForQuestionAnswering", None, "qa_outputs"),
        MULTIPLE_CHOICE: TaskClass("RobertaPreLayerNormForMultipleChoice", "roberta_prelayernorm.pooler.dense",
                                   "classifier")}

    def config(self, hf: dict) -> TransformerConfig:
        return dataclasses.replace(super().config(hf), norm="pre")

    def covers(self, cfg: TransformerConfig) -> bool:
        # positions from 0 or after the padding id alike: an export adds the rows in front (export_layout)
        return bert_shaped(cfg) and cfg.norm == "pre" and cfg.embedding_size is None


FAMILY = RobertaPreLayerNorm()

"""ELECTRA: BERT's layers, its smaller embeddings projected up (`embedding_size`), the generator's
masked-LM head `generator_predictions`, a GELU classification head; a published discriminator's
replaced-token detection head is kept aside (ImportedModel.discriminator_head). Exported bidirectional only."""
from __future__ import annotations

from lib.models.config import TransformerConfig
from lib.models.families.base import (GENERATOR_PREDICTIONS, QUESTION_ANSWERING, SEQUENCE_CLASSIFICATION,
                                      TOKEN_CLASSIFICATION, TaskClass, preferring)
from lib.models.families.bert import Bert, bert_shaped


class Electra(Bert):
    name, title, base = "electra", "ELECTRA", "electra."
    heads = preferring(GENERATOR_PREDICTIONS)
    projects_embeddings = True
    detector_head = "discriminator_predictions."  # ElectraForPreTraining's: dense, act, dense_prediction
    lm_classes = ("ElectraForMaskedLM", None)
    # its multiple-choice model pools through a SequenceSummary, which our plain head is not
    task_models = {SEQUENCE_CLASSIFICATION: TaskClass("ElectraForSequenceClassification", "classifier.dense",
                                                      "classifier.out_proj"),
                   TOKEN_CLASSIFICATION: TaskClass("ElectraForTokenClassification", None, "classifier"),
                   QUESTION_ANSWERING: TaskClass("ElectraForQuestionAnswering", None, "qa_outputs")}
    head_activation = "gelu"

    def covers(self, cfg: TransformerConfig) -> bool:
        return bert_shaped(cfg) and cfg.embedding_size is not None

    def mismatch(self, cfg: TransformerConfig) -> str:
        if cfg.norm != "post":
            return "factorised embeddings with pre-LN layers"
        return "a causal ELECTRA" if cfg.causal or cfg.position_offset else ""


FAMILY = Electra()

"""RoBERTa: BERT's layers, positions numbered from padding_idx + 1, the masked-LM head `lm_head`, a
classification head of its own (dense + tanh + out_proj on the first token)."""
from __future__ import annotations

from lib.models.families.base import (LM_HEAD, MULTIPLE_CHOICE, QUESTION_ANSWERING, SEQUENCE_CLASSIFICATION,
                                      TOKEN_CLASSIFICATION, TaskClass, preferring)
from lib.models.families.bert import Bert


class Roberta(Bert):
    name, title, base = "roberta", "RoBERTa", "roberta."
    heads = preferring(LM_HEAD)
    positions_after_padding = True
    lm_classes = ("RobertaForMaskedLM", "RobertaForCausalLM")
    task_models = {SEQUENCE_CLASSIFICATION: TaskClass("RobertaForSequenceClassification", "classifier.dense",
                                                      "classifier.out_proj"),
                   TOKEN_CLASSIFICATION: TaskClass("RobertaForTokenClassification", None, "classifier"),
                   QUESTION_ANSWERING: TaskClass("RobertaForQuestionAnswering", None, "qa_outputs"),
                   MULTIPLE_CHOICE: TaskClass("RobertaForMultipleChoice", "roberta.pooler.dense", "classifier")}


FAMILY = Roberta()

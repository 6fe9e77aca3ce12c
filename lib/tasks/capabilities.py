"""What a task type may have beyond what every type has (lib/tasks/base.py's TaskType): each capability is a
small class that a type declares by inheriting it beside TaskType, holding the members only types with that
capability have, and the code that uses one asks `isinstance(kind, Exported)`, never a type's name:

    class Classification(Exported, Served, UnlabeledTransfer, TaskType): ...

A type declares what it offers and nothing else: a type that generates text from an encoder-decoder need
not carry an export shape, a raw-text encoding or a soft loss it does not have.

Two training extras stay flags on TaskType rather than capabilities: `aux_lm` (finetune.aux_lm_weight's
auxiliary LM loss on the task's texts) and `logistic_probe` (the frozen variant fits scikit-learn's logistic
regression rather than L-BFGS on the type's loss). Each is a yes or no with no member behind it, and its
default (no) is a true answer for any type, one that generates too: a capability with nothing to hold would
be the same flag spelled as a base class.

This module imports nothing of lib.tasks: lib.tasks.model reads it (Exported), and lib.tasks.base builds the
types' models with lib.tasks.model, so an import of lib.tasks.base here would close a cycle.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from lib.config.params import TaskConfig


# model side: export, serving, distillation

class Exported:
    """transformers has a task model of the type's shape: where a family computes the type's head, the
    saved folder is that model (lib.tasks.model.save_task_model; each family names its class of the shape,
    lib.models.families.base), and its card names the hub's task. A type without it keeps its head in
    head.safetensors, and classifier.json's "transformers" says why."""

    # the shape of transformers' task model the type exports as (SEQUENCE_CLASSIFICATION, ...)
    task_model: str
    pipeline_tag: str  # the hub's task of that model (a model card's pipeline_tag)

    def export_config(self, label_names: list[str]) -> dict[str, Any]:
        """The keys of transformers' config.json that make an exported checkpoint this type's model."""
        return {}

    def export_output(self, layer: dict[str, torch.Tensor], info: dict[str, Any],
                      inverse: bool = False) -> dict[str, torch.Tensor]:
        """The head's output layer ({"weight", "bias" where it has one}) as transformers' model of this type
        reads it, or with `inverse` the one it came from (`info`: the task's, as saved with the model)."""
        return layer


class Served:
    """lib/serving predicts it from raw text (TextClassifier, ONNX Runtime, MLflow pyfunc), so evaluate also
    runs its models in ONNX Runtime and logs them as pyfunc models."""

    def encode_texts(self, texts: list[str], text_pairs: list[str] | None, encoding, tokenizer,
                     special: dict[str, int]) -> list:
        """Model inputs of raw texts (and their second texts), as training encoded the task's: `encoding` has
        the task's max_len, truncation and text_pair_field (a TaskConfig, or what classifier.json saved)."""
        raise NotImplementedError


class Distilled:
    """lib/training/distill trains a student on its teacher's outputs."""

    def soft_loss(self, student: torch.Tensor, teacher: torch.Tensor, batch: dict[str, torch.Tensor],
                  temperature: float) -> torch.Tensor:
        """The student's loss against the teacher's outputs on a batch (padded alike), a mean over the
        units TaskType.units counts: by default KL over the last dimension (classes, choices)."""
        return soft_loss(student, teacher, temperature)


class UnlabeledTransfer(Distilled):
    """distill.unlabeled: in-domain texts the teacher labels for the student, beside the task's train rows."""

    def read_unlabeled(self, cfg: TaskConfig, split: str, limit: int | None, exclude: set[int],
                       key: str) -> tuple[list, dict[str, int]]:
        """(items with the UNLABELED label, skipped rows by reason): at most `limit` texts of `split` for a
        teacher to label, none whose text_hash(hash_text) is in `exclude`."""
        raise NotImplementedError


def soft_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(teacher_T || student_T) averaged over the batch, times T^2 (the distributions over the last dim)."""
    return F.kl_div(F.log_softmax(student_logits / temperature, -1), F.log_softmax(teacher_logits / temperature, -1),
                    log_target=True, reduction="batchmean") * temperature**2

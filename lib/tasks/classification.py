"""Classification of one text or a pair (lib/tasks/shared.py reads, labels and encodes): cross-entropy over
the classes; accuracy, F1 and MCC with the confusion matrix."""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F

from lib.config.params import TaskConfig
from lib.evaluation.metrics import compute_metrics, confusion_matrix
from lib.tasks.base import TaskType
from lib.tasks.shared import Example, TaskData, collate, load_task


class Classification(TaskType):
    name = "classification"

    def load(self, name: str, cfg: TaskConfig, tokenizer, special: dict[str, int], *, dev_fraction: float,
             dev_max: int, max_train: int | None = None, max_eval: int | None = None,
             causal: bool = False) -> TaskData:
        return load_task(name, cfg, tokenizer, special, dev_fraction=dev_fraction, dev_max=dev_max,
                         max_train=max_train, max_eval=max_eval)

    def n_outputs(self, task: TaskData) -> int:
        return len(task.label_names)

    def collate(self, examples: Sequence[Example], pad_id: int, task: TaskData) -> dict[str, torch.Tensor]:
        return vars(collate(examples, pad_id))

    def class_names(self, task: TaskData) -> list[str]:
        return task.label_names

    def loss(self, outputs: torch.Tensor, batch: dict[str, torch.Tensor], task: TaskData) -> torch.Tensor:
        return F.cross_entropy(outputs.float(), batch["labels"])

    def predict(self, outputs: torch.Tensor, examples: Sequence[Example], task: TaskData) -> list[int]:
        return outputs.argmax(-1).tolist()

    def score(self, task: TaskData, split: str, predictions: list[int], metrics: list[str],
              calibration: dict[str, Any] | None = None) -> tuple[dict[str, float], dict[str, Any]]:
        examples = task.dev if split == "dev" else task.eval
        return scores_of(torch.tensor(predictions), torch.tensor([e.label for e in examples]), metrics,
                         len(task.label_names))


def scores_of(predicted: torch.Tensor, labels: torch.Tensor, metrics: list[str],
              n_classes: int) -> tuple[dict[str, float], dict[str, Any]]:
    """(metrics, {"confusion": matrix, rows = true class}) of predicted classes."""
    return (compute_metrics(metrics, predicted, labels, n_classes),
            {"confusion": confusion_matrix(predicted, labels, n_classes).tolist()})


TYPE = Classification()

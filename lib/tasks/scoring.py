"""The one way a task model's predictions and scores are computed, by finetune, distill, evaluate and
lib.serving.predict alike: examples batched by length (lib.data.encoding.batch_indices), each batch
collated, run and read as the task's type says (lib/tasks), at the run's precision. Equal inputs in the
same batches give the same numbers wherever a model is scored.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from lib.config.params import ImplConfig
from lib.core import distributed, runtime
from lib.core.distributed import Context
from lib.data.encoding import batch_indices
from lib.tasks import TYPES
from lib.tasks.base import TaskData, move
from lib.tasks.model import TaskModel


def predict_all(model: TaskModel, task: TaskData, examples: list, batch_size: int, pad_id: int, device: torch.device,
                impl: ImplConfig, context: Context = Context(),
                read: Callable[[torch.Tensor, list], list] | None = None,
                on_batch: Callable[[], None] = lambda: None) -> list:
    """The task type's prediction for each of `examples` (in their order: TaskType.predict_batch per
    batch), the model in eval mode and reading them as text in the task's language (TaskModel.read_as);
    `read`: instead, what to keep of a batch's forward outputs (on the CPU) for its examples
    (TextClassifier: the class probabilities). Under torchrun each rank predicts every world-th batch,
    in step with the others (a sharded model's forward is a collective), and every rank gets all of them.
    on_batch: called after each of this rank's batches (a progress line)."""
    model.eval()
    model.read_as(task.language)
    kind = TYPES[task.type]
    precision = runtime.resolve_precision(impl.precision, device)

    @torch.no_grad()
    def predict(group: list[int]) -> list:
        part = [examples[i] for i in group]
        batch = move(kind.collate(part, pad_id, task), device)
        with runtime.autocast(device, precision):
            predicted = kind.predict_batch(model, batch, part, task) if read is None else kind.forward(model, batch)[0]
        if read is not None:
            predicted = read(predicted.cpu(), part)
        on_batch()
        return predicted

    groups = batch_indices(examples, batch_size)
    predictions: list = [None] * len(examples)
    for group, predicted in zip(groups, distributed.spread(context, groups, predict)):
        for i, prediction in zip(group, predicted):
            predictions[i] = prediction
    return predictions


def score_split(model: TaskModel, task: TaskData, split: str, metrics: list[str], batch_size: int, pad_id: int,
                device: torch.device, impl: ImplConfig, context: Context = Context(),
                calibration: dict[str, Any] | None = None) -> tuple[dict[str, float], dict[str, Any]]:
    """(metrics, extras) of the model on task.dev ("dev") or task.eval ("eval"), as the task's type scores them."""
    examples = task.dev if split == "dev" else task.eval
    predictions = predict_all(model, task, examples, batch_size, pad_id, device, impl, context)
    return TYPES[task.type].score(task, split, predictions, metrics, calibration)

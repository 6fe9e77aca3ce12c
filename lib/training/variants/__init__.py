"""Finetune variants, looked up by name: the ways finetune turns the adapted model into a task's model,
so that each trick's value shows next to its baseline.

A variant builds its task model from the adapted backbone and trains it, and says what the rest of the
chain asks of it (its label in the report, whether its weights start random). The contract:

    result, model = run_variant(name, task, metrics, adapted, cfg, impl, device, seed, pad_id, ...)

A new variant is a module in this package with a subclass of `Variant` (lib/training/variants/base.py:
`TrainedVariant` for one trained in epochs, which only says what it trains and how) decorated with
`@register`, and its settings, a dataclass section `finetune.<name>` of lib/config/params.py's
FinetuneConfig; every module here is imported below, so nothing else changes (`check_variants`
validates finetune.variants against the registry).
"""
from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Callable

import torch

from lib.config.params import FinetuneConfig, ImplConfig, Params, ParamsError, check_choice
from lib.tasks import task_type
from lib.core.distributed import Context
from lib.models.architectures import Transformer
from lib.tasks.base import TaskData
from lib.tasks.model import TaskModel
from lib.training.finetune import RunResult, run_name
from lib.training.variants.base import VARIANTS


def check_variants(params: Params) -> None:
    """finetune.variants against the registry (a check of lib.config.params.load_params, for the stages
    that finetune)."""
    for i, name in enumerate(params.finetune.variants):
        check_choice(name, VARIANTS, f"finetune.variants[{i}]")
        if VARIANTS[name].needs_head:
            for task in params.finetune.tasks:
                kind = task_type(params.tasks[task])
                if kind.headless:
                    raise ParamsError(f"finetune.variants[{i}]: {name} trains a head on the model's states, and "
                                      f"finetune.tasks has {task}, a {kind.name} task, which has none; "
                                      f"leave {name} out")


def run_variant(name: str, task: TaskData, metrics: list[str], adapted: Transformer, cfg: FinetuneConfig,
                impl: ImplConfig, device: torch.device, seed: int, pad_id: int, checkpoint_dir: Path, fingerprint: str,
                on_epoch: Callable[[dict[str, float]], None] = lambda row: None,
                context: Context = Context()) -> tuple[RunResult, TaskModel]:
    """Train variant `name` on task.train, pick its best epoch on task.dev, score it on task.eval.
    Returns the result and the classifier with its best weights (on the CPU). A variant trained in epochs
    keeps their checkpoints in checkpoint_dir and, started again with the same fingerprint, resumes after
    its last finished epoch. Under torchrun every rank calls it: a variant trained in epochs trains
    data-parallel, each rank its share of every batch; the frozen probe's ranks share the feature
    extraction and each fits the same probe. With impl.strategy fsdp the model is sharded over the ranks
    and the returned one is whole on rank 0 only."""
    torch.manual_seed(seed)
    label = f"finetune: {run_name(task.name, name, seed)}"
    return VARIANTS[name].run(task, metrics, adapted, cfg, impl, device, seed, pad_id, checkpoint_dir, fingerprint,
                              on_epoch, context, label)


for _module in pkgutil.iter_modules(__path__):  # each variant module registers itself on import
    importlib.import_module(f"{__name__}.{_module.name}")

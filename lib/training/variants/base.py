"""The finetune variant interface (see lib/training/variants/__init__.py) and the registry variants join by
name. A variant builds its model through the task's type (TaskType.head, TaskType.build_model): it names the
head it wants, the type gives it its shape."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, ClassVar

import torch

from lib.config.params import FinetuneConfig, ImplConfig
from lib.core.distributed import Context
from lib.models.architectures import Transformer
from lib.tasks import DEFAULT_TYPE, TYPES
from lib.tasks.base import TaskData, TaskType
from lib.tasks.model import TaskModel
from lib.training.finetune import RunResult, Setup, run_trained


class Variant:
    """One way to finetune: its model from the adapted one, how it trains it, what others show of it."""

    name: ClassVar[str]  # also the key of its settings: finetune.<name> (lib.config.params.FinetuneConfig)
    label: ClassVar[str]  # what the report calls its models
    # its weights start random, not from the adapted model: pretraining's value is measured against it, and
    # the adapted model's chain is not its model's
    random_init: ClassVar[bool] = False
    # it trains a head on the backbone's fixed or mixed states, which a headless type's model has none of
    # (TaskType.headless: one that writes text with the pretrained LM head)
    needs_head: ClassVar[bool] = False

    def run(self, task: TaskData, metrics: list[str], adapted: Transformer, cfg: FinetuneConfig, impl: ImplConfig,
            device: torch.device, seed: int, pad_id: int, checkpoint_dir: Path, fingerprint: str,
            on_epoch: Callable[[dict[str, float]], None], context: Context,
            label: str) -> tuple[RunResult, TaskModel]:
        """See lib.training.variants.run_variant (which has seeded torch's RNG); `label` names the run in
        progress lines and errors."""
        raise NotImplementedError


class TrainedVariant(Variant):
    """A variant trained by gradient steps in epochs (lib.training.finetune.FullTrainer): it says what it
    trains and how (a Setup)."""

    def setup(self, adapted: Transformer, n_outputs: int, cfg: FinetuneConfig,
              kind: TaskType = TYPES[DEFAULT_TYPE]) -> Setup:
        """Its model (around a copy of `adapted`, which stays as it is) and recipe, for a task of type
        `kind` with n_outputs outputs per sequence or token."""
        raise NotImplementedError

    def run(self, task: TaskData, metrics: list[str], adapted: Transformer, cfg: FinetuneConfig, impl: ImplConfig,
            device: torch.device, seed: int, pad_id: int, checkpoint_dir: Path, fingerprint: str,
            on_epoch: Callable[[dict[str, float]], None], context: Context,
            label: str) -> tuple[RunResult, TaskModel]:
        kind = TYPES[task.type]
        plan = self.setup(adapted, kind.n_outputs(task), cfg, kind)
        return run_trained(self.name, plan, task, metrics, cfg, impl, device, seed, pad_id, checkpoint_dir,
                           fingerprint, on_epoch, context, label)


VARIANTS: dict[str, Variant] = {}


def register(cls: type[Variant]) -> type[Variant]:
    """Class decorator: make (an instance of) `cls` runnable by its `name`."""
    if cls.name in VARIANTS and type(VARIANTS[cls.name]) is not cls:
        raise ValueError(f"finetune variant '{cls.name}' is registered twice")
    VARIANTS[cls.name] = cls()
    return cls


"""`from_scratch`: `plain` on a randomly initialised model of the adapted one's shape, with its own LR
(random weights need a larger one): what pretraining is worth. Settings: finetune.from_scratch."""
from __future__ import annotations

from lib.config.params import FinetuneConfig
from lib.models.architectures import Transformer, build_model
from lib.tasks import DEFAULT_TYPE, TYPES
from lib.tasks.base import TaskType
from lib.training.finetune import Setup
from lib.training.optim import Schedule
from lib.training.variants.base import TrainedVariant, register


@register
class FromScratch(TrainedVariant):
    name = "from_scratch"
    label = "from scratch"
    random_init = True

    def setup(self, adapted: Transformer, n_outputs: int, cfg: FinetuneConfig,
              kind: TaskType = TYPES[DEFAULT_TYPE]) -> Setup:
        backbone = build_model(adapted.cfg)
        return Setup(kind.build_model(backbone, kind.head("transformers", backbone.cfg, n_outputs, cfg)),
                     cfg.from_scratch.lr, 1.0, Schedule("linear", warmup_frac=cfg.from_scratch.warmup_frac))

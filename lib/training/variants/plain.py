"""`plain`: the adapted model, the head transformers' model of its family has for the task's type
(TaskType.head's "transformers" head; an imported BERT's pooler is its start), every layer from
the start, one LR with linear warmup and decay: the usual BERT/GPT recipe. Settings: finetune.plain."""
from __future__ import annotations

import copy

from lib.config.params import FinetuneConfig
from lib.models.architectures import Transformer
from lib.tasks import DEFAULT_TYPE, TYPES
from lib.tasks.base import TaskType
from lib.training.finetune import Setup
from lib.training.optim import Schedule
from lib.training.variants.base import TrainedVariant, register


@register
class Plain(TrainedVariant):
    name = "plain"
    label = "plain finetune"

    def setup(self, adapted: Transformer, n_outputs: int, cfg: FinetuneConfig,
              kind: TaskType = TYPES[DEFAULT_TYPE]) -> Setup:
        backbone = copy.deepcopy(adapted)
        return Setup(kind.build_model(backbone, kind.head("transformers", backbone.cfg, n_outputs, cfg)), cfg.plain.lr,
                     1.0, Schedule("linear", warmup_frac=cfg.plain.warmup_frac))

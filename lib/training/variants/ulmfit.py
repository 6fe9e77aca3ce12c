"""`ulmfit` (Howard & Ruder 2018): the adapted model, ULMFiT's concat-pooling classifier block, gradual
unfreezing (only the top layer group, which holds the head, trains at first; one more group from the top
joins every `unfreeze_every` steps, or every epoch), discriminative LRs (each group's LR = the one above /
lr_decay) and the slanted triangular schedule over the whole run. Settings: finetune.ulmfit."""
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
class Ulmfit(TrainedVariant):
    name = "ulmfit"
    label = "ULMFiT"

    def setup(self, adapted: Transformer, n_outputs: int, cfg: FinetuneConfig,
              kind: TaskType = TYPES[DEFAULT_TYPE]) -> Setup:
        own = cfg.ulmfit
        # the ablation without STLR warms up and decays as plain does
        schedule = (Schedule("stlr", cut_frac=own.cut_frac, stlr_ratio=own.stlr_ratio) if own.stlr
                    else Schedule("linear", warmup_frac=own.warmup_frac))
        model = kind.build_model(copy.deepcopy(adapted), kind.head("block", adapted.cfg, n_outputs, cfg))
        return Setup(model, own.lr, own.lr_decay, schedule,
                     unfreeze_every=own.unfreeze_every if own.gradual_unfreezing else None)

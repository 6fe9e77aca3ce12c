"""`elmo`: ELMo's feature-based approach (Peters et al. 2018): the backbone frozen as in `frozen` (no
gradient, eval mode), the features read a learned softmax-weighted mix of every layer's states scaled by
gamma (eq. 1, lib.tasks.model.ScalarMix) instead of the last layer's, and ULMFiT's concat block on
them; the mix and the block train with one LR, linear warmup and decay. The run reports the learned layer
weights and gamma (RunResult.learned): which layers the task uses, next to `frozen`'s last layer only.
Any backbone takes it: on a causal one each position's mixed state still reads only its left context, and
the block reads the last token, which has read the whole text. Settings: finetune.elmo."""
from __future__ import annotations

import copy
import dataclasses

from lib.config.params import FinetuneConfig
from lib.models.architectures import Transformer
from lib.tasks import DEFAULT_TYPE, TYPES
from lib.tasks.base import TaskType
from lib.training.finetune import Setup
from lib.training.optim import Schedule
from lib.training.variants.base import TrainedVariant, register


@register
class Elmo(TrainedVariant):
    name = "elmo"
    needs_head = True
    label = "ELMo layer mix (frozen)"

    def setup(self, adapted: Transformer, n_outputs: int, cfg: FinetuneConfig,
              kind: TaskType = TYPES[DEFAULT_TYPE]) -> Setup:
        head = dataclasses.replace(kind.head("block", adapted.cfg, n_outputs, cfg), mix=cfg.elmo.mix)
        return Setup(kind.build_model(copy.deepcopy(adapted), head), cfg.elmo.lr, 1.0,
                     Schedule("linear", warmup_frac=cfg.elmo.warmup_frac), frozen_backbone=True)

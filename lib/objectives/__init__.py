"""Pretraining objectives, plugged into the trainer by name.

An objective owns its model(s) and turns a batch of token windows into a loss; the trainer knows
nothing else about it. The contract:

    objective = build_objective(name, params, vocab_size, special_ids)
    loss, metrics = objective(tokens, word_starts)  # (B, T+1) windows of packed documents
    model = objective.backbone()                     # the Transformer later stages fine-tune

`metrics` holds detached scalar tensors, always with "loss". All randomness (masks, samples) comes
from torch's global RNG, which the trainer checkpoints and, for validation, seeds.

A new objective is a module in this package with a subclass of `Objective` decorated with `@register`;
every module here is imported below, so nothing else changes (but `lib.config.Objective` lists the
names params.yaml accepts).
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, ClassVar

from torch import Tensor, nn

from lib.config import Params
from lib.errors import UserError

if TYPE_CHECKING:
    from lib.model import Transformer


class Objective(nn.Module):
    """Base class: a module that maps (tokens, word_starts) to (loss, metrics)."""

    name: ClassVar[str]
    causal: ClassVar[bool]

    def __init__(self, params: Params, vocab_size: int, special_ids: dict[str, int]):
        super().__init__()
        self.vocab_size = vocab_size
        self.special_ids = dict(special_ids)

    def forward(self, tokens: Tensor, word_starts: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """tokens (B, T+1) long, word_starts (B, T+1) bool -> (scalar loss, detached scalar metrics)."""
        raise NotImplementedError

    def backbone(self) -> Transformer:
        """The Transformer that later stages fine-tune."""
        raise NotImplementedError


OBJECTIVES: dict[str, type[Objective]] = {}


def register(cls: type[Objective]) -> type[Objective]:
    """Class decorator: make `cls` buildable by its `name`."""
    if cls.name in OBJECTIVES and OBJECTIVES[cls.name] is not cls:
        raise ValueError(f"objective '{cls.name}' is registered twice")
    OBJECTIVES[cls.name] = cls
    return cls


def build_objective(name: str, params: Params, vocab_size: int, special_ids: dict[str, int]) -> Objective:
    if name not in OBJECTIVES:
        raise UserError(f"objective: '{name}' is not one of {', '.join(sorted(OBJECTIVES))}")
    return OBJECTIVES[name](params, vocab_size, special_ids)


for _module in pkgutil.iter_modules(__path__):  # each objective module registers itself on import
    importlib.import_module(f"{__name__}.{_module.name}")

"""Optimizers and LR schedules by name, and the optimizer step, shared by every stage that trains.

- `OPTIMIZERS`: each optimizer by the name a stage's `optimizer` key gives (an `OptimizerConfig`:
  adamw, AdamW with its betas, eps and weight decay from the stage's params), built over layer groups
  with ULMFiT's discriminative LRs (`discriminative_groups`).
- `SCHEDULES`: each LR schedule by name, as a multiplier of the peak LR per step (`Schedule` names one
  and holds what it reads): stlr (`slanted_triangular`), linear and cosine (`warmup_decay`).
- `optimizer_and_schedule`: the one call that builds both, for pretrain, adapt, finetune and distill;
  `check_optimizers` checks params' names against the registries at start.
- `Stepper`: the optimizer step after backward. A loss that is not finite skips its batch (the
  gradients are dropped, the schedule moves on: a retry would see the same batch); more than
  max_bad_steps such losses in a row stop the run with an error that says what to do.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from lib.config.errors import UserError
from lib.config.params import OptimizerConfig, Params, TrainConfig, check_choice

Multiplier = Callable[[int], float]  # step -> the LR as a share of the peak LR


def discriminative_groups(module: nn.Module, layer_groups: list[list[nn.Parameter]], lr: float, lr_decay: float,
                          weight_decay: float, decay_embeddings: bool = True) -> list[dict[str, Any]]:
    """Two optimizer groups per layer group, bottom to top: weight decay on matrices (embeddings as
    configured), never on biases and norm weights. ULMFiT's discriminative LRs: the top layer group
    trains at `lr`, each one below at the LR above it / lr_decay. Parameters of `module` in no layer
    group join the top one (an objective's generator, a classifier head). Frozen parameters are
    included, so that unfreezing later needs no new optimizer; while frozen they have no gradient,
    which AdamW skips. Each group carries "layer": its layer group's index."""
    embeddings = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    grouped = {id(p) for group in layer_groups for p in group}
    rest = [p for p in module.parameters() if id(p) not in grouped]
    layers = [*layer_groups[:-1], [*layer_groups[-1], *rest]] if layer_groups else [rest]
    groups = []
    for i, params in enumerate(layers):
        layer_lr = lr / lr_decay ** (len(layers) - 1 - i)
        decay = [p for p in params if p.ndim >= 2 and (decay_embeddings or id(p) not in embeddings)]
        no_decay = [p for p in params if not (p.ndim >= 2 and (decay_embeddings or id(p) not in embeddings))]
        groups += [{"params": decay, "weight_decay": weight_decay, "lr": layer_lr, "layer": i},
                   {"params": no_decay, "weight_decay": 0.0, "lr": layer_lr, "layer": i}]
    return groups


def adamw(groups: list[dict[str, Any]], lr: float, cfg: OptimizerConfig,
          device: torch.device) -> torch.optim.Optimizer:
    """AdamW with cfg's betas and eps (the groups carry the weight decay); fused on CUDA."""
    return torch.optim.AdamW(groups, lr=lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=device.type == "cuda")


# name -> (parameter groups, peak LR, the stage's optimizer params, device) -> the optimizer
OptimizerBuilder = Callable[[list[dict[str, Any]], float, OptimizerConfig, torch.device], torch.optim.Optimizer]
OPTIMIZERS: dict[str, OptimizerBuilder] = {"adamw": adamw}


def build_optimizer(module: nn.Module, cfg: OptimizerConfig, device: torch.device, lr: float, lr_decay: float = 1.0,
                    layer_groups: list[list[nn.Parameter]] | None = None,
                    decay_embeddings: bool = True) -> torch.optim.Optimizer:
    """cfg.optimizer over `module`, its groups as discriminative_groups makes them."""
    groups = discriminative_groups(module, layer_groups or [], lr, lr_decay, cfg.weight_decay, decay_embeddings)
    return OPTIMIZERS[cfg.optimizer](groups, lr, cfg, device)


@dataclass(frozen=True)
class Schedule:
    """An LR schedule of SCHEDULES and the settings it reads."""

    name: str
    warmup_steps: int = 0  # linear, cosine: steps from 1/warmup_steps of the peak LR up to it
    warmup_frac: float | None = None  # linear, cosine: else the warmup as a share of the run's steps (at least 1)
    min_ratio: float = 0.0  # linear, cosine: the multiplier reached at the last step
    cut_frac: float = 0.1  # stlr: the share of the steps the LR rises
    stlr_ratio: float = 32.0  # stlr: how many times smaller than the peak the LR is at both ends

    def warmup(self, total_steps: int) -> int:
        """The warmup steps of a run of `total_steps`."""
        return self.warmup_steps if self.warmup_frac is None else max(1, round(total_steps * self.warmup_frac))

    def multiplier(self, total_steps: int) -> Multiplier:
        """The LR multiplier of each step of a run of `total_steps`."""
        return SCHEDULES[self.name](self, total_steps)


def optimizer_and_schedule(module: nn.Module, cfg: OptimizerConfig, device: torch.device, lr: float,
                           schedule: Schedule, total_steps: int, lr_decay: float = 1.0,
                           layer_groups: list[list[nn.Parameter]] | None = None, decay_embeddings: bool = True,
                           ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """What every stage trains with: the optimizer of build_optimizer and `schedule` over total_steps."""
    optimizer = build_optimizer(module, cfg, device, lr, lr_decay, layer_groups, decay_embeddings)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule.multiplier(total_steps))


def check_optimizers(params: Params) -> None:
    """Each training section's `optimizer` (and a token-budget section's `schedule`) against the registries
    (a check of lib.config.params.load_params, for the stages that train)."""
    for section in dataclasses.fields(params):
        cfg = getattr(params, section.name)
        if isinstance(cfg, OptimizerConfig):
            check_choice(cfg.optimizer, OPTIMIZERS, f"{section.name}.optimizer")
        if isinstance(cfg, TrainConfig):
            check_choice(cfg.schedule, SCHEDULES, f"{section.name}.schedule")


def slanted_triangular(total_steps: int, cut_frac: float, ratio: float) -> Multiplier:
    """ULMFiT's STLR (Howard & Ruder 2018, eq. 3) as a multiplier of the peak LR: from 1/ratio up to 1
    over the first cut_frac of the steps, then linearly back down to 1/ratio at total_steps."""
    cut = max(1, math.floor(total_steps * cut_frac))

    def multiplier(step: int) -> float:
        if step < cut:
            p = step / cut
        else:
            p = max(0.0, 1 - (step - cut) / max(1, total_steps - cut))
        return (1 + p * (ratio - 1)) / ratio
    return multiplier


def warmup_decay(total_steps: int, warmup_steps: int, min_ratio: float = 0.0,
                 shape: str = "linear") -> Multiplier:
    """Linear warmup from 1/warmup_steps to 1, then linear or cosine decay to min_ratio at total_steps."""
    def multiplier(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        decayed = 1 - progress if shape == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
        return min_ratio + (1 - min_ratio) * decayed
    return multiplier


# name -> (its Schedule, the run's steps) -> the LR multiplier of each step
SCHEDULES: dict[str, Callable[[Schedule, int], Multiplier]] = {
    "linear": lambda s, total: warmup_decay(total, s.warmup(total), s.min_ratio, "linear"),
    "cosine": lambda s, total: warmup_decay(total, s.warmup(total), s.min_ratio, "cosine"),
    "stlr": lambda s, total: slanted_triangular(total, s.cut_frac, s.stlr_ratio),
}


class Stepper:
    """The optimizer step of every loop, after the loss's backward. `where` names the run in its
    error, `kept` says what survives it (e.g. the last checkpoint)."""

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, cfg: OptimizerConfig,
                 where: str, kept: str = ""):
        self.module, self.optimizer, self.scheduler, self.cfg = module, optimizer, scheduler, cfg
        self.where, self.kept = where, kept
        self.grad_norm: torch.Tensor | None = None  # of the last step taken, before clipping (if it clips)

    def step(self, loss: float, number: int, bad_steps: int) -> int:
        """Step `number` (1-based, for the error) of a batch whose loss, the same on every rank, is
        `loss`, after `bad_steps` non-finite losses in a row: clip, step, advance the schedule and
        clear the gradients, or skip the batch when the loss is not finite. Returns the non-finite
        losses in a row now (0: the weights changed), which the caller keeps in its checkpointed state."""
        if not math.isfinite(loss):
            self.optimizer.zero_grad(set_to_none=True)
            bad_steps += 1
            if bad_steps > self.cfg.max_bad_steps:
                raise UserError(f"{self.where}: loss is {loss} at step {number}, {bad_steps} bad steps in a row; "
                                f"lower the lr or check the data{self.kept}")
            self.scheduler.step()
            return bad_steps
        if self.cfg.clip_norm > 0:
            self.grad_norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.cfg.clip_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return 0



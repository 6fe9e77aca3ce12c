"""The optimizer, its LR schedules and its step, shared by every training loop.

- `adamw`: AdamW over layer groups with ULMFiT's discriminative LRs, its betas, eps and weight decay
  from the stage's params (an `OptimizerConfig`).
- `slanted_triangular`, `warmup_decay`: the LR schedules, as multipliers of the peak LR.
- `Stepper`: the optimizer step after backward. A loss that is not finite skips its batch (the
  gradients are dropped, the schedule moves on: a retry would see the same batch); more than
  max_bad_steps such losses in a row stop the run with an error that says what to do.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import nn

from lib.config.params import OptimizerConfig
from lib.core.errors import UserError


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


def adamw(module: nn.Module, cfg: OptimizerConfig, device: torch.device, lr: float, lr_decay: float = 1.0,
          layer_groups: list[list[nn.Parameter]] | None = None, decay_embeddings: bool = True) -> torch.optim.AdamW:
    """AdamW over `module` with cfg's betas, eps and weight decay; see discriminative_groups."""
    groups = discriminative_groups(module, layer_groups or [], lr, lr_decay, cfg.weight_decay, decay_embeddings)
    return torch.optim.AdamW(groups, lr=lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=device.type == "cuda")


def slanted_triangular(total_steps: int, cut_frac: float, ratio: float) -> Callable[[int], float]:
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
                 shape: str = "linear") -> Callable[[int], float]:
    """Linear warmup from 1/warmup_steps to 1, then linear or cosine decay to min_ratio at total_steps."""
    def multiplier(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        decayed = 1 - progress if shape == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
        return min_ratio + (1 - min_ratio) * decayed
    return multiplier


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



"""The epoch loop of finetune and distill: an epoch, a dev score, the best epoch's weights kept,
`patience` epochs without a better score end it, and a checkpoint after every epoch, from which a
killed run started again resumes after its last finished epoch and, on CPU, ends with the same weights
as a run that was never interrupted (batch order and dropout come from the seed and the saved RNG
state). Pretraining and adaptation count tokens, not epochs (lib/training/budget_loop.py).
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from lib.config.params import OptimizerConfig
from lib.core import distributed
from lib.core.distributed import Context
from lib.core.io import read_safetensors, write_safetensors
from lib.training.checkpoint import load_checkpoint, save_run
from lib.training.optim import Stepper

BEST_WEIGHTS, EPOCHS = "best.safetensors", "epochs"  # in an EpochLoop's checkpoint directory



@dataclass
class EpochState:
    """Where an EpochLoop is; saved in every epoch's checkpoint."""

    fingerprint: str
    epoch: int = 0  # epochs finished
    steps: int = 0  # batches so far, skipped ones included: where the schedule is
    bad_steps: int = 0
    best_score: float = -math.inf
    best_epoch: int = 0
    bad_epochs: int = 0  # epochs since the best one
    seconds: float = 0.0  # training and dev scoring, over every resumed part
    history: list[dict[str, float]] = field(default_factory=list)  # per epoch: train metrics, lr, dev metrics


class EpochLoop:
    """Epochs of `trained` (what the optimizer updates) that keep the best weights of `kept` (the
    model itself, or the student inside a distiller), in checkpoint_dir: EPOCHS/ holds the last
    epochs' checkpoints, BEST_WEIGHTS the best epoch's weights of `kept`. Under torchrun every rank
    runs it and rank 0 writes."""

    def __init__(self, trained: nn.Module, kept: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                 cfg: OptimizerConfig, *, epochs: int, patience: int, metric: str, checkpoint_dir: Path,
                 fingerprint: str, where: str, context: Context = Context()):
        self.trained, self.kept, self.optimizer, self.scheduler = trained, kept, optimizer, scheduler
        self.epochs, self.patience, self.metric = epochs, patience, metric
        self.checkpoints, self.best_path = checkpoint_dir / EPOCHS, checkpoint_dir / BEST_WEIGHTS
        self.where, self.context = where, context
        self.stepper = Stepper(trained, optimizer, scheduler, cfg, where,
                               f" (the checkpoint after the last finished epoch is kept in {checkpoint_dir})")
        self.state = EpochState(fingerprint)
        saved = load_checkpoint(self.checkpoints, trained, optimizer, scheduler, fingerprint, context.rank)
        if saved is not None and self.best_path.is_file():
            self.state = EpochState(**saved)
            distributed.say(context, f"{where}: resuming after epoch {self.state.epoch}")

    def step(self, loss: float) -> bool:
        """The optimizer step of one batch (after its backward), whether the weights changed; see Stepper.step."""
        self.state.steps += 1
        self.state.bad_steps = self.stepper.step(loss, self.state.steps, self.state.bad_steps)
        return self.state.bad_steps == 0

    def run(self, train_epoch: Callable[[int], dict[str, float]], score_dev: Callable[[], dict[str, float]],
            on_epoch: Callable[[dict[str, float]], None] = lambda row: None) -> EpochState:
        """Epochs of train_epoch(epoch) (which calls `step` per batch and returns its train metrics)
        and score_dev() until `epochs`, or `patience` epochs without a better dev `metric`; then
        `kept` holds the best epoch's weights. on_epoch gets each epoch's row once its checkpoint is
        written."""
        state = self.state
        while state.epoch < self.epochs and state.bad_epochs < self.patience:
            started = time.perf_counter()
            epoch = state.epoch + 1
            train = train_epoch(epoch)
            dev = score_dev()
            row = {"epoch": epoch, **train, "lr": self.scheduler.get_last_lr()[-1],  # the top group's
                   **{f"dev_{k}": v for k, v in dev.items()}}
            state.history.append(row)
            if dev[self.metric] > state.best_score:
                state.best_score, state.best_epoch, state.bad_epochs = dev[self.metric], epoch, 0
                best, _ = distributed.full_state(self.kept, None, self.context)
                if self.context.main:
                    write_safetensors(self.best_path, best)
            else:
                state.bad_epochs += 1
            state.epoch = epoch
            state.seconds += time.perf_counter() - started
            save_run(self.checkpoints, self.trained, self.optimizer, self.scheduler, asdict(state), self.context)
            distributed.barrier(self.context)  # the best weights are on disk before any rank reads them
            on_epoch(row)
        distributed.load_full_state(self.kept, None, read_safetensors(self.best_path))
        return state

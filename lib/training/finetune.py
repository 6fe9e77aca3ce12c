"""ULMFiT step 3 and its baselines: what every finetune variant's run shares, and the epochs of those that
train by gradient steps.

The task's type (lib/tasks: classification, regression, tagging, span_qa, multiple_choice)
gives the batches, the head's shape (one output vector per sequence or per token), the loss and the
scores; everything else here is the same for every type. The variants themselves (ulmfit, plain,
from_scratch, frozen, elmo: what model each builds from the adapted one and how it trains it) are
lib/training/variants, one file each.

A variant trained in epochs (a `Setup`: its model, LR, discriminative LR decay, schedule, gradual
unfreezing, whether its backbone is frozen) keeps the weights of its best epoch on the dev set (the task's
first metric) and stops after `patience` epochs without improvement (lib.training.epoch_loop.EpochLoop,
which checkpoints every epoch, so a killed run resumes after its last finished one). The kept weights
are scored on the evaluation split.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from lib.config.params import FinetuneConfig, ImplConfig
from lib.core import distributed, runtime
from lib.core.distributed import Context
from lib.core.progress import Progress
from lib.data.encoding import batch_indices
from lib.tasks import TYPES
from lib.tasks.base import TaskData
from lib.tasks.base import move
from lib.tasks.capabilities import Calibrated
from lib.tasks.model import TaskModel, lm_loss
from lib.tasks.scoring import score_split
from lib.training.epoch_loop import EpochLoop
from lib.training.optim import Schedule, optimizer_and_schedule


@dataclass
class RunResult:
    task: str
    variant: str
    seed: int
    dev_curve: list[float]  # the selection metric on dev after each epoch
    best_epoch: int  # 1-based
    dev: dict[str, float]
    eval: dict[str, float] | None
    steps: int
    seconds: float
    confusion: list[list[int]] | None = None  # eval split, rows = true class
    history: list[dict[str, float]] = field(default_factory=list)  # per-epoch train loss, lr, dev metrics
    learned: dict[str, Any] = field(default_factory=dict)  # what the report shows of the weights (elmo: the mix's)
    # zero-shot transfer: per task transferred to (tasks.<name>.transfer_from), its evaluation split's metrics
    transfer: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class Setup:
    """What a variant trained in epochs trains, and how."""

    model: TaskModel
    lr: float  # the top layer group's peak LR
    lr_decay: float  # discriminative LRs: each layer group's LR is the one above it / lr_decay
    schedule: Schedule  # over the whole run's steps
    # gradual unfreezing: steps between unfreezing the next layer group from the top (0: every epoch);
    # None: every group trains from the first step
    unfreeze_every: int | None = None
    frozen_backbone: bool = False  # only what is not the backbone trains (elmo)


def run_name(task: str, variant: str, seed: int) -> str:
    """How progress lines name one run: `imdb × ulmfit × seed 1338`."""
    return f"{task} × {variant} × seed {seed}"


def run_trained(variant: str, plan: Setup, task: TaskData, metrics: list[str], cfg: FinetuneConfig, impl: ImplConfig,
                device: torch.device, seed: int, pad_id: int, checkpoint_dir: Path, fingerprint: str,
                on_epoch: Callable[[dict[str, float]], None], context: Context,
                label: str) -> tuple[RunResult, TaskModel]:
    """Train `plan`'s model on task.train in epochs (FullTrainer), pick the best epoch on task.dev, score it
    on task.eval; see lib.training.variants.run_variant."""
    plan.model.read_as(task.language)
    model = plan.model.to(device)
    trainer = FullTrainer(model, plan, task, cfg, impl, device, pad_id, seed, checkpoint_dir, fingerprint, metrics[0],
                          context, label)
    state = trainer.loop.run(trainer.train_epoch, lambda: trainer.score("dev", metrics)[0], on_epoch)
    scoring_started = time.perf_counter()
    dev, evaluated, confusion = final_scores(trainer.score, task, metrics)
    curve = [row[f"dev_{metrics[0]}"] for row in state.history]
    model = distributed.to_cpu(model, context)  # whole on rank 0, which alone reports
    learned = model.mix.learned() if model.mix is not None and context.main else {}
    result = RunResult(task.name, variant, seed, curve, state.best_epoch, dev, evaluated, state.steps,
                       round(state.seconds + time.perf_counter() - scoring_started, 1), confusion, state.history,
                       learned)
    return result, model


def transfer_scores(model: TaskModel, task: TaskData, transfers: dict[str, TaskData], metrics: list[str],
                    cfg: FinetuneConfig, impl: ImplConfig, device: torch.device,
                    pad_id: int) -> dict[str, dict[str, float]]:
    """Zero-shot transfer: the scores of `model`, trained on `task`, on the evaluation split of each task
    in `transfers` (tasks.<name>.transfer_from), each read in its own language, scored as finetune scores
    `task`'s (with what `task`'s dev calibrates, SQuAD 2.0's no-answer threshold). One process: the model
    is whole on rank 0 alone after training (lib.core.distributed.to_cpu); it is left on the CPU."""
    model.to(device)
    batch = cfg.batch_size * 2
    calibration = score_split(model, task, "dev", metrics, batch, pad_id, device, impl)[1] \
        if isinstance(TYPES[task.type], Calibrated) else None
    scores = {name: score_split(model, other, "eval", metrics, batch, pad_id, device, impl, calibration=calibration)[0]
              for name, other in transfers.items()}
    model.to("cpu")
    model.read_as(task.language)
    return scores


def final_scores(score: Callable[..., Any], task: TaskData,
                 metrics: list[str]) -> tuple[dict[str, float], dict[str, float] | None, list[list[int]] | None]:
    """(dev metrics, evaluation split metrics, its confusion matrix where the type has one) of a
    trainer's `score`; None, None for a task without a labeled evaluation split. The evaluation split
    is scored with what dev calibrated (SQuAD 2.0's no-answer threshold)."""
    dev, calibration = score("dev", metrics)
    if task.eval is None:
        return dev, None, None
    evaluated, extras = score("eval", metrics, calibration)
    return dev, evaluated, extras.get("confusion")


class FullTrainer:
    """Trains a Setup's model (what of it is not frozen) on batches of the task's type, in an
    EpochLoop over checkpoint_dir; progress lines (`label`) count the batches of every epoch, so
    their ETA is that of the whole run if patience does not end it sooner."""

    def __init__(self, model: TaskModel, plan: Setup, task: TaskData, cfg: FinetuneConfig, impl: ImplConfig,
                 device: torch.device, pad_id: int, seed: int, checkpoint_dir: Path, fingerprint: str, metric: str,
                 context: Context = Context(), label: str = "finetune"):
        self.model, self.task, self.cfg, self.impl, self.device, self.pad_id, self.seed = (
            model, task, cfg, impl, device, pad_id, seed)
        self.kind = TYPES[task.type]
        self.precision = runtime.resolve_precision(impl.precision, device)
        self.context = context
        self.frozen = plan.frozen_backbone
        if self.frozen:  # before wrapping, so that DDP expects no gradient for it
            model.backbone.requires_grad_(False)
        # wrapped while every other parameter still trains, so that DDP syncs the groups unfrozen later
        # (FSDP reads requires_grad at every forward)
        self.synced = distributed.wrap(model, context, device, impl.strategy)
        self.aux = cfg.aux_lm_weight > 0 and model.backbone.cfg.causal and not self.frozen  # a frozen LM learns nothing
        self.groups = model.layer_groups(with_lm_head=self.aux)
        if self.frozen:  # one group: what trains
            self.groups = [[p for group in self.groups for p in group if p.requires_grad]]
        self.steps_per_epoch = math.ceil(len(task.train) / cfg.batch_size)
        total = self.steps_per_epoch * cfg.epochs
        optimizer, scheduler = optimizer_and_schedule(model, cfg, device, plan.lr, plan.schedule, total, plan.lr_decay,
                                                      self.groups)
        self.loop = EpochLoop(model, model, optimizer, scheduler, cfg, epochs=cfg.epochs, patience=cfg.patience,
                              metric=metric, checkpoint_dir=checkpoint_dir, fingerprint=fingerprint, where=label,
                              context=context)
        self.unfreeze_every = 0 if plan.unfreeze_every is None else plan.unfreeze_every or self.steps_per_epoch
        self.progress = Progress(label, total, "batches", out=lambda line: distributed.say(context, line))
        self.progress.start(self.loop.state.steps, self.loop.state.seconds)
        self._set_trainable()

    def _set_trainable(self) -> None:
        """Gradual unfreezing: groups from the top, one more every unfreeze_every steps."""
        n = len(self.groups)
        thawed = n if not self.unfreeze_every else min(n, 1 + self.loop.state.steps // self.unfreeze_every)
        for i, group in enumerate(self.groups):
            for p in group:
                p.requires_grad_(i >= n - thawed)

    def train_epoch(self, epoch: int) -> dict[str, float]:
        self.model.train()
        if self.frozen:  # its features, as `frozen` reads them: no dropout
            self.model.backbone.eval()
        total, train, kind = 0.0, self.task.train, self.kind
        for group in batch_indices(train, self.cfg.batch_size, seed=self.seed * 1000 + epoch):
            # each term weighted by this rank's share of the batch's units (examples, tagged tokens) or
            # predicted tokens, so that DDP's mean over the ranks is the whole batch's loss
            mine, scale = self.context.part(group)
            batch = move(kind.collate([train[i] for i in mine], self.pad_id, self.task), self.device)
            with runtime.autocast(self.device, self.precision):
                outputs, hidden = kind.forward(self.synced, batch)
                units = [sum(kind.units(train[i]) for i in part) for part in (mine, group)]
                loss = kind.loss(outputs, batch, self.task) * distributed.part_weight(*units, scale)
                if self.aux:  # a mean over the predicted tokens, len(ids) - 1 per example
                    targets = [sum(len(train[i].ids) - 1 for i in part) for part in (mine, group)]
                    lm = lm_loss(self.model.backbone, hidden, batch["input_ids"], batch["attention_mask"])
                    loss = loss + self.cfg.aux_lm_weight * lm * distributed.part_weight(*targets, scale)
            loss.backward()
            batch_loss = distributed.total(self.context, loss.item() / self.context.world, self.device)  # the batch's
            self.loop.step(batch_loss)
            if self.unfreeze_every:
                self._set_trainable()
            total += batch_loss * len(group)
            self.progress.tick(self.loop.state.steps, f"  epoch {epoch} of {self.cfg.epochs}")
        return {"train_loss": total / max(len(train), 1)}

    def score(self, split: str, metrics: list[str],
              calibration: dict[str, Any] | None = None) -> tuple[dict[str, float], dict[str, Any]]:
        return score_split(self.model, self.task, split, metrics, self.cfg.batch_size * 2, self.pad_id, self.device,
                           self.impl, self.context, calibration)

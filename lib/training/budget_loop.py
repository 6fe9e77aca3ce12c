"""The token-budgeted training loop of pretrain and adapt (its optimizer and step: lib/training/optim.py).

It knows nothing of models or objectives: it trains any module whose forward(batch) returns (loss,
metrics), reads batches (lib/data/windows.py's Batch: named tensors, whatever the objective reads) by
step number and passes each whole, and reports through callbacks. A run's length is a budget of
tokens (which also sets the LR schedule) or minutes, whichever comes first.
Killed at any point and started again, it resumes from its last checkpoint and, on CPU, follows
the same loss curve step for step as a run that was never interrupted.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from lib.config.errors import UserError
from lib.config.params import ImplConfig, TrainConfig
from lib.core import distributed, runtime
from lib.core.distributed import Context
from lib.core.progress import Progress
from lib.data.windows import Batch, BatchStream
from lib.training.checkpoint import load_checkpoint, save_run
from lib.training.optim import Schedule, Stepper, optimizer_and_schedule

# dense bf16 peak FLOP/s by device name, for MFU; devices not listed get no MFU figure
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12, "A10G": 70e12}


class Callback(Protocol):
    def on_log(self, step: int, metrics: dict[str, float]) -> None: ...
    def on_eval(self, step: int, metrics: dict[str, float]) -> None: ...


def step_tokens(cfg: TrainConfig) -> int:
    """Tokens per optimizer step: the global batch."""
    return cfg.seq_len * cfg.batch_size * cfg.grad_accum


def flops_budget(cfg: TrainConfig, flops_per_token: float, key: str) -> TrainConfig:
    """cfg with budget_tokens set to what cfg.budget_flops buys at `flops_per_token` (cfg itself when
    budget_flops is null): at equal FLOPs an objective that computes more per token trains on fewer."""
    if cfg.budget_flops is None:
        return cfg
    tokens = int(cfg.budget_flops // flops_per_token)
    if tokens < step_tokens(cfg):
        raise UserError(f"{key}.budget_flops: {cfg.budget_flops:.3g} buys {tokens:,} tokens at {flops_per_token:.3g} "
                        f"FLOPs per token, less than one step ({step_tokens(cfg):,} tokens); raise it")
    return dataclasses.replace(cfg, budget_tokens=tokens)


def planned_tokens(cfg: TrainConfig) -> int:
    """The tokens a run to cfg.budget_tokens trains on: whole steps, so the last may pass the budget."""
    return math.ceil(cfg.budget_tokens / step_tokens(cfg)) * step_tokens(cfg)


def schedule_of(cfg: TrainConfig) -> Schedule:
    """cfg's schedule: STLR, or warmup then linear/cosine decay to min_lr_ratio at the budget."""
    return Schedule(cfg.schedule, warmup_steps=cfg.warmup_steps, min_ratio=cfg.min_lr_ratio, cut_frac=cfg.cut_frac,
                    stlr_ratio=cfg.stlr_ratio)


@dataclass
class TrainState:
    step: int = 0
    tokens: int = 0
    seconds: float = 0.0  # training wall time so far, over every resumed part
    bad_steps: int = 0
    history: list[dict[str, float]] = field(default_factory=list)  # every logged and evaluated row


class Trainer:
    def __init__(self, module: nn.Module, cfg: TrainConfig, impl: ImplConfig, device: torch.device,
                 train: BatchStream, valid: list[Batch], checkpoint_dir: Path, fingerprint: str,
                 seed: int, flops_per_token: float | None = None, callbacks: tuple[Callback, ...] = (),
                 layer_groups: list[list[nn.Parameter]] | None = None, context: Context = Context(),
                 progress: Progress | None = None):
        """Under torchrun (context.active) `train` must read this rank's share of each batch, and
        only rank 0 should get callbacks and `progress` (over planned_tokens(cfg), updated before
        each log row reaches the callbacks); checkpoints are written by rank 0. With
        impl.strategy fsdp `module` is sharded in place."""
        self.module, self.cfg, self.impl, self.device = module.to(device), cfg, impl, device
        self.precision = runtime.resolve_precision(impl.precision, device)  # what every forward runs in
        self.context = context
        self.train, self.valid, self.seed = train, valid, seed
        self.checkpoint_dir, self.fingerprint, self.callbacks = checkpoint_dir, fingerprint, callbacks
        self.step_tokens = step_tokens(cfg)
        self.total_steps = planned_tokens(cfg) // self.step_tokens
        self.progress = progress
        names = {id(p): name for name, p in module.named_parameters()}
        group_names = [[names[id(p)] for p in group] for group in layer_groups or []]
        self.synced = distributed.wrap(module, context, device, impl.strategy)
        by_name = dict(module.named_parameters())  # sharding replaced the parameters: find them again
        layer_groups = [[by_name[name] for name in group] for group in group_names]
        self.optimizer, self.scheduler = optimizer_and_schedule(module, cfg, device, cfg.lr, schedule_of(cfg),
                                                                self.total_steps, cfg.lr_decay, layer_groups,
                                                                cfg.decay_embeddings)
        self.stepper = Stepper(module, self.optimizer, self.scheduler, cfg, "training",
                               f" (the last good checkpoint in {checkpoint_dir} is kept)")
        compile_it = impl.compile == "on" or (impl.compile == "auto" and device.type == "cuda")
        self.forward = torch.compile(self.synced) if compile_it else self.synced
        peak = next((v for k, v in PEAK_BF16_FLOPS.items() if device.type == "cuda"
                     and k in torch.cuda.get_device_name(device)), None)
        self.flops_per_s_peak = peak * context.world if peak and flops_per_token else None
        self.flops_per_token = flops_per_token
        self.state = TrainState()

    def fit(self) -> TrainState:
        """Train to the budget, resuming from the last checkpoint of this configuration if any."""
        saved = load_checkpoint(self.checkpoint_dir, self.module, self.optimizer, self.scheduler,
                                self.fingerprint, self.context.rank)
        if saved is not None:
            self.state = TrainState(**{k: v for k, v in saved.items() if k != "fingerprint"})
            distributed.say(self.context, f"resuming from step {self.state.step} ({self.state.tokens} tokens)")
        if self.progress is not None:
            self.progress.start(self.state.tokens, self.state.seconds)
        self.module.train()
        window = defaultdict(float)  # sums of the metrics of the steps since the last log line
        while not distributed.agree(self.context, self._budget_spent(), self.device):  # rank 0's clock decides
            started = time.perf_counter()
            loss, metrics = self._train_step()
            if loss is not None:
                window["seconds"] += time.perf_counter() - started  # tokens/s counts train steps only
                window["steps"] += 1
                for k, v in metrics.items():
                    window[k] += v
                if self.state.step % self.cfg.log_every == 0:
                    self._log(window)
                    window = defaultdict(float)
            if self.state.step % self.cfg.eval_every == 0:
                self._eval()
            if self.state.step % self.cfg.checkpoint_every == 0 and not self._budget_spent():
                self._checkpoint()
            self.state.seconds += time.perf_counter() - started  # the wall-clock budget counts everything
        if not any(row["step"] == self.state.step and "val_loss" in row for row in self.state.history[-2:]):
            self._eval()  # the run ends with a validation of its final weights
        return self.state

    def _budget_spent(self) -> bool:
        minutes = self.cfg.budget_minutes
        return self.state.step >= self.total_steps or (minutes is not None and self.state.seconds >= minutes * 60)

    def _train_step(self) -> tuple[float | None, dict[str, float]]:
        """One optimizer step over grad_accum micro-batches; (None, {}) when the loss was not finite."""
        totals: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), device=self.device))
        for micro in range(self.cfg.grad_accum):
            batch = self.train.batch(self.state.step, micro).to(self.device, non_blocking=True)
            with distributed.no_sync(self.synced, skip=micro < self.cfg.grad_accum - 1):  # sync on the last
                with runtime.autocast(self.device, self.precision):
                    loss, metrics = self.forward(batch)
                (loss / self.cfg.grad_accum).backward()
            for k, v in metrics.items():
                totals[k] += v.detach().float() / self.cfg.grad_accum
        values = distributed.mean(self.context, {k: float(v) for k, v in totals.items()}, self.device)
        self.state.bad_steps = self.stepper.step(values["loss"], self.state.step + 1, self.state.bad_steps)
        self.state.step += 1
        if self.state.bad_steps:  # skipped
            return None, {}
        self.state.tokens += self.step_tokens
        norm = self.stepper.grad_norm
        if self.cfg.clip_norm > 0:  # the same on every rank: gradients are synced (and sharded under FSDP)
            values["grad_norm"] = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        return values["loss"], values

    def _log(self, window: dict[str, float]) -> None:
        steps, seconds = window.pop("steps"), window.pop("seconds")
        tokens_per_s = steps * self.step_tokens / seconds
        row = {"step": self.state.step, "tokens": self.state.tokens, "lr": self.scheduler.get_last_lr()[-1],  # top group
               "tokens_per_s": tokens_per_s, **{f"train_{k}": v / steps for k, v in window.items()}}
        if self.flops_per_s_peak:
            row["mfu"] = self.flops_per_token * tokens_per_s / self.flops_per_s_peak
        self.state.history.append(row)
        if self.progress is not None:
            self.progress.update(self.state.tokens)
        for callback in self.callbacks:
            callback.on_log(self.state.step, row)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean metrics over the fixed validation batches, each under its own fixed seed (the same masks
        every time, whichever rank evaluates it); under torchrun the ranks split the batches. Every
        rank runs as many forwards (a sharded model gathers its weights in each): a rank out of
        batches repeats the first one and does not count it."""
        self.module.eval()
        sums: dict[str, float] = defaultdict(float)
        count = 0
        world = self.context.world
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            for i in range(self.context.rank, math.ceil(len(self.valid) / world) * world, world):
                counted = i < len(self.valid)
                batch = self.valid[i if counted else 0]
                torch.manual_seed(self.seed + i)
                with runtime.autocast(self.device, self.precision):
                    _, metrics = self.module(batch.to(self.device))
                if counted:
                    for k, v in metrics.items():
                        sums[k] += float(v) * len(batch)
                    count += len(batch)
        self.module.train()
        names = distributed.gather(self.context, sorted(sums))[0]  # rank 0's names: a rank may hold no batch
        totals = distributed.mean(self.context, {k: sums[k] for k in names} | {"_count": count}, self.device)
        return {k: totals[k] / totals["_count"] for k in names}

    def _eval(self) -> None:
        row = {"step": self.state.step, "tokens": self.state.tokens,
               **{f"val_{k}": v for k, v in self.evaluate().items()}}
        self.state.history.append(row)
        for callback in self.callbacks:
            callback.on_eval(self.state.step, row)

    def _checkpoint(self) -> None:
        save_run(self.checkpoint_dir, self.module, self.optimizer, self.scheduler,
                 {**self.state.__dict__, "fingerprint": self.fingerprint}, self.context)

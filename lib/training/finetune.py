"""ULMFiT step 3 and its baselines: train one model for one task x variant x seed.

The task's type (lib/tasks: classification, regression, tagging, span_qa, multiple_choice)
gives the batches, the head's shape (one output vector per sequence or per token), the loss and the
scores; everything else here is the same for every type.

Variants, so that each trick's value shows next to its baseline:
- `ulmfit`: the adapted model, ULMFiT's concat-pooling classifier block, gradual unfreezing (only the
  top layer group, which holds the head, trains at first; one more group from the top joins every
  `unfreeze_every` steps, or every epoch), discriminative LRs (each group's LR = the one above / lr_decay)
  and the slanted triangular schedule over the whole run.
- `plain`: the adapted model, the head transformers' sequence-classification model of its family has
  (lib.models.classifier.plain_head: BERT's pooler + linear layer on [CLS], GPT-2's bias-free linear layer on
  the last token; an imported BERT's pooler is its start), every layer from the start, one LR with
  linear warmup and decay: the usual BERT/GPT recipe.
- `from_scratch`: `plain` on a randomly initialised model of the same shape (its own LR, scratch_lr,
  since random weights need a larger one): what pretraining is worth.
- `frozen`: a linear probe. The backbone never changes and has no dropout in eval mode, so its concat-
  pooled features are computed once and a logistic regression is fit on them: how much the features
  alone hold.
- `elmo`: ELMo's feature-based approach (Peters et al. 2018): the backbone frozen as in `frozen` (no
  gradient, eval mode), the features read a learned softmax-weighted mix of every layer's states scaled
  by gamma (eq. 1, lib.models.classifier.ScalarMix) instead of the last layer's, and ULMFiT's concat
  block on them; the mix and the block train with `lr`, linear warmup and decay. The run reports the
  learned layer weights and gamma (RunResult.learned): which layers the task uses, next to `frozen`'s
  last layer only. Any backbone takes it: on a causal one each position's mixed state still reads only
  its left context, and the block reads the last token, which has read the whole text.

Every full variant keeps the weights of its best epoch on the dev set (the task's first metric) and
stops after `patience` epochs without improvement (lib.training.epoch_loop.EpochLoop, which checkpoints every epoch,
so a killed run resumes after its last finished one); the probe is fit in one pass, its
regularisation picked on the dev set. The kept weights are scored on the evaluation split.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression

from lib.config.params import FinetuneConfig, ImplConfig
from lib.core import distributed, runtime
from lib.core.distributed import Context
from lib.core.progress import Progress
from lib.data.encoding import batch_indices
from lib.evaluation.scoring import score_split
from lib.models.classifier import Classifier, HeadConfig, lm_loss, plain_head
from lib.models.transformer import Transformer
from lib.tasks import DEFAULT_TYPE, TYPES
from lib.tasks.base import TaskData, TaskType
from lib.tasks.base import move
from lib.training.epoch_loop import EpochLoop
from lib.training.optim import adamw, slanted_triangular, warmup_decay


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
    """What one variant trains and how."""

    model: Classifier
    lr: float
    lr_decay: float
    schedule: Callable[[int, int], Callable[[int], float]]  # (total steps, steps per epoch) -> LR multiplier
    unfreeze: bool
    epochs: int
    frozen_backbone: bool = False  # only what is not the backbone trains (elmo)


def run_name(task: str, variant: str, seed: int) -> str:
    """How progress lines name one run: `imdb × ulmfit × seed 1338`."""
    return f"{task} × {variant} × seed {seed}"


def warmup_linear(warmup_frac: float) -> Callable[[int, int], Callable[[int], float]]:
    """plain/from_scratch: warmup over warmup_frac of the steps, then linear decay to 0."""
    return lambda total, _: warmup_decay(total, max(1, round(total * warmup_frac)))


def setup(variant: str, adapted: Transformer, n_outputs: int, cfg: FinetuneConfig,
          kind: TaskType = TYPES[DEFAULT_TYPE]) -> Setup:
    """The model and recipe of a full variant (ulmfit, plain, from_scratch, elmo), around a copy of
    `adapted` (random weights for from_scratch). A sequence-level type's ulmfit head is ULMFiT's
    concat-pooling block, its plain head that of transformers' sequence classifier; a per-token type
    (tagging, spans) puts the block, or a linear layer (as BERT's token-classification and QA heads),
    on every position."""
    backbone = copy.deepcopy(adapted)
    if variant == "from_scratch":
        backbone = Transformer(adapted.cfg)
    if kind.per_token:
        concat = HeadConfig(n_outputs, "tokens", block=True, hidden=cfg.head_hidden, dropout=cfg.head_dropout)
        token = HeadConfig(n_outputs, "tokens", block=False, dropout=cfg.head_dropout if kind.head_dropout else 0.0)
    else:
        concat = HeadConfig(n_outputs, "concat", block=True, hidden=cfg.head_hidden, dropout=cfg.head_dropout)
        token = plain_head(backbone.cfg, n_outputs, cfg.head_dropout)
    plain = warmup_linear(cfg.warmup_frac)
    if variant == "ulmfit":
        stlr = lambda total, _: slanted_triangular(total, cfg.cut_frac, cfg.stlr_ratio)  # noqa: E731
        return Setup(Classifier(backbone, concat), cfg.lr, cfg.lr_decay, stlr if cfg.stlr else plain,
                     unfreeze=cfg.gradual_unfreezing, epochs=cfg.epochs)
    if variant == "plain":
        return Setup(Classifier(backbone, token), cfg.plain_lr, 1.0, plain, unfreeze=False, epochs=cfg.epochs)
    if variant == "from_scratch":
        return Setup(Classifier(backbone, token), cfg.scratch_lr, 1.0, plain, unfreeze=False, epochs=cfg.epochs)
    if variant == "elmo":
        return Setup(Classifier(backbone, dataclasses.replace(concat, mix=cfg.elmo_mix)), cfg.lr, 1.0, plain,
                     unfreeze=False, epochs=cfg.epochs, frozen_backbone=True)
    raise ValueError(f"unknown variant {variant!r}")


def run_variant(variant: str, task: TaskData, metrics: list[str], adapted: Transformer, cfg: FinetuneConfig,
                impl: ImplConfig, device: torch.device, seed: int, pad_id: int, checkpoint_dir: Path, fingerprint: str,
                on_epoch: Callable[[dict[str, float]], None] = lambda row: None,
                context: Context = Context()) -> tuple[RunResult, Classifier]:
    """Train `variant` on task.train, pick the best epoch on task.dev, score it on task.eval.
    Returns the result and the classifier with its best weights (on the CPU). A full variant keeps
    its epochs' checkpoints in checkpoint_dir and, started again with the same fingerprint, resumes
    after its last finished epoch. Under torchrun every rank calls it: the full variants train
    data-parallel, each rank its share of every batch; for the frozen variant the ranks share the
    feature extraction and each fits the same probe. With impl.strategy fsdp the model is sharded
    over the ranks and the returned one is whole on rank 0 only."""
    torch.manual_seed(seed)
    label = f"finetune: {run_name(task.name, variant, seed)}"
    if variant == "frozen":
        return run_probe(task, metrics, adapted, cfg, impl, device, seed, pad_id, on_epoch, context, label)
    plan = setup(variant, adapted, TYPES[task.type].n_outputs(task), cfg, TYPES[task.type])
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


def run_probe(task: TaskData, metrics: list[str], adapted: Transformer, cfg: FinetuneConfig, impl: ImplConfig,
              device: torch.device, seed: int, pad_id: int, on_epoch: Callable[[dict[str, float]], None],
              context: Context, label: str) -> tuple[RunResult, Classifier]:
    """The frozen variant: one exact fit of the probe (ProbeTrainer), reported as its one epoch."""
    started = time.perf_counter()  # the feature extraction counts too
    kind = TYPES[task.type]
    probe = HeadConfig(kind.n_outputs(task), "tokens" if kind.per_token else "concat", block=False, dropout=0.0)
    model = Classifier(copy.deepcopy(adapted), probe).to(device)
    model.read_as(task.language)
    trainer = ProbeTrainer(model, task, metrics[0], cfg, impl, device, pad_id, context, label)
    train_loss = trainer.fit()
    dev, evaluated, confusion = final_scores(trainer.score, task, metrics)
    row = {"epoch": 1, "train_loss": train_loss, "probe_c": trainer.c, **{f"dev_{k}": v for k, v in dev.items()}}
    on_epoch(row)
    trainer.fold_standardisation()
    result = RunResult(task.name, "frozen", seed, [dev[metrics[0]]], 1, dev, evaluated, trainer.steps,
                       round(time.perf_counter() - started, 1), confusion, [row])
    return result, distributed.to_cpu(model, context)


def transfer_scores(model: Classifier, task: TaskData, transfers: dict[str, TaskData], metrics: list[str],
                    cfg: FinetuneConfig, impl: ImplConfig, device: torch.device,
                    pad_id: int) -> dict[str, dict[str, float]]:
    """Zero-shot transfer: the scores of `model`, trained on `task`, on the evaluation split of each task
    in `transfers` (tasks.<name>.transfer_from), each read in its own language, scored as finetune scores
    `task`'s (with what `task`'s dev calibrates, SQuAD 2.0's no-answer threshold). One process: the model
    is whole on rank 0 alone after training (lib.core.distributed.to_cpu); it is left on the CPU."""
    model.to(device)
    batch = cfg.batch_size * 2
    calibration = score_split(model, task, "dev", metrics, batch, pad_id, device, impl)[1] \
        if TYPES[task.type].calibrated else None
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
    """Trains the whole model (ulmfit, plain, from_scratch) on batches of the task's type, in an
    EpochLoop over checkpoint_dir; progress lines (`label`) count the batches of every epoch, so
    their ETA is that of the whole run if patience does not end it sooner."""

    def __init__(self, model: Classifier, plan: Setup, task: TaskData, cfg: FinetuneConfig, impl: ImplConfig,
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
        optimizer = adamw(model, cfg, device, plan.lr, plan.lr_decay, self.groups)
        self.steps_per_epoch = math.ceil(len(task.train) / cfg.batch_size)
        total = self.steps_per_epoch * plan.epochs
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, plan.schedule(total, self.steps_per_epoch))
        self.loop = EpochLoop(model, model, optimizer, scheduler, cfg, epochs=plan.epochs, patience=cfg.patience,
                              metric=metric, checkpoint_dir=checkpoint_dir, fingerprint=fingerprint, where=label,
                              context=context)
        self.unfreeze_every = (cfg.unfreeze_every or self.steps_per_epoch) if plan.unfreeze else 0
        self.epochs = plan.epochs
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
            self.progress.tick(self.loop.state.steps, f"  epoch {epoch} of {self.epochs}")
        return {"train_loss": total / max(len(train), 1)}

    def score(self, split: str, metrics: list[str],
              calibration: dict[str, Any] | None = None) -> tuple[dict[str, float], dict[str, Any]]:
        return score_split(self.model, self.task, split, metrics, self.cfg.batch_size * 2, self.pad_id, self.device,
                           self.impl, self.context, calibration)


class ProbeTrainer:
    """The frozen variant: a linear layer on the frozen backbone's features, fit exactly.

    The features (a sequence's concat-pooled state; every position's state for a per-token type) are
    computed once and standardised with the train split's mean and std (max-pooled states are far
    larger than mean-pooled ones). For each C in probe_c a convex fit runs to convergence: for
    classification scikit-learn's L2-regularised logistic regression, for the other types L-BFGS on
    the type's own loss (mean over its units) + |W|^2 / (2 C n), scikit-learn's objective divided by
    n; the fit with the best dev score goes into the head's linear layer, and the standardisation is
    folded in at the end, so the saved head reads raw features. A convex fit has no learning rate or
    epoch count that must suit each feature width: an AdamW probe at one LR overshot on a 512-wide
    model's 1,536 features (train loss 0.66 -> 1.33). Span QA caches every position's state of every
    window (T x d floats a window): mind its memory on long contexts."""

    def __init__(self, model: Classifier, task: TaskData, metric: str, cfg: FinetuneConfig, impl: ImplConfig,
                 device: torch.device, pad_id: int, context: Context = Context(), label: str = "finetune"):
        self.model, self.task, self.metric, self.cfg, self.device, self.context = (
            model, task, metric, cfg, device, context)
        self.kind = TYPES[task.type]
        for p in model.backbone.parameters():
            p.requires_grad_(False)
        model.backbone.eval()
        if impl.strategy == "fsdp":
            distributed.shard(model.backbone, context)
        splits = {"train": task.train, "dev": task.dev, **({"eval": task.eval} if task.eval is not None else {})}
        # this rank's batches: distributed.spread gives it every world-th of each split's
        mine = sum(-(-len(batch_indices(examples, cfg.batch_size * 2)) // context.world) for examples in splits.values())
        self.progress = Progress(f"{label} features", mine, "batches", out=lambda line: distributed.say(context, line))
        # per split, per batch: (example indices, features, the batch as the type collates it)
        self.batches = {name: self._features(examples, impl, pad_id) for name, examples in splits.items()}
        rows = torch.cat([self._rows(f, batch) for _, f, batch in self.batches["train"]])
        self.mean, self.std = rows.mean(0), rows.std(0).clamp(min=1e-6)
        self.batches = {name: [(group, (f - self.mean) / self.std, batch) for group, f, batch in batches]
                        for name, batches in self.batches.items()}
        # each train batch's share of the loss's units (examples, tagged words), and their number: the
        # L-BFGS objective reads them at every evaluation
        self.train_units = sum(self.kind.units(e) for e in task.train)
        self.train_weights = [sum(self.kind.units(task.train[i]) for i in group) / self.train_units
                              for group, _, _ in self.batches["train"]]
        self.steps, self.c = 0, None  # L-BFGS iterations over every fit; the C kept

    @torch.no_grad()
    def _features(self, examples: list, impl: ImplConfig, pad_id: int) -> list[tuple[list[int], torch.Tensor, dict]]:
        """(indices, features, batch) of each batch of `examples` in `batches` order, on the device; under
        torchrun each rank encodes every world-th batch."""
        precision = runtime.resolve_precision(impl.precision, self.device)
        groups = batch_indices(examples, self.cfg.batch_size * 2)

        def encode(group: list[int]) -> tuple[torch.Tensor, dict]:
            batch = self.kind.collate([examples[i] for i in group], pad_id, self.task)
            input_ids, segment_ids, mask = (t.to(self.device) for t in self.kind.inputs(batch))
            with runtime.autocast(self.device, precision):
                hidden = self.model.encode(input_ids, segment_ids, mask)
            self.progress.tick(self.progress.done + 1)
            return self.model.features(hidden.float(), mask).cpu(), batch  # CPU: ranks swap them

        encoded = distributed.spread(self.context, groups, encode)
        return [(group, f.to(self.device), move(batch, self.device)) for group, (f, batch) in zip(groups, encoded)]

    def _rows(self, features: torch.Tensor, batch: dict) -> torch.Tensor:
        """The feature rows the head reads: every sequence's, or every real position's."""
        return features[self.kind.inputs(batch)[2]] if self.kind.per_token else features

    def fit(self) -> float:
        """Fits a probe for each C in probe_c and keeps the best on dev; returns its mean train loss.
        Every rank fits the same probes on the same gathered features."""
        linear = self.model.head[-1]
        best, kept = -math.inf, None
        for c in self.cfg.probe_c:
            weight, bias = self._logistic(c) if self.kind.logistic_probe else self._lbfgs(c)
            with torch.no_grad():
                linear.weight.copy_(weight)
                linear.bias.copy_(bias)
            score = self.score("dev", [self.metric])[0][self.metric]
            if kept is None or score > best:
                best, self.c, kept = score, c, (weight, bias)
        with torch.no_grad():
            linear.weight.copy_(kept[0])
            linear.bias.copy_(kept[1])
            return self._train_loss().item()

    def _logistic(self, c: float) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([f for _, f, _ in self.batches["train"]]).cpu().numpy()
        y = torch.cat([batch["labels"] for _, _, batch in self.batches["train"]]).cpu().numpy()
        fit = LogisticRegression(C=c, max_iter=1000).fit(x.astype(np.float64), y)
        self.steps += int(fit.n_iter_.max())
        return self._linear(fit)

    def _train_loss(self) -> torch.Tensor:
        """The type's loss on the train split, a mean over its units (examples, tagged words)."""
        return sum(self.kind.loss(self.kind.shape(self.model.classify(f), batch), batch, self.task) * weight
                   for (_, f, batch), weight in zip(self.batches["train"], self.train_weights))

    def _lbfgs(self, c: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight, bias) minimising the type's mean train loss + |W|^2 / (2 C n), from zero."""
        linear, n = self.model.head[-1], self.train_units
        with torch.no_grad():
            linear.weight.zero_()
            linear.bias.zero_()
        optimizer = torch.optim.LBFGS(linear.parameters(), max_iter=200, history_size=20,
                                      line_search_fn="strong_wolfe")

        def objective() -> torch.Tensor:
            optimizer.zero_grad()
            loss = self._train_loss() + linear.weight.pow(2).sum() / (2 * c * n)
            loss.backward()
            return loss

        with torch.enable_grad():
            optimizer.step(objective)
        self.steps += optimizer.state[linear.weight].get("n_iter", 0)
        return linear.weight.detach().clone(), linear.bias.detach().clone()

    def _linear(self, fit: LogisticRegression) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's (weight, bias) that give `fit`'s predictions. A binary fit has one row: P(classes_[1])
        = sigmoid(w x + b), i.e. logits (0, w x + b). A class absent from train gets a prohibitive bias."""
        linear = self.model.head[-1]
        weight = torch.zeros_like(linear.weight)
        bias = torch.full_like(linear.bias, -1e4)
        classes = torch.as_tensor(fit.classes_, device=weight.device)
        coef = torch.as_tensor(fit.coef_, dtype=weight.dtype, device=weight.device)
        intercept = torch.as_tensor(fit.intercept_, dtype=bias.dtype, device=bias.device)
        if len(coef) == 1:
            weight[classes[1]], bias[classes[0]], bias[classes[1]] = coef[0], 0.0, intercept[0]
        else:
            weight[classes], bias[classes] = coef, intercept
        return weight, bias

    @torch.no_grad()
    def fold_standardisation(self) -> None:
        """linear((x - mean) / std) == linear'(x) with W' = W / std and b' = b - W' mean."""
        linear = self.model.head[-1]
        linear.weight.div_(self.std)
        linear.bias.sub_(linear.weight @ self.mean)

    @torch.no_grad()
    def score(self, split: str, metrics: list[str],
              calibration: dict[str, Any] | None = None) -> tuple[dict[str, float], dict[str, Any]]:
        self.model.head.eval()
        examples = self.task.dev if split == "dev" else self.task.eval
        predictions: list = [None] * len(examples)
        for group, f, batch in self.batches[split]:
            outputs = self.kind.shape(self.model.classify(f), batch).cpu()
            for i, prediction in zip(group, self.kind.predict(outputs, [examples[i] for i in group], self.task)):
                predictions[i] = prediction
        return self.kind.score(self.task, split, predictions, metrics, calibration)



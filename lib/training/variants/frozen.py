"""`frozen`: a linear probe. The backbone never changes and has no dropout in eval mode, so its concat-
pooled features are computed once and a logistic regression is fit on them (ProbeTrainer), its
regularisation picked on the dev set: how much the features alone hold. Settings: finetune.frozen."""
from __future__ import annotations

import copy
import math
import time
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
from lib.models.architectures import Transformer
from lib.tasks import TYPES
from lib.tasks.base import TaskData, move
from lib.tasks.model import TaskModel
from lib.training.finetune import RunResult, final_scores
from lib.training.variants.base import Variant, register


@register
class Frozen(Variant):
    name = "frozen"
    needs_head = True
    label = "frozen features + linear"

    def run(self, task: TaskData, metrics: list[str], adapted: Transformer, cfg: FinetuneConfig, impl: ImplConfig,
            device: torch.device, seed: int, pad_id: int, checkpoint_dir: Path, fingerprint: str,
            on_epoch: Callable[[dict[str, float]], None], context: Context,
            label: str) -> tuple[RunResult, TaskModel]:
        """One exact fit of the probe, reported as its one epoch; nothing to resume, so no checkpoints."""
        started = time.perf_counter()  # the feature extraction counts too
        kind = TYPES[task.type]
        probe = kind.head("probe", adapted.cfg, kind.n_outputs(task), cfg)
        model = kind.build_model(copy.deepcopy(adapted), probe).to(device)
        model.read_as(task.language)
        trainer = ProbeTrainer(model, task, metrics[0], cfg, impl, device, pad_id, context, label)
        train_loss = trainer.fit()
        dev, evaluated, confusion = final_scores(trainer.score, task, metrics)
        row = {"epoch": 1, "train_loss": train_loss, "probe_c": trainer.c, **{f"dev_{k}": v for k, v in dev.items()}}
        on_epoch(row)
        trainer.fold_standardisation()
        result = RunResult(task.name, self.name, seed, [dev[metrics[0]]], 1, dev, evaluated, trainer.steps,
                           round(time.perf_counter() - started, 1), confusion, [row])
        return result, distributed.to_cpu(model, context)


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

    def __init__(self, model: TaskModel, task: TaskData, metric: str, cfg: FinetuneConfig, impl: ImplConfig,
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
        return features[self.kind.inputs(batch)[2]] if self.model.head_cfg.features == "tokens" else features

    def fit(self) -> float:
        """Fits a probe for each C in probe_c and keeps the best on dev; returns its mean train loss.
        Every rank fits the same probes on the same gathered features."""
        linear = self.model.head[-1]
        best, kept = -math.inf, None
        for c in self.cfg.frozen.probe_c:
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



"""Language-model training as the `pretrain` and `adapt` stages run it: one objective, packed tokens,
the trainer, and the stage's outputs (model folder with tokenizer, metrics JSON, curve CSVs, MLflow).

`pretrain` starts from random weights on the general corpus; `adapt` (ULMFiT step 2) starts from the
pretrained model on the target domain's text, with discriminative LRs and the slanted triangular
schedule, and also reports the domain validation loss before it trains.
"""
from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lib.config.errors import UserError
from lib.config.params import Params, TrainConfig
from lib.core import distributed, runtime
from lib.core.io import write_csv, write_json
from lib.core.progress import Progress
from lib.data.packed import PackedTokens
from lib.data.tokenizer import read_meta, saved_special_ids, tokenizer_sha256
from lib.models.folder import model_folder
from lib.models.hf import ImportedModel, describe_import, import_model, init_folder
from lib.objectives import BatchPlan, Objective, build_objective, fitting_objective, save_objective
from lib.serving.model_card import write_model_card
from lib.training.budget_loop import Trainer, flops_budget, planned_tokens
from lib.training.checkpoint import fingerprint

# curve -> its columns; a history row belongs to a curve when it has the curve's `<name>_loss`
CURVES = {"train": ["step", "tokens", "train_loss", "lr", "tokens_per_s"], "val": ["step", "tokens", "val_loss"]}


@dataclass
class LMPaths:
    tokenizer: Path  # the folder whose tokenizer files go into the model folder
    tokens: Path  # packed tokens: <tokens>/train and <tokens>/valid
    parallel: Path  # packed translation pairs (<parallel>/train, /valid), for objectives that read them
    out: Path
    metrics: Path
    plots: Path
    checkpoints: Path


def train_language_model(stage: str, params: Params, cfg: TrainConfig, objective: Objective, paths: LMPaths,
                         run: Any, stage_params: dict, layer_groups: list | None = None,
                         measure_before: bool = False) -> dict[str, Any]:
    """Train `objective` to cfg's budget and write the stage's outputs; returns the metrics written.
    `run` is the stage's tracking.StageRun. With measure_before, the validation metrics of the
    weights as loaded are reported too, as `before_val_*`. Under torchrun every rank trains its share
    of each batch and rank 0 alone writes."""
    device = runtime.resolve_device(params.device)
    context = distributed.setup(device.type)
    device = distributed.device_for(context, device)
    facts = runtime.configure(params.impl, device)
    run.log_params({"runtime": facts})
    batches = objective.batches(BatchPlan(
        tokenizer=paths.tokenizer, tokens=paths.tokens, parallel=paths.parallel, seq_len=cfg.seq_len, batch_size=cfg.batch_size,
        eval_batches=cfg.eval_batches, seed=params.seed, batch_key=f"{stage}.batch_size", share=context.share))
    flops_per_token = objective.flops_per_token(cfg.seq_len)
    cfg = flops_budget(cfg, flops_per_token, stage)
    if cfg.budget_flops is not None and context.main:
        print(f"{stage}: budget_flops {cfg.budget_flops:.3g} buys {objective.name} {cfg.budget_tokens:,} tokens "
              f"at {flops_per_token:.3g} FLOPs per token", flush=True)
    tokenizer = tokenizer_sha256(paths.tokenizer)
    for packed in batches.splits:
        packed.check_tokenizer(tokenizer, paths.tokenizer)
    run_id = fingerprint(stage_params, tokenizer=tokenizer, data=[[s.n_tokens, s.n_docs] for s in batches.splits])
    limit = None if cfg.budget_minutes is None else cfg.budget_minutes * 60
    progress = Progress(stage, planned_tokens(cfg), "tokens", limit_s=limit, limit_key=f"{stage}.budget_minutes")
    trainer = Trainer(objective, cfg, params.impl, device, batches.train, batches.valid, paths.checkpoints, run_id,
                      params.seed, flops_per_token, callbacks=(run, ConsoleLog(progress)) if context.main else (),
                      layer_groups=layer_groups, context=context, progress=progress if context.main else None)
    before = {}
    if measure_before:
        before = {f"before_val_{k}": v for k, v in trainer.evaluate().items()}
        if context.main:
            print(f"before {stage}: " + "  ".join(f"{k[11:]} {v:.4f}" for k, v in before.items()), flush=True)
    state = trainer.fit()
    distributed.unshard(objective, context)  # a sharded model is gathered whole on rank 0
    if not context.main:
        return {}
    final = next(row for row in reversed(state.history) if "val_loss" in row)
    metrics = {**before, **{k: v for k, v in final.items() if k.startswith("val_")},
               "unigram_loss": unigram_loss(batches.splits[0]), "objective": objective.name,
               "tokens_seen": state.tokens, "steps": state.step, "train_seconds": round(state.seconds, 1),
               "tokens_per_s": round(state.tokens / max(state.seconds, 1e-9), 1),
               "params": objective.backbone().num_params(), "device": device.type,
               "precision": trainer.precision, "threads": facts["threads"],
               "tokens_planned": trainer.total_steps * trainer.step_tokens,
               "flops_per_token": flops_per_token, "train_flops": state.tokens * flops_per_token}
    if cfg.budget_flops is not None:
        metrics["budget_flops"] = cfg.budget_flops
    if state.step < trainer.total_steps:  # the wall-clock safety stop ended it: say so wherever results are read
        budget = "budget_flops" if cfg.budget_flops is not None else "budget_tokens"
        metrics["stopped_early"] = (f"{stage}.budget_minutes ({cfg.budget_minutes:g}) stopped it after "
                                    f"{state.tokens:,} of {metrics['tokens_planned']:,} planned tokens, so its results "
                                    f"depend on this machine's speed; raise the limit (or lower {budget}) and rerun")
        print(f"warning: {stage}: {metrics['stopped_early']}", flush=True)
    if objective.causal:
        metrics["val_perplexity"] = math.exp(min(metrics["val_loss"], 50.0))
        if before:
            metrics["before_val_perplexity"] = math.exp(min(before["before_val_loss"], 50.0))
    save_model_folder(objective, paths.tokenizer, paths.out, stage, params, metrics)
    write_outputs(metrics, state.history, paths, run)
    shutil.rmtree(paths.checkpoints, ignore_errors=True)  # the model is out: nothing left to resume
    return metrics


def objective_from_init(params: Params, tokenizer_dir: Path) -> tuple[Objective, ImportedModel]:
    """(the objective that fits params.init's published model, its backbone holding the published model's weights;
    the import, for what it did not have). The tokenizer folder must be the published model's."""
    made_for = read_meta(tokenizer_dir).get("init")
    if made_for != params.init:
        raise UserError(f"{tokenizer_dir}: made for init {made_for}, not {params.init}; rerun the tokenizer stage")
    imported = import_model(init_folder(params))
    print(describe_import(imported, params.init), flush=True)
    name = fitting_objective(params.objective, imported.model.cfg)
    if name != params.objective:
        print(f"objective: {params.objective} does not fit a {imported.family} model; training it with {name}",
              flush=True)
    arch = imported.model.cfg
    objective = build_objective(name, params, arch.vocab_size, saved_special_ids(tokenizer_dir), arch)
    objective.start_from(imported)
    return objective, imported


def keep_published_model(params: Params, objective: Objective, imported: ImportedModel, paths: LMPaths, run: Any) -> None:
    """pretrain.with_init keep: the published model goes on as the pretrained model, with no curves."""
    metrics = {"init": params.init, "family": imported.family, "kept": True, "steps": 0, "objective": objective.name,
               "params": objective.backbone().num_params(), "fresh": sorted(imported.fresh)}
    save_model_folder(objective, paths.tokenizer, paths.out, "pretrain", params, metrics)
    write_outputs(metrics, [], paths, run)
    print(f"pretrain.with_init is keep: {params.init} goes on unchanged", flush=True)


def save_model_folder(objective: Objective, tokenizer_dir: Path, out: Path, stage: str, params: Params,
                      metrics: dict[str, Any]) -> None:
    """out/: the backbone (+ the objective's extras), the tokenizer files and the model card of `stage`'s
    `metrics`, written whole or not at all."""
    with model_folder(out, tokenizer_dir) as tmp:
        save_objective(objective, tmp)
        # adapt's tokenizer folder is the model it started from, whose card tells the chain so far
        write_model_card(tmp, stage, params, metrics, upstream=tokenizer_dir if stage == "adapt" else None)


def write_outputs(metrics: dict[str, Any], history: list[dict], paths: LMPaths, run: Any) -> None:
    write_json(paths.metrics, metrics)
    for name, columns in CURVES.items():
        write_csv(paths.plots / f"{name}.csv", columns,
                  [[row.get(c, "") for c in columns] for row in history if f"{name}_loss" in row])
    # the validation curve's last point (a resumed run logged no earlier one), where it started, then the facts
    run.log_metrics({k: v for k, v in metrics.items() if k.startswith("val_")}, step=metrics["steps"])
    run.log_metrics({k.removeprefix("before_"): v for k, v in metrics.items() if k.startswith("before_val_")}, step=0)
    run.log_summary({k: v for k, v in metrics.items() if not k.startswith(("val_", "before_val_"))})
    for path in (paths.metrics, paths.plots):
        run.log_artifact(path)


def unigram_loss(packed: PackedTokens) -> float:
    """Cross-entropy of predicting every token by its training frequency: the loss to beat."""
    counts = np.bincount(packed.tokens, minlength=packed.vocab_size).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


class ConsoleLog:
    """Progress lines on stdout (DVC shows them as the stage runs), one per logged step:
    `<stage>: <tokens>/<planned> tokens (p%) elapsed .. eta ..  step ..  loss ..  lr ..  .. tok/s`.
    The trainer updates `progress` before each row comes."""

    def __init__(self, progress: Progress):
        self.progress = progress

    def on_log(self, step: int, row: dict) -> None:
        print(self.progress.line(f"  step {step}  loss {row['train_loss']:.4f}  lr {row['lr']:.2e}  "
              f"{row['tokens_per_s']:,.0f} tok/s" + (f"  mfu {row['mfu']:.1%}" if "mfu" in row else "")), flush=True)

    def on_eval(self, step: int, row: dict) -> None:
        print(f"step {step:6d}  validation  " + "  ".join(f"{k[4:]} {v:.4f}" for k, v in row.items()
                                                           if k.startswith("val_")), flush=True)

"""The finetune stage's runs: each task x variant x seed trained once (lib/training/variants), kept with
its result under the stage's checkpoints folder so a stage started again skips it, the task's best model
by dev score kept beside them, and the runs of a task summarised over seeds.

A kept run is reused only by a stage with the same fingerprint (params, starting model, device).
"""
from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import torch

from lib.config.errors import UserError
from lib.config.params import FinetuneConfig, Params, TaskConfig
from lib.core import distributed
from lib.core.distributed import Context
from lib.core.io import write_json
from lib.core.tracking import StageRun
from lib.models.architectures import Transformer
from lib.models.config import TransformerConfig
from lib.models.folder import model_folder
from lib.serving.model_card import write_model_card
from lib.tasks import TYPES, task_type
from lib.tasks.base import TaskData
from lib.tasks.model import card_facts, language_row
from lib.training.finetune import RunResult, run_name, transfer_scores
from lib.training.variants import VARIANTS, run_variant

BEST = "best"  # the folder, under a task's, of its best model so far


def finetune_once(name: str, variant: str, seed: int, task: TaskData, metric_names: list[str], adapted: Transformer,
                  params: Params, device: torch.device, pad_id: int, checkpoints: Path, tokenizer_dir: Path,
                  run_id: str, run: StageRun, context: Context,
                  transfers: dict[str, TaskData] | None = None) -> RunResult:
    """One task x variant x seed: the result kept in `checkpoints` if this configuration (`run_id`) has it,
    else trained now, as a child of `run`, and scored zero-shot on the tasks of `transfers` (those that
    transfer from it; RunResult.transfer). The task's best model so far (by dev score) is kept there too,
    with the tokenizer of `tokenizer_dir` (the adapted model's folder) and its model card. Under torchrun
    every rank trains it; rank 0 alone scores the transfer tasks and writes."""
    task_dir = checkpoints / name
    saved, epochs = task_dir / f"{variant}-seed{seed}.json", task_dir / f"{variant}-seed{seed}"
    if saved.is_file():
        record = json.loads(saved.read_text(encoding="utf-8"))
        if record["fingerprint"] == run_id:
            distributed.say(context, f"finetune: {run_name(name, variant, seed)}: done in an earlier run, kept")
            return RunResult(**record["result"])
    child = run.child(f"{name}/{variant}/seed{seed}", {"task": name, "variant": variant, "seed": seed},
                      {"pipeline.role": "finetune-run"})

    def on_epoch(row: dict) -> None:
        distributed.say(context, f"finetune: {run_name(name, variant, seed)} epoch {row['epoch']}: "
            f"train loss {row['train_loss']:.4f}  "
            + "  ".join(f"{k} {v:.4f}" for k, v in row.items() if k.startswith("dev_")))
        child.log_metrics({k: v for k, v in row.items() if k != "epoch"}, step=row["epoch"])

    try:
        result, model = run_variant(variant, task, metric_names, adapted, params.finetune, params.impl, device, seed,
                                    pad_id, epochs, run_id, on_epoch, context)
        if transfers and context.main:
            result.transfer = transfer_scores(model, task, transfers, metric_names, params.finetune, params.impl,
                                              device, pad_id)
    except BaseException:
        child.finish("FAILED")
        raise
    child.log_metrics({**{f"final_dev_{k}": v for k, v in result.dev.items()},
                       **{f"eval_{k}": v for k, v in (result.eval or {}).items()}, **numbered(result.learned),
                       **{f"{other}.eval_{k}": v for other, scores in result.transfer.items()
                          for k, v in scores.items()}})
    child.log_summary({"best_epoch": result.best_epoch, "seconds": result.seconds})
    child.finish("FINISHED")
    distributed.say(context, f"finetune: {run_name(name, variant, seed)}: best epoch {result.best_epoch}, dev {result.dev}, "
        f"{task.eval_split} {result.eval} ({result.seconds:.0f} s)"
        + "".join(f"; zero-shot {other} {scores}" for other, scores in result.transfer.items()))
    if not context.main:
        return result
    best_record = task_dir / f"{BEST}.json"
    best = json.loads(best_record.read_text(encoding="utf-8")) if best_record.is_file() else None
    score = result.dev[metric_names[0]]
    if best is None or best["fingerprint"] != run_id or score > best["dev_score"]:
        meta = {"task": name, "type": task.type, "info": task.info, "label_names": task.label_names,
                "language": task.language, "variant": variant, "seed": seed,
                "dev": result.dev, "eval_split": task.eval_split, "eval": result.eval,
                "encoding": {k: getattr(params.tasks[name], k) for k in ("max_len", "truncation", "text_field",
                                                                           "text_pair_field")}}
        with model_folder(task_dir / BEST, tokenizer_dir) as tmp:
            line = TYPES[task.type].write_model(model, tmp, meta)
            card = {"transformers": line, **card_facts(TYPES[task.type]),
                    "params": sum(p.numel() for p in model.parameters()), "best_epoch": result.best_epoch,
                    "examples": {split: task.size(split) for split in ("train", "dev", "eval")}}
            # a model whose weights started random: the adapted model's chain is not its own
            write_model_card(tmp, "finetune", params, {**meta, **card},
                             upstream=None if VARIANTS[variant].random_init else tokenizer_dir)
        print(f"{name}: {task_dir / BEST} as {line}", flush=True)
        write_json(best_record, {"fingerprint": run_id, "dev_score": score, "variant": variant, "seed": seed})
    write_json(saved, {"fingerprint": run_id, "result": result.__dict__})
    shutil.rmtree(epochs, ignore_errors=True)  # the run is done: its epochs' checkpoints are not needed again
    return result


def numbered(values: dict) -> dict[str, float]:
    """MLflow's flat metrics of RunResult.learned: a list's items as name_0, name_1, ..."""
    return {f"{k}_{i}" if isinstance(v, list) else k: x for k, v in values.items()
            for i, x in (enumerate(v) if isinstance(v, list) else [(0, v)])}


def load_transfer(name: str, cfg: TaskConfig, source: str, source_cfg: TaskConfig, tokenizer, special: dict[str, int],
                  ft: FinetuneConfig, causal: bool, context: Context) -> TaskData:
    """Transfer task `name` as its source's runs are scored on it: the source's train and dev (what they
    learned and were calibrated on) and its own labeled evaluation split, finetune.max_eval_examples of it."""
    task = task_type(cfg).load(name, cfg, tokenizer, special, dev_fraction=ft.dev_fraction, dev_max=ft.dev_max,
                               max_train=ft.train_limit(source), max_eval=ft.eval_limit(name), causal=causal,
                               train_from=(source, source_cfg))
    if task.eval is None:
        raise UserError(f"tasks.{name}.eval_splits: '{task.eval_split}' has no labels, and a transfer task is only "
                        "scored; name a labeled split first")
    distributed.say(context, f"{name}: zero-shot from {source}, {task.size('eval')} {task.eval_split} examples; "
                             f"skipped {eval_skipped(task)}; truncated {task.truncated['eval']}")
    return task


def eval_skipped(task: TaskData) -> dict[str, int]:
    """The evaluation split's skipped rows: a transfer task's train rows are its source's."""
    return {k: v for k, v in task.skipped.items() if k.startswith("eval.")}


def language_facts(name: str, cfg: TaskConfig, backbone: TransformerConfig, context: Context) -> dict[str, str | None]:
    """The task's language and, where the backbone has language embeddings, the one its text reads; a
    language the backbone has none for is said here, once."""
    row, note = language_row(backbone, cfg.language)
    if note:
        distributed.say(context, f"{name}: {note}")
    return {"language": cfg.language, **({"language_embedding": backbone.languages[row]} if row is not None else {})}


def stats(values: list[float]) -> dict:
    """A metric over seeds: mean, std (0 for one seed) and the values."""
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "seeds": values}


def summarise(task: TaskData, metric_names: list[str], results: list[RunResult]) -> dict:
    """Per variant: the evaluation split's metrics (and dev's) as mean, std (over seeds) and per seed,
    and what its runs learned that the report shows (elmo's layer weights and gamma), per seed."""
    variants = {}
    for variant, runs in by_variant(results).items():
        summary = {"dev": {m: stats([r.dev[m] for r in runs]) for m in metric_names},
                   "best_epoch": [r.best_epoch for r in runs], "seconds": sum(r.seconds for r in runs)}
        if task.eval is not None:
            summary["eval"] = {m: stats([r.eval[m] for r in runs]) for m in metric_names}
        summary.update({k: [r.learned[k] for r in runs] for k in runs[0].learned})
        variants[variant] = summary
    return {"metric": metric_names[0], "eval_split": task.eval_split if task.eval is not None else None,
            "train_examples": task.size("train"), "dev_examples": task.size("dev"), "eval_examples": task.size("eval"),
            "skipped": task.skipped, "truncated": task.truncated, "variants": variants}


def summarise_transfer(task: TaskData, source: str, metric_names: list[str], results: list[RunResult]) -> dict:
    """A transfer task as summarise gives a task, from the zero-shot scores of its source's runs: per
    variant the evaluation split's metrics over seeds; no dev and no training of its own."""
    return {"metric": metric_names[0], "transfer_from": source, "eval_split": task.eval_split,
            "eval_examples": task.size("eval"), "skipped": eval_skipped(task),
            "truncated": {"eval": task.truncated["eval"]},
            "variants": {variant: {"eval": {m: stats([r.transfer[task.name][m] for r in runs]) for m in metric_names}}
                         for variant, runs in by_variant(results).items()}}


def by_variant(results: list[RunResult]) -> dict[str, list[RunResult]]:
    """The runs of each variant, variants in the order they ran."""
    variants = dict.fromkeys(r.variant for r in results)
    return {variant: [r for r in results if r.variant == variant] for variant in variants}


def dev_curves(results: list[RunResult], variants: list[str]) -> list[list]:
    """Per epoch: [epoch, each variant's dev metric as the mean over its seeds ("" past its last epoch)]."""
    rows = []
    for epoch in range(max(len(r.dev_curve) for r in results)):
        row = [epoch + 1]
        for variant in variants:
            values = [r.dev_curve[epoch] for r in results if r.variant == variant and len(r.dev_curve) > epoch]
            row.append(statistics.fmean(values) if values else "")
        rows.append(row)
    return rows

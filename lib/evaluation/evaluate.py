"""The evaluate stage for the task types other than classification (regression, tagging, span_qa,
multiple_choice; classification keeps its own path in stages/evaluate.py: raw strings through
lib.serving.predict, ONNX, zero-shot).

For each labeled split of a task's eval_splits, on the examples finetune selects (the same dev carve
and limits), it scores the teacher and the student with finetune's own scoring (lib.training.finetune.score_split:
dev first, then the split with what it takes from dev, SQuAD 2.0's no-answer threshold), every finetune
variant (mean ± std over seeds, first split only, as finetune reports them) and the type's train-only
baseline (lib.evaluation.baselines) fit on the same train examples and, where finetuning used a subset,
on all of train. It keeps what the report draws (per-entity-type F1 for tagging, predicted vs gold for
regression, HasAns / NoAns and the threshold for span QA) and times each model on CPU (lib.evaluation.efficiency).
"""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from lib.config.params import Params, TaskConfig
from lib.core import runtime
from lib.core.errors import UserError
from lib.evaluation.efficiency import profile
from lib.models.classifier import load_classifier
from lib.tasks import TYPES, task_type
from lib.tasks.base import TaskData
from lib.training.finetune import predict_all, score_split

CLASSIFICATION_ONLY = ("ONNX Runtime and its int8 student, zero-shot prompting and the MLflow pyfunc models are "
                       "classification-only so far: none of them was run for this {type} task.")


def evaluate_typed_task(name: str, task_cfg: TaskConfig, models: dict[str, Path], finetuned: dict | None,
                        distilled: dict | None, tokenizer, special: dict[str, int], params: Params) -> dict:
    """evaluate's result for a task of a type other than classification, in its layout (splits -> scores
    -> model -> metric, efficiency, teacher, notes), with `scatter` (regression) and `per_type` (tagging)
    for the report's figures."""
    kind, ft = task_type(task_cfg), params.finetune
    metrics = task_cfg.metrics
    device = runtime.resolve_device(params.device)
    impl = replace(params.impl, precision="auto")
    loaded = {role: load_classifier(folder, device) for role, folder in models.items()}
    result: dict[str, Any] = {"type": kind.name, "metric": metrics[0], "metrics": metrics, "splits": {},
                              "confusion": {}}
    if "teacher" in loaded:
        result["teacher"] = {"variant": loaded["teacher"][1]["variant"], "seed": loaded["teacher"][1]["seed"]}
    if task_cfg.data_label or task_cfg.data_note:
        result["data"] = {"label": task_cfg.data_label, "note": task_cfg.data_note}
    # teacher and student are of one family: the examples are encoded for it (tagging's causal layout)
    causal = {model.backbone.cfg.causal for model, _ in loaded.values()} == {True}
    selection = dict(dev_fraction=ft.dev_fraction, dev_max=ft.dev_max)
    train, full_train = train_items(name, task_cfg, max_train=ft.train_limit(name), **selection)
    calibration: dict[str, dict] = {}
    unlabeled = []
    for split in task_cfg.eval_splits:
        cfg = replace(task_cfg, eval_splits=[split, *(s for s in task_cfg.eval_splits if s != split)])
        task = kind.load(name, cfg, tokenizer, special, max_train=ft.train_limit(name), max_eval=ft.eval_limit(name),
                         causal=causal, **selection)
        if task.eval is None:
            unlabeled.append(split)
            continue
        first = not result["splits"]
        if first and kind.class_names(task):  # what the confusion matrices' rows and columns are
            result["label_names"] = kind.class_names(task)
        entry: dict[str, Any] = {"examples": len(task.references["eval"]), "train_examples": len(train),
                                 "full_train_examples": len(full_train), "scores": {}}
        for role, (model, info) in loaded.items():
            print(f"{name} {split}: scoring the {role} on {entry['examples']} examples ({device.type})", flush=True)
            scored = as_saved(task, info, f"{models[role]}")
            if role not in calibration:  # from dev, the same for every split
                calibration[role] = score_split(model, scored, "dev", metrics, ft.batch_size, special["pad"], device,
                                                impl)[1]
            score_model(entry, result, role, model, scored, metrics, calibration[role], ft.batch_size, special["pad"],
                        device, impl, first)
        if first and finetuned:
            entry["scores"].update(variant_means(finetuned))
        baseline = kind.baseline
        for suffix, items in (("", train), ("_full_train", full_train)):
            if suffix and len(full_train) == len(train):
                continue  # finetuning used all of train: the baseline above already did
            print(f"{name} {split}: {baseline} baseline on {len(items)} train examples", flush=True)
            values, extras = kind.baseline_scores(task, items, metrics)
            entry["scores"][baseline + suffix] = values
            keep_extras(entry, result, baseline + suffix, extras, first and not suffix)
        result["splits"][split] = entry
        print(f"{name} {split}: " + "; ".join(f"{m} {s[metrics[0]]:.4f}" for m, s in entry["scores"].items()),
              flush=True)
    if not result["splits"]:
        raise UserError(f"tasks.{name}.eval_splits: none of {task_cfg.eval_splits} has labels; "
                        "name a labeled split to evaluate on")
    notes = [f"Evaluated on {', '.join(result['splits'])}: {', '.join(unlabeled)} has no labels."] if unlabeled else []
    notes.append(CLASSIFICATION_ONLY.format(type=kind.name))
    print(f"{name}: {notes[-1]}", flush=True)
    result["note"] = " ".join(notes)
    cfg = params.evaluate
    latency_batch = kind.latency_batch(task.info)  # the last split's task: the same train, so the same info
    if loaded:
        result["timed"] = kind.timed.format(seq_len=cfg.latency_seq_len, n=latency_batch)
        print(f"{name}: timing {', '.join(loaded)}: {result['timed']}", flush=True)
    result["efficiency"] = {role: profile(model, models[role], seq_len=cfg.latency_seq_len,
                                          repeats=cfg.latency_repeats, throughput_batch=cfg.throughput_batch,
                                          latency_batch=latency_batch)
                            for role, (model, _) in loaded.items()}
    if distilled:
        add_retention(result, metrics[0])
    return result


def add_retention(result: dict, metric: str) -> None:
    """result["retained"] (the student's share of the teacher's `metric` on the first split) and
    result["speedup"] (the teacher's CPU p50 latency over the student's), where both were timed."""
    if not {"teacher", "student"} <= set(result["efficiency"]):
        return
    first_scores = result["splits"][next(iter(result["splits"]))]["scores"]
    teacher, student = first_scores["teacher"][metric], first_scores["student"][metric]
    result["retained"] = student / teacher if teacher else None
    result["speedup"] = (result["efficiency"]["teacher"]["cpu"]["p50_ms"]
                         / result["efficiency"]["student"]["cpu"]["p50_ms"])


def score_model(entry: dict, result: dict, role: str, model, task: TaskData, metrics: list[str],
                calibration: dict[str, Any], batch_size: int, pad_id: int, device: torch.device, impl,
                first: bool) -> None:
    """The model's scores on task.eval into entry["scores"][role], its extras beside them: what
    lib.training.finetune.score_split does, keeping the predictions for the regression scatter (first split)."""
    kind = TYPES[task.type]
    predicted = predict_all(model, task, task.eval, batch_size, pad_id, device, impl)
    values, extras = kind.score(task, "eval", predicted, metrics, calibration)
    entry["scores"][role] = values
    keep_extras(entry, result, role, extras, first)
    scatter = kind.scatter(task, predicted) if first else None
    if scatter is not None:
        result.setdefault("scatter", {})[role] = scatter


def train_items(name: str, cfg: TaskConfig, *, dev_fraction: float, dev_max: int,
                max_train: int | None) -> tuple[list, list]:
    """(the train items finetune trains on, all of train but the dev carve), as the type's `load` selects
    them, without encoding them: the baselines learn from the raw items."""
    kind, key = task_type(cfg), f"tasks.{name}"
    items, _ = kind.read(cfg, cfg.train_split, key, None)
    return tuple(kind.split_train(items, key, dev_fraction=dev_fraction, dev_max=dev_max, max_train=limit)[0]
                 for limit in (max_train, None))


def as_saved(task: TaskData, info: dict[str, Any], where: str) -> TaskData:
    """The task as the saved model reads it: its label names (tag order) and info (regression's scale,
    span settings) from classifier.json, not recomputed from today's data."""
    names = info.get("label_names") or task.label_names
    TYPES[task.type].check_labels(names, task, where)
    return replace(task, label_names=list(names), info={**task.info, **info.get("info", {})})


def keep_extras(entry: dict, result: dict, model: str, extras: dict, first: bool) -> None:
    """SQuAD's threshold and HasAns / NoAns breakdown per split; per-entity-type F1 of the first split."""
    if "threshold" in extras:  # "-inf" (JSON has no infinity): the baseline answers no question
        threshold = extras["threshold"]
        entry.setdefault("threshold", {})[model] = threshold if math.isfinite(threshold) else str(threshold)
    if "breakdown" in extras:
        entry.setdefault("breakdown", {})[model] = extras["breakdown"]
    if "per_type" in extras and first:
        result.setdefault("per_type", {})[model] = extras["per_type"]
    if "confusion" in extras and first:  # tagging's words, multiple choice's endings
        result["confusion"][model] = extras["confusion"]


def variant_means(finetuned: dict) -> dict[str, dict[str, float]]:
    """Each finetune variant's evaluation scores: the mean over seeds, and their std where there were
    several (one seed has no spread to show: the report would print "± 0.0")."""
    def stats(metric: str, summary: dict) -> dict[str, float]:
        spread = {f"{metric}_std": summary["std"]} if len(summary.get("seeds", ())) > 1 else {}
        return {metric: summary["mean"], **spread}

    return {variant: {k: v for m, s in summary.get("eval", {}).items() for k, v in stats(m, s).items()}
            for variant, summary in finetuned["variants"].items()}

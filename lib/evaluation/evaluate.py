"""What the evaluate stage reports for one task, the same way for every task type.

For each labeled split of a task's eval_splits, on the examples finetune selects (the same dev carve
and limits), it scores the teacher and the student as finetune scores a model (lib.tasks.scoring:
dev first where the type calibrates on it, SQuAD 2.0's no-answer threshold), every finetune variant
(mean ± std over seeds, first split only, as finetune reports them) and the type's train-only baseline
(lib.metrics.baselines) fit on the same train examples and, where finetuning used a subset, on all
of train, for a type with one (lib.tasks.capabilities.Baselined). It keeps the extras of the models' scores
that the type declares (Reported.kept_extras: confusion matrices, per-entity-type F1 for tagging,
predicted vs gold for regression, HasAns / NoAns and the threshold for span QA) and times each model on
CPU (lib.evaluation.efficiency). The result is a lib.evaluation.result.TaskEvaluation.

A type that lib/serving serves (`Served`) also gets: its models exported to ONNX and timed in ONNX
Runtime on CPU at batch 1 on torch's threads, beside their PyTorch latency, and the student's graph
with int8 weights (ONNX Runtime's dynamic quantization, what a CPU deployment would run) scored on
every split as the others are; and, where evaluate.zero_shot has a prompt and the LM is causal,
zero-shot prompting of the LM (a lib.tasks.capabilities.ZeroShot type).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from lib.config.errors import UserError
from lib.config.params import EvaluateConfig, Params, TaskConfig
from lib.core import runtime
from lib.evaluation.efficiency import onnx_latency, profile
from lib.evaluation.result import Retention, SplitEvaluation, TaskEvaluation
from lib.evaluation.zero_shot import zero_shot, zero_shot_problem
from lib.models.architectures import Transformer
from lib.serving.onnx_export import OnnxClassifier, folder_to_onnx, quantize_int8
from lib.tasks import TYPES, task_metrics, task_type
from lib.tasks.base import TaskData, TaskType
from lib.tasks.capabilities import Baselined, Calibrated, Reported, Served, kept_extras
from lib.tasks.model import load_task_model
from lib.tasks.scoring import predict_all, score_split

INT8_ROLE = "student_int8"  # the student's ONNX graph with int8 weights (ONNX Runtime's dynamic quantization)


def evaluate_task(name: str, task_cfg: TaskConfig, models: dict[str, Path], finetuned: dict | None,
                  distilled: dict | None, lm: Transformer, tokenizer, special: dict[str, int], params: Params,
                  train_from: tuple[str, TaskConfig] | None = None) -> TaskEvaluation:
    """evaluate's result for a task: per split the scores of every model, the extras its type keeps for the
    report, efficiency, teacher, notes. `models`: role -> folder of the teacher and student that exist; `lm`,
    `tokenizer`, `special`: the adapted LM and its tokenizer, which every task model shares. A transfer
    task's train (its baseline's) is its source's, `train_from` (name, config), as
    lib.tasks.base.TaskType.select takes it."""
    kind, ft, cfg = task_type(task_cfg), params.finetune, params.evaluate
    metrics = task_metrics(task_cfg)
    device = runtime.resolve_device(params.device)
    impl = replace(params.impl, precision="auto")  # scored and timed at deployment precision
    loaded = {role: load_task_model(folder, device) for role, folder in models.items()}
    onnx = onnx_classifiers(models) if isinstance(kind, Served) else {}
    result = TaskEvaluation(kind.name, metrics[0], metrics, language=task_cfg.language,
                            transfer_from=train_from[0] if train_from else None)
    if "teacher" in loaded:
        result.teacher = {"variant": loaded["teacher"][1]["variant"], "seed": loaded["teacher"][1]["seed"]}
    if task_cfg.data_label or task_cfg.data_note:
        result.data = {"label": task_cfg.data_label, "note": task_cfg.data_note}
    # teacher and student are of one family: the examples are encoded for it (tagging's causal layout)
    causal = {model.backbone.cfg.causal for model, _ in loaded.values()} == {True}
    selection = dict(dev_fraction=ft.dev_fraction, dev_max=ft.dev_max, train_from=train_from)
    trained_on = train_from[0] if train_from else name  # whose train the models and baselines learned from
    # the baselines also learn from all of train but dev; finetune's train is each split's task's
    full_train = kind.select(name, task_cfg, **selection).train
    scored_models = {**{role: model for role, (model, _) in loaded.items()},
                     **{role: classifier.model for role, (classifier, _) in onnx.items() if role == INT8_ROLE}}
    infos = {**{role: info for role, (_, info) in loaded.items()}, INT8_ROLE: loaded.get("student", (None, {}))[1]}
    calibration: dict[str, dict] = {}
    unlabeled, zero_shot_note = [], None
    for split in task_cfg.eval_splits:
        split_cfg = replace(task_cfg, eval_splits=[split, *(s for s in task_cfg.eval_splits if s != split)])
        task = kind.load(name, split_cfg, tokenizer, special, max_train=ft.train_limit(trained_on),
                         max_eval=ft.eval_limit(name), causal=causal, **selection)
        if task.eval is None:
            unlabeled.append(split)
            continue
        first = not result.splits
        if first and isinstance(kind, Reported):  # what the confusion matrices' rows and columns are
            result.label_names = kind.class_names(task) or None
        train = task.references["train"]
        entry = SplitEvaluation(len(task.references["eval"]), len(train), len(full_train))
        for role, model in scored_models.items():
            print(f"{name} {split}: scoring the {role} on {entry.examples} examples", flush=True)
            scored = as_saved(task, infos[role], f"{models.get(role, models.get('student'))}")
            if role not in calibration:  # from dev, the same for every split
                calibration[role] = score_split(model, scored, "dev", metrics, ft.batch_size * 2, special["pad"],
                                                device, impl)[1] if isinstance(kind, Calibrated) else {}
            score_model(entry, result, role, model, scored, metrics, calibration[role], ft.batch_size * 2,
                        special["pad"], device, impl, first)
        if first and finetuned:
            entry.scores.update(variant_means(finetuned))
        if isinstance(kind, Baselined):
            for suffix, items in (("", train), ("_full_train", full_train)):
                if suffix and (len(full_train) == len(train) or not kind.baseline_fits):
                    continue  # finetuning used all of train (or the baseline learns nothing): scored above
                print(f"{name} {split}: {kind.baseline_label} baseline on {len(items)} train examples", flush=True)
                values, extras = kind.baseline_scores(task, items, metrics, cfg)
                entry.scores[kind.baseline + suffix] = values
                keep_extras(entry, result, kind, kind.baseline + suffix, extras, first and not suffix)
        prompt = cfg.zero_shot.get(name)
        if prompt is not None and lm.cfg.causal:
            zero_shot_note = zero_shot_problem(name, prompt.label_words, task.label_names)
            if zero_shot_note is None:
                predicted = zero_shot(lm, tokenizer, special, task.references["eval"], template=prompt.template,
                                      label_words=prompt.label_words, max_len=task_cfg.max_len,
                                      truncation=task_cfg.truncation)
                entry.scores["zero_shot"] = kind.score(task, "eval", predicted, metrics)[0]
        result.splits[split] = entry
        print(f"{name} {split}: " + "; ".join(f"{m} {s[metrics[0]]:.4f}" for m, s in entry.scores.items()),
              flush=True)
    if not result.splits:
        raise UserError(f"tasks.{name}.eval_splits: none of {task_cfg.eval_splits} has labels; "
                        "name a labeled split to evaluate on")
    notes = [f"Evaluated on {', '.join(result.splits)}: {', '.join(unlabeled)} has no labels."] if unlabeled else []
    if not isinstance(kind, Baselined):
        notes.append(f"{kind.name} tasks have no train-only baseline so far: none was scored.")
    if zero_shot_note is not None:
        notes.append(zero_shot_note)
    if not isinstance(kind, Served) and not train_from:  # a transfer task has no models of its own to serve
        served = ", ".join(other.name for other in TYPES.values() if isinstance(other, Served))
        notes.append(f"ONNX Runtime and its int8 student, zero-shot prompting and the MLflow pyfunc models are for "
                     f"{served} tasks so far: none of them was run for this {kind.name} task.")
    for note in notes:
        print(f"{name}: {note}", flush=True)
    if notes:
        result.note = " ".join(notes)
    latency_batch = kind.latency_batch(task.info)  # the last split's task: the same train, so the same info
    if loaded:
        result.timed = kind.timed.format(seq_len=cfg.latency_seq_len, n=latency_batch)
        print(f"{name}: timing {', '.join(loaded)}: {result.timed}", flush=True)
    result.efficiency = {role: profile(model, models[role], seq_len=cfg.latency_seq_len,
                                       repeats=cfg.latency_repeats, throughput_batch=cfg.throughput_batch,
                                       latency_batch=latency_batch, call=kind.timed_call(model, task),
                                       written_tokens=kind.written_tokens(task))
                         for role, (model, _) in loaded.items()}
    if onnx:
        print(f"{name}: timing {', '.join(onnx)} in ONNX Runtime", flush=True)
        result.onnx = {role: onnx_efficiency(c, size, cfg) for role, (c, size) in onnx.items()}
    if distilled:
        add_retention(result)
    return result


def onnx_classifiers(models: dict[str, Path]) -> dict[str, tuple[OnnxClassifier, int]]:
    """Each model through ONNX Runtime on CPU, and the student quantized to int8 (INT8_ROLE), each with
    the bytes of its ONNX model. Exported in memory: the model folders are other stages' outputs, and
    evaluate's own are its reports."""
    exported = {role: folder_to_onnx(folder) for role, folder in models.items()}
    if "student" in exported:
        exported[INT8_ROLE] = quantize_int8(exported["student"])
    folders = {**models, INT8_ROLE: models.get("student")}
    return {role: (OnnxClassifier.load(folders[role], model), len(model)) for role, model in exported.items()}


def onnx_efficiency(classifier: OnnxClassifier, size: int, cfg: EvaluateConfig) -> dict:
    """Size of the ONNX model, and its CPU latency at batch 1 in ONNX Runtime at evaluate.latency_seq_len
    tokens, on the session's threads: torch's, so it compares with the PyTorch CPU latency."""
    forward = classifier.model
    timing = onnx_latency(forward, forward.vocab_size, cfg.latency_seq_len, repeats=cfg.latency_repeats)
    return {"disk_bytes": size, "cpu": {**timing, "seq_len": cfg.latency_seq_len, "threads": forward.threads}}


def add_retention(result: TaskEvaluation) -> None:
    """result.retention: the student's share of the teacher's main metric on the first split and the
    teacher's CPU p50 latency over the student's, where both were timed."""
    if not {"teacher", "student"} <= set(result.efficiency):
        return
    scores = result.first_split.scores
    teacher, student = scores["teacher"][result.metric], scores["student"][result.metric]
    latency = {role: result.efficiency[role]["cpu"]["p50_ms"] for role in ("teacher", "student")}
    result.retention = Retention(student / teacher if teacher else None, latency["teacher"] / latency["student"])


def score_model(entry: SplitEvaluation, result: TaskEvaluation, role: str, model, task: TaskData, metrics: list[str],
                calibration: dict[str, Any], batch_size: int, pad_id: int, device: torch.device, impl,
                first: bool) -> None:
    """The model's scores on task.eval into entry.scores[role], the extras its type keeps beside them: what
    lib.tasks.scoring.score_split does, with the extras of the predictions themselves (regression's
    predicted vs gold)."""
    kind = TYPES[task.type]
    predicted = predict_all(model, task, task.eval, batch_size, pad_id, device, impl)
    values, extras = kind.score(task, "eval", predicted, metrics, calibration)
    entry.scores[role] = values
    if isinstance(kind, Reported):
        extras = {**extras, **kind.prediction_extras(task, predicted)}
    keep_extras(entry, result, kind, role, extras, first)


def as_saved(task: TaskData, info: dict[str, Any], where: str) -> TaskData:
    """The task as the saved model reads it: its label names (tag order) and info (regression's scale,
    span settings) from classifier.json, not recomputed from today's data."""
    names = info.get("label_names") or task.label_names
    TYPES[task.type].check_labels(names, task, where)
    return replace(task, label_names=list(names), info={**task.info, **info.get("info", {})})


def keep_extras(entry: SplitEvaluation, result: TaskEvaluation, kind: TaskType, model: str, extras: dict[str, Any],
                first: bool) -> None:
    """The extras of `model`'s scores that its type keeps (lib.tasks.capabilities.Reported.kept_extras), as
    the JSON holds them: those of every split on the split's entry, the others on the task, from the
    first split (`first`)."""
    for extra in kept_extras(kind):
        if extra.name in extras and (extra.per_split or first):
            kept = entry.extras if extra.per_split else result.extras
            kept.setdefault(extra.name, {})[model] = extra.as_json(extras[extra.name])


def variant_means(finetuned: dict) -> dict[str, dict[str, float]]:
    """Each finetune variant's evaluation scores: the mean over seeds, and their std where there were
    several (one seed has no spread to show: the report would print "± 0.0")."""
    def stats(metric: str, summary: dict) -> dict[str, float]:
        spread = {f"{metric}_std": summary["std"]} if len(summary.get("seeds", ())) > 1 else {}
        return {metric: summary["mean"], **spread}

    return {variant: {k: v for m, s in summary.get("eval", {}).items() for k, v in stats(m, s).items()}
            for variant, summary in finetuned["variants"].items()}

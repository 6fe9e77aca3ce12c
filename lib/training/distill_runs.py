"""The distill stage's runs: each task's student trained once (lib/training/distill.py) from its teacher,
kept with its result in the task's folder under the stage's checkpoints, so a stage started again with
the same fingerprint (params, teacher, device) skips it, and its result summarised against the teacher's.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from lib.config.errors import UserError
from lib.config.params import Params, TaskConfig
from lib.core import distributed
from lib.core.distributed import Context
from lib.core.io import write_json
from lib.core.tracking import StageRun
from lib.data.tokenizer import load_tokenizer, saved_special_ids
from lib.models.folder import model_folder
from lib.serving.model_card import write_model_card
from lib.tasks import saved_type, task_metrics, task_type
from lib.tasks.base import text_hash
from lib.tasks.model import TaskModel, card_facts
from lib.training.distill import DistillResult, distill_task, student_depths
from lib.training.finetune import run_name

STUDENT, RESULT = "student", "result.json"  # in a task's folder: the student model, the run's result


def distill_once(name: str, task_cfg: TaskConfig, teacher: TaskModel, info: dict, teacher_dir: Path, params: Params,
                 device: torch.device, task_dir: Path, run_id: str, run: StageRun, context: Context) -> DistillResult:
    """One task's student: kept in `task_dir` if this configuration (`run_id`) has it, else trained now as a
    child of `run` (under torchrun by every rank; rank 0 alone writes). `info`: the teacher's classifier.json."""
    record = task_dir / RESULT
    if record.is_file() and json.loads(record.read_text(encoding="utf-8"))["fingerprint"] == run_id:
        distributed.say(context, f"{name}: distilled in an earlier run, kept")
        return DistillResult(**json.loads(record.read_text(encoding="utf-8"))["result"])
    cfg, ft = params.distill, params.finetune
    tokenizer = load_tokenizer(teacher_dir)
    special = saved_special_ids(teacher_dir)
    taught_as = saved_type(info).name
    kind = task_type(task_cfg)
    if taught_as != kind.name:
        raise UserError(f"tasks.{name}.type: {kind.name}, but the teacher in {teacher_dir} was finetuned as "
                        f"{taught_as}; run the finetune stage again")
    task = kind.load(name, task_cfg, tokenizer, special, dev_fraction=ft.dev_fraction, dev_max=ft.dev_max,
                     max_train=ft.train_limit(name), max_eval=ft.eval_limit(name), causal=teacher.backbone.cfg.causal)
    # the teacher's outputs are in its units (regression's target scale): the student learns in those
    task = dataclasses.replace(task, info={**task.info, **info.get("info", {})})
    unlabeled, skipped = [], {}
    if name in cfg.unlabeled:  # texts the teacher labels, none of them a dev or evaluation text
        held_out = {text_hash(kind.hash_text(item)) for item in task.references["dev"] + task.references["eval"]}
        texts, skipped = kind.read_unlabeled(task_cfg, cfg.unlabeled[name], cfg.max_unlabeled, held_out,
                                             f"tasks.{name}")
        unlabeled, _ = kind.encode(texts, task_cfg, tokenizer, special, task.label_names, task.info, f"tasks.{name}",
                                   teacher.backbone.cfg.causal)
    distributed.say(context, f"{name}: teacher {info['variant']} (seed {info['seed']}), {task.size('train')} labeled + "
        f"{len(unlabeled)} unlabeled transfer examples (skipped {skipped}), {task.size('dev')} dev")
    child = run.child(f"{name}/student", {"task": name, "teacher_variant": info["variant"]},
                      {"pipeline.role": "distill-run"})

    def on_epoch(row: dict) -> None:
        distributed.say(context, f"distill: {run_name(name, 'student', params.seed)} epoch {row['epoch']}: " + "  ".join(
            f"{k} {v:.4f}" for k, v in row.items() if k != "epoch"))
        child.log_metrics({k: v for k, v in row.items() if k != "epoch"}, step=row["epoch"])

    try:
        result, student = distill_task(teacher, task, unlabeled, task_metrics(task_cfg), cfg, params.impl, device,
                                       params.seed, special["pad"], task_dir, run_id, on_epoch, context)
    except BaseException:
        child.finish("FAILED")
        raise
    child.log_metrics({**{f"student_{s}_{m}": v for s in ("dev", "eval") for m, v in (result.student[s] or {}).items()},
                       **{f"teacher_{s}_{m}": v for s in ("dev", "eval") for m, v in (result.teacher[s] or {}).items()}})
    child.log_summary({"best_epoch": result.best_epoch, "seconds": result.seconds})
    child.finish("FINISHED")
    distributed.say(context, f"{name}: teacher {result.teacher}, student {result.student} ({result.seconds:.0f} s)")
    if not context.main:
        return result
    meta = {"task": name, "type": task.type, "info": task.info, "label_names": task.label_names,
            "encoding": info["encoding"], "variant": "student",
            "eval_split": task.eval_split, "dev": result.student["dev"], "eval": result.student["eval"],
            "teacher": {"variant": info["variant"], "seed": info["seed"], "blocks": result.teacher_blocks,
                        "layer_map": result.layer_map}}
    with model_folder(task_dir / STUDENT, teacher_dir) as tmp:
        line = kind.write_model(student, tmp, meta)
        depths = student_depths(params.distill, teacher.backbone.cfg)
        card = {"transformers": line, **card_facts(kind), "params": result.student_params,
                "student_layers": list(depths.values()),
                "best_epoch": result.best_epoch, "teacher_scores": result.teacher, "transfer": result.transfer,
                "examples": {split: task.size(split) for split in ("train", "dev", "eval")}}
        write_model_card(tmp, "distill", params, {**meta, **card}, upstream=teacher_dir)
    print(f"{name}: {task_dir / STUDENT} as {line}", flush=True)
    write_json(task_dir / RESULT, {"fingerprint": run_id, "result": result.__dict__})
    return result


def summarise(result: DistillResult, metric_names: list[str], info: dict) -> dict:
    """Teacher and student scores, the share of the teacher's score the student keeps (on the
    evaluation split, dev where it has no labels), sizes and timings."""
    split = "eval" if result.student["eval"] is not None else "dev"
    main = metric_names[0]
    teacher_score, student_score = result.teacher[split][main], result.student[split][main]
    return {"metric": main, "retained_on": split,
            "retained": student_score / teacher_score if teacher_score else None,
            "teacher": {**result.teacher, "variant": info["variant"], "params": result.teacher_params},
            "student": {**result.student, "params": result.student_params, "best_epoch": result.best_epoch},
            "transfer": result.transfer, "teacher_blocks": result.teacher_blocks, "layer_map": result.layer_map,
            "seconds": result.seconds, "teacher_seconds": result.teacher_seconds}

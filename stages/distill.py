"""Stage `distill`: a smaller student per task from its finetuned teacher (lib/training/distill.py).

For every task in distill.tasks it loads the teacher the finetune stage kept (--teachers/<task>),
the same train/dev/eval examples finetune used (read as the task's type reads them, lib/tasks),
and, for a classification task where distill.unlabeled names a split, that many in-domain texts for
the teacher to label; trains the student and writes:
- --out/<task>/: the student classifier (lib/models/classifier.py format, with the task's type, label names,
  tokenizer and the teacher's type info: regression's target scale, the units its outputs are in);
- the metrics JSON: per task, teacher and student scores on dev and the evaluation split, the share
  of the teacher's score the student keeps, sizes, transfer-set counts and timings;
- --plots/<task>.csv: per epoch, each loss term and the dev metric;
- an MLflow child run per task under this stage's run.
A finished task is kept in --checkpoints and a task in progress resumes from its last epoch.
"""
import dataclasses
import json
import shutil

from lib.core import runtime
from lib.core.errors import UserError, run_main
from lib.core.io import atomic_dir, file_sha256, write_csv, write_json
from lib.core.stage import open_stage
from lib.data.raw import localize
from lib.data.tokenizer import load_tokenizer, saved_special_ids
from lib.models.classifier import load_classifier, save_classifier, saved_type
from lib.models.folder import MODEL_FILE
from lib.tasks import check_tasks, task_metrics, task_type
from lib.tasks.base import text_hash
from lib.training import distributed
from lib.training.checkpoint import fingerprint
from lib.training.distill import DistillResult, distill_task
from lib.training.finetune import run_name

STUDENT, RESULT = "student", "result.json"


def main() -> None:
    stage = open_stage("distill", __doc__, inputs={"raw": "data/raw", "teachers": "models/finetune"},
                       outputs={"out": "models/distill", "metrics": "metrics/distill.json",
                                "plots": "plots/distill", "checkpoints": "data/checkpoints/distill"},
                       checks=[check_tasks])
    args, params = stage.args, stage.params
    if stage.relaunch():
        return
    cfg = params.distill
    local = localize(params, args.raw).tasks
    tasks = {name: local[name] for name in cfg.tasks}
    device = runtime.resolve_device(params.device)
    context = distributed.setup(device.type)
    device = distributed.device_for(context, device)
    runtime_facts = runtime.configure(params.impl, device)
    metrics, results = {}, {}
    with stage.run() as run:
        run.log_params({"runtime": runtime_facts})
        for number, (name, task_cfg) in enumerate(tasks.items(), 1):
            distributed.say(context, f"distill: {run_name(name, 'student', params.seed)} (run {number} of {len(tasks)})")
            teacher_dir = args.teachers / name
            teacher, info = load_classifier(teacher_dir)
            run_id = fingerprint(stage.keyed_on, task=name, device=device.type,
                                 teacher=file_sha256(teacher_dir / MODEL_FILE))
            task_dir = args.checkpoints / name
            record = task_dir / RESULT
            if record.is_file() and json.loads(record.read_text(encoding="utf-8"))["fingerprint"] == run_id:
                distributed.say(context, f"{name}: distilled in an earlier run, kept")
                result = DistillResult(**json.loads(record.read_text(encoding="utf-8"))["result"])
            else:
                result = distill_once(name, task_cfg, teacher, info, teacher_dir, params, device, task_dir, run_id, run,
                                      context)
            results[name] = result
            metrics[name] = summarise(result, task_metrics(task_cfg), info)
        distributed.barrier(context)  # every rank is past reading the kept results
        if context.main:
            write_outputs(metrics, results, args, run)
            shutil.rmtree(args.checkpoints, ignore_errors=True)  # the outputs are complete: nothing left to resume


def distill_once(name, task_cfg, teacher, info, teacher_dir, params, device, task_dir, run_id, run,
                 context) -> DistillResult:
    """One task's student, trained now (under torchrun by every rank; rank 0 alone writes)."""
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
    print(f"{name}: {task_dir / STUDENT} as {save_classifier(student, task_dir / STUDENT, teacher_dir, meta)}", flush=True)
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


def write_outputs(metrics: dict, results: dict[str, DistillResult], args, run) -> None:
    with atomic_dir(args.out) as tmp:
        for name in metrics:
            shutil.copytree(args.checkpoints / name / STUDENT, tmp / name)
            load_classifier(tmp / name)  # what later stages load must load
    write_json(args.metrics, metrics)
    with atomic_dir(args.plots) as plots:  # whole: a task no longer distilled leaves no curve behind
        for name, result in results.items():
            columns = list(dict.fromkeys(k for row in result.history for k in row))
            write_csv(plots / f"{name}.csv", columns, [[row.get(c, "") for c in columns] for row in result.history])
    run.log_metrics({f"{task}.{role}.{split}_{metric}": value for task, m in metrics.items()
                     for role in ("teacher", "student") for split in ("dev", "eval")
                     for metric, value in (m[role][split] or {}).items()})
    run.log_metrics({f"{task}.retained": m["retained"] for task, m in metrics.items() if m["retained"] is not None})
    for path in (args.metrics, args.plots):
        run.log_artifact(path)


if __name__ == "__main__":
    run_main(main)

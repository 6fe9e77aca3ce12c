"""Stage `distill`: a smaller student per task from its finetuned teacher (lib/training/distill.py).

For every task in distill.tasks (lib/training/distill_runs.py) it loads the teacher the finetune stage
kept (--teachers/<task>), the same train/dev/eval examples finetune used (read as the task's type reads them, lib/tasks),
and, for a classification task where distill.unlabeled names a split, that many in-domain texts for
the teacher to label; trains the student and writes:
- --out/<task>/: the student classifier (lib/tasks/model.py format, with the task's type, label names,
  tokenizer and the teacher's type info: regression's target scale, the units its outputs are in);
- the metrics JSON: per task, teacher and student scores on dev and the evaluation split, the share
  of the teacher's score the student keeps, sizes, transfer-set counts and timings;
- --plots/<task>.csv: per epoch, each loss term and the dev metric;
- an MLflow child run per task under this stage's run.
A finished task is kept in --checkpoints and a task in progress resumes from its last epoch.
"""
import shutil

from lib.core import distributed, runtime
from lib.core.errors import run_main
from lib.core.io import atomic_dir, file_sha256, write_csv, write_json
from lib.core.stage import open_stage
from lib.data.raw import localize
from lib.models.folder import MODEL_FILE
from lib.tasks import check_tasks, task_metrics
from lib.tasks.model import load_task_model
from lib.training.checkpoint import fingerprint
from lib.training.distill import DistillResult
from lib.training.distill_runs import STUDENT, distill_once, summarise
from lib.training.finetune import run_name
from lib.training.optim import check_optimizers


def main() -> None:
    stage = open_stage("distill", __doc__, inputs={"raw": "data/raw", "teachers": "models/finetune"},
                       outputs={"out": "models/distill", "metrics": "metrics/distill.json",
                                "plots": "plots/distill", "checkpoints": "data/checkpoints/distill"},
                       checks=[check_tasks, check_optimizers])
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
            teacher, info = load_task_model(teacher_dir)
            run_id = fingerprint(stage.keyed_on, task=name, device=device.type,
                                 teacher=file_sha256(teacher_dir / MODEL_FILE))
            result = distill_once(name, task_cfg, teacher, info, teacher_dir, params, device, args.checkpoints / name,
                                  run_id, run, context)
            results[name] = result
            metrics[name] = summarise(result, task_metrics(task_cfg), info)
        distributed.barrier(context)  # every rank is past reading the kept results
        if context.main:
            write_outputs(metrics, results, args, run)
            shutil.rmtree(args.checkpoints, ignore_errors=True)  # the outputs are complete: nothing left to resume


def write_outputs(metrics: dict, results: dict[str, DistillResult], args, run) -> None:
    with atomic_dir(args.out) as tmp:
        for name in metrics:
            shutil.copytree(args.checkpoints / name / STUDENT, tmp / name)
            load_task_model(tmp / name)  # what later stages load must load
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

"""Stage `evaluate`: one honest report of everything the chain produced.

For every task in finetune.tasks, on each labeled split of its eval_splits (the examples finetune
evaluates, finetune.max_eval_examples of them), lib.evaluation.evaluate scores, the same way for every
task type:
- the teacher (finetune's best model) and the student (distill's), as finetune scores a model, at
  deployment precision;
- every finetune variant, as mean ± std over seeds, from the finetune metrics (first split only:
  that is where finetune evaluates them);
- the type's train-only baseline (TF-IDF + logistic regression for classification) trained on the
  same train examples and on the whole train split;
- a transfer task (tasks.<name>.transfer_from): its source's variants, which finetune scored on it
  zero-shot, and the baseline trained on its source's train split; the report sets them beside the
  source's scores in a table per source task, a column per language;
- for a type lib/serving serves (classification): the student's int8 ONNX graph, and zero-shot
  prompting of the adapted LM where evaluate.zero_shot has a prompt and the LM is causal.
It times teacher and student (size, CPU latency, throughput at a batch; in ONNX Runtime too where
served), on the GPU too when there is one, and writes metrics/evaluate.json, DVC plot data under --plots
(confusion matrices, predicted vs gold, per-entity F1), and reports/ (summary.md, headed by the commit,
params digest, MLflow parent run and machine it came from, + PNG figures), attached with the metrics to
the MLflow parent run; the served tasks' teacher and student are logged as MLflow pyfunc models and
registered as a version of `<tracking.experiment>.<task>-teacher` / `-student` (a new one only when the
folder's files changed), whose alias `best` names the version with the highest dev score (lib.core.tracking).
"""
import json
from dataclasses import replace
from pathlib import Path

from lib.config.errors import UserError
from lib.core import runtime
from lib.core.errors import run_main
from lib.core.io import atomic_dir, write_json
from lib.core.stage import open_stage
from lib.core.tracking import registered_name
from lib.data.raw import localize
from lib.data.tokenizer import load_tokenizer, saved_special_ids
from lib.evaluation.evaluate import evaluate_task
from lib.evaluation.report import describe_provenance, starting_point, write_plots, write_report
from lib.evaluation.result import TaskEvaluation
from lib.models.folder import load_model
from lib.serving.predict import log_pyfunc
from lib.tasks import TYPES, check_tasks
from lib.tasks.capabilities import Served
from lib.tasks.model import META_FILE
from lib.training.variants import VARIANTS


def main() -> None:
    stage = open_stage("evaluate", __doc__,
                       inputs={"raw": "data/raw", "lm": "models/adapt", "teachers": "models/finetune",
                               "students": "models/distill", "pretrain_metrics": "metrics/pretrain.json",
                               "adapt_metrics": "metrics/adapt.json", "finetune_metrics": "metrics/finetune.json",
                               "distill_metrics": "metrics/distill.json"},
                       outputs={"metrics": "metrics/evaluate.json", "plots": "plots/evaluate", "report": "reports"},
                       checks=[check_tasks])
    args, params = stage.args, stage.params
    # scored and timed at deployment precision (auto), whatever precision training ran in
    runtime_facts = runtime.configure(replace(params.impl, precision="auto"), runtime.resolve_device(params.device))
    finetuned = read_json(args.finetune_metrics)
    distilled = read_json(args.distill_metrics)
    lm_metrics = {"pretrain": read_json(args.pretrain_metrics), "adapt": read_json(args.adapt_metrics)}
    warnings = [f"**{stage} stopped early**: {metrics['stopped_early']}." for stage, metrics in lm_metrics.items()
                if "stopped_early" in metrics]
    results = {}
    with stage.run() as run:
        run.log_params({"runtime": runtime_facts})
        lm = load_model(args.lm)
        lm_tokenizer = load_tokenizer(args.lm)
        special = saved_special_ids(args.lm)
        local = localize(params, args.raw)
        for name in params.finetune.tasks:  # the tasks with models to score; other entries of `tasks` wait their turn
            task_cfg, source = local.tasks[name], local.tasks[name].transfer_from
            # a transfer task's models are its source's, whose variants finetune scored on it
            models = {} if source else {role: folder / name for role, folder in (("teacher", args.teachers),
                                                                                  ("student", args.students))
                                        if (folder / name).is_dir()}
            results[name] = evaluate_task(name, task_cfg, models, finetuned.get(name), distilled.get(name), lm,
                                          lm_tokenizer, special, params,
                                          train_from=(source, local.tasks[source]) if source else None)
        provenance = {**describe_provenance(args.params, params, run, runtime_facts),
                      "started from": starting_point(lm_metrics)}
        write_outputs(results, warnings, provenance, args, run)
        for folder, artifact, metric in pyfunc_models(results, args.teachers, args.students):
            dev = json.loads((folder / META_FILE).read_text(encoding="utf-8"))["dev"]  # what kept this model
            run.register_folder(log_pyfunc, folder, artifact, registered_name(params.tracking.experiment, artifact),
                                dev, metric)


def pyfunc_models(results: dict[str, TaskEvaluation], teachers: Path, students: Path) -> list[tuple[Path, str, str]]:
    """(folder, artifact name, the task's main metric) of each teacher and student logged as an MLflow pyfunc
    model and registered: those of the tasks whose type lib.serving.predict serves."""
    return [(folder / name, f"{name}-{role}", r.metric) for name, r in results.items()
            if isinstance(TYPES[r.type], Served)
            for role, folder in (("teacher", teachers), ("student", students)) if (folder / name).is_dir()]


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"{path}: cannot read it ({err}); run the stage that writes it first (dvc repro)") from None


def write_outputs(results: dict[str, TaskEvaluation], warnings: list[str], provenance: dict[str, str], args,
                  run) -> None:
    write_json(args.metrics, {name: r.to_json() for name, r in results.items()})
    with atomic_dir(args.plots) as tmp:
        write_plots(results, tmp)
    with atomic_dir(args.report) as tmp:
        write_report(results, tmp, VARIANTS, warnings, provenance)
    parent = run.parent()
    for target in (run, parent):
        for path in (args.metrics, args.plots, args.report):
            target.log_artifact(path, path.name if path.is_dir() else None)
    parent.log_metrics({f"{name}.{model}.{metric}": value for name, r in results.items()
                        for model, s in r.first_split.scores.items() for metric, value in s.items()
                        if metric in r.metrics})


if __name__ == "__main__":
    run_main(main)

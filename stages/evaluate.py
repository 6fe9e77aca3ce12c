"""Stage `evaluate`: one honest report of everything the chain produced.

For every task in finetune.tasks, on each labeled split of its eval_splits (the examples finetune
evaluates, finetune.max_eval_examples of them), it scores:
- the teacher (finetune's best classifier) and the student (distill's), through lib.serving.predict, the
  way a user classifies raw strings, at deployment precision;
- every finetune variant, as mean ± std over seeds, from the finetune metrics (first split only:
  that is where finetune evaluates them);
- TF-IDF + logistic regression trained on the same train examples and on the whole train split;
- zero-shot prompting of the adapted LM where evaluate.zero_shot has a prompt and the LM is causal.
It times teacher and student (size, CPU latency at batch 1, throughput at a batch), on the GPU too
when there is one, and writes metrics/evaluate.json, DVC plot data under --plots (confusion matrices
of teacher, student and the TF-IDF baseline), and reports/ (summary.md, headed by the commit, params
digest, MLflow parent run and machine it came from, + PNG figures), attached with the metrics to the
MLflow parent run; the teacher and student are logged as MLflow pyfunc models.

A task of another type (regression, tagging, span_qa, multiple_choice) is scored by lib.evaluation.evaluate, as
finetune scores it, beside finetune's variants and its type's train-only baseline, sized and timed; ONNX,
zero-shot and pyfunc, classification-only, are noted as not run.

ONNX (lib.serving.onnx_export): teacher and student are exported in memory and timed in ONNX Runtime on CPU
at batch 1, on torch's CPU threads, beside their PyTorch CPU latency; the student's graph with int8
weights (ONNX Runtime's dynamic quantization), what a CPU deployment would run, is scored on every
split the student is and timed the same way.
"""
import hashlib
import json
import platform
from datetime import datetime, timezone
from dataclasses import replace
from pathlib import Path

import torch

from lib.config.params import Params
from lib.core import runtime, tracking
from lib.core.errors import UserError, run_main
from lib.core.io import atomic_dir, write_csv, write_json
from lib.core.stage import open_stage
from lib.data.raw import localize
from lib.data.tokenizer import load_tokenizer, saved_special_ids
from lib.evaluation.baselines import tfidf_baseline, zero_shot, zero_shot_problem
from lib.evaluation.efficiency import onnx_latency, profile
from lib.evaluation.evaluate import add_retention, evaluate_typed_task, variant_means
from lib.evaluation.metrics import compute_metrics, confusion_matrix
from lib.evaluation.report import write_report
from lib.models.classifier import META_FILE
from lib.models.folder import load_model
from lib.serving.onnx_export import OnnxClassifier, folder_to_onnx, quantize_int8
from lib.serving.predict import TextClassifier, log_pyfunc
from lib.tasks import check_tasks, task_type
from lib.tasks.classification import read_task

INT8_ROLE = "student_int8"  # the student's ONNX graph with int8 weights (ONNX Runtime's dynamic quantization)

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
            task_cfg = local.tasks[name]
            models = {role: folder / name for role, folder in (("teacher", args.teachers), ("student", args.students))
                      if (folder / name).is_dir()}
            if task_type(task_cfg).served:  # raw strings through lib.serving, as a user would
                results[name] = evaluate_task(name, task_cfg, models, finetuned.get(name), distilled.get(name), lm,
                                              lm_tokenizer, special, params)
            else:  # scored as finetune scores the type (lib.evaluation.evaluate); ONNX, zero-shot, pyfunc noted as not run
                results[name] = evaluate_typed_task(name, task_cfg, models, finetuned.get(name), distilled.get(name),
                                                    lm_tokenizer, special, params)
        provenance = {**describe_provenance(args.params, params, run, runtime_facts), "started from": starting_point(lm_metrics)}
        write_outputs(results, warnings, provenance, args, run)
        for folder, artifact in pyfunc_models(results, args.teachers, args.students):
            run.log_model(log_pyfunc, folder, artifact)


def pyfunc_models(results: dict, teachers: Path, students: Path) -> list[tuple[Path, str]]:
    """(folder, artifact name) of each teacher and student logged as an MLflow pyfunc model: those of the
    classification tasks, which lib.serving.predict serves (the other types' results have a `type` and say so)."""
    return [(folder / name, f"{name}-{role}") for name, r in results.items() if "type" not in r
            for role, folder in (("teacher", teachers), ("student", students)) if (folder / name).is_dir()]


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"{path}: cannot read it ({err}); run the stage that writes it first (dvc repro)") from None


def evaluate_task(name, task_cfg, models, finetuned, distilled, lm, lm_tokenizer, special, params) -> dict:
    cfg, ft = params.evaluate, params.finetune
    metric_names = task_cfg.metrics
    selection = dict(dev_fraction=ft.dev_fraction, dev_max=ft.dev_max, max_eval=ft.eval_limit(name))
    # scored where the stage runs (bf16 on a GPU, as finetune scored them); timed on CPU and GPU below
    classifiers = {role: TextClassifier.load(folder, device=params.device) for role, folder in models.items()}
    onnx = onnx_classifiers(models)
    scored = {**classifiers, **{role: c for role, (c, _) in onnx.items() if role == INT8_ROLE}}
    result = {"metric": metric_names[0], "metrics": metric_names, "splits": {}, "confusion": {}}
    if "teacher" in models:
        info = json.loads((models["teacher"] / META_FILE).read_text(encoding="utf-8"))
        result["teacher"] = {"variant": info["variant"], "seed": info["seed"]}
    unlabeled, zero_shot_note = [], None
    for split in task_cfg.eval_splits:
        rows = read_task(name, task_cfg, max_train=ft.train_limit(name), eval_split=split, **selection)
        if rows.eval is None:
            unlabeled.append(split)
            continue
        result["label_names"] = rows.label_names
        labels = [row.label for row in rows.eval]
        n_classes = len(rows.label_names)
        scores = {}
        first = not result["splits"]
        for role, classifier in scored.items():
            print(f"{name} {split}: scoring the {role} on {len(rows.eval)} examples ({classifier.device.type})",
                  flush=True)
            texts = [row.a for row in rows.eval]
            pairs = [row.b for row in rows.eval] if classifier.pairs else None
            predicted = classifier.predict_proba(texts, pairs).argmax(axis=1)
            scores[role] = compute_metrics(metric_names, predicted, labels, n_classes)
            if first:
                result["confusion"][role] = confusion_matrix(predicted, labels, n_classes).tolist()
        if first and finetuned:
            scores.update(variant_means(finetuned))
        print(f"{name} {split}: TF-IDF baseline on {len(rows.train)} train examples", flush=True)
        baseline = tfidf_baseline(rows.train, rows.dev, rows.eval, n_classes, metric_names, c_grid=tuple(cfg.tfidf_c))
        scores["tfidf"] = tfidf_scores(baseline)
        if first:  # every task has this one: plots/evaluate/confusion is never empty, so never missing from git
            result["confusion"]["tfidf"] = baseline["confusion"]
        full = read_task(name, task_cfg, eval_split=split, **selection)
        if len(full.train) > len(rows.train):  # finetuning used a subset: show what all of train gives
            print(f"{name} {split}: TF-IDF baseline on all {len(full.train)} train examples", flush=True)
            scores["tfidf_full_train"] = tfidf_scores(tfidf_baseline(
                full.train, full.dev, full.eval, n_classes, metric_names, c_grid=tuple(cfg.tfidf_c)))
        prompt = cfg.zero_shot.get(name)
        if prompt is not None and lm.cfg.causal:
            zero_shot_note = zero_shot_problem(name, prompt.label_words, rows.label_names)
            if zero_shot_note is None:
                predicted = zero_shot(lm, lm_tokenizer, special, rows.eval, template=prompt.template,
                                      label_words=prompt.label_words, max_len=task_cfg.max_len,
                                      truncation=task_cfg.truncation)
                scores["zero_shot"] = compute_metrics(metric_names, predicted, labels, n_classes)
        result["splits"][split] = {"examples": len(rows.eval), "train_examples": len(rows.train),
                                   "full_train_examples": len(full.train), "scores": scores}
        print(f"{name} {split}: " + "; ".join(f"{model} {s[metric_names[0]]:.4f}" for model, s in scores.items()),
              flush=True)
    if not result["splits"]:
        raise UserError(f"tasks.{name}.eval_splits: none of {task_cfg.eval_splits} has labels; "
                        "name a labeled split to evaluate on")
    notes = [f"Evaluated on {', '.join(result['splits'])}: {', '.join(unlabeled)} has no labels."] if unlabeled else []
    if zero_shot_note is not None:
        print(f"{name}: {zero_shot_note}", flush=True)
        notes.append(zero_shot_note)
    if notes:
        result["note"] = " ".join(notes)
    print(f"{name}: timing {', '.join(classifiers)}", flush=True)
    result["efficiency"] = {role: efficiency(c, models[role], cfg) for role, c in classifiers.items()}
    print(f"{name}: timing {', '.join(onnx)} in ONNX Runtime", flush=True)
    result["onnx"] = {role: onnx_efficiency(c, size, cfg) for role, (c, size) in onnx.items()}
    if distilled:
        add_retention(result, metric_names[0])
    return result


def tfidf_scores(baseline: dict) -> dict:
    return {**baseline["eval"], "c": baseline["c"], "seconds": baseline["seconds"]}


def efficiency(classifier: TextClassifier, folder: Path, cfg) -> dict:
    """Size, and speed on CPU (and on the GPU when there is one) at evaluate.latency_seq_len tokens."""
    return profile(classifier.model, folder, seq_len=cfg.latency_seq_len, repeats=cfg.latency_repeats,
                   throughput_batch=cfg.throughput_batch)


def describe_provenance(params_path: str | Path, params: Params, run: tracking.StageRun,
                        runtime_facts: dict) -> dict[str, str]:
    """What produced this report, for its header, so that a copy read later says whether it is current:
    the commit (as the MLflow runs are tagged), date, DVC experiment, params, MLflow parent run, machine."""
    tags = tracking.run_tags("evaluate", params)
    dirty = " with uncommitted changes" if tags["git.dirty"] == "true" else ""
    gpu = f"; GPU {torch.cuda.get_device_name()}" if runtime_facts["device"] == "cuda" else ""
    return {"commit": f"`{tags['git.commit'][:12]}`{dirty}",
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "DVC experiment": f"`{tags['dvc.exp_name']}`",
            "params.yaml": f"sha256 `{hashlib.sha256(Path(params_path).read_bytes()).hexdigest()[:12]}`",
            "MLflow parent run": f"`{run.parent_id}`" if run.parent_id else "none (tracking off or MLflow unavailable)",
            "machine": f"CPU {cpu_model()}, {runtime_facts['threads']} threads{gpu}; "
                       f"models scored in {runtime_facts['precision']}"}


def starting_point(lm_metrics: dict[str, dict]) -> str:
    """Where the language model every classifier here was finetuned from started, and what followed."""
    pretrain, adapt = lm_metrics["pretrain"], lm_metrics["adapt"]
    if "init" in pretrain:
        start = (f"the published checkpoint `{pretrain['init']}` ({pretrain['family']}), "
                 + ("kept as it is" if pretrain.get("kept") else
                    f"pretrained further with {pretrain['objective']} on {pretrain['tokens_seen']:,} tokens"))
    else:
        start = f"random weights, pretrained with {pretrain['objective']} on {pretrain['tokens_seen']:,} tokens"
    if adapt.get("enabled", True):
        return f"{start}; adapted to the domain with {adapt['objective']} on {adapt['tokens_seen']:,} tokens"
    return f"{start}; not adapted (adapt.enabled: false)"


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what the platform module knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def onnx_classifiers(models: dict[str, Path]) -> dict[str, tuple[OnnxClassifier, int]]:
    """Each classifier through ONNX Runtime on CPU, and the student quantized to int8 (INT8_ROLE),
    each with the bytes of its ONNX model. Exported in memory: the model folders are other stages'
    outputs, and evaluate's own are its reports."""
    exported = {role: folder_to_onnx(folder) for role, folder in models.items()}
    if "student" in exported:
        exported[INT8_ROLE] = quantize_int8(exported["student"])
    folders = {**models, INT8_ROLE: models.get("student")}
    return {role: (OnnxClassifier.load(folders[role], model), len(model)) for role, model in exported.items()}


def onnx_efficiency(classifier: OnnxClassifier, size: int, cfg) -> dict:
    """Size of the ONNX model, and its CPU latency at batch 1 in ONNX Runtime at evaluate.latency_seq_len
    tokens, on the session's threads: torch's, so it compares with the PyTorch CPU latency."""
    forward = classifier.model
    timing = onnx_latency(forward, forward.vocab_size, cfg.latency_seq_len, repeats=cfg.latency_repeats)
    return {"disk_bytes": size, "cpu": {**timing, "seq_len": cfg.latency_seq_len, "threads": forward.threads}}


def write_outputs(results: dict, warnings: list[str], provenance: dict[str, str], args, run) -> None:
    write_json(args.metrics, {name: {k: v for k, v in r.items() if k not in ("confusion", "label_names", "scatter")}
                              for name, r in results.items()})
    with atomic_dir(args.plots) as tmp:
        # a declared output, so there even where no task has a confusion matrix (regression, span QA)
        (tmp / "confusion").mkdir()
        scores, speed = [], []
        for name, r in results.items():
            split = next(iter(r["splits"]))
            for model, s in r["splits"][split]["scores"].items():
                scores.append([f"{name}/{model}", s[r["metric"]]])
            for role, e in r["efficiency"].items():
                speed.append([f"{name}/{role}", e["cpu"]["p50_ms"], r["splits"][split]["scores"][role][r["metric"]]])
            for role, matrix in r["confusion"].items():
                labels = r["label_names"]
                write_csv(tmp / "confusion" / f"{name}_{role}.csv", ["actual", "predicted"],
                          [[labels[i], labels[j]] for i, row in enumerate(matrix) for j, n in enumerate(row)
                           for _ in range(n)])
            for role, pairs in r.get("scatter", {}).items():  # regression: predicted vs gold
                write_csv(tmp / "predicted_vs_gold" / f"{name}_{role}.csv", ["gold", "predicted"], pairs)
            for role, f1 in r.get("per_type", {}).items():  # tagging: F1 per entity type
                write_csv(tmp / "entity_f1" / f"{name}_{role}.csv", ["entity_type", "f1"], sorted(f1.items()))
        write_csv(tmp / "scores.csv", ["model", "score"], scores)
        write_csv(tmp / "speed.csv", ["model", "cpu_p50_ms", "score"], speed)
    with atomic_dir(args.report) as tmp:
        write_report(results, tmp, warnings, provenance)
    parent = run.parent()
    for target in (run, parent):
        for path in (args.metrics, args.plots, args.report):
            target.log_artifact(path, path.name if path.is_dir() else None)
    parent.log_metrics({f"{name}.{model}.{metric}": value for name, r in results.items()
                        for model, s in r["splits"][next(iter(r["splits"]))]["scores"].items()
                        for metric, value in s.items() if metric in r["metrics"]})


if __name__ == "__main__":
    run_main(main)

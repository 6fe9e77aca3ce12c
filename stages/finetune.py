"""Stage `finetune` (ULMFiT step 3): a model for each task x variant x seed, from the adapted model.

For every task in finetune.tasks it loads the labeled data as its type reads it (lib/tasks/), trains each variant
(ulmfit, plain, from_scratch, frozen, elmo; lib/training/variants) once per seed, and writes:
- --out/<task>/: the model with the best dev score of all its runs (lib/tasks/model.py format, with
  the task's type, label names, the type's info and the tokenizer), for `distill` and `evaluate`;
- the metrics JSON: per task and variant, the evaluation split's metrics as mean, std and per seed (elmo also
  its learned layer weights and gamma, per seed); a transfer task (tasks.<name>.transfer_from) trains
  nothing: every run of its source task is scored on its evaluation split, zero-shot, and it is reported
  the same way;
- --plots/<task>.csv: the dev metric per epoch of each variant (mean over seeds);
- an MLflow child run per task x variant x seed under this stage's run.
A finished run is kept in --checkpoints (lib/training/finetune_runs.py), so a killed stage started again
skips what it had done, and a run in progress resumes after its last finished epoch.
"""
import shutil

from lib.config.params import flatten
from lib.core import distributed, runtime
from lib.core.errors import run_main
from lib.core.io import atomic_dir, file_sha256, write_csv, write_json
from lib.core.progress import Progress, RunTimes, duration
from lib.core.stage import open_stage
from lib.data.raw import localize
from lib.data.tokenizer import load_tokenizer, saved_special_ids
from lib.models.folder import MODEL_FILE, load_model
from lib.tasks import check_tasks, task_metrics, task_type
from lib.tasks.model import load_task_model
from lib.training.checkpoint import fingerprint
from lib.training.finetune import RunResult, run_name
from lib.training.finetune_runs import (BEST, dev_curves, finetune_once, language_facts, load_transfer, summarise,
                                       summarise_transfer)
from lib.training.optim import check_optimizers
from lib.training.variants import check_variants


def main() -> None:
    stage = open_stage("finetune", __doc__, inputs={"raw": "data/raw", "model": "models/adapt"},
                       outputs={"out": "models/finetune", "metrics": "metrics/finetune.json",
                                "plots": "plots/finetune", "checkpoints": "data/checkpoints/finetune"},
                       checks=[check_tasks, check_variants, check_optimizers])
    args, params = stage.args, stage.params
    if stage.relaunch():
        return
    cfg = params.finetune
    local = localize(params, args.raw).tasks
    tasks = {name: local[name] for name in cfg.tasks if local[name].transfer_from is None}
    transfers = {name: [t for t in cfg.tasks if local[t].transfer_from == name] for name in tasks}

    device = runtime.resolve_device(params.device)
    context = distributed.setup(device.type)
    device = distributed.device_for(context, device)
    runtime_facts = runtime.configure(params.impl, device)
    if params.init is not None and cfg.with_init:
        distributed.say(context, f"finetune: starting from {params.init}, so finetune.with_init sets "
                        + ", ".join(f"{k}={v}" for k, v in flatten(cfg.with_init).items()))
    tokenizer = load_tokenizer(args.model)
    special = saved_special_ids(args.model)
    pretrained = load_model(args.model)
    # what each task's models are built on: the stack its head reads (an encoder-decoder's encoder), or
    # for a type that writes text the whole encoder-decoder
    backbones = {name: task_type(local[name]).backbone(pretrained, f"tasks.{name}") for name in cfg.tasks}
    # a kept run is reused only by a stage with the same params, starting model and device
    run_id = fingerprint(stage.keyed_on, device=device.type,
                         model=file_sha256(args.model / MODEL_FILE))
    metrics, curves = {}, {}
    seeds = range(params.seed, params.seed + cfg.seeds)
    kinds = [(name, variant) for name in tasks for variant in cfg.variants for _ in seeds]  # each run's, in order
    times = RunTimes()  # a run's time depends on its task and variant far more than on its seed
    runs = Progress("finetune", len(kinds), "runs", estimate=lambda: times.eta_s(kinds[runs.done:]),
                    out=lambda line: distributed.say(context, line))
    # which language embedding each task's text reads, said once
    languages = {name: language_facts(name, local[name], backbones[name].cfg, context) for name in cfg.tasks}
    with stage.run() as run:
        run.log_params({"runtime": runtime_facts})
        for name, task_cfg in tasks.items():
            task = task_type(task_cfg).load(name, task_cfg, tokenizer, special, dev_fraction=cfg.dev_fraction,
                                             dev_max=cfg.dev_max, max_train=cfg.train_limit(name),
                                             max_eval=cfg.eval_limit(name), causal=backbones[name].cfg.causal)
            distributed.say(context, f"{name}: {task.size('train')} train, {task.size('dev')} dev, "
                f"{task.size('eval') if task.eval is not None else 'no labeled'} {task.eval_split} examples; "
                f"labels {task.label_names}; skipped {task.skipped}; truncated {task.truncated}")
            transferred = {t: load_transfer(t, local[t], name, task_cfg, tokenizer, special, cfg,
                                            backbones[name].cfg.causal, context) for t in transfers[name]}
            results = []
            for variant in cfg.variants:
                for seed in seeds:
                    distributed.say(context, f"finetune: {run_name(name, variant, seed)} "
                                             f"(run {runs.done + 1} of {len(kinds)})")
                    results.append(finetune_once(name, variant, seed, task, task_metrics(task_cfg), backbones[name],
                                                 params, device, special["pad"], args.checkpoints, args.model, run_id,
                                                 run, context, transferred))
                    times.add((name, variant), results[-1].seconds)  # a kept run: what it took when it ran
                    runs.update(runs.done + 1)
                    known, untimed = times.left(kinds[runs.done:])
                    floor = f"at least {duration(known)}; " if known else ""
                    distributed.say(context, runs.line(f"  ({floor}{untimed} of the runs left of a task × variant "
                                                       "not timed yet)" if untimed else ""))
            metrics[name] = summarise(task, task_metrics(task_cfg), results)
            curves[name] = results
            if context.main:  # rank 0 alone scored the transfer tasks
                metrics.update({t: summarise_transfer(other, name, task_metrics(task_cfg), results)
                                for t, other in transferred.items()})
        for name, facts in languages.items():
            metrics.get(name, {}).update(facts)
        distributed.barrier(context)  # every rank is past reading the kept runs
        if context.main:
            write_outputs(metrics, curves, cfg.variants, args, run)
            shutil.rmtree(args.checkpoints, ignore_errors=True)  # the outputs are complete: nothing left to resume


def write_outputs(metrics: dict, curves: dict[str, list[RunResult]], variants: list[str], args, run) -> None:
    with atomic_dir(args.out) as tmp:
        for name in curves:  # the tasks that trained; a transfer task's models are its source's
            shutil.copytree(args.checkpoints / name / BEST, tmp / name)
            load_task_model(tmp / name)  # what later stages load must load
    write_json(args.metrics, metrics)
    with atomic_dir(args.plots) as plots:  # whole: a task no longer finetuned leaves no curve behind
        for name, results in curves.items():
            write_csv(plots / f"{name}.csv", ["epoch", *variants], dev_curves(results, variants))
    run.log_metrics({f"{task}.{variant}.{split}_{metric}": stats["mean"]
                     for task, m in metrics.items() for variant, v in m["variants"].items()
                     for split in ("dev", "eval") if split in v for metric, stats in v[split].items()})
    for path in (args.metrics, args.plots):
        run.log_artifact(path)


if __name__ == "__main__":
    run_main(main)

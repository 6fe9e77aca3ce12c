"""The evaluate stage's human report: reports/summary.md and its PNG figures, and its DVC plot data, from
the tasks' results (lib.evaluation.result.TaskEvaluation). Each task type adds its own: the plots of
the extras it keeps and its section of the report (lib.tasks.capabilities.Reported).

The PNGs open anywhere (a markdown viewer, MLflow's artifact view), without DVC; they are attached to
the MLflow parent run with the summary. Scores are drawn on zero-based axes, so a gap of a point
between two models looks like one.
"""
from __future__ import annotations

import hashlib
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402

import torch  # noqa: E402

from lib.config.params import Params  # noqa: E402
from lib.core import tracking  # noqa: E402
from lib.core.io import write_csv  # noqa: E402
from lib.evaluation.result import SplitEvaluation, TaskEvaluation  # noqa: E402
from lib.tasks import TYPES  # noqa: E402
from lib.tasks.capabilities import (BARS, CONFUSION, MATRIX, SCATTER, Baselined, Plot, Reported,  # noqa: E402
                                     kept_extras)

# Above this many classes a confusion matrix is shown by colour alone: a count per cell is unreadable
# there, and drawing one text per cell took minutes (300 classes: 250 s)
ANNOTATED_MAX_CLASSES = 20
# Figures 7 inches wide at 110 dpi (770 px): readable on a laptop screen and in MLflow's artifact view
# without zooming, their labels at 9-10 pt
FIGURE_WIDTH, DPI, LABEL_SIZE, TITLE_SIZE = 7.0, 110, 9, 10
# the models that are not finetune variants (each variant has its own label: Shown)
ROLES = {"teacher": "teacher (best finetuned)", "student": "student (distilled)", "zero_shot": "zero-shot LM prompt",
         "tfidf": "TF-IDF + LR", "student_int8": "student, int8 (ONNX Runtime)"}
# the task types' train-only baselines (lib.metrics.baselines), each also as "<name>_full_train"
BASELINES = {kind.baseline: kind.baseline_label for kind in TYPES.values() if isinstance(kind, Baselined)}
UNFITTED = {kind.baseline for kind in TYPES.values() if isinstance(kind, Baselined) and not kind.baseline_fits}


class Shown(Protocol):
    """What the report reads of a finetune variant (lib.training.variants.base.Variant), which the evaluate
    stage passes in: the variants are named, not the LM they start from (the summary's "started from" line
    says whether it was adapted)."""

    label: str  # its models' name in the tables and figures
    random_init: bool  # its weights start random: what pretraining is measured against


def write_report(results: dict[str, TaskEvaluation], out_dir: Path, variants: Mapping[str, Shown],
                 warnings: list[str] = (), provenance: dict[str, str] | None = None) -> list[Path]:
    """summary.md and figures into out_dir (which must exist); returns the files written. `variants`: the
    finetune variants by name (lib.training.variants.VARIANTS). `provenance` (what produced the results:
    commit, date, params, run, machine; label -> markdown) heads the summary, so a stale copy says so;
    `warnings` (plain sentences, e.g. a stage a time limit stopped early) follow. The figures of the types'
    plots (`<plot folder>_<task>.png`) come by drawing, all matrices first, then bars, then scatters."""
    figures = [scores_figure(results, out_dir / "scores.png", variants), speed_figure(results, out_dir / "speed.png")]
    figures += [draw(task, values, r, out_dir / f"{plot.folder}_{task}.png", variants)
                for drawing, draw in DRAWINGS.items() for task, r in results.items()
                for plot, values in plotted(r) if plot.drawing == drawing]
    figures = [f for f in figures if f is not None]
    summary = out_dir / "summary.md"
    summary.write_text(markdown(results, [f.name for f in figures], variants, warnings, provenance), encoding="utf-8")
    return [summary, *figures]


def fmt(score: dict[str, Any] | None, metric: str) -> str:
    """A score as a percentage, with its std over seeds where there is one."""
    if not score or metric not in score:
        return "–"
    text = f"{100 * score[metric]:.1f}"
    if f"{metric}_std" in score:
        text += f" ± {100 * score[f'{metric}_std']:.1f}"
    return text


def plotted(r: TaskEvaluation) -> list[tuple[Plot, dict[str, Any]]]:
    """(plot, model -> value) of each extra of the task that its type plots (lib.tasks.capabilities.Extra),
    where a model has one."""
    kind = TYPES[r.type]
    kept = kept_extras(kind)
    return [(extra.plot, r.extras[extra.name]) for extra in kept if extra.plot and r.extras.get(extra.name)]


def write_plots(results: dict[str, TaskEvaluation], out_dir: Path) -> None:
    """DVC plot data into out_dir: scores.csv and speed.csv over every task's models, and per task and
    model the plots of its type's extras (a folder per plot, e.g. the confusion matrix: one row per item,
    actual and predicted)."""
    # a declared output, so there even where no task has a confusion matrix (regression, span QA)
    (out_dir / CONFUSION.plot.folder).mkdir()
    scores, speed = [], []
    for name, r in results.items():
        first = r.first_split
        for model, s in first.scores.items():
            scores.append([f"{name}/{model}", s[r.metric]])
        for role, e in r.efficiency.items():
            speed.append([f"{name}/{role}", e["cpu"]["p50_ms"], first.scores[role][r.metric]])
        for plot, values in plotted(r):
            for model, value in values.items():
                write_csv(out_dir / plot.folder / f"{name}_{model}.csv", plot.columns, plot.rows(value, r.label_names))
    write_csv(out_dir / "scores.csv", ["model", "score"], scores)
    write_csv(out_dir / "speed.csv", ["model", "cpu_p50_ms", "score"], speed)


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
        start = (f"the published model `{pretrain['init']}` ({pretrain['family']}), "
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


def markdown(results: dict[str, TaskEvaluation], figures: list[str], variants: Mapping[str, Shown],
             warnings: list[str] = (), provenance: dict[str, str] | None = None) -> str:
    about = [f"- {label}: {value}" for label, value in (provenance or {}).items()]
    lines = ["# Evaluation summary", "", *about, *([""] if about else []),
             *[f"> {warning}" for warning in warnings], *([""] if warnings else []),
             "Every score below was measured by the pipeline on the split named, on the examples the finetune "
             "stage evaluates (`finetune.max_eval_examples`). Finetune variants are mean ± std over seeds. "
             "The best epoch of every model was picked on a dev set carved out of train, never on these splits.", ""]
    for task, r in results.items():
        metric = r.metric
        lines += [f"## {task}", ""]
        if (r.data or {}).get("note"):
            lines += [f"**{r.data['note']}**", ""]
        if r.note:
            lines += [r.note, ""]
        if r.teacher:
            distilled = "; the student is distilled from it" if "student" in r.first_split.scores else ""
            lines += [f"Teacher: the finetuned model with the best dev score, `{r.teacher['variant']}` "
                      f"(seed {r.teacher['seed']}){distilled}.", ""]
        splits = list(r.splits)
        lines += ["| model | " + " | ".join(f"{s} {m}" for s in splits for m in r.metrics) + " |",
                  "|---|" + "---:|" * (len(splits) * len(r.metrics))]
        models = list(dict.fromkeys(m for s in r.splits.values() for m in s.scores))
        for model in models:
            cells = [fmt(r.splits[s].scores.get(model), m) for s in splits for m in r.metrics]
            lines.append(f"| {row_label(model, r.first_split, variants)} | " + " | ".join(cells) + " |")
        lines.append("")
        lines += pretraining_gain(r, variants)
        lines += type_section(r, variants)
        efficiency, onnx = r.efficiency, r.onnx or {}
        if efficiency:
            typed = not onnx  # not served: timed per call as `timed` says, no ONNX Runtime
            written = "tokens_per_s" in next(iter(efficiency.values()))["cpu"]  # a generation's
            lines += [f"| model | parameters | size on disk | CPU p50 / p95 ms ({'per call' if typed else 'batch 1'}) | "
                      f"CPU sequences/s (batch {next(iter(efficiency.values()))['cpu']['batch']}) |"
                      + (" CPU tokens written/s (same batches) |" if written else "")
                      + ("" if typed else " ONNX Runtime CPU p50 / p95 ms (batch 1) |"),
                      "|---|---:|---:|---:|---:|" + ("---:|" if written else "") + ("" if typed else "---:|")]
            for role, e in efficiency.items():
                cpu = e["cpu"]
                lines.append(f"| {ROLES.get(role, role)} | {e['params']:,} | {e['disk_bytes'] / 1e6:.1f} MB | "
                             f"{cpu['p50_ms']:.1f} / {cpu['p95_ms']:.1f} | {cpu['throughput']:.0f} |"
                             + (f" {cpu['tokens_per_s']:.0f} |" if written else "")
                             + ("" if typed else f" {onnx_milliseconds(onnx.get(role))} |"))
            if "student_int8" in onnx:  # the student's parameters, stored as int8 in its ONNX file
                int8 = onnx["student_int8"]
                lines.append(f"| {ROLES['student_int8']} | {efficiency['student']['params']:,} | "
                             f"{int8['disk_bytes'] / 1e6:.1f} MB | – | – | {onnx_milliseconds(int8)} |")
            lines.append("")
            lines.append(f"Timed at {next(iter(efficiency.values()))['cpu']['seq_len']} tokens per sequence on "
                         f"{next(iter(efficiency.values()))['cpu']['threads']} CPU threads"
                         + (f": {r.timed}." if r.timed else "."))
            if onnx:
                lines.append(f"ONNX Runtime ran on the same {next(iter(onnx.values()))['cpu']['threads']} threads "
                             "(intra_op_num_threads) as PyTorch, so the two latency columns compare; it runs fp32. The int8 "
                             "student is the student's ONNX graph with int8 weights (ONNX Runtime's dynamic "
                             "quantization); its size is the ONNX file's.")
            if "cuda" in next(iter(efficiency.values())):
                lines.append("GPU: " + "; ".join(f"{role} p50 {e['cuda']['p50_ms']:.2f} ms, {e['cuda']['throughput']:.0f}"
                                                 " sequences/s" for role, e in efficiency.items()))
            lines.append("")
        if r.retention and r.retention.retained is not None:
            lines += [f"The student keeps **{100 * r.retention.retained:.1f}%** of the teacher's {metric} and is "
                      f"**{r.retention.speedup:.2f}x** as fast on CPU at batch 1 (p50).", ""]
    lines += transfer_tables(results, variants)
    lines += ["## Figures", ""] + [f"![{name}]({name})" for name in figures] + [""]
    return "\n".join(lines)


def transfer_tables(results: dict[str, TaskEvaluation], variants: Mapping[str, Shown]) -> list[str]:
    """Zero-shot cross-lingual transfer: per task that others transfer from (tasks.<name>.transfer_from),
    one table, a row per model scored on them (the finetune variants, the baselines), a column per
    task and its language, the source first; each transfer cell with its difference from the source's
    score (first split, first metric of each)."""
    sources = dict.fromkeys(r.transfer_from for r in results.values() if r.transfer_from in results)
    if not sources:
        return []
    lines = ["## Zero-shot cross-lingual transfer", "",
             "Each model was trained on the task of the first column only and scored on the others as they are, "
             "without any training in their language. In brackets: the difference from the first column, in "
             "points. The baselines learn from the first column's train set too: only what the languages share "
             "word for word (names, numbers, cognates) carries over to theirs.", ""]
    for source in sources:
        columns = [source, *(name for name, r in results.items() if r.transfer_from == source)]
        firsts = {name: results[name].first_split.scores for name in columns}
        metric = results[source].metric
        rows = list(dict.fromkeys(m for name in columns[1:] for m in firsts[name]))
        first_transfer = results[columns[1]].first_split
        heads = [f"{name} ({results[name].language})" if results[name].language else name for name in columns]
        splits = ", ".join(f"{name} {results[name].first_split_name}" for name in columns)
        lines += [f"### From {source}: {metric}", "", f"Splits: {splits}.", "",
                  "| model | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(columns)]
        for model in rows:
            base = firsts[source].get(model, {}).get(metric)
            cells = [fmt(firsts[source].get(model), metric)]
            for name in columns[1:]:
                score = firsts[name].get(model, {}).get(metric)
                drop = f" ({100 * (score - base):+.1f})" if score is not None and base is not None else ""
                cells.append(fmt(firsts[name].get(model), metric) + drop)
            lines.append(f"| {row_label(model, first_transfer, variants)} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def pretraining_gain(r: TaskEvaluation, variants: Mapping[str, Shown]) -> list[str]:
    """How far each variant that starts from the pretrained model lands from the first variant with random
    weights (from_scratch: the same finetuning from random weights) on the first split's first metric,
    beside the seeds' spread, in the table's order: whether pretraining helped. Nothing when no such
    variant was run."""
    split_name = r.first_split_name
    scores, metric = r.first_split.scores, r.metrics[0]
    scored = {model: score for model, score in scores.items() if model in variants and metric in score}
    baseline = next((model for model in scored if variants[model].random_init), None)
    if baseline is None:
        return []
    scratch, parts = scored[baseline], []
    for variant, score in scored.items():
        if not variants[variant].random_init:
            diff = 100 * (score[metric] - scratch[metric])
            spread = 100 * max(score.get(f"{metric}_std", 0.0), scratch.get(f"{metric}_std", 0.0))
            verdict = "within" if abs(diff) <= spread else "beyond"
            parts.append(f"{variants[variant].label} {diff:+.1f} ({verdict} the seeds' spread of {spread:.1f})")
    if not parts:
        return []
    return [f"Pretraining against {variants[baseline].label} ({split_name} {metric}, difference of the means; the "
            "spread is the larger std over seeds): " + "; ".join(parts) + ".", ""]


def type_section(r: TaskEvaluation, variants: Mapping[str, Shown]) -> list[str]:
    """The task type's own section of the report (lib.tasks.capabilities.Reported.report_section)."""
    kind = TYPES[r.type]
    if not isinstance(kind, Reported):
        return []
    return kind.report_section(r, lambda model, split: row_label(model, split, variants))


def onnx_milliseconds(timing: dict[str, Any] | None) -> str:
    """An ONNX Runtime latency cell, p50 / p95 ms; – where the model was not run there."""
    return "–" if timing is None else f"{timing['cpu']['p50_ms']:.1f} / {timing['cpu']['p95_ms']:.1f}"


def row_label(model: str, split: SplitEvaluation, variants: Mapping[str, Shown]) -> str:
    """A model's name in the tables; the baselines that learn say how many train examples they learned from
    (the finetune subset, or all of train: a task that is not finetuned has no subset)."""
    base = model.removesuffix("_full_train")
    if model in variants:
        return variants[model].label
    if base not in BASELINES:
        return ROLES.get(model, model)
    if base in UNFITTED:
        return BASELINES[base]
    if model != base or split.train_examples == split.full_train_examples:
        return f"{BASELINES[base]} (all {split.full_train_examples:,} train)"
    return f"{BASELINES[base]} (same {split.train_examples:,} train as finetuning)"


def task_title(task: str, r: TaskEvaluation) -> str:
    """A task's name where a figure shows its scores, with what its data is where its params say
    (`data_label`: SQuAD's copies are the official dev set split by article)."""
    label = (r.data or {}).get("label")
    return f"{task} ({label})" if label else task


def _score_range(values: list[float]) -> tuple[float, float]:
    """A zero-based score axis in %, to 100: a gap of a point looks like one (negative scores, e.g. MCC,
    extend it below zero)."""
    return (min(values) - 5.0 if min(values) < 0 else 0.0), 100.0


def _bars(ax, labels: list[str], values: list[float], errors: list[float], title: str, xlabel: str) -> None:
    """Horizontal bars, top to bottom in the order given, each with its value written past its end (and
    past its error bar)."""
    ax.barh(range(len(labels)), values, xerr=errors, color="tab:blue", height=0.6)
    for i, (value, error) in enumerate(zip(values, errors)):
        ax.annotate(f"{value:.1f}", (max(value + error, 0.0), i), xytext=(3, 0), textcoords="offset points",
                    va="center", fontsize=LABEL_SIZE)
    ax.set_yticks(range(len(labels)), labels, fontsize=LABEL_SIZE)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlim(*_score_range(values))
    ax.set_xlabel(xlabel, fontsize=LABEL_SIZE)
    ax.set_title(title, fontsize=TITLE_SIZE, loc="left")
    ax.grid(axis="x", alpha=0.3)


def scores_figure(results: dict[str, TaskEvaluation], path: Path, variants: Mapping[str, Shown]) -> Path | None:
    """A panel per task with more than one model (each model's score on the task's first split, error
    bars: std over seeds), stacked; the tasks scored by one model alone (a baseline: not finetuned) share
    one last panel, a bar each, rather than a panel of one bar each."""
    panels, single = [], []
    for task, r in results.items():
        metric, split = r.metric, r.first_split_name
        scores = {m: s for m, s in r.first_split.scores.items() if metric in s}
        if len(scores) > 1:
            panels.append(([row_label(m, r.first_split, variants) for m in scores],
                           [100 * s[metric] for s in scores.values()],
                           [100 * s.get(f"{metric}_std", 0.0) for s in scores.values()],
                           task_title(task, r), f"{metric} (%) on {split}"))
        elif scores:
            model, score = next(iter(scores.items()))
            single.append((f"{task_title(task, r)}: {row_label(model, r.first_split, variants)}",
                           100 * score[metric], f"{metric} on {split}"))
    if single:
        panels.append(([f"{label}, {what}" for label, _, what in single], [value for _, value, _ in single],
                       [0.0] * len(single), "tasks with one model only", "score (%)"))
    if not panels:
        return None
    heights = [len(labels) for labels, *_ in panels]
    fig, axes = plt.subplots(len(panels), 1, squeeze=False, figsize=(FIGURE_WIDTH, 0.3 * sum(heights) + 1.0 * len(panels)),
                             gridspec_kw={"height_ratios": [h + 2 for h in heights]})
    for ax, panel in zip(axes[:, 0], panels):
        _bars(ax, *panel)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def speed_figure(results: dict[str, TaskEvaluation], path: Path) -> Path | None:
    """Score against CPU latency (batch 1, p50) for the teacher and student of each task, both axes from
    zero; the legend names each point with its score and latency (labels beside points close in score
    would overlap)."""
    points = [(task_title(task, r), role, e["cpu"]["p50_ms"], 100 * r.first_split.scores[role][r.metric])
              for task, r in results.items() for role, e in r.efficiency.items() if role in r.first_split.scores]
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(FIGURE_WIDTH, 4.5))
    colours = {task: f"C{i}" for i, task in enumerate(dict.fromkeys(task for task, *_ in points))}
    for task, role, ms, score in points:
        ax.scatter(ms, score, marker="o" if role == "teacher" else "s", s=45, color=colours[task],
                   label=f"{task} {role}: {score:.1f}, {ms:.1f} ms")
    ax.set_xlim(0, 1.1 * max(ms for _, _, ms, _ in points))
    ax.set_ylim(*_score_range([score for *_, score in points]))
    ax.legend(fontsize=LABEL_SIZE, loc="lower right")
    ax.set_xlabel("CPU latency, batch 1, p50 (ms)", fontsize=LABEL_SIZE)
    ax.set_ylabel("score (%)", fontsize=LABEL_SIZE)
    ax.tick_params(labelsize=LABEL_SIZE)
    ax.set_title("Score vs latency (o teacher, □ student)", fontsize=TITLE_SIZE, loc="left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def confusion_figure(task: str, matrices: dict[str, list[list[int]]], r: TaskEvaluation, path: Path,
                     variants: Mapping[str, Shown]) -> Path:
    """The confusion matrix of each model that has one (rows: true label, columns: predicted), on one
    colour scale from zero; counts and label names on small ones, colour alone (label indices on the
    axes) on large ones."""
    labels = r.label_names
    # one colour scale from zero for every panel: the same count is the same colour, and a near-uniform
    # matrix looks near-uniform (each panel's own min-to-max scale made 12 vs 18 look like white vs navy)
    largest = max(max(map(max, matrix)) for matrix in matrices.values()) or 1
    fig, axes = plt.subplots(1, len(matrices), figsize=(2.8 * len(matrices) + 0.4, 3.2), squeeze=False)
    for ax, (role, matrix) in zip(axes[0], matrices.items()):
        ax.imshow(matrix, cmap="Blues", vmin=0, vmax=largest)
        if len(labels) <= ANNOTATED_MAX_CLASSES:
            for i, row in enumerate(matrix):
                for j, count in enumerate(row):  # white on the dark half of the colour scale, black on the light
                    ax.text(j, i, str(count), ha="center", va="center", fontsize=LABEL_SIZE,
                            color="white" if count > largest / 2 else "black")
            ax.set_xticks(range(len(labels)), labels, fontsize=LABEL_SIZE, rotation=30)
            ax.set_yticks(range(len(labels)), labels, fontsize=LABEL_SIZE)
        ax.set_xlabel("predicted", fontsize=LABEL_SIZE)
        ax.set_ylabel("true", fontsize=LABEL_SIZE)
        ax.set_title(f"{task}: {ROLES.get(role, role)}", fontsize=TITLE_SIZE)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def entity_figure(task: str, per_type: dict[str, dict[str, float]], r: TaskEvaluation, path: Path,
                  variants: Mapping[str, Shown]) -> Path:
    """F1 per entity type (first split), a bar per model in each type's group."""
    kinds = sorted({kind for scores in per_type.values() for kind in scores})
    models = list(per_type)
    height = 0.8 / len(models)
    fig, ax = plt.subplots(figsize=(FIGURE_WIDTH, 1.2 + 0.25 * len(kinds) * len(models) + 0.25 * len(models)))
    for n, model in enumerate(models):
        values = [100 * per_type[model].get(kind, 0.0) for kind in kinds]
        ax.barh([i + n * height for i in range(len(kinds))], values, height=height, color=f"C{n}",
                label=row_label(model, r.first_split, variants))
    ax.set_yticks([i + height * (len(models) - 1) / 2 for i in range(len(kinds))], kinds, fontsize=LABEL_SIZE)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel(f"entity F1 (%) on {r.first_split_name}", fontsize=LABEL_SIZE)
    ax.set_title(f"{task}: F1 per entity type", fontsize=TITLE_SIZE, loc="left")
    ax.legend(fontsize=LABEL_SIZE, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)  # below: no bar hidden
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def scatter_figure(task: str, pairs: dict[str, list[list[float]]], r: TaskEvaluation, path: Path,
                   variants: Mapping[str, Shown]) -> Path:
    """Predicted against gold score (first split), a panel per model, on one square range with the
    diagonal a perfect model would lie on."""
    values = [v for points in pairs.values() for point in points for v in point]
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    margin = 0.03 * (high - low or 1.0)  # points on the edge stay whole
    low, high = low - margin, high + margin
    fig, axes = plt.subplots(1, len(pairs), figsize=(FIGURE_WIDTH, FIGURE_WIDTH / max(len(pairs), 2) + 0.6),
                             squeeze=False)
    split = r.first_split_name
    for ax, (model, points) in zip(axes[0], pairs.items()):
        ax.scatter([g for g, _ in points], [p for _, p in points], s=8, alpha=0.5, color="tab:blue")
        ax.plot([low, high], [low, high], color="grey", linewidth=1)
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        ax.set_aspect("equal", adjustable="box")
        score = r.first_split.scores.get(model, {}).get(r.metric)
        shown = f", {r.metric} {100 * score:.1f}" if score is not None else ""
        ax.set_title(f"{task}: {ROLES.get(model, model)}{shown}", fontsize=TITLE_SIZE)
        ax.set_xlabel(f"gold ({split})", fontsize=LABEL_SIZE)
        ax.set_ylabel("predicted", fontsize=LABEL_SIZE)
        ax.tick_params(labelsize=LABEL_SIZE)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


# How each kind of plot a type declares is drawn (lib.tasks.capabilities.Plot.drawing), in the report's order
DRAWINGS: dict[str, Callable[..., Path]] = {MATRIX: confusion_figure, BARS: entity_figure, SCATTER: scatter_figure}

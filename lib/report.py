"""The evaluate stage's human report: reports/summary.md and its PNG figures, from metrics/evaluate.json.

DVC's own plots (`dvc plots show`) load their chart library from a CDN; the PNGs here open anywhere,
offline included, and are attached to the MLflow parent run with the summary.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402

FINETUNE_ORDER = ("ulmfit", "plain", "from_scratch", "frozen")
# Above this many classes a confusion matrix is shown by colour alone: a count per cell is unreadable
# there, and drawing one text per cell took minutes (300 classes: 250 s)
ANNOTATED_MAX_CLASSES = 20
ROLES = {"teacher": "teacher (best finetuned)", "student": "student (distilled)", "zero_shot": "zero-shot LM prompt",
         "ulmfit": "ULMFiT (adapted LM)", "plain": "plain finetune (adapted LM)", "from_scratch": "from scratch",
         "frozen": "frozen features + linear", "student_int8": "student, int8 (ONNX Runtime)"}


def write_report(results: dict[str, Any], out_dir: Path, warnings: list[str] = ()) -> list[Path]:
    """summary.md and figures into out_dir (which must exist); returns the files written. `warnings`
    (plain sentences, e.g. a stage a time limit stopped early) open the summary."""
    figures = [scores_figure(results, out_dir / "scores.png"), speed_figure(results, out_dir / "speed.png")]
    figures += [confusion_figure(task, r, out_dir / f"confusion_{task}.png")
                for task, r in results.items() if r.get("confusion")]
    figures = [f for f in figures if f is not None]
    summary = out_dir / "summary.md"
    summary.write_text(markdown(results, [f.name for f in figures], warnings), encoding="utf-8")
    return [summary, *figures]


def fmt(score: dict[str, Any] | None, metric: str) -> str:
    """A score as a percentage, with its std over seeds where there is one."""
    if not score or metric not in score:
        return "–"
    text = f"{100 * score[metric]:.1f}"
    if f"{metric}_std" in score:
        text += f" ± {100 * score[f'{metric}_std']:.1f}"
    return text


def markdown(results: dict[str, Any], figures: list[str], warnings: list[str] = ()) -> str:
    lines = ["# Evaluation summary", "", *[f"> {warning}" for warning in warnings], *([""] if warnings else []),
             "Every score below was measured by the pipeline on the split named, on the examples the finetune "
             "stage evaluates (`finetune.max_eval_examples`). Finetune variants are mean ± std over seeds. "
             "The best epoch of every model was picked on a dev set carved out of train, never on these splits.", ""]
    for task, r in results.items():
        metric = r["metric"]
        lines += [f"## {task}", ""]
        if r.get("note"):
            lines += [r["note"], ""]
        if r.get("teacher"):
            lines += [f"Teacher: the finetuned classifier with the best dev score, `{r['teacher']['variant']}` "
                      f"(seed {r['teacher']['seed']}); the student is distilled from it.", ""]
        splits = list(r["splits"])
        lines += ["| model | " + " | ".join(f"{s} {m}" for s in splits for m in r["metrics"]) + " |",
                  "|---|" + "---:|" * (len(splits) * len(r["metrics"]))]
        models = list(dict.fromkeys(m for s in splits for m in r["splits"][s]["scores"]))
        for model in models:
            cells = [fmt(r["splits"][s]["scores"].get(model), m) for s in splits for m in r["metrics"]]
            lines.append(f"| {row_label(model, r['splits'][splits[0]])} | " + " | ".join(cells) + " |")
        lines.append("")
        efficiency, onnx = r.get("efficiency", {}), r.get("onnx", {})
        if efficiency:
            lines += ["| model | parameters | size on disk | CPU p50 / p95 ms (batch 1) | CPU sequences/s (batch "
                      f"{next(iter(efficiency.values()))['cpu']['batch']}) | ONNX Runtime CPU p50 / p95 ms (batch 1) |",
                      "|---|---:|---:|---:|---:|---:|"]
            for role, e in efficiency.items():
                cpu = e["cpu"]
                lines.append(f"| {ROLES.get(role, role)} | {e['params']:,} | {e['disk_bytes'] / 1e6:.1f} MB | "
                             f"{cpu['p50_ms']:.1f} / {cpu['p95_ms']:.1f} | {cpu['throughput']:.0f} | "
                             f"{onnx_milliseconds(onnx.get(role))} |")
            if "student_int8" in onnx:  # the student's parameters, stored as int8 in its ONNX file
                int8 = onnx["student_int8"]
                lines.append(f"| {ROLES['student_int8']} | {efficiency['student']['params']:,} | "
                             f"{int8['disk_bytes'] / 1e6:.1f} MB | – | – | {onnx_milliseconds(int8)} |")
            lines.append("")
            lines.append(f"Timed at {next(iter(efficiency.values()))['cpu']['seq_len']} tokens per sequence on "
                         f"{next(iter(efficiency.values()))['cpu']['threads']} CPU threads.")
            if onnx:
                lines.append(f"ONNX Runtime ran on the same {next(iter(onnx.values()))['cpu']['threads']} threads "
                             "(intra_op_num_threads) as PyTorch, so the two latency columns compare; it runs fp32. The int8 "
                             "student is the student's ONNX graph with int8 weights (ONNX Runtime's dynamic "
                             "quantization); its size is the ONNX file's.")
            if "gpu" in next(iter(efficiency.values())):
                lines.append("GPU: " + "; ".join(f"{role} p50 {e['gpu']['p50_ms']:.2f} ms, {e['gpu']['throughput']:.0f}"
                                                 " sequences/s" for role, e in efficiency.items()))
            lines.append("")
        if r.get("retained") is not None:
            lines += [f"The student keeps **{100 * r['retained']:.1f}%** of the teacher's {metric} and is "
                      f"**{r['speedup']:.2f}x** as fast on CPU at batch 1 (p50).", ""]
    lines += ["## Figures", ""] + [f"![{name}]({name})" for name in figures] + [""]
    return "\n".join(lines)


def onnx_milliseconds(timing: dict[str, Any] | None) -> str:
    """An ONNX Runtime latency cell, p50 / p95 ms; – where the model was not run there."""
    return "–" if timing is None else f"{timing['cpu']['p50_ms']:.1f} / {timing['cpu']['p95_ms']:.1f}"


def row_label(model: str, split: dict[str, Any]) -> str:
    """A model's name in the tables; the TF-IDF baselines say how many train examples they learned from
    (the finetune subset, or all of train: a task that is not finetuned has no subset)."""
    if model == "tfidf_full_train" or (model == "tfidf" and split["train_examples"] == split["full_train_examples"]):
        return f"TF-IDF + LR (all {split['full_train_examples']:,} train)"
    if model == "tfidf":
        return f"TF-IDF + LR (same {split['train_examples']:,} train as finetuning)"
    return ROLES.get(model, model)


def _first_split_scores(r: dict[str, Any]) -> dict[str, Any]:
    return r["splits"][next(iter(r["splits"]))]["scores"]


def scores_figure(results: dict[str, Any], path: Path) -> Path | None:
    """One panel per task: each model's score on the task's first split (error bars: std over seeds)."""
    tasks = list(results)
    if not tasks:
        return None
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        r, metric = results[task], results[task]["metric"]
        split = next(iter(r["splits"]))
        scores = {m: s for m, s in r["splits"][split]["scores"].items() if metric in s}
        names = list(scores)
        ax.barh(range(len(names)), [100 * scores[n][metric] for n in names],
                xerr=[100 * scores[n].get(f"{metric}_std", 0.0) for n in names], color="tab:blue")
        ax.set_yticks(range(len(names)), [row_label(n, r["splits"][split]) for n in names], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(f"{metric} (%) on {split}")
        ax.set_title(task)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def speed_figure(results: dict[str, Any], path: Path) -> Path | None:
    """Score against CPU latency (batch 1, p50) for the teacher and student of each task."""
    points = [(task, role, e["cpu"]["p50_ms"], _first_split_scores(r)[role][r["metric"]])
              for task, r in results.items() for role, e in r.get("efficiency", {}).items()
              if role in _first_split_scores(r)]
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for task, role, ms, score in points:
        ax.scatter(ms, 100 * score, marker="o" if role == "teacher" else "s")
        ax.annotate(f"{task} {role}", (ms, 100 * score), fontsize=8, xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("CPU latency, batch 1, p50 (ms)")
    ax.set_ylabel("score (%)")
    ax.set_title("Score vs latency")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def confusion_figure(task: str, r: dict[str, Any], path: Path) -> Path:
    """The confusion matrix of each model that has one (rows: true label, columns: predicted); counts
    and label names on small ones, colour alone (label indices on the axes) on large ones."""
    matrices = r["confusion"]
    labels = r["label_names"]
    fig, axes = plt.subplots(1, len(matrices), figsize=(3.6 * len(matrices), 3.4), squeeze=False)
    for ax, (role, matrix) in zip(axes[0], matrices.items()):
        ax.imshow(matrix, cmap="Blues")
        if len(labels) <= ANNOTATED_MAX_CLASSES:
            for i, row in enumerate(matrix):
                for j, count in enumerate(row):
                    ax.text(j, i, str(count), ha="center", va="center", fontsize=9)
            ax.set_xticks(range(len(labels)), labels, fontsize=8, rotation=30)
            ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.set_xlabel("predicted")
        ax.set_ylabel("true")
        ax.set_title(f"{task}: {role}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

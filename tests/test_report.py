"""The evaluate stage's report: markdown tables and figures from tasks' results as evaluate gives them."""
import time
from dataclasses import replace

from lib.evaluation import report
from lib.evaluation.report import confusion_figure, fmt, markdown, write_report
from lib.evaluation.result import SplitEvaluation, TaskEvaluation
from lib.training.variants import VARIANTS


def evaluated(entry: dict, label_names: list[str] | None = None, **figures) -> TaskEvaluation:
    """A task's result from its entry of metrics/evaluate.json, with what the figures alone draw."""
    result = TaskEvaluation.from_json(entry)
    result.extras.update(figures)
    result.label_names = label_names
    return result


CPU = {"p50_ms": 10.0, "p95_ms": 12.5, "mean_ms": 10.4, "throughput": 150.0, "batch": 32, "seq_len": 128, "threads": 2}
RESULTS = {
    "imdb": evaluated({
        "type": "classification", "metric": "accuracy", "metrics": ["accuracy"],
        "splits": {"test": {"examples": 100, "train_examples": 3000, "full_train_examples": 24000, "scores": {
            "teacher": {"accuracy": 0.84}, "student": {"accuracy": 0.83},
            "ulmfit": {"accuracy": 0.8, "accuracy_std": 0.01}, "tfidf": {"accuracy": 0.86, "c": 4.0},
            "from_scratch": {"accuracy": 0.78, "accuracy_std": 0.004}, "plain": {"accuracy": 0.775, "accuracy_std": 0.02},
            "tfidf_full_train": {"accuracy": 0.9, "c": 16.0}}}},
        "efficiency": {"teacher": {"params": 1000, "disk_bytes": 4_000_000, "cpu": CPU},
                       "student": {"params": 600, "disk_bytes": 2_400_000, "cpu": {**CPU, "p50_ms": 5.0}}},
        "retained": 0.83 / 0.84, "speedup": 2.0, "teacher": {"variant": "plain", "seed": 1338}},
        ["negative", "positive"], confusion={"teacher": [[40, 10], [6, 44]], "student": [[41, 9], [8, 42]]}),
    "rte": evaluated({
        "type": "classification", "metric": "accuracy", "metrics": ["accuracy"], "note": "Evaluated on validation: test_unlabeled has no labels.",
        "splits": {"validation": {"examples": 30, "train_examples": 2233, "full_train_examples": 2233,
                                  "scores": {"tfidf": {"accuracy": 0.5}}}},
        "efficiency": {}}),
}


def test_fmt_shows_percent_and_std():
    assert fmt({"accuracy": 0.8, "accuracy_std": 0.012}, "accuracy") == "80.0 ± 1.2"
    assert fmt({"mcc": 0.115}, "mcc") == "11.5"
    assert fmt(None, "accuracy") == "–" and fmt({"f1": 0.5}, "accuracy") == "–"


def test_markdown_tables_name_every_model_and_the_student_figures():
    text = markdown(RESULTS, ["scores.png"], VARIANTS)
    assert "| teacher (best finetuned) | 84.0 |" in text
    assert "| ULMFiT | 80.0 ± 1.0 |" in text
    assert "| TF-IDF + LR (same 3,000 train as finetuning) | 86.0 |" in text
    assert "| TF-IDF + LR (all 24,000 train) | 90.0 |" in text
    assert "| TF-IDF + LR (all 2,233 train) | 50.0 |" in text  # not finetuned, or finetuned on all of train
    assert "keeps **98.8%** of the teacher's accuracy and is **2.00x** as fast" in text
    assert "| student (distilled) | 600 | 2.4 MB | 5.0 / 12.5 | 150 |" in text
    assert "`plain` (seed 1338)" in text and "test_unlabeled has no labels" in text and "![scores.png](scores.png)" in text
    assert ("Pretraining against from scratch (test accuracy, difference of the means; the spread is the larger std "
            "over seeds): ULMFiT +2.0 (beyond the seeds' spread of 1.0); plain finetune -0.5 (within the seeds' spread "
            "of 2.0).") in text
    assert text.count("Pretraining against from scratch") == 1  # rte ran no from_scratch


def test_gpu_timings_are_shown_where_evaluate_measured_them():
    gpu = {**CPU, "p50_ms": 1.25, "throughput": 4000.0, "threads": None}
    efficiency = {role: {**e, "cuda": gpu} for role, e in RESULTS["imdb"].efficiency.items()}
    text = markdown({"imdb": replace(RESULTS["imdb"], efficiency=efficiency)}, [], VARIANTS)
    assert "GPU: teacher p50 1.25 ms, 4000 sequences/s; student p50 1.25 ms" in text
    assert "GPU:" not in markdown(RESULTS, [], VARIANTS)


def test_write_report_writes_summary_and_figures(tmp_path):
    written = write_report(RESULTS, tmp_path, VARIANTS)
    names = {p.name for p in written}
    assert names == {"summary.md", "scores.png", "speed.png", "confusion_imdb.png"}
    assert all((tmp_path / n).stat().st_size > 0 for n in names)
    assert (tmp_path / "scores.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_warnings_open_the_summary():
    """A stage a time limit stopped early is said before any table, in the words its metrics hold."""
    warning = "**pretrain stopped early**: pretrain.budget_minutes (60) stopped it after 612,352 of 4,505,600 planned tokens."
    lines = markdown(RESULTS, [], VARIANTS, [warning]).splitlines()
    assert lines[:4] == ["# Evaluation summary", "", f"> {warning}", ""]
    assert not markdown(RESULTS, [], VARIANTS).splitlines()[2].startswith(">")


def drawn_figures(monkeypatch) -> list:
    """The figures lib.evaluation.report draws from now on, kept for inspection after it closes them."""
    figures = []
    monkeypatch.setattr(report.plt, "close", figures.append)
    return figures


def test_a_large_confusion_matrix_is_drawn_by_colour_alone_and_fast(tmp_path, monkeypatch):
    """300 classes with a count per cell took 250 s: only small matrices get their counts written."""
    figures = drawn_figures(monkeypatch)
    n = 300
    matrix = [[(i * 7 + j) % 5 for j in range(n)] for i in range(n)]
    started = time.monotonic()
    topics = replace(RESULTS["imdb"], label_names=[f"topic {i}" for i in range(n)])
    path = confusion_figure("topics", {"teacher": matrix, "student": matrix}, topics, tmp_path / "c.png", VARIANTS)
    assert time.monotonic() - started < 15 and path.stat().st_size > 0
    assert [len(ax.texts) for ax in figures[0].axes] == [0, 0]
    confusion_figure("imdb", RESULTS["imdb"].extras["confusion"], RESULTS["imdb"], tmp_path / "small.png", VARIANTS)
    assert [len(ax.texts) for ax in figures[1].axes] == [4, 4]  # a count per cell of the 2 x 2 matrices


def test_provenance_heads_the_summary_before_the_warnings():
    provenance = {"commit": "`0123456789ab` with uncommitted changes", "MLflow parent run": "`abc`"}
    lines = markdown(RESULTS, [], VARIANTS, ["**pretrain stopped early**: ..."], provenance).splitlines()
    assert lines[:6] == ["# Evaluation summary", "", "- commit: `0123456789ab` with uncommitted changes",
                         "- MLflow parent run: `abc`", "", "> **pretrain stopped early**: ..."]


def test_scores_merge_the_tasks_with_one_model_into_one_panel(tmp_path, monkeypatch):
    """rte has a baseline alone: it is a bar of a shared panel, not a panel of one bar; the figure is
    as wide as the others whatever the number of tasks, its score axes from zero."""
    figures = drawn_figures(monkeypatch)
    tasks = {**RESULTS, "cola": replace(RESULTS["rte"], metric="mcc", metrics=["mcc"], splits={
        "validation": SplitEvaluation(examples=30, train_examples=80, full_train_examples=80,
                                      scores={"tfidf": {"mcc": -0.1}})})}
    report.scores_figure(tasks, tmp_path / "scores.png", VARIANTS)
    imdb, shared = figures[0].axes
    assert imdb.get_title(loc="left") == "imdb" and len(imdb.patches) == 7
    assert [t.get_text() for t in shared.get_yticklabels()] == [
        "rte: TF-IDF + LR (all 2,233 train), accuracy on validation", "cola: TF-IDF + LR (all 80 train), mcc on validation"]
    assert imdb.get_xlim() == (0.0, 100.0) and shared.get_xlim() == (-15.0, 100.0)  # MCC may be negative
    assert figures[0].get_size_inches()[0] * report.DPI == 770


def test_speed_axes_start_at_zero(tmp_path, monkeypatch):
    """Teacher and student a point apart (84 vs 83) look a point apart, not a whole axis apart."""
    figures = drawn_figures(monkeypatch)
    report.speed_figure(RESULTS, tmp_path / "speed.png")
    ax = figures[0].axes[0]
    assert ax.get_ylim() == (0.0, 100.0) and ax.get_xlim()[0] == 0.0
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["imdb teacher: 84.0, 10.0 ms",
                                                                    "imdb student: 83.0, 5.0 ms"]


def test_confusion_panels_share_one_colour_scale_from_zero(tmp_path, monkeypatch):
    """A near-uniform matrix (40/10/6/44 beside 41/9/8/42) is not stretched over the whole colour range."""
    figures = drawn_figures(monkeypatch)
    confusion_figure("imdb", RESULTS["imdb"].extras["confusion"], RESULTS["imdb"], tmp_path / "c.png", VARIANTS)
    assert [ax.images[0].get_clim() for ax in figures[0].axes] == [(0, 44), (0, 44)]
    assert figures[0].axes[0].get_title() == "imdb: teacher (best finetuned)"


SPLIT = {"examples": 12, "train_examples": 20, "full_train_examples": 30}
TYPED = {
    "squad_v2": evaluated({
        "type": "span_qa", "metric": "f1", "metrics": ["f1", "exact_match"],
        "data": {"label": "SQuAD dev, article split", "note": "Data: our SQuAD copies are the official dev set split by article."},
        "splits": {"validation": {**SPLIT, "scores": {
            "teacher": {"f1": 0.6, "exact_match": 0.5}, "overlap_qa": {"f1": 0.5, "exact_match": 0.5}},
            "threshold": {"teacher": 0.25, "overlap_qa": "-inf"},
            "breakdown": {"teacher": {"has_answer_exact_match": 0.4, "has_answer_f1": 0.55, "no_answer_exact_match": 0.6,
                                      "no_answer_f1": 0.6, "exact_match": 0.5, "f1": 0.6},
                          "overlap_qa": {"has_answer_exact_match": 0.0, "has_answer_f1": 0.0, "no_answer_exact_match": 1.0,
                                         "no_answer_f1": 1.0, "exact_match": 0.5, "f1": 0.5}}}},
        "efficiency": {"teacher": {"params": 1000, "disk_bytes": 4_000_000, "cpu": CPU}},
        "timed": "one window of 128 tokens per call (a longer context takes several)"}),
    "conll": evaluated({
        "type": "tagging", "metric": "f1", "metrics": ["f1"],
        "splits": {"test": {**SPLIT, "scores": {"teacher": {"f1": 0.7}, "lexicon": {"f1": 0.6},
                                                 "lexicon_full_train": {"f1": 0.65}}}},
        "per_type": {"teacher": {"PER": 0.8, "LOC": 0.7}, "lexicon": {"PER": 0.5, "LOC": 0.6, "MISC": 0.1}},
        "efficiency": {}}),
    "stsb": evaluated({
        "type": "regression", "metric": "pearson", "metrics": ["pearson", "spearman"],
        "splits": {"validation": {**SPLIT, "scores": {"teacher": {"pearson": 0.8, "spearman": 0.79},
                                                       "tfidf_similarity": {"pearson": 0.6, "spearman": 0.58}}}},
        "efficiency": {}}, scatter={"teacher": [[0.0, 0.5], [2.5, 2.0], [5.0, 4.2]]}),
}


def test_each_task_type_has_its_table_and_squad_says_its_data_is_the_dev_set_split_by_article():
    text = markdown(TYPED, [], VARIANTS)
    assert "**Data: our SQuAD copies are the official dev set split by article.**" in text
    assert "| model | validation f1 | validation exact_match |" in text
    assert "| teacher (best finetuned) | validation | 40.0 / 55.0 | 60.0 / 60.0 | 50.0 / 60.0 | 0.250 |" in text
    assert ("| word-overlap QA (same 20 train as finetuning) | validation | 0.0 / 0.0 | 100.0 / 100.0 "
            "| 50.0 / 50.0 | −∞ (answers no question) |") in text
    assert "| lexicon tagger (all 30 train) | 65.0 |" in text
    assert "| TF-IDF cosine (same 20 train as finetuning) | 60.0 | 58.0 |" in text
    assert "CPU threads: one window of 128 tokens per call" in text
    assert "| teacher (best finetuned) | 1,000 | 4.0 MB | 10.0 / 12.5 | 150 |\n" in text  # no ONNX column
    assert "| CPU p50 / p95 ms (per call) |" in text


def test_typed_figures_entity_f1_bars_and_predicted_vs_gold(tmp_path, monkeypatch):
    figures = drawn_figures(monkeypatch)
    written = {p.name for p in write_report(TYPED, tmp_path, VARIANTS)}
    assert written == {"summary.md", "scores.png", "speed.png", "entity_f1_conll.png", "predicted_vs_gold_stsb.png"}
    titles = [ax.get_title(loc="left") for fig in figures for ax in fig.axes]
    assert "squad_v2 (SQuAD dev, article split)" in titles and "conll: F1 per entity type" in titles
    entity = next(fig for fig in figures if any(ax.get_title(loc="left") == "conll: F1 per entity type" for ax in fig.axes))
    assert [t.get_text() for t in entity.axes[0].get_yticklabels()] == ["LOC", "MISC", "PER"]
    assert len(entity.axes[0].patches) == 6  # 3 entity types x 2 models
    scatter = next(fig for fig in figures if fig.axes[0].get_title().startswith("stsb"))
    assert scatter.axes[0].get_title() == "stsb: teacher (best finetuned), pearson 80.0"
    assert scatter.axes[0].get_xlim() == scatter.axes[0].get_ylim() == (-0.15, 5.15)  # 0 to 5, 3% margins
    legend = [t.get_text() for fig in figures for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert "squad_v2 (SQuAD dev, article split) teacher: 60.0, 10.0 ms" in legend

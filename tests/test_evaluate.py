"""The evaluate stage's per-task decisions, on a tiny task without running the stage."""
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

import lib.evaluation.evaluate
import stages.evaluate
from lib.config.params import EvaluateConfig, FinetuneConfig, Params, TaskConfig, ZeroShotConfig
from lib.core import tracking
from lib.data.tokenizer import load_tokenizer, saved_special_ids
from lib.evaluation.evaluate import evaluate_task
from lib.evaluation.report import describe_provenance, starting_point
from lib.evaluation.result import TaskEvaluation
from lib.tasks import TYPES, task_metrics
from tests.helpers import tiny_tokenizer, write_jsonl_gz

WORDS = ["great", "awful", "odd"]


@pytest.fixture
def three_class_task(tmp_path) -> TaskConfig:
    """A task whose classes (0, 1, 2) are found in train, so params cannot check the label words."""
    for split, n in (("train", 60), ("validation", 12)):
        write_jsonl_gz(tmp_path / "toy" / f"{split}.jsonl.gz",
                       [{"text": f"a {WORDS[i % 3]} film number {i}", "label": i % 3} for i in range(n)])
    return TaskConfig(source=str(tmp_path / "toy"))


def evaluate_with_label_words(task: TaskConfig, label_words: list[str], monkeypatch) -> TaskEvaluation:
    """evaluate_task's result for the task with a zero-shot prompt (scoring faked: the decision is tested)."""
    prompt = ZeroShotConfig(template="{text} It was", label_words=label_words)
    params = Params(corpora=None, tasks={"toy": task}, finetune=FinetuneConfig(tasks=["toy"]),
                    evaluate=EvaluateConfig(tfidf_c=[1.0], zero_shot={"toy": prompt}))
    monkeypatch.setattr(lib.evaluation.evaluate, "zero_shot", lambda lm, tokenizer, special, rows, **_: [0] * len(rows))
    causal_lm = SimpleNamespace(cfg=SimpleNamespace(causal=True))
    tokenizer_dir = tiny_tokenizer(Path(task.source).parent / "tok")
    return evaluate_task("toy", task, {}, None, None, causal_lm, load_tokenizer(tokenizer_dir),
                         saved_special_ids(tokenizer_dir), params)


def test_zero_shot_with_fewer_label_words_than_classes_is_skipped_and_noted(three_class_task, monkeypatch, capsys):
    result = evaluate_with_label_words(three_class_task, [" good", " bad"], monkeypatch)
    note = ("Zero-shot not scored: evaluate.zero_shot.toy.label_words has 2 words for 3 classes; give one word per "
            "class, in label order.")
    assert "zero_shot" not in result.splits["validation"].scores
    assert result.note == note and f"toy: {note}" in capsys.readouterr().out.splitlines()


def test_zero_shot_with_a_label_word_per_class_is_scored(three_class_task, monkeypatch):
    result = evaluate_with_label_words(three_class_task, [" good", " bad", " odd"], monkeypatch)
    assert "zero_shot" in result.splits["validation"].scores and result.note is None


def test_a_type_without_a_baseline_gets_no_baseline_rows_and_says_so(three_class_task, monkeypatch):
    monkeypatch.setattr(lib.evaluation.evaluate, "Baselined", type("Capability", (), {}))  # that no type declares
    result = evaluate_with_label_words(three_class_task, [" good", " bad", " odd"], monkeypatch)
    assert list(result.splits["validation"].scores) == ["zero_shot"] and result.extras == {}
    assert result.note == "classification tasks have no train-only baseline so far: none was scored."


def test_an_unlabeled_evaluation_split_is_noted_not_scored(three_class_task, tmp_path, monkeypatch):
    write_jsonl_gz(tmp_path / "toy" / "test_unlabeled.jsonl.gz", [{"text": "a film", "label": -1}] * 5)
    three_class_task.eval_splits = ["validation", "test_unlabeled"]
    result = evaluate_with_label_words(three_class_task, [" good", " bad", " odd"], monkeypatch)
    assert set(result.splits) == {"validation"}
    assert result.note == "Evaluated on validation: test_unlabeled has no labels."


def test_a_task_without_models_still_writes_a_confusion_plot_and_a_report(three_class_task, monkeypatch, tmp_path):
    """The TF-IDF baseline's confusion matrix is there for every task: plots/evaluate/confusion is never an
    empty folder, which git would drop and DVC would then call a file of an unsupported format."""
    result = evaluate_with_label_words(three_class_task, [" good", " bad", " odd"], monkeypatch)
    assert list(result.extras["confusion"]) == ["tfidf"] and sum(map(sum, result.extras["confusion"]["tfidf"])) == 12
    args = SimpleNamespace(metrics=tmp_path / "evaluate.json", plots=tmp_path / "plots", report=tmp_path / "reports")
    stages.evaluate.write_outputs({"toy": result}, [], {"commit": "`c0ffee`"}, args, tracking.StageRun())
    assert [p.name for p in (args.plots / "confusion").iterdir()] == ["toy_tfidf.csv"]
    assert "- commit: `c0ffee`" in (args.report / "summary.md").read_text(encoding="utf-8")


def test_provenance_names_commit_experiment_params_run_and_machine(tmp_path, monkeypatch):
    params = tmp_path / "params.yaml"
    params.write_text("seed: 1\n", encoding="utf-8")
    monkeypatch.setattr(tracking, "run_tags", lambda stage, params: {"git.commit": "0123456789abcdef", "git.dirty": "true",
                                                             "dvc.exp_name": "wordpiece"})
    facts = {"device": "cpu", "threads": 2, "precision": "fp32"}
    about = describe_provenance(str(params), None, tracking.StageRun(run_id="r", parent_id="p1"), facts)
    assert about["commit"] == "`0123456789ab` with uncommitted changes"
    assert about["DVC experiment"] == "`wordpiece`" and about["MLflow parent run"] == "`p1`"
    assert about["params.yaml"] == "sha256 `adf0396d435b`"  # sha256sum of 'seed: 1\n'
    assert about["machine"].startswith("CPU ") and about["machine"].endswith("2 threads; models scored in fp32")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", about["date"])
    untracked = describe_provenance(params, None, tracking.StageRun(), facts)
    assert untracked["MLflow parent run"] == "none (tracking off or MLflow unavailable)"


def test_report_says_where_the_language_model_started():
    scratch = {"pretrain": {"objective": "clm", "tokens_seen": 4_500_000},
               "adapt": {"objective": "clm", "tokens_seen": 2_400_000}}
    assert starting_point(scratch) == ("random weights, pretrained with clm on 4,500,000 tokens; "
                                                       "adapted to the domain with clm on 2,400,000 tokens")
    checkpoint = {"pretrain": {"init": "hf:org/bert", "family": "bert", "kept": True, "objective": "mlm"},
                  "adapt": {"enabled": False, "objective": "mlm"}}
    assert starting_point(checkpoint) == ("the published model `hf:org/bert` (bert), kept as it "
                                                          "is; not adapted (adapt.enabled: false)")


def test_onnx_runtime_latency_and_the_int8_students_score_beside_pytorchs(three_class_task, tmp_path):
    """Teacher and student timed in ONNX Runtime on torch's threads; the int8 student scored on the
    student's split and timed, with the bytes of its ONNX file."""
    import torch

    from tests.helpers import save_tiny_classifier

    tiny_tokenizer(tmp_path / "tok")
    models = {role: save_tiny_classifier(tmp_path / role, tmp_path / "tok") for role in ("teacher", "student")}
    info = json.loads((models["teacher"] / "classifier.json").read_text())
    (models["teacher"] / "classifier.json").write_text(json.dumps({**info, "variant": "plain", "seed": 1}))
    params = Params(corpora=None, tasks={"toy": three_class_task}, device="cpu", finetune=FinetuneConfig(tasks=["toy"]),
                    evaluate=EvaluateConfig(tfidf_c=[1.0], latency_seq_len=12, latency_repeats=3, throughput_batch=2))
    lm = SimpleNamespace(cfg=SimpleNamespace(causal=False))
    result = evaluate_task("toy", three_class_task, models, None, None, lm, load_tokenizer(tmp_path / "tok"),
                           saved_special_ids(tmp_path / "tok"), params)

    scores = result.splits["validation"].scores
    assert set(scores["student_int8"]) == set(scores["student"]) == {"accuracy"}
    assert set(result.onnx) == {"teacher", "student", "student_int8"}
    for role, figures in result.onnx.items():
        assert figures["cpu"]["threads"] == torch.get_num_threads() == result.efficiency["student"]["cpu"]["threads"]
        assert figures["cpu"]["seq_len"] == 12 and 0 < figures["cpu"]["p50_ms"] <= figures["cpu"]["p95_ms"]
    assert result.onnx["student_int8"]["disk_bytes"] < result.onnx["student"]["disk_bytes"]


# The other task types (lib.evaluation.evaluate): a tiny task of each, a tiny teacher and student saved as finetune
# and distill save them, scored through the stage's evaluate path.
NAMES = ["Rollo", "Paris", "Normandy", "William", "England", "Frankish"]
TAGS = {"Rollo": "PER", "William": "PER", "Paris": "LOC", "Normandy": "LOC", "England": "LOC", "Frankish": "MISC"}


def typed_rows(task_type: str, i: int) -> dict:
    """Row i of a tiny task of `task_type` (fields as TYPED_FIELDS name them)."""
    name, other = NAMES[i % len(NAMES)], NAMES[(i * 5 + 1) % len(NAMES)]
    if task_type == "regression":
        return {"sentence1": f"{name} ruled the city", "sentence2": f"{other} ruled the duchy in {i}", "label": i % 6}
    if task_type == "tagging":
        words = [name, "ruled", "the", "city", "of", other, str(i)]
        return {"tokens": words, "ner_tags": [f"B-{TAGS[w]}" if w in TAGS else "O" for w in words]}
    if task_type == "span_qa":
        context = f"{name} founded the duchy in {900 + i}. {other} ruled it."
        answerable = i % 3 != 0
        question = f"When did {name} found the duchy?" if answerable else f"Why did {name} leave {i}?"
        answers = {"text": [str(900 + i)], "answer_start": [context.index(str(900 + i))]} if answerable else \
            {"text": [], "answer_start": []}
        return {"id": f"q{i}", "question": question, "context": context, "answers": answers}
    return {"startphrase": f"{name} founded the duchy", "endings": [f"and {other} ruled {k}" for k in range(3)],
            "label": i % 3}


TYPED_FIELDS = {"regression": dict(text_field="sentence1", text_pair_field="sentence2"),
                "tagging": dict(text_field="tokens", label_field="ner_tags"),
                "span_qa": dict(text_field="question", text_pair_field="context", label_field="answers", stride=8,
                                max_question_len=12),
                "multiple_choice": dict(text_field="startphrase", text_pair_field="endings")}


def typed_task(task_type: str, tmp_path) -> tuple[TaskConfig, Params, dict]:
    """(the task's config, params, {role: model folder}) of a 40-row task with a 12-row validation
    split and an unlabeled test split, a tiny teacher and student saved with the task's type and info."""
    import torch

    from lib.tasks.model import TaskModel, save_task_model
    from lib.training.variants import VARIANTS
    from lib.models.architectures import build_model
    from lib.models.config import TransformerConfig

    folder = tmp_path / task_type
    for split, rows in (("train", range(40)), ("validation", range(40, 52))):
        write_jsonl_gz(folder / f"{split}.jsonl.gz", [typed_rows(task_type, i) for i in rows])
    task_cfg = TaskConfig(source=str(folder), type=task_type, max_len=32, **TYPED_FIELDS[task_type])
    task_cfg.validate("tasks.toy")
    params = Params(corpora=None, tasks={"toy": task_cfg}, device="cpu",
                    finetune=FinetuneConfig(tasks=["toy"], dev_fraction=0.25, max_train_examples=20, batch_size=8),
                    evaluate=EvaluateConfig(tfidf_c=[1.0], latency_seq_len=12, latency_repeats=3, throughput_batch=2))
    tokenizer_dir = tiny_tokenizer(tmp_path / "tok")
    kind = TYPES[task_type]
    task = kind.load("toy", task_cfg, load_tokenizer(tokenizer_dir), saved_special_ids(tokenizer_dir),
                     dev_fraction=0.25, dev_max=100, max_train=20)
    models = {}
    for role, layers in (("teacher", 2), ("student", 1)):
        torch.manual_seed(layers)
        backbone = build_model(TransformerConfig(vocab_size=load_tokenizer(tokenizer_dir).get_vocab_size(), d_model=32,
                                                 n_layers=layers, n_heads=2, d_ff=64, dropout=0.0, max_positions=64))
        model: TaskModel = VARIANTS["plain"].setup(backbone, kind.n_outputs(task), FinetuneConfig(tasks=[]),
                                                    kind).model
        meta = {"task": "toy", "type": task_type, "info": task.info, "label_names": task.label_names,
                "variant": "plain", "seed": 1, "encoding": {"max_len": 32, "truncation": "head",
                                                            "text_field": task_cfg.text_field,
                                                            "text_pair_field": task_cfg.text_pair_field}}
        save_task_model(model, tmp_path / role, tokenizer_dir, meta)
        models[role] = tmp_path / role
    return task_cfg, params, models


FINETUNED = {"variants": {"plain": {"eval": {"pearson": {"mean": 0.5, "std": 0.1}, "spearman": {"mean": 0.4, "std": 0.0},
                                             "f1": {"mean": 0.3, "std": 0.1}, "exact_match": {"mean": 0.2, "std": 0.0},
                                             "accuracy": {"mean": 0.4, "std": 0.0}}}}}


@pytest.mark.parametrize("task_type", ["regression", "tagging", "span_qa", "multiple_choice"])
def test_every_task_type_is_scored_with_its_metrics_baseline_size_and_latency(task_type, tmp_path, monkeypatch):
    """Teacher, student, the finetune variants' means and the type's baseline (on finetune's 20 train
    examples and on all of train) on the labeled split, in each type's metric names; the unlabeled split
    and what is classification-only are said, not skipped; figures' data and the report follow."""
    task_cfg, params, models = typed_task(task_type, tmp_path)
    write_jsonl_gz(tmp_path / task_type / "test.jsonl.gz", [{"text": "no labels"}])
    task_cfg.eval_splits = ["validation", "test"]
    finetuned = {"variants": {"plain": {"eval": {m: s for m, s in FINETUNED["variants"]["plain"]["eval"].items()
                                                 if m in task_metrics(task_cfg)}}}}
    lm = SimpleNamespace(cfg=SimpleNamespace(causal=False))
    result = evaluate_task("toy", task_cfg, models, finetuned, {"toy": {}}, lm, load_tokenizer(models["teacher"]),
                           saved_special_ids(models["teacher"]), params)
    assert list(result.splits) == ["validation"] and result.type == task_type
    split = result.splits["validation"]
    baseline = TYPES[task_type].baseline
    assert list(split.scores) == ["teacher", "student", "plain", baseline, f"{baseline}_full_train"]
    assert split.train_examples == 20 < split.full_train_examples and split.examples == 12
    for model in ("teacher", "student", baseline):
        assert set(split.scores[model]) == set(task_metrics(task_cfg)) <= set(TYPES[task_type].metrics)
    assert split.scores["plain"][task_metrics(task_cfg)[0]] == finetuned["variants"]["plain"]["eval"][task_metrics(task_cfg)[0]]["mean"]
    assert "test has no labels" in result.note and "for classification tasks so far" in result.note
    assert set(result.efficiency) == {"teacher", "student"} and result.retention.speedup > 0
    cpu = result.efficiency["student"]["cpu"]
    assert cpu["seq_len"] == 12 and 0 < cpu["p50_ms"] <= cpu["p95_ms"]
    if task_type == "multiple_choice":
        assert cpu["latency_batch"] == 3 and "3 (context, ending) sequences" in result.timed
    if task_type == "span_qa":  # SQuAD 2.0-like: no-answer threshold from dev, HasAns / NoAns beside overall
        assert set(split.extras["threshold"]) >= {"teacher", "student"}
        assert {"has_answer_f1", "no_answer_f1", "f1"} <= set(split.extras["breakdown"]["teacher"])
    if task_type in ("tagging", "multiple_choice"):  # a confusion matrix over the tags of words / the endings
        n = len(result.label_names)
        assert set(result.extras["confusion"]) == {"teacher", "student", baseline}
        assert all(len(matrix) == n and sum(map(sum, matrix)) > 0 for matrix in result.extras["confusion"].values())
    if task_type == "tagging":
        assert set(result.extras["per_type"]) == {"teacher", "student", baseline}
        assert set(result.extras["per_type"][baseline]) >= {"PER", "LOC"}
    if task_type == "regression":
        assert len(result.extras["scatter"]["teacher"]) == 12 and result.extras["scatter"]["teacher"][0][0] == 40 % 6

    args = SimpleNamespace(metrics=tmp_path / "evaluate.json", plots=tmp_path / "plots", report=tmp_path / "reports")
    stages.evaluate.write_outputs({"toy": result}, [], {}, args, tracking.StageRun())
    written = json.loads(args.metrics.read_text())["toy"]
    assert written["splits"]["validation"]["scores"]["teacher"].keys() == set(task_metrics(task_cfg))
    assert "scatter" not in written
    plots = {str(p.relative_to(args.plots)) for p in args.plots.rglob("*.csv")}
    confusion = {f"confusion/toy_{m}.csv" for m in ("teacher", "student", baseline)}  # words' tags, ending picked
    extra = {"regression": {"predicted_vs_gold/toy_teacher.csv", "predicted_vs_gold/toy_student.csv"},
             "tagging": {f"entity_f1/toy_{m}.csv" for m in ("teacher", "student", baseline)} | confusion,
             "multiple_choice": confusion}
    assert plots == {"scores.csv", "speed.csv", *extra.get(task_type, ())}
    assert (args.plots / "confusion").is_dir()  # declared in dvc.yaml: there even when empty
    summary = (args.report / "summary.md").read_text(encoding="utf-8")
    assert "for classification tasks so far" in summary and "## toy" in summary


def test_the_baselines_learn_from_the_train_examples_finetune_trains_on(tmp_path):
    """select, which gives the baselines their train items, selects as the type's load does: the same
    number of train items, none of dev's, and all of train but dev when finetuning takes all of it."""
    task_cfg, _, models = typed_task("tagging", tmp_path)
    tokenizer, special = load_tokenizer(models["teacher"]), saved_special_ids(models["teacher"])
    for limit in (20, None):
        task = TYPES["tagging"].load("toy", task_cfg, tokenizer, special, dev_fraction=0.25, dev_max=100, max_train=limit)
        train, full = (TYPES["tagging"].select("toy", task_cfg, dev_fraction=0.25, dev_max=100, max_train=n).train
                       for n in (limit, None))
        assert len(train) == len(task.train) and len(full) == 40 - len(task.references["dev"])
        assert not {tuple(s.words) for s in train} & {tuple(s.words) for s in task.references["dev"]}


def test_only_classifiers_are_logged_as_pyfunc_models(tmp_path):
    for folder in ("finetune/imdb", "distill/imdb", "finetune/stsb", "distill/stsb"):
        (tmp_path / folder).mkdir(parents=True)
    results = {"imdb": TaskEvaluation("classification", "accuracy", ["accuracy"]),
               "stsb": TaskEvaluation("regression", "spearman", ["spearman"])}
    assert stages.evaluate.pyfunc_models(results, tmp_path / "finetune", tmp_path / "distill") == [
        (tmp_path / "finetune/imdb", "imdb-teacher", "accuracy"), (tmp_path / "distill/imdb", "imdb-student", "accuracy")]


def test_a_variants_spread_is_shown_only_over_several_seeds():
    """One seed has no std: the report printed "86.9 ± 0.0" for a single run (a GPU run of the MiniLM targets)."""
    from lib.evaluation.evaluate import variant_means
    from lib.evaluation.report import fmt
    finetuned = {"variants": {
        "plain": {"eval": {"f1": {"mean": 0.869, "std": 0.0, "seeds": [0.869]}}},
        "ulmfit": {"eval": {"f1": {"mean": 0.8, "std": 0.02, "seeds": [0.78, 0.81, 0.81]}}}}}
    means = variant_means(finetuned)
    assert means == {"plain": {"f1": 0.869}, "ulmfit": {"f1": 0.8, "f1_std": 0.02}}
    assert (fmt(means["plain"], "f1"), fmt(means["ulmfit"], "f1")) == ("86.9", "80.0 ± 2.0")


# A task's entry of metrics/evaluate.json with every key that may be there, in the order evaluate's dict
# had them before the result was typed: the typed result must give exactly this file
EVERY_KEY = {
    "type": "tagging", "metric": "f1", "metrics": ["f1", "precision"],
    "splits": {"validation": {"examples": 12, "train_examples": 20, "full_train_examples": 28,
                              "scores": {"teacher": {"f1": 0.5, "precision": 0.25}, "lexicon": {"f1": 0.4, "precision": 0.5}},
                              "threshold": {"teacher": 0.25, "lexicon": "-inf"},
                              "breakdown": {"teacher": {"has_answer_f1": 0.5}, "lexicon": {"has_answer_f1": 0.0}}},
               "test": {"examples": 9, "train_examples": 20, "full_train_examples": 28,
                        "scores": {"teacher": {"f1": 0.45, "precision": 0.5}}}},
    "language": "de", "transfer_from": "conll", "teacher": {"variant": "plain", "seed": 1},
    "data": {"label": "a copy", "note": "A note."}, "per_type": {"teacher": {"PER": 0.5}, "lexicon": {"PER": 0.25}},
    "note": "Evaluated on validation, test: test_unlabeled has no labels.", "timed": "one sentence per call",
    "efficiency": {"teacher": {"params": 1000, "disk_bytes": 4000, "cpu": {"p50_ms": 10.0}},
                   "student": {"params": 600, "disk_bytes": 2400, "cpu": {"p50_ms": 5.0}}},
    "onnx": {"student": {"disk_bytes": 2500, "cpu": {"p50_ms": 4.0, "threads": 2}}}, "retained": None, "speedup": 2.0}


def test_the_typed_result_gives_exactly_the_json_the_dict_gave():
    """Every key in its place (order too: json.dumps without sorting), values unchanged, absent keys absent,
    a null retention (a teacher that scored 0) kept; what only the figures draw is left out."""
    result = TaskEvaluation.from_json(EVERY_KEY)
    assert result.retention.retained is None and result.splits["validation"].extras["threshold"]["lexicon"] == "-inf"
    assert json.dumps(result.to_json()) == json.dumps(EVERY_KEY)
    result.extras["confusion"] = {"teacher": [[1, 0], [0, 1]]}
    result.label_names = ["O", "B-PER"]
    assert json.dumps(result.to_json()) == json.dumps(EVERY_KEY)
    least = {key: EVERY_KEY[key] for key in ("type", "metric", "metrics", "splits", "language", "efficiency")}
    assert json.dumps(TaskEvaluation.from_json(least).to_json()) == json.dumps(least)

"""The evaluate stage's per-task decisions, on a tiny task without running the stage."""
import json
import re
from types import SimpleNamespace

import pytest

import stages.evaluate
from lib import tracking
from lib.config import EvaluateConfig, FinetuneConfig, Params, TaskConfig, ZeroShotConfig
from tests.helpers import write_jsonl_gz

WORDS = ["great", "awful", "odd"]


@pytest.fixture
def three_class_task(tmp_path) -> TaskConfig:
    """A task whose classes (0, 1, 2) are found in train, so params cannot check the label words."""
    for split, n in (("train", 60), ("validation", 12)):
        write_jsonl_gz(tmp_path / "toy" / f"{split}.jsonl.gz",
                       [{"text": f"a {WORDS[i % 3]} film number {i}", "label": i % 3} for i in range(n)])
    return TaskConfig(source=str(tmp_path / "toy"))


def evaluate_with_label_words(task: TaskConfig, label_words: list[str], monkeypatch) -> dict:
    """evaluate_task's result for the task with a zero-shot prompt (scoring faked: the decision is tested)."""
    prompt = ZeroShotConfig(template="{text} It was", label_words=label_words)
    params = Params(corpora=None, tasks={"toy": task}, finetune=FinetuneConfig(tasks=["toy"]),
                    evaluate=EvaluateConfig(tfidf_c=[1.0], zero_shot={"toy": prompt}))
    monkeypatch.setattr(stages.evaluate, "zero_shot", lambda lm, tokenizer, special, rows, **_: [0] * len(rows))
    causal_lm = SimpleNamespace(cfg=SimpleNamespace(causal=True))
    return stages.evaluate.evaluate_task("toy", task, {}, None, None, causal_lm, None, None, params)


def test_zero_shot_with_fewer_label_words_than_classes_is_skipped_and_noted(three_class_task, monkeypatch, capsys):
    result = evaluate_with_label_words(three_class_task, [" good", " bad"], monkeypatch)
    note = ("Zero-shot not scored: evaluate.zero_shot.toy.label_words has 2 words for 3 classes; give one word per "
            "class, in label order.")
    assert "zero_shot" not in result["splits"]["validation"]["scores"]
    assert result["note"] == note and f"toy: {note}" in capsys.readouterr().out.splitlines()


def test_zero_shot_with_a_label_word_per_class_is_scored(three_class_task, monkeypatch):
    result = evaluate_with_label_words(three_class_task, [" good", " bad", " odd"], monkeypatch)
    assert "zero_shot" in result["splits"]["validation"]["scores"] and "note" not in result


def test_an_unlabeled_evaluation_split_is_noted_not_scored(three_class_task, tmp_path, monkeypatch):
    write_jsonl_gz(tmp_path / "toy" / "test_unlabeled.jsonl.gz", [{"text": "a film", "label": -1}] * 5)
    three_class_task.eval_splits = ["validation", "test_unlabeled"]
    result = evaluate_with_label_words(three_class_task, [" good", " bad", " odd"], monkeypatch)
    assert set(result["splits"]) == {"validation"}
    assert result["note"] == "Evaluated on validation: test_unlabeled has no labels."


def test_a_task_without_models_still_writes_a_confusion_plot_and_a_report(three_class_task, monkeypatch, tmp_path):
    """The TF-IDF baseline's confusion matrix is there for every task: plots/evaluate/confusion is never an
    empty folder, which git would drop and DVC would then call a file of an unsupported format."""
    result = evaluate_with_label_words(three_class_task, [" good", " bad", " odd"], monkeypatch)
    assert list(result["confusion"]) == ["tfidf"] and sum(map(sum, result["confusion"]["tfidf"])) == 12
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
    about = stages.evaluate.describe_provenance(str(params), None, tracking.StageRun(run_id="r", parent_id="p1"), facts)
    assert about["commit"] == "`0123456789ab` with uncommitted changes"
    assert about["DVC experiment"] == "`wordpiece`" and about["MLflow parent run"] == "`p1`"
    assert about["params.yaml"] == "sha256 `adf0396d435b`"  # sha256sum of 'seed: 1\n'
    assert about["machine"].startswith("CPU ") and about["machine"].endswith("2 threads; models scored in fp32")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", about["date"])
    untracked = stages.evaluate.describe_provenance(params, None, tracking.StageRun(), facts)
    assert untracked["MLflow parent run"] == "none (tracking off or MLflow unavailable)"


def test_report_says_where_the_language_model_started():
    scratch = {"pretrain": {"objective": "clm", "tokens_seen": 4_500_000},
               "adapt": {"objective": "clm", "tokens_seen": 2_400_000}}
    assert stages.evaluate.starting_point(scratch) == ("random weights, pretrained with clm on 4,500,000 tokens; "
                                                       "adapted to the domain with clm on 2,400,000 tokens")
    checkpoint = {"pretrain": {"init": "hf:org/bert", "family": "bert", "kept": True, "objective": "mlm"},
                  "adapt": {"enabled": False, "objective": "mlm"}}
    assert stages.evaluate.starting_point(checkpoint) == ("the published checkpoint `hf:org/bert` (bert), kept as it "
                                                          "is; not adapted (adapt.enabled: false)")


def test_onnx_runtime_latency_and_the_int8_students_score_beside_pytorchs(three_class_task, tmp_path):
    """Teacher and student timed in ONNX Runtime on torch's threads; the int8 student scored on the
    student's split and timed, with the bytes of its ONNX file."""
    import torch

    from tests.helpers import save_tiny_classifier, tiny_tokenizer

    tiny_tokenizer(tmp_path / "tok")
    models = {role: save_tiny_classifier(tmp_path / role, tmp_path / "tok") for role in ("teacher", "student")}
    info = json.loads((models["teacher"] / "classifier.json").read_text())
    (models["teacher"] / "classifier.json").write_text(json.dumps({**info, "variant": "plain", "seed": 1}))
    params = Params(corpora=None, tasks={"toy": three_class_task}, device="cpu", finetune=FinetuneConfig(tasks=["toy"]),
                    evaluate=EvaluateConfig(tfidf_c=[1.0], latency_seq_len=12, latency_repeats=3, throughput_batch=2))
    result = stages.evaluate.evaluate_task("toy", three_class_task, models, None, None, None, None, None, params)

    scores = result["splits"]["validation"]["scores"]
    assert set(scores["student_int8"]) == set(scores["student"]) == {"accuracy"}
    assert set(result["onnx"]) == {"teacher", "student", "student_int8"}
    for role, figures in result["onnx"].items():
        assert figures["cpu"]["threads"] == torch.get_num_threads() == result["efficiency"]["student"]["cpu"]["threads"]
        assert figures["cpu"]["seq_len"] == 12 and 0 < figures["cpu"]["p50_ms"] <= figures["cpu"]["p95_ms"]
    assert result["onnx"]["student_int8"]["disk_bytes"] < result["onnx"]["student"]["disk_bytes"]

"""The evaluate stage's per-task decisions, on a tiny task without running the stage."""
import json
from types import SimpleNamespace

import pytest

import stages.evaluate
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


def test_onnx_runtime_latency_and_the_int8_students_score_beside_pytorchs(three_class_task, tmp_path):
    """Teacher and student timed in ONNX Runtime on torch's threads; the int8 student scored on the
    student's split and timed, with the bytes of its ONNX file."""
    import torch

    from tests.test_onnx_export import CORPUS, save_tiny_classifier
    from lib.config import TokenizerConfig
    from lib.tokenizer import train_tokenizer

    train_tokenizer(CORPUS * 4, TokenizerConfig(algorithm="wordpiece", vocab_size=120, min_frequency=1), tmp_path / "tok")
    models = {role: save_tiny_classifier(tmp_path / role, tmp_path / "tok", False, "learned", 2, "concat", True, False)
              for role in ("teacher", "student")}
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

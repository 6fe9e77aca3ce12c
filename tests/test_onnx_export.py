"""ONNX export of classifier folders: ONNX Runtime gives TextClassifier's probabilities for every head,
pairs and a causal model, whatever a row is batched with; the int8 copy mostly agrees; faults are
one line."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lib.config.errors import UserError
from lib.evaluation.report import markdown
from lib.evaluation.result import TaskEvaluation
from lib.serving.onnx_export import INPUT_NAMES, INT8_SUFFIX, OnnxClassifier, export_onnx, to_onnx
from lib.serving.predict import TextClassifier
from lib.tasks.model import HeadConfig, load_task_model
from lib.training.variants import VARIANTS
from tests.helpers import ROOT, TINY_CORPUS, TINY_LABELS, TINY_MAX_LEN, TINY_TEXTS, save_tiny_classifier, tiny_tokenizer

LABELS, MAX_LEN, CORPUS, TEXTS = TINY_LABELS, TINY_MAX_LEN, TINY_CORPUS, TINY_TEXTS
# name: (TransformerConfig fields, head features, ULMFiT block, pairs); ALiBi's and T5's 8 positions are
# fewer than MAX_LEN: they extrapolate, and their graphs must take the longer inputs too
MODELS = {"concat": ({}, "concat", True, False),
          "plain_pair": ({"position": "alibi", "max_positions": MAX_LEN // 2}, "token", False, True),
          "causal": ({"causal": True, "position": "rope", "segment_vocab": 0}, "concat", True, False),
          # an encoder-decoder's encoder, as finetuning reads it: its relative bias is computed from a parameter
          "t5_encoder": ({"position": "t5", "max_positions": MAX_LEN // 2, "rms_norm": True, "bias": False,
                          "scale_attention": False, "activation": "relu", "embedding_norm": False, "lm_head": "linear",
                          "segment_vocab": 0}, "token", False, False)}


def onnx_file(folder: Path) -> Path:
    """Where the tests export a classifier folder: beside it (the default place is in the project)."""
    return folder.with_name(f"{folder.name}.onnx")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """A classifier folder per MODELS entry, each exported to its onnx_file (the concat one also int8)."""
    root = tmp_path_factory.mktemp("onnx")
    tok = tiny_tokenizer(root / "tok")
    made = {name: save_tiny_classifier(root / name, tok, pairs, HeadConfig(len(LABELS), features, block, 16, 0.0),
                                       **fields) for name, (fields, features, block, pairs) in MODELS.items()}
    for name, folder in made.items():
        export_onnx(folder, onnx_file(folder), int8=name == "concat")
    return made


def inputs(folder: Path) -> tuple[list[str], list[str] | None]:
    return TEXTS, list(reversed(TEXTS)) if MODELS[folder.name][3] else None


@pytest.mark.parametrize("name", list(MODELS))
def test_onnx_runtime_gives_text_classifiers_probabilities(folders, name):
    folder = folders[name]
    reference = TextClassifier.load(folder, device="cpu", precision="fp32")
    onnx = OnnxClassifier.load(folder, onnx_file(folder))
    expected = reference.predict_proba(*inputs(folder))
    assert np.ptp(expected, axis=0).max() > 0.1  # the texts get different probabilities: a constant would not pass
    probabilities = onnx.predict_proba(*inputs(folder), batch_size=3)
    assert probabilities.dtype == np.float32 and probabilities.shape == (len(TEXTS), len(LABELS))
    np.testing.assert_allclose(probabilities, expected, atol=1e-5)
    assert onnx.predict(*inputs(folder)) == reference.predict(*inputs(folder))


@pytest.mark.parametrize("name", list(MODELS))
def test_padding_in_a_batch_does_not_change_a_rows_probabilities(folders, name):
    onnx = OnnxClassifier.load(folders[name], onnx_file(folders[name]))
    alone = onnx.predict_proba(*inputs(folders[name]), batch_size=1)
    batched = onnx.predict_proba(*inputs(folders[name]), batch_size=len(TEXTS))  # padded to the longest
    np.testing.assert_allclose(batched, alone, atol=1e-5)


def test_the_graph_takes_any_batch_and_sequence_length(folders):
    import onnxruntime

    session = onnxruntime.InferenceSession(str(onnx_file(folders["causal"])), providers=["CPUExecutionProvider"])
    # all three inputs, though this backbone has no segment embeddings: every graph is fed alike
    assert [node.name for node in session.get_inputs()] == list(INPUT_NAMES)
    for batch, length in ((1, 2), (5, MAX_LEN)):
        ids = np.ones((batch, length), dtype=np.int64)
        feed = {"input_ids": ids, "segment_ids": np.zeros_like(ids), "attention_mask": np.ones_like(ids, dtype=bool)}
        logits = session.run(None, feed)[0]
        assert logits.shape == (batch, len(LABELS))


def test_files_are_written_whole_beside_nothing_else(folders):
    names = {path.name for path in folders["concat"].parent.iterdir()}
    assert {"concat.onnx", f"concat{INT8_SUFFIX}"} <= names and not any(".tmp-" in name for name in names)


def test_int8_copy_is_smaller_and_mostly_agrees_with_fp32(folders):
    folder = folders["concat"]
    fp32 = OnnxClassifier.load(folder, onnx_file(folder))
    int8 = OnnxClassifier.load(folder, folder.with_name(f"concat{INT8_SUFFIX}"))
    assert folder.with_name(f"concat{INT8_SUFFIX}").stat().st_size < onnx_file(folder).stat().st_size
    words = " ".join(CORPUS).split()
    texts = [" ".join(words[i % len(words):][:3 + i % 9]) for i in range(200)]
    agreement = (int8.predict_proba(texts).argmax(1) == fp32.predict_proba(texts).argmax(1)).mean()
    assert agreement >= 0.9  # measured 0.975 (195 of 200) on this model; 0.985 and 1.0 on the other two


def test_a_missing_onnxruntime_is_one_line(folders, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # None: importing it fails
    with pytest.raises(UserError, match=r"^onnxruntime is not installed; pip install 'onnxruntime>=") as err:
        OnnxClassifier.load(folders["concat"], onnx_file(folders["concat"]))
    assert "\n" not in str(err.value)


def test_an_export_failure_is_one_line(folders, monkeypatch):
    def fails(*args, **kwargs):
        raise RuntimeError("Dynamic control flow is not supported\nat line 3")

    monkeypatch.setattr(torch.export, "export", fails)
    model, _ = load_task_model(folders["concat"])
    with pytest.raises(UserError) as err:
        to_onnx(model)
    assert str(err.value) == ("cannot export the classifier to ONNX (RuntimeError: Dynamic control flow is not "
                              "supported); the PyTorch folder still predicts (lib.serving.predict)")


def test_a_folder_without_an_onnx_file_is_one_line(folders, tmp_path):
    with pytest.raises(UserError, match="no such ONNX file; write it with python -m lib.serving.onnx_export"):
        OnnxClassifier.load(folders["concat"], tmp_path / "missing.onnx")


def tree(root: Path) -> dict[Path, bytes | None]:
    """Every folder (None) and file (its bytes) under `root`, by relative path."""
    return {path.relative_to(root): path.read_bytes() if path.is_file() else None for path in root.rglob("*")}


def test_without_out_the_command_line_writes_to_exports_and_leaves_the_model_folder_as_it_was(tmp_path, monkeypatch):
    """A model folder is a DVC stage's output: a file added to it would change what `dvc status` sees."""
    project = tmp_path / "project"
    (project / "models" / "distill").mkdir(parents=True)
    (project / "dvc.yaml").write_text("stages: {}\n")
    folder = save_tiny_classifier(project / "models" / "distill" / "tiny", tiny_tokenizer(tmp_path / "tok"))
    before = tree(project)
    # run from a folder inside the project: the default place is at the project root, not the working folder
    env = {**{k: v for k, v in os.environ.items() if k != "DVC_ROOT"}, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "lib.serving.onnx_export", str(folder), "--int8"],
                            cwd=project / "models", env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    exported = [project / "exports" / "distill-tiny.onnx", project / "exports" / f"distill-tiny{INT8_SUFFIX}"]
    assert [line.split(" (")[0] for line in result.stdout.splitlines()] == [f"wrote {path}" for path in exported]
    after = tree(project)
    assert {path: data for path, data in after.items() if path.parts[0] != "exports"} == before
    assert {path for path in after if path.parts[0] == "exports"} == \
        {Path("exports"), *(path.relative_to(project) for path in exported)}
    # OnnxClassifier.load reads the file where the export put it by default
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.chdir(project)
    expected = TextClassifier.load(folder, device="cpu", precision="fp32").predict_proba(TEXTS)
    np.testing.assert_allclose(OnnxClassifier.load(folder).predict_proba(TEXTS), expected, atol=1e-5)


def test_the_command_line_says_one_line_for_a_wrong_folder(tmp_path):
    result = subprocess.run([sys.executable, "-m", "lib.serving.onnx_export", str(tmp_path)], capture_output=True, text=True,
                            timeout=120, cwd=ROOT)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"error: {tmp_path}/classifier.json: not a classifier description")


def test_the_summary_puts_onnx_runtime_beside_pytorch():
    cpu = {"p50_ms": 10.0, "p95_ms": 12.5, "mean_ms": 10.4, "throughput": 150.0, "batch": 32, "seq_len": 128,
           "threads": 2}
    onnx_cpu = {"p50_ms": 4.0, "p95_ms": 4.5, "mean_ms": 4.1, "seq_len": 128, "threads": 2}
    result = {"type": "classification", "metric": "accuracy", "metrics": ["accuracy"],
              "splits": {"test": {"examples": 10, "train_examples": 10, "full_train_examples": 10,
                                  "scores": {"student": {"accuracy": 0.8}, "student_int8": {"accuracy": 0.79}}}},
              "efficiency": {"student": {"params": 600, "disk_bytes": 2_400_000, "cpu": cpu}},
              "onnx": {"student": {"disk_bytes": 2_500_000, "cpu": onnx_cpu},
                       "student_int8": {"disk_bytes": 700_000, "cpu": {**onnx_cpu, "p50_ms": 2.0, "p95_ms": 2.2}}}}
    text = markdown({"imdb": TaskEvaluation.from_json(result)}, [], VARIANTS)
    assert "| student, int8 (ONNX Runtime) | 79.0 |" in text
    assert "| student (distilled) | 600 | 2.4 MB | 10.0 / 12.5 | 150 | 4.0 / 4.5 |" in text
    assert "| student, int8 (ONNX Runtime) | 600 | 0.7 MB | – | – | 2.0 / 2.2 |" in text
    assert "ONNX Runtime ran on the same 2 threads (intra_op_num_threads) as PyTorch" in text


def test_an_elmo_classifier_exports_with_its_layer_mix(tmp_path):
    """The elmo variant's head reads every layer's states through its scalar mix: the graph must too."""
    tok = tiny_tokenizer(tmp_path / "tok")
    head = HeadConfig(len(LABELS), hidden=16, dropout=0.0, mix=True)
    folder = save_tiny_classifier(tmp_path / "elmo", tok, head=head, causal=True)
    export_onnx(folder, onnx_file(folder))
    expected = TextClassifier.load(folder, device="cpu", precision="fp32").predict_proba(TEXTS)
    onnx = OnnxClassifier.load(folder, onnx_file(folder))
    np.testing.assert_allclose(onnx.predict_proba(TEXTS, batch_size=3), expected, atol=1e-5)

"""Size and speed of a classifier: parameters counted once, bytes of the weight files, latency and
throughput on a tiny model."""
import time

import pytest
import torch

from lib.evaluation.efficiency import MIN_MEASURED_S, latency, onnx_latency, parameter_count, size_on_disk, throughput
from lib.models.architectures import build_model
from lib.models.config import TransformerConfig
from lib.tasks.model import HeadConfig, TaskModel, save_task_model
from tests.helpers import stub_tokenizer_dir

SEQ_LEN = 24


def classifier(tie_embeddings: bool = True) -> TaskModel:
    torch.manual_seed(0)
    backbone = build_model(TransformerConfig(vocab_size=100, d_model=32, n_layers=2, n_heads=2, d_ff=64, dropout=0.1,
                                             max_positions=32, tie_embeddings=tie_embeddings))
    return TaskModel(backbone, HeadConfig(2, hidden=16))


def test_tied_embeddings_count_once():
    tied, untied = classifier(tie_embeddings=True), classifier(tie_embeddings=False)
    cfg = tied.backbone.cfg
    assert tied.backbone.head.decoder.weight is tied.backbone.embeddings.token.weight
    assert parameter_count(untied) - parameter_count(tied) == cfg.padded_vocab * cfg.embedding_dim


def test_size_on_disk_is_the_weight_files(tmp_path):
    model = classifier()
    stub_tokenizer_dir(tmp_path / "tok")
    save_task_model(model, tmp_path / "clf", tmp_path / "tok", {"label_names": ["no", "yes"]})
    files = sorted((tmp_path / "clf").glob("*.safetensors"))
    assert [f.name for f in files] == ["head.safetensors", "model.safetensors"]
    size = size_on_disk(tmp_path / "clf")
    assert size == sum(f.stat().st_size for f in files)
    # fp32 tensors, the tied matrix stored once, plus small JSON headers
    assert 4 * parameter_count(model) < size < 4 * parameter_count(model) + 20_000
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        size_on_disk(tmp_path / "tok")


def test_latency_and_throughput_on_a_tiny_model():
    model = classifier().train()
    threads = torch.get_num_threads()
    start = time.perf_counter()
    timing = latency(model, SEQ_LEN, "cpu", warmup=1, repeats=5, threads=1)
    assert time.perf_counter() - start >= MIN_MEASURED_S  # 5 calls of a tiny model would be timer noise
    assert set(timing) == {"p50_ms", "p95_ms", "mean_ms"}
    assert 0 < timing["p50_ms"] <= timing["p95_ms"] and timing["mean_ms"] > 0
    assert torch.get_num_threads() == threads and model.training  # restored
    assert throughput(model, SEQ_LEN, "cpu", batch_size=4, repeats=2) > 0
    with pytest.raises(ValueError, match="max_positions"):
        latency(model, 33, "cpu", repeats=1)


def test_onnx_latency_times_any_forward_under_the_same_rules():
    shapes = []

    def forward(input_ids, segment_ids, attention_mask):
        shapes.append((tuple(input_ids.shape), segment_ids.sum().item(), attention_mask.all().item()))
        time.sleep(0.001)  # a millisecond a call: MIN_MEASURED_S, not MAX_CALLS, ends the measurement

    start = time.perf_counter()
    timing = onnx_latency(forward, 100, SEQ_LEN, warmup=2, repeats=5)
    assert time.perf_counter() - start >= MIN_MEASURED_S and len(shapes) >= 2 + 5
    assert set(shapes) == {((1, SEQ_LEN), 0, True)}  # batch 1, no padding, as latency times
    assert 0 < timing["p50_ms"] <= timing["p95_ms"] and set(timing) == {"p50_ms", "p95_ms", "mean_ms"}

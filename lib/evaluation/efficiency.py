"""How big and how fast a classifier is, for the evaluate stage: a score alone hides that a model
twice the size may be a point better.

Size is counted as parameters (a tied or shared tensor once, as it is stored) and as bytes of the
weight files. Speed is measured on random token ids of exactly `seq_len` tokens with no padding, so
the numbers depend on the model and the length alone, not on a dataset's length distribution; the
forward is the one prediction runs (`lib.serving.predict`): inference mode, in the precision lib.core.runtime
resolves (auto: bf16 on CUDA, and on a CPU only where bf16 proved faster). Latency is per call
(batch 1 by default: one request); throughput is sequences per second over full batches. A
measurement runs for at least `repeats` calls and at least MIN_MEASURED_S, so a tiny model that
takes microseconds a call is not timed on timer noise. `onnx_latency` times the ONNX Runtime forward
(lib.serving.onnx_export) on the same inputs under the same rules, on the session's threads.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from lib.core import runtime
from lib.tasks.model import TaskModel

MIN_MEASURED_S = 0.2
MAX_CALLS = 100_000  # a bound on the calls of one measurement, whatever MIN_MEASURED_S asks for
WEIGHT_PATTERN = "*.safetensors"


def parameter_count(model: nn.Module) -> int:
    """Parameters, each tensor once: parameters() skips a tensor it has already yielded, so tied
    embeddings and shared blocks count once."""
    return sum(p.numel() for p in model.parameters())


def size_on_disk(folder: str | Path) -> int:
    """Bytes of the weight files (*.safetensors) in `folder`, e.g. a classifier folder: backbone + head."""
    files = sorted(Path(folder).glob(WEIGHT_PATTERN))
    if not files:
        raise FileNotFoundError(f"{folder}: no {WEIGHT_PATTERN} weight files")
    return sum(path.stat().st_size for path in files)


def latency(model: TaskModel, seq_len: int, device: str | torch.device, *, batch_size: int = 1, warmup: int = 5,
            repeats: int = 50, threads: int | None = None, precision: str = "auto",
            call: Callable[..., object] | None = None) -> dict[str, float]:
    """{"p50_ms", "p95_ms", "mean_ms"}: milliseconds per forward of `batch_size` sequences of `seq_len`
    tokens. `threads` sets torch's CPU threads for the measurement; `precision` is auto, bf16 or fp32;
    `call`: what one call runs on (input_ids, segment_ids, attention_mask), by default the model's forward
    (lib.tasks.base.TaskType.timed_call: a type that generates times a generation). The model is moved to
    `device` (in place, as nn.Module.to does) and left in its training mode."""
    return _milliseconds(_timed_calls(model, seq_len, torch.device(device), batch_size, warmup, repeats, threads,
                                      precision, call))


def onnx_latency(forward: Callable[..., object], vocab_size: int, seq_len: int, *, batch_size: int = 1,
                 warmup: int = 5, repeats: int = 50) -> dict[str, float]:
    """As `latency`, for an ONNX Runtime forward on CPU: `forward` is called as a TaskModel is
    (lib.serving.onnx_export.OnnxForward, what OnnxClassifier predicts with; not imported here, so the stages
    that time PyTorch alone do not depend on it), on the same inputs under the same rules, with the
    threads its session was made with."""
    inputs = _random_inputs(vocab_size, batch_size, seq_len, torch.device("cpu"))
    return _milliseconds(_measured(lambda: forward(*inputs), warmup, repeats))


def throughput(model: TaskModel, seq_len: int, device: str | torch.device, *, batch_size: int = 32,
               warmup: int = 2, repeats: int = 10, threads: int | None = None, precision: str = "auto",
               call: Callable[..., object] | None = None) -> float:
    """Sequences of `seq_len` tokens predicted per second, in batches of `batch_size` (as latency)."""
    times = _timed_calls(model, seq_len, torch.device(device), batch_size, warmup, repeats, threads, precision, call)
    return batch_size * len(times) / sum(times)


def profile(model: TaskModel, folder: str | Path, *, seq_len: int, repeats: int, throughput_batch: int,
            latency_batch: int = 1, call: Callable[..., object] | None = None,
            written_tokens: int | None = None) -> dict:
    """Size (parameters, bytes of `folder`'s weights) and speed on CPU, and on the GPU when there is one:
    latency of a call of `latency_batch` sequences (1: one request; a multiple-choice question is one
    call over its choices) and throughput in sequences/s over batches of `throughput_batch`, all of
    `seq_len` tokens, each call `call` (as latency); where a call writes `written_tokens` per sequence
    (generation), also the tokens written per second. The model is left on the CPU."""
    figures = {"params": parameter_count(model), "disk_bytes": size_on_disk(folder)}
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        timing = latency(model, seq_len, device, batch_size=latency_batch, repeats=repeats, call=call)
        sequences = throughput(model, seq_len, device, batch_size=throughput_batch, call=call)
        figures[device] = {**timing, "throughput": sequences, "batch": throughput_batch, "seq_len": seq_len,
                           **({"tokens_per_s": sequences * written_tokens} if written_tokens else {}),
                           "threads": torch.get_num_threads() if device == "cpu" else None,
                           **({"latency_batch": latency_batch} if latency_batch != 1 else {})}
    model.to("cpu")
    return figures


def _milliseconds(times: list[float]) -> dict[str, float]:
    ms = np.array(times) * 1000
    return {"p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)),
            "mean_ms": float(ms.mean())}


def _random_inputs(vocab_size: int, batch_size: int, seq_len: int,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, segment_ids, attention_mask): random ids of exactly `seq_len` tokens, the same on
    every call, with an all-true mask, as lib.serving.predict passes one: the same attention path as a real
    prediction."""
    if seq_len < 1 or batch_size < 1:
        raise ValueError(f"seq_len ({seq_len}) and batch_size ({batch_size}) must be >= 1")
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(vocab_size, (batch_size, seq_len), generator=generator).to(device)
    return input_ids, torch.zeros_like(input_ids), torch.ones_like(input_ids, dtype=torch.bool)


def _measured(call: Callable[[], object], warmup: int, repeats: int) -> list[float]:
    """Seconds of each timed `call` after `warmup` untimed ones: at least `repeats` of them and
    MIN_MEASURED_S in all."""
    if repeats < 1:
        raise ValueError(f"repeats ({repeats}) must be >= 1")
    times: list[float] = []
    measured = 0.0
    for index in range(warmup + MAX_CALLS):
        start = time.perf_counter()
        call()
        if index >= warmup:
            times.append(time.perf_counter() - start)
            measured += times[-1]
            if len(times) >= repeats and measured >= MIN_MEASURED_S:
                break
    return times


def _timed_calls(model: TaskModel, seq_len: int, device: torch.device, batch_size: int, warmup: int, repeats: int,
                 threads: int | None, precision: str, call: Callable[..., object] | None = None) -> list[float]:
    """Seconds of each timed forward (see _measured)."""
    inputs = _random_inputs(model.backbone.cfg.vocab_size, batch_size, seq_len, device)
    # resolved at the stage's thread count, the one the probe's cached answer is for
    resolved = runtime.resolve_precision(precision, device, key="precision")
    was_training, previous_threads = model.training, torch.get_num_threads()
    model.to(device).eval()
    if threads is not None:
        torch.set_num_threads(threads)

    def forward() -> None:
        (call or model)(*inputs)
        _sync(device)  # CUDA returns before the kernels have run

    try:
        _sync(device)  # nothing queued before the clock starts
        with torch.inference_mode(), runtime.autocast(device, resolved):
            return _measured(forward, warmup, repeats)
    finally:
        torch.set_num_threads(previous_threads)
        model.train(was_training)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)

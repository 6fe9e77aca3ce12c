"""A classifier folder as an ONNX model, run by ONNX Runtime with the same probabilities as lib.serving.predict.

`to_onnx` exports a TaskModel (any head, any backbone lib.models.architectures builds) to an ONNX graph from
(input_ids, segment_ids, attention_mask) to logits, with dynamic batch and sequence axes; the
sequence axis goes up to the model's max_length, the longest input it takes, or for ALiBi and T5's
bias (no position table: they extrapolate) up to the classifier's encoding max_len where that is longer.
`quantize_int8` is ONNX Runtime's dynamic quantization of it: int8 weights, activations quantized
per call.
`OnnxClassifier` is a TextClassifier whose forward is an ONNX Runtime session: the same reading of
the folder, the same encoding (lib.data.encoding.encode), batching and softmax, so only the forward differs.

    python -m lib.serving.onnx_export models/distill/imdb --int8   # exports/distill-imdb.onnx and .int8.onnx

    from lib.serving.onnx_export import OnnxClassifier
    OnnxClassifier.load("models/distill/imdb").predict(["A wonderful film."])   # reads exports/distill-imdb.onnx

Unless given another (--out, or a file to OnnxClassifier.load), the ONNX file is
exports/<folder above>-<folder>.onnx at the project root, ignored by git: never inside the classifier
folder, which a DVC stage wrote (models/finetune, models/distill) and a file added to would change.

Exporter: torch.onnx.export's dynamo exporter, from a strict torch.export graph. The TorchScript
exporter (dynamo=False) writes the padding mask's torch.eye as a boolean EyeLike node, which ONNX
Runtime 1.32 has no kernel for, and is deprecated. Non-strict torch.export reads `len(hidden)` in
TaskModel.token_state as a Python int and silently fixes the batch size of causal models to the
example's; strict export (TorchDynamo) keeps it symbolic.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lib.config.errors import UserError
from lib.core.errors import describe, os_error_line, run_main
from lib.core.io import atomic_file, project_root
from lib.models.config import TABLELESS_POSITIONS
from lib.serving.predict import TextClassifier
from lib.tasks.model import TaskModel, load_task_model

EXPORTS, INT8_SUFFIX = "exports", ".int8.onnx"
INPUT_NAMES, OUTPUT_NAME = ("input_ids", "segment_ids", "attention_mask"), "logits"


def default_onnx_file(model_dir: str | Path) -> Path:
    """Where the ONNX model of the classifier in `model_dir` goes unless told: exports/<folder above>-<folder>.onnx
    at the project root (exports/distill-imdb.onnx for models/distill/imdb: a teacher and its student differ)."""
    model_dir = Path(model_dir).resolve()
    return project_root() / EXPORTS / f"{model_dir.parent.name}-{model_dir.name}.onnx"


def onnxruntime() -> Any:
    """The onnxruntime module, or one line saying how to install it."""
    try:
        import onnxruntime
    except ImportError:
        raise UserError("onnxruntime is not installed; pip install 'onnxruntime>=1.32' (or the project: "
                        "pip install -e .)") from None
    return onnxruntime


class Logits(nn.Module):
    """The classifier's logits alone: the exported graph's one output (the hidden states it also
    returns are for distillation, and would cost a (B, T, d_model) copy a call)."""

    def __init__(self, model: TaskModel):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, segment_ids, attention_mask)[0]


def folder_to_onnx(model_dir: Path) -> bytes:
    """The serialized ONNX model of the classifier in `model_dir`, taking inputs as long as its
    encoding makes them (see to_onnx)."""
    model, info = load_task_model(model_dir)
    return to_onnx(model, info.get("encoding", {}).get("max_len"))


def to_onnx(model: TaskModel, max_len: int | None = None) -> bytes:
    """The serialized ONNX model of `model`: int64 input_ids and segment_ids and a bool attention_mask
    (B, T) -> float32 logits (B, n_classes); a backbone without segment embeddings ignores
    segment_ids, which the graph still takes. T goes up to the model's max_length, or for ALiBi and T5 up to
    `max_len` (the longest input it will be given) where that is longer. The model is moved to CPU
    and put in eval mode (in place, as nn.Module.to does)."""
    onnxruntime()  # a missing runtime is said before a long export
    try:
        import onnxscript  # noqa: F401  the dynamo exporter writes its graph with it
    except ImportError:
        raise UserError("onnxscript is not installed (torch's ONNX exporter needs it); pip install "
                        "'onnxscript>=0.7' (or the project: pip install -e .)") from None
    logits = Logits(model).cpu().eval()
    cfg = model.backbone.cfg
    longest = max(cfg.max_length, max_len or 0) if cfg.position in TABLELESS_POSITIONS else cfg.max_length
    # two rows of (up to) 8 tokens: export specializes sizes 0 and 1, so the example avoids them
    input_ids = torch.zeros(2, min(8, longest), dtype=torch.long)
    example = (input_ids, torch.zeros_like(input_ids), torch.ones_like(input_ids, dtype=torch.bool))
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence", max=longest)
    try:
        with quiet_exporter(), sequences_up_to(model, longest), no_gradients(logits):
            program = torch.export.export(logits, example, dynamic_shapes=({0: batch, 1: sequence},) * 3,
                                          strict=True)
            exported = torch.onnx.export(program, input_names=list(INPUT_NAMES), output_names=[OUTPUT_NAME],
                                         external_data=False, verbose=False)
    except Exception as err:  # torch.export and the exporter raise many types; all mean the same to a user
        raise UserError(f"cannot export the classifier to ONNX ({describe(err)}); the PyTorch folder still "
                        "predicts (lib.serving.predict)") from None
    return exported.model_proto.SerializeToString()


@contextlib.contextmanager
def sequences_up_to(model: TaskModel, longest: int) -> Iterator[None]:
    """The backbone's max_positions raised to `longest` while in the block, a no-op for any model but
    ALiBi's and T5's. Transformer.forward compares the length with max_length before it asks whether
    positions have a table, and export turns that comparison into a bound on the sequence axis; ALiBi
    and T5's bias size no table by max_positions, so raising it changes nothing else."""
    backbone = model.backbone
    cfg = backbone.cfg
    backbone.cfg = dataclasses.replace(cfg, max_positions=longest + cfg.position_offset)
    try:
        yield
    finally:
        backbone.cfg = cfg


@contextlib.contextmanager
def no_gradients(module: nn.Module) -> Iterator[None]:
    """`module`'s parameters without requires_grad while in the block: an attention bias computed from a
    parameter (T5's) that requires grad sends SDPA to a decomposition the exporter then cannot view."""
    wanted = [p.requires_grad for p in module.parameters()]
    module.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in zip(module.parameters(), wanted):
            p.requires_grad_(flag)


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """Silence what torch's exporter says on every export that no user can act on: that torchvision
    (which no classifier here uses) is not installed, and a deprecation inside torch's own pytree code."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
            yield
    finally:
        registration.setLevel(level)


def quantize_int8(model: bytes) -> bytes:
    """`model` (serialized ONNX) with ONNX Runtime's dynamic quantization: the weights of its MatMuls
    and its embedding tables stored as int8 (QInt8), a MatMul's input quantized to uint8 per call from
    its range; attention's score products, which have no weights, stay fp32."""
    onnxruntime()  # one line when it is missing
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # quantize_dynamic reads a proto but writes only to a path: files in a temporary folder, removed however it ends
    with tempfile.TemporaryDirectory(prefix="quantize-") as tmp:
        source, target = Path(tmp) / "model.onnx", Path(tmp) / "model.int8.onnx"
        try:
            source.write_bytes(model)
            with without_preprocessing_advice():
                quantize_dynamic(source, target, weight_type=QuantType.QInt8)
        except Exception as err:  # onnxruntime.quantization raises plain Exceptions and onnx errors
            if isinstance(err, OSError) and os_error_line(err):
                # a full disk or a denied permission: run_main's one line, which names the file, else the temporary
                # folder (its disk is often not the project's)
                raise OSError(err.errno, err.strerror, err.filename or tmp) from None
            raise UserError(f"cannot quantize the ONNX model to int8 ({describe(err)})") from None
        return target.read_bytes()


class PreprocessingAdvice(logging.Filter):
    """Drops quantize_dynamic's advice to run quant_pre_process first: its symbolic shape inference
    fails on these graphs (TypeError in _infer_Concat, onnxruntime 1.32), so the advice cannot be taken."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Please consider to run pre-processing before quantization")


@contextlib.contextmanager
def without_preprocessing_advice() -> Iterator[None]:
    advice = PreprocessingAdvice()
    logging.getLogger().addFilter(advice)  # quantize_dynamic logs it on the root logger
    try:
        yield
    finally:
        logging.getLogger().removeFilter(advice)


def inference_session(model: bytes | str | Path, threads: int | None = None) -> Any:
    """An ONNX Runtime CPU session on `model` (serialized, or a file) with `threads` intra-op threads,
    by default torch's current number (what lib.core.runtime set): PyTorch and ONNX Runtime timed on the
    same threads compare."""
    ort = onnxruntime()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.log_severity_level = 3  # errors only: its warnings name graph internals a user cannot act on
    source = model if isinstance(model, bytes) else str(model)
    try:
        return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime's errors are its own pybind types, none shared
        where = "the ONNX model" if isinstance(model, bytes) else str(model)
        raise UserError(f"{where}: ONNX Runtime cannot load it ({describe(err)}); export it again "
                        "(python -m lib.serving.onnx_export <classifier folder>)") from None


class OnnxForward:
    """An ONNX Runtime session called as a TaskModel is: (input_ids, segment_ids, attention_mask)
    tensors -> (logits tensor, None), so TextClassifier runs it in place of the PyTorch model."""

    def __init__(self, session: Any, vocab_size: int):
        self.session, self.vocab_size = session, vocab_size
        self.threads = session.get_session_options().intra_op_num_threads

    language = None  # as a TaskModel's: the graph reads its inputs as the language it was exported with

    def eval(self) -> OnnxForward:
        """As a module's: a session has no training mode."""
        return self

    def read_as(self, language: str | None) -> None:
        """As a TaskModel's, but the graph keeps the language its classifier read when it was traced (the
        one in classifier.json): ONNX Runtime scores a model on its own task only."""

    def __call__(self, input_ids: torch.Tensor, segment_ids: torch.Tensor, attention_mask: torch.Tensor,
                 output_hidden_states: bool = False) -> tuple[torch.Tensor, None]:
        feed = {name: tensor.cpu().numpy() for name, tensor in zip(INPUT_NAMES, (input_ids, segment_ids,
                                                                                 attention_mask))}
        return torch.from_numpy(self.session.run([OUTPUT_NAME], feed)[0]), None


class OnnxClassifier(TextClassifier):
    """TextClassifier through ONNX Runtime on CPU: the same inputs, predict and predict_proba."""

    @classmethod
    def load(cls, model_dir: str | Path, model: bytes | str | Path | None = None,
             threads: int | None = None) -> OnnxClassifier:
        """The classifier in `model_dir` (a finetune or distill folder) with its forward run by ONNX
        Runtime on `model`: serialized ONNX, or a file (default: default_onnx_file(model_dir), where
        export_onnx writes it)."""
        model = default_onnx_file(model_dir) if model is None else model
        if not isinstance(model, bytes) and not Path(model).is_file():
            raise UserError(f"{model}: no such ONNX file; write it with python -m lib.serving.onnx_export {model_dir}")
        # the folder's checks, tokenizer, labels and encoding are TextClassifier.load's, read once there
        reference = TextClassifier.load(model_dir, device="cpu", precision="fp32")
        forward = OnnxForward(inference_session(model, threads), reference.model.backbone.cfg.vocab_size)
        return cls(reference.kind, forward, reference.tokenizer, reference.label_names, reference.encoding,
                   reference.special, torch.device("cpu"), "fp32")


def export_onnx(model_dir: str | Path, out_file: str | Path | None = None, int8: bool = False) -> list[Path]:
    """Write the classifier in `model_dir` as ONNX to `out_file` (default: default_onnx_file(model_dir))
    and, with `int8`, its dynamically quantized copy beside it (<name>.int8.onnx); each file is written
    whole or not at all. Returns the files written."""
    out_file = default_onnx_file(model_dir) if out_file is None else Path(out_file)
    exported = folder_to_onnx(Path(model_dir))
    files = {out_file: exported}
    if int8:
        files[out_file.with_name(out_file.name.removesuffix(".onnx") + INT8_SUFFIX)] = quantize_int8(exported)
    for path, data in files.items():
        with atomic_file(path, "wb") as f:
            f.write(data)
    return list(files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="a classifier folder (models/finetune/<task>, models/distill/<task>)")
    parser.add_argument("--out", type=Path, help=f"the ONNX file (default: {EXPORTS}/<folder above>-<folder>.onnx "
                        f"at the project root, e.g. {EXPORTS}/distill-imdb.onnx for models/distill/imdb; never inside "
                        "model_dir, a DVC output that a file added to would change)")
    parser.add_argument("--int8", action="store_true", help=f"also write the int8 copy (<name>{INT8_SUFFIX})")
    args = parser.parse_args()
    for path in export_onnx(args.model_dir, args.out, args.int8):
        print(f"wrote {path} ({os.path.getsize(path) / 1e6:.1f} MB)")


if __name__ == "__main__":
    run_main(main)

"""Model folders: the one module that reads and writes them (a stage's output, a published model).

Every model folder is written by `model_folder`: whole or not at all, with the tokenizer's files copied
in, and what its writer adds (the weights by `write_model`, an objective's extras, a task model's head
and classifier.json, the model card) written into it before it replaces the old one.

A folder holds `config.json` and `model.safetensors`. A model that a transformers architecture computes
exactly is written in that architecture's layout (lib/models/hf.py), with our own config kept under
EXPORT_KEY, so the folder loads in transformers too; any other model in this module's own layout (the
dataclass fields of TransformerConfig). A published model (a config.json with a `model_type`) is
imported through lib/models/hf.py.
"""
from __future__ import annotations

import dataclasses
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
import torch.nn as nn

from lib.config.errors import UserError
from lib.core.errors import one_line
from lib.core.io import atomic_dir, read_safetensors, write_safetensors
from lib.data.tokenizer import copy_tokenizer
from lib.models import hf
from lib.models.architectures import Seq2SeqConfig, Transformer, build_model
from lib.models.config import TransformerConfig
from lib.models.hf import CONFIG_FILE, EXPORT_KEY, export_family, export_layout
from lib.models.hf import SAFETENSORS_FILE as MODEL_FILE


@contextmanager
def model_folder(out_dir: Path, tokenizer_dir: Path | None = None) -> Iterator[Path]:
    """Yield the folder that becomes `out_dir` once the block ends without an error (lib.core.io.atomic_dir),
    the tokenizer's files of `tokenizer_dir` already in it."""
    with atomic_dir(out_dir) as folder:
        if tokenizer_dir is not None:
            copy_tokenizer(tokenizer_dir, folder)
        yield folder


def save_model(model: Transformer, out_dir: Path, special_ids: dict[str, int] | None = None) -> None:
    """A model folder of the weights and config alone (write_model), written whole or not at all."""
    with model_folder(out_dir) as folder:
        write_model(model, folder, special_ids)


def write_model(model: Transformer, folder: Path, special_ids: dict[str, int] | None = None,
                task_head: tuple[dict[str, torch.Tensor], dict] | None = None, language: int | None = None) -> None:
    """folder/model.safetensors + folder/config.json (`folder`: a model_folder being written): in the layout of
    the transformers architecture that computes exactly what this model does, where there is one
    (lib.models.hf, which needs the tokenizer's `special_ids` for pad/bos/eos), else in this module's
    own layout. `task_head`: (tensors, config.json keys) a task model adds to that transformers layout,
    so the file is written once (lib.tasks.model). `language`: the row of the language embeddings
    that the transformers model reads when given no language ids (a task model's language), else the first."""
    model = getattr(model, "_orig_mod", model)  # a torch.compile'd model saves its plain parameter names
    family, _ = export_family(model.cfg)
    if task_head is not None and family is None:
        raise ValueError("a task head's tensors go into a transformers layout; this model has none")
    if family is None:
        write_safetensors(folder / MODEL_FILE, model.state_dict())
        config = dataclasses.asdict(model.cfg)
    else:
        config, tensors = export_layout(model, family, special_ids or {}, language)
        head_tensors, head_config = task_head or ({}, {})
        config.update(head_config)
        write_safetensors(folder / MODEL_FILE, {**tensors, **head_tensors}, metadata={"format": "pt"})
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def load_model(model_dir: Path, device: str | torch.device = "cpu") -> Transformer:
    """Rebuild the model from config.json and load its weights strictly; returned in eval mode
    (call .train() to train it). Also a published Hugging Face model (BERT, RoBERTa, DistilBERT,
    ELECTRA, GPT-2, RoBERTa-PreLayerNorm, ESM, T5, BART), through lib.models.hf, with transformers' hidden states."""
    model_dir = Path(model_dir)
    config = read_config_json(model_dir)
    if EXPORT_KEY in config:
        return hf.load_exported(model_dir, read_config(model_dir)).to(device).eval()
    if "model_type" in config:
        return hf.import_model(model_dir).model.to(device)
    model = build_model(read_config(model_dir))
    load_weights(model, model_dir / MODEL_FILE, model_dir / CONFIG_FILE)
    return model.to(device).eval()


def read_config(model_dir: Path) -> TransformerConfig:
    """The config of a model folder save_model wrote (or of a published model)."""
    config = read_config_json(model_dir)
    if "model_type" in config and EXPORT_KEY not in config:
        return load_model(model_dir).cfg  # a published model: its weights tell whether it has a pooler
    fields = config.get(EXPORT_KEY, config)
    try:
        return (Seq2SeqConfig if "architecture" in fields else TransformerConfig)(**fields)
    except (ValueError, TypeError) as err:  # unknown/invalid fields
        raise UserError(f"{Path(model_dir) / CONFIG_FILE}: cannot build the model config ({one_line(err)}); "
                        "point at a folder written by save_model") from None


def read_config_json(model_dir: Path) -> dict:
    path = Path(model_dir) / CONFIG_FILE
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # missing, not JSON
        raise UserError(f"{path}: cannot read the model config ({one_line(err)}); "
                        "point at a model folder the pipeline wrote, or a Hugging Face model") from None
    if not isinstance(config, dict):
        raise UserError(f"{path}: not a model config (a JSON object)")
    return config


def load_weights(module: nn.Module, weights_path: Path, config_path: Path) -> None:
    """Load the safetensors file `weights_path` into `module` (built from `config_path`) strictly; a
    missing, truncated or corrupt file, or tensors that do not fit the module, end in one line."""
    tensors = read_safetensors(weights_path)
    try:
        module.load_state_dict(tensors)
    except RuntimeError as err:  # missing, unexpected or mis-sized tensors
        raise UserError(f"{weights_path}: does not match {config_path.name} ({one_line(err)})") from None

"""Pretraining objectives, plugged into the trainer by name.

An objective owns its model(s), says which batches it reads and how they are built from the packed
token files, and turns one into a loss; the trainer knows nothing else about it. The contract:

    objective = build_objective(name, params, vocab_size, special_ids[, arch])
    batches = objective.batches(plan)  # BatchPlan -> Batches: .train.batch(step, micro), .valid, .splits
    loss, metrics = objective(batch)   # a batch of its type objective.reads (named fields)
    model = objective.backbone()       # the model later stages start from (an encoder-decoder: its encoder is finetuned)

A batch is a dataclass of named tensors (lib/data/windows.py): Windows (tokens and word_starts,
(B, T+1) windows of packed documents), TaggedWindows (their language_ids too), tlm's WindowsAndPairs.
`metrics` holds detached scalar tensors, always with "loss". All randomness (masks, samples) comes
from torch's global RNG, which the trainer checkpoints and, for validation, seeds.

A new objective is a module in this package with a subclass of `Objective` (lib/objectives/base.py)
decorated with `@register`; every module here is imported below, so nothing else changes
(`check_objective` validates params.yaml's `objective` against the registry).
"""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from pathlib import Path

import torch
from torch import Tensor

from lib.config.errors import UserError
from lib.config.params import Params, ParamsError, check_choice
from lib.core.io import read_safetensors, write_safetensors
from lib.models.config import TransformerConfig
from lib.models.folder import load_model, write_model
from lib.objectives.base import (  # noqa: F401 (the interface)
    OBJECTIVES, BatchPlan, Objective, fitting_objective, register)


def reading(field: str) -> list[str]:
    """The objectives whose batches carry `field`."""
    return [name for name, cls in OBJECTIVES.items() if field in {f.name for f in dataclasses.fields(cls.reads)}]


def check_objective(params: Params) -> None:
    """`objective` against the registry, and the sections that depend on it (a check of
    lib.config.params.load_params, for the stages that pretrain)."""
    check_choice(params.objective, OBJECTIVES, "objective")
    objective = OBJECTIVES[params.objective]
    if params.mlm.sentence != "none" and (not objective.sentence_task or params.model.segment_vocab < 2):
        able = ", ".join(name for name, cls in OBJECTIVES.items() if cls.sentence_task)
        raise ParamsError(f"mlm.sentence: {params.mlm.sentence} needs objective: {able} and model.segment_vocab >= 2 "
                          f"(they are {params.objective} and {params.model.segment_vocab}); set mlm.sentence: none")
    # an encoder-decoder has no language embeddings: it reads each side as text of its own (mBART's way)
    if params.corpora.parallel and params.objective not in reading("language_ids") and not objective.encoder_decoder:
        able = ", ".join([*reading("language_ids"), *(n for n, cls in OBJECTIVES.items() if cls.encoder_decoder)])
        raise ParamsError(f"corpora.parallel: its text of several languages trains with objective: {able} (which "
                          f"read each token's language, or each side as text), not {params.objective}; change the "
                          "objective or set corpora.parallel: {}")
    if params.corpora.parallel and params.mlm.sentence != "none":
        raise ParamsError(f"mlm.sentence: {params.mlm.sentence} with corpora.parallel (XLM) is not supported; "
                          "set mlm.sentence: none")
    if params.objective in reading("pairs") and not params.corpora.parallel:
        raise ParamsError(f"objective: {params.objective} trains on translation pairs: set corpora.parallel (e.g. "
                          "multi30k_en_de, params.yaml) and list its languages in model.languages")
    if params.finetune.aux_lm_weight > 0 and not objective.causal:
        able = ", ".join(name for name, cls in OBJECTIVES.items() if cls.causal)
        raise ParamsError(f"finetune.aux_lm_weight: the auxiliary LM loss needs a causal model "
                          f"(objective: {able}), not {params.objective}; set it to 0")


def build_objective(name: str, params: Params, vocab_size: int, special_ids: dict[str, int],
                    arch: TransformerConfig | None = None) -> Objective:
    if name not in OBJECTIVES:
        raise UserError(f"objective: '{name}' is not one of {', '.join(sorted(OBJECTIVES))}")
    return OBJECTIVES[name](params, vocab_size, special_ids, arch)


for _module in pkgutil.iter_modules(__path__):  # each objective module registers itself on import
    importlib.import_module(f"{__name__}.{_module.name}")


EXTRAS_FILE = "objective.safetensors"


def objective_extras(objective: Objective) -> dict[str, Tensor]:
    """The objective's tensors outside its backbone (ELECTRA's generator and detection head): what a
    later stage needs, beside the backbone, to continue the same objective. Empty for clm and mlm."""
    backbone = {id(p) for p in objective.backbone().parameters()}
    return {name: p.detach() for name, p in objective.named_parameters() if id(p) not in backbone}


def save_objective(objective: Objective, folder: Path) -> None:
    """The backbone (lib.models.folder.write_model) and objective.safetensors if any extras, into `folder`: a
    model folder being written (lib.models.folder.model_folder)."""
    write_model(objective.backbone(), folder, objective.special_ids)
    extras = objective_extras(objective)
    if extras:
        write_safetensors(folder / EXTRAS_FILE, extras)


def load_objective(objective: Objective, model_dir: Path) -> bool:
    """Load a folder written by save_objective into `objective` (built with the same params). The
    backbone must match exactly; the extras load when the folder has them. Returns whether it had them."""
    backbone = objective.backbone()
    saved = load_model(model_dir)
    if saved.cfg != backbone.cfg:
        raise UserError(f"{model_dir}: its model config differs from params.yaml's model section "
                        "(rerun the stage that wrote it)")
    backbone.load_state_dict(saved.state_dict())
    path = Path(model_dir) / EXTRAS_FILE
    expected = objective_extras(objective)
    if not expected or not path.is_file():
        return False
    tensors = read_safetensors(path)
    if set(tensors) != set(expected) or any(tensors[k].shape != expected[k].shape for k in tensors):
        raise UserError(f"{path}: does not match objective '{objective.name}' with these params; "
                        "rerun the stage that wrote it")
    with torch.no_grad():
        for name, tensor in tensors.items():
            expected[name].copy_(tensor)
    return True

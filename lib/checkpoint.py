"""Training checkpoints: written atomically, resumed only by a run of the same configuration.

A checkpoint folder holds the module's weights (safetensors), the optimizer, scheduler and RNG
states (torch), and the trainer's state (JSON) with a fingerprint of everything that determines the
run. A run whose fingerprint differs (other params, other data) starts fresh and says so.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model

from lib.config import flatten
from lib.errors import describe
from lib.io import atomic_dir, write_json

WEIGHTS, TRAIN_STATE, STATE = "module.safetensors", "train_state.pt", "state.json"


def fingerprint(stage_params: dict[str, Any], **facts: Any) -> str:
    """What determines a run: its params (but how it is compiled) and `facts` (data sizes, hashes of
    inputs). Saved work is reused only by a run with the same fingerprint."""
    described = {"params": {k: str(v) for k, v in flatten(stage_params).items() if not k.startswith("impl.compile")},
                 **facts}
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]


def save_checkpoint(path: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any, state: dict[str, Any]) -> None:
    with atomic_dir(path) as tmp:
        save_model(module, str(tmp / WEIGHTS))
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng},
                   tmp / TRAIN_STATE)
        write_json(tmp / STATE, state)


def load_checkpoint(path: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                    fingerprint: str, device: torch.device) -> dict[str, Any] | None:
    """Restore everything saved by save_checkpoint and return the trainer state; None (start fresh)
    when there is no checkpoint, or it belongs to another configuration, or cannot be read."""
    if not (path / STATE).exists():
        return None
    try:
        state = json.loads((path / STATE).read_text())
        if state.get("fingerprint") != fingerprint:
            print(f"checkpoint {path} is from another configuration: starting fresh", file=sys.stderr)
            return None
        load_model(module, str(path / WEIGHTS), device=str(device))
        saved = torch.load(path / TRAIN_STATE, map_location=device, weights_only=True)
    except Exception as err:  # a torn or foreign file: the run can still start over
        print(f"checkpoint {path} cannot be read ({describe(err)}): starting fresh", file=sys.stderr)
        return None
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    torch.set_rng_state(saved["rng"]["torch"].cpu())
    if "cuda" in saved["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in saved["rng"]["cuda"]])
    return state

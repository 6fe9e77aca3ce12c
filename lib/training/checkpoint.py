"""Training checkpoints: written atomically, checksummed, resumed only by a run of the same configuration.

A run's checkpoint directory holds its last KEEP checkpoints, `ckpt-000001`, `ckpt-000002`, ...; each
is a folder with the module's whole weights (safetensors; a sharded FSDP run gathers them, so they
are the same file as a single process's), the optimizer, scheduler and every rank's RNG states
(torch), the trainer's state (JSON) with a fingerprint of everything that determines the run, and a
manifest of the files' SHA-256 sums, which is written last. Loading takes the newest checkpoint
whose files match their sums; a truncated or corrupted one is reported in one line and the one before
it is used. A run whose fingerprint differs (other params, other data) starts fresh and says so.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from lib.config.params import flatten
from lib.core.distributed import Context, full_state, gather, load_full_state
from lib.core.errors import describe
from lib.core.io import atomic_dir, file_sha256, read_safetensors, write_json, write_safetensors

WEIGHTS, TRAIN_STATE, STATE, MANIFEST = "module.safetensors", "train_state.pt", "state.json", "manifest.json"
PREFIX, KEEP = "ckpt-", 2


def fingerprint(stage_params: dict[str, Any], **facts: Any) -> str:
    """What determines a run: its params (but how it is compiled) and `facts` (data sizes, hashes of
    inputs). Saved work is reused only by a run with the same fingerprint."""
    described = {"params": {k: str(v) for k, v in flatten(stage_params).items() if not k.startswith("impl.compile")},
                 **facts}
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]


def rng_state() -> dict[str, Any]:
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def checkpoints(directory: Path) -> list[Path]:
    """The checkpoint folders in `directory`, oldest first."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def save_checkpoint(directory: Path, weights: dict[str, torch.Tensor], optimizer_state: dict[str, Any],
                    scheduler: Any, state: dict[str, Any], rng: list[dict[str, Any]] | None = None) -> Path:
    """A new checkpoint in `directory` (all of it or nothing), then all but the newest KEEP removed.
    `weights` and `optimizer_state` as lib.core.distributed.full_state returns them; `rng`: every rank's
    RNG states (rank order), None = this process's."""
    existing = checkpoints(directory)
    number = int(existing[-1].name[len(PREFIX):]) + 1 if existing else 1
    path = directory / f"{PREFIX}{number:06d}"
    with atomic_dir(path) as tmp:
        write_safetensors(tmp / WEIGHTS, weights)
        torch.save({"optimizer": optimizer_state, "scheduler": scheduler.state_dict(),
                    "rng": rng if rng is not None else [rng_state()]}, tmp / TRAIN_STATE)
        write_json(tmp / STATE, state)
        write_json(tmp / MANIFEST, {name: file_sha256(tmp / name) for name in (WEIGHTS, TRAIN_STATE, STATE)})
    for old in checkpoints(directory)[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return path


def save_run(directory: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
             state: dict[str, Any], context: Context) -> None:
    """A training loop's checkpoint (save_checkpoint), called by every rank: each gives its RNG state,
    a sharded module and optimizer are gathered whole, and rank 0 writes."""
    rng = gather(context, rng_state())  # every rank's, for an exact resume
    weights, optimizer_state = full_state(module, optimizer, context)
    if context.main:
        save_checkpoint(directory, weights, optimizer_state, scheduler, state, rng)


def verify(path: Path) -> str | None:
    """None when every file of the checkpoint matches its manifest, else what is wrong, in a few words."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as err:
        return f"no readable manifest ({describe(err)})"
    for name, expected in manifest.items():
        try:
            if file_sha256(path / name) != expected:
                return f"{name} does not match its checksum"
        except OSError as err:
            return f"{name}: {describe(err)}"
    return None


def load_checkpoint(directory: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                    fingerprint: str, rank: int = 0) -> dict[str, Any] | None:
    """Restore the newest good checkpoint of `directory` and return the trainer state it saved; None
    (start fresh) when there is none, or it belongs to another configuration. A corrupted checkpoint
    is reported and skipped for the one before it."""
    for path in reversed(checkpoints(directory)):
        problem = verify(path)
        if problem is not None:
            print(f"checkpoint {path} is corrupted ({problem}): trying the one before it", file=sys.stderr)
            continue
        try:
            state = json.loads((path / STATE).read_text())
            if state.get("fingerprint") != fingerprint:
                print(f"checkpoint {path} is from another configuration: starting fresh", file=sys.stderr)
                return None
            saved = torch.load(path / TRAIN_STATE, map_location="cpu", weights_only=True)
            rng = saved["rng"][rank]
            load_full_state(module, optimizer, read_safetensors(path / WEIGHTS), saved["optimizer"])
        except Exception as err:  # a foreign file with a valid manifest: the run can still start over
            print(f"checkpoint {path} cannot be read ({describe(err)}): starting fresh", file=sys.stderr)
            return None
        scheduler.load_state_dict(saved["scheduler"])
        torch.set_rng_state(rng["torch"].cpu())
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([s.cpu() for s in rng["cuda"]])
        return state
    return None

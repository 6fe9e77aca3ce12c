"""Data-parallel training on PyTorch's own engine: torchrun launches the processes, DDP syncs them.

A stage runs under torchrun when `impl.nproc` > 1: `relaunch` starts `python -m torch.distributed.run
--standalone --nproc_per_node N -m stages.<stage> <same args>` and waits for it, so `dvc.yaml` stays
the same. Started by torchrun yourself (multi-node rendezvous, say), a stage sees torchrun's
environment and runs as one rank of it.

The global batch is what params say: `batch_size` x `grad_accum` sequences per optimizer step, the
same for any number of processes; each rank reads its own contiguous share of every batch
(`batch_size / world` rows), so together they read exactly the batch one process would. DDP averages
the gradients, the logged metrics are averaged over ranks, and only rank 0 writes checkpoints,
outputs and MLflow runs.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist

from lib.errors import UserError

TORCHRUN_ENV = "LOCAL_RANK"  # set by torchrun in every process it starts


@dataclass(frozen=True)
class Context:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def share(self, n: int, key: str) -> slice:
        """This rank's contiguous part of n rows; n must split evenly, else `key` is named."""
        if n % self.world:
            raise UserError(f"{key}: {n} does not split evenly over {self.world} processes (impl.nproc); "
                            f"use a multiple of {self.world}")
        per = n // self.world
        return slice(self.rank * per, (self.rank + 1) * per)


    def part(self, group: list[int]) -> tuple[list[int], int]:
        """This rank's contiguous part of a batch's example indices and the factor that turns its
        share-weighted loss into the whole batch's under DDP's mean: (part, world). A batch smaller
        than the world is computed whole by every rank: (group, 1)."""
        n = len(group)
        if n < self.world:
            return group, 1
        return group[self.rank * n // self.world:(self.rank + 1) * n // self.world], self.world


def relaunch(nproc: int, module: str) -> bool:
    """Run `module` (this stage) again under torchrun with nproc processes, unless nproc is 1 or this
    process is already one of torchrun's. True when it ran (the caller has nothing left to do)."""
    if nproc <= 1 or TORCHRUN_ENV in os.environ:
        return False
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", module, *sys.argv[1:]]
    print(f"impl.nproc = {nproc}: running under torchrun", flush=True)
    code = subprocess.call(command)
    if code:
        sys.exit(code)
    return True


def setup(device_type: str) -> Context:
    """This process's rank and world from torchrun's environment, with the process group initialised
    (NCCL on GPUs, gloo on CPU); rank 0 of 1 without torchrun. On CUDA each rank takes the GPU of its
    local rank."""
    if TORCHRUN_ENV not in os.environ:
        return Context()
    context = Context(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"]))
    if device_type == "cuda":
        torch.cuda.set_device(context.local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    return context


def wrap(module: torch.nn.Module, context: Context, device: torch.device) -> torch.nn.Module:
    """`module` under DDP when there are several ranks, else itself. find_unused_parameters: a step may
    leave parameters out of its graph (segment embeddings without pairs, an LM head a classifier does
    not use, layer groups still frozen)."""
    if not context.active:
        return module
    return torch.nn.parallel.DistributedDataParallel(
        module, device_ids=[device.index] if device.type == "cuda" else None, find_unused_parameters=True)


def device_for(context: Context, device: torch.device) -> torch.device:
    return torch.device("cuda", context.local_rank) if device.type == "cuda" and context.active else device


def mean(context: Context, values: dict[str, float], device: torch.device) -> dict[str, float]:
    """Each value averaged over the ranks (identity with one process)."""
    if not context.active or not values:
        return values
    keys = sorted(values)
    tensor = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return dict(zip(keys, (tensor / context.world).tolist()))


def total(context: Context, value: float, device: torch.device) -> float:
    if not context.active:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return float(tensor.item())


def agree(context: Context, flag: bool, device: torch.device) -> bool:
    """True on every rank if `flag` is true on rank 0: one decision (stop now?) for all."""
    if not context.active:
        return flag
    tensor = torch.tensor([int(flag)], device=device)
    dist.broadcast(tensor, src=0)
    return bool(tensor.item())


def gather(context: Context, obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank."""
    if not context.active:
        return [obj]
    objects: list[Any] = [None] * context.world
    dist.all_gather_object(objects, obj)
    return objects


def say(context: Context, line: str) -> None:
    """Print `line` on rank 0 alone (the console is shared)."""
    if context.main:
        print(line, flush=True)


def barrier(context: Context) -> None:
    if context.active:
        dist.barrier()


@contextlib.contextmanager
def no_sync(module: torch.nn.Module, skip: bool) -> Iterator[None]:
    """DDP's no_sync (no gradient all-reduce) around a micro-batch that is not the step's last."""
    if skip and hasattr(module, "no_sync"):
        with module.no_sync():
            yield
    else:
        yield

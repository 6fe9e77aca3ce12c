"""Data-parallel training on PyTorch's own engine: torchrun launches the processes, DDP (or FSDP2) syncs them.

A stage runs under torchrun when `impl.nproc` > 1: `relaunch` starts `python -m torch.distributed.run
--standalone --nproc_per_node N -m stages.<stage> <same args>` and waits for it, so `dvc.yaml` stays
the same. Started by torchrun yourself (multi-node rendezvous, say), a stage sees torchrun's
environment and runs as one rank of it.

The global batch is what params say: `batch_size` x `grad_accum` sequences per optimizer step, the
same for any number of processes; each rank reads its own contiguous share of every batch
(`batch_size / world` rows), so together they read exactly the batch one process would. DDP averages
the gradients, the logged metrics are averaged over ranks, and only rank 0 writes checkpoints,
outputs and MLflow runs.

`impl.strategy: fsdp` shards the parameters, gradients and optimizer state over the ranks with FSDP2
(`fully_shard` on every transformer block, then on the whole model) instead of replicating them, for
models that do not fit one GPU. Checkpoints and outputs are then gathered whole on rank 0, in CPU
memory, so they are the same files as DDP's and load anywhere. Every training stage shards: finetune
its classifiers (the frozen probe's backbone), distill its student and its teacher. A sharded forward
is a collective, so whatever runs one (validation, prediction, the teacher's outputs) runs the same
number of them on every rank (`spread`).
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from lib.config.errors import UserError
from lib.config.params import ImplConfig

T, R = TypeVar("T"), TypeVar("R")
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
        check_split(n, self.world, key)
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


def part_weight(local: float, whole: float, scale: int) -> float:
    """The weight of a loss term this rank computed over `local` of a batch's `whole` units (examples,
    labeled examples, tokens), `scale` as Context.part gives it: DDP's mean of the weighted terms over
    the ranks is then the term over the whole batch."""
    return local / whole * scale if whole else 0.0


def check_split(n: int, world: int, key: str) -> None:
    """n rows must split evenly over `world` processes, else a UserError names `key`."""
    if n % world:
        raise UserError(f"{key}: {n} does not split evenly over {world} processes (impl.nproc); "
                        f"use a multiple of {world}")


def relaunch(impl: ImplConfig, module: str, split: dict[str, int]) -> bool:
    """Run `module` (this stage) again under torchrun with impl.nproc processes, unless that is 1 or
    this process is already one of torchrun's. True when it ran (the caller has nothing left to do).
    `split` (key: rows) holds what each rank takes an even share of: checked here, before torchrun
    starts, so that one that does not split ends in one line, not once per rank under torchrun's report."""
    nproc = impl.nproc
    if nproc <= 1 or TORCHRUN_ENV in os.environ:
        return False
    for key, rows in split.items():
        check_split(rows, nproc, key)
    print(f"impl.nproc = {nproc}: running under torchrun with {impl.strategy}", flush=True)
    # torchrun's per-rank error files, which it would otherwise leave in the temp folder as torchelastic_*
    with tempfile.TemporaryDirectory(prefix="torchrun-", ignore_cleanup_errors=True) as logs:
        code = subprocess.call([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                f"--nproc_per_node={nproc}", f"--log_dir={logs}", "-m", module, *sys.argv[1:]])
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


def wrap(module: nn.Module, context: Context, device: torch.device, strategy: str = "ddp",
         parts: Sequence[nn.Module] = ()) -> nn.Module:
    """`module` synced over the ranks, or itself with one process. "ddp": a DDP wrapper;
    find_unused_parameters because a step may leave parameters out of its graph (segment embeddings
    without pairs, an LM head a classifier does not use, layer groups still frozen). "fsdp": `module`
    itself, sharded in place (see shard). Its parameters are new objects then, so build optimizers
    after wrapping."""
    if not context.active:
        return module
    if strategy == "fsdp":
        return shard(module, context, parts)
    return nn.parallel.DistributedDataParallel(
        module, device_ids=[device.index] if device.type == "cuda" else None, find_unused_parameters=True)


def shard(module: nn.Module, context: Context, parts: Sequence[nn.Module] = ()) -> nn.Module:
    """`module` sharded in place with FSDP2; itself, unchanged, with one process. Units, each gathered
    for its forward (and backward) only: every member with parameters of a ModuleList (the transformer
    blocks), then each of `parts` (submodules whose forward is also called on its own, such as a
    student scored outside its distiller), then the rest (embeddings, heads) as the root. A unit's
    parameters are gathered by its `forward`: call parts' other methods inside a forward only. Also
    for a model that only runs forwards (a teacher's backbone): each rank holds 1/world of it."""
    if not context.active:
        return module
    from torch.distributed.fsdp import fully_shard  # imported on use: see sharded()

    for blocks in [m for m in module.modules() if isinstance(m, nn.ModuleList)]:
        for block in blocks:
            if next(block.parameters(), None) is not None:
                fully_shard(block)
    for part in parts:
        fully_shard(part)
    fully_shard(module)
    return module


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


def spread(context: Context, items: list[T], compute: Callable[[T], R]) -> list[R]:
    """[compute(item) for item in items] on every rank, each rank computing every world-th item. Every
    rank calls compute equally often (one short of items repeats items[0] and drops the result), so
    compute may run collectives, such as a sharded model's forward."""
    mine = items[context.rank::context.world]
    results = [compute(item) for item in mine]
    for _ in range(-(-len(items) // context.world) - len(mine)):
        compute(items[0])
    parts = gather(context, results)
    return [parts[i % context.world][i // context.world] for i in range(len(items))]


def say(context: Context, line: str) -> None:
    """Print `line` on rank 0 alone (the console is shared)."""
    if context.main:
        print(line, flush=True)


def barrier(context: Context) -> None:
    if context.active:
        dist.barrier()


@contextlib.contextmanager
def no_sync(module: nn.Module, skip: bool) -> Iterator[None]:
    """No gradient all-reduce (DDP) or reduce-scatter (FSDP) around a micro-batch that is not the
    step's last."""
    if skip and sharded(module):
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)
    elif skip and hasattr(module, "no_sync"):
        with module.no_sync():
            yield
    else:
        yield


def sharded(module: nn.Module) -> bool:
    """Whether `module` or a part of it is sharded. FSDP and its state-dict helpers are imported only
    when a model is sharded: imported at start-up in every process, they made about a third of our
    2-process DDP test runs on gloo hang at exit (cause not found); imported on use, none did in 6 tries."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and any(isinstance(m, fsdp.FSDPModule) for m in module.modules())


def _state_dict_api() -> Any:
    from torch.distributed.checkpoint import state_dict

    return state_dict


def _full_on_cpu() -> Any:
    return _state_dict_api().StateDictOptions(full_state_dict=True, cpu_offload=True)


def aliases(module: nn.Module) -> set[str]:
    """Names of parameters that are another name's parameter too (tied embeddings, ELECTRA's shared
    embeddings): a state dict without them holds every tensor once."""
    seen: set[int] = set()
    names = set()
    for name, param in module.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            names.add(name)
        seen.add(id(param))
    return names


def full_state(module: nn.Module, optimizer: torch.optim.Optimizer | None,
               context: Context = Context()) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The whole model's tensors (no aliases), in CPU memory, and the optimizer's state ({} without
    one), on rank 0; the other ranks get empty dicts. A sharded `module`'s are gathered, so every rank
    must call it; its optimizer state is keyed by parameter name."""
    skip = aliases(module)
    if not sharded(module):
        if not context.main:
            return {}, {}
        weights = {k: v.detach().cpu() for k, v in module.state_dict().items() if k not in skip}
        return weights, optimizer.state_dict() if optimizer else {}
    api = _state_dict_api()
    weights = api.get_model_state_dict(module, options=_full_on_cpu())
    return ({k: v for k, v in weights.items() if k not in skip},
            api.get_optimizer_state_dict(module, optimizer, options=_full_on_cpu()) if optimizer else {})


def load_full_state(module: nn.Module, optimizer: torch.optim.Optimizer | None, weights: dict[str, torch.Tensor],
                    optimizer_state: dict[str, Any] | None = None) -> None:
    """Put what full_state returned (read by every rank) into `module` and `optimizer` (if any). Raises
    ValueError, having changed nothing, when the names or shapes are not the model's."""
    skip = aliases(module)
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items() if k not in skip}  # global shapes
    found = {k: tuple(v.shape) for k, v in weights.items()}
    if found != expected:
        wrong = sorted(k for k in expected.keys() | found.keys() if expected.get(k) != found.get(k))
        raise ValueError(f"weights do not fit this model ({', '.join(wrong[:3])} ...)")
    if not sharded(module):
        module.load_state_dict(weights, strict=False)  # the aliases are left out on purpose
        if optimizer:
            optimizer.load_state_dict(optimizer_state)
        return
    api = _state_dict_api()
    options = api.StateDictOptions(full_state_dict=True, strict=False)
    api.set_model_state_dict(module, dict(weights), options=options)  # it replaces the dict's values: give a copy
    if optimizer:
        api.set_optimizer_state_dict(module, optimizer, optimizer_state, options=options)


def to_cpu(module: nn.Module, context: Context) -> nn.Module:
    """`module` whole in CPU memory, to be saved: moved there, or if sharded gathered there on rank 0
    (unshard: FSDP's own `to` would reshard it; the other ranks' copies are no longer usable)."""
    if not sharded(module):
        return module.to("cpu")
    unshard(module, context)
    return module


def unshard(module: nn.Module, context: Context) -> None:
    """Make a sharded `module` whole again on rank 0 (plain parameters holding the full tensors, ties
    kept), so that it can be saved like any module; nothing when it is not sharded. Every rank must
    call it; only rank 0's module is usable afterwards, and for saving only."""
    if not sharded(module):
        return
    weights = _state_dict_api().get_model_state_dict(module, options=_full_on_cpu())
    if not context.main:
        return
    whole: dict[int, nn.Parameter] = {}
    for name, param in list(module.named_parameters(remove_duplicate=False)):
        owner, _, leaf = name.rpartition(".")
        plain = whole.setdefault(id(param), nn.Parameter(weights[name], requires_grad=param.requires_grad))
        module.get_submodule(owner)._parameters[leaf] = plain

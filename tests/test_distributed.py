"""Data parallel training with torchrun's environment on CPU (gloo, 2 processes), replicated (DDP) and
sharded (FSDP2): the same curve as one process with the same global batch, and an exact resume after
both ranks are killed."""
import dataclasses
import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from lib import distributed
from lib.config import ModelConfig
from lib.data import WindowBatches, fixed_windows
from lib.errors import UserError
from lib.distill import distill_task
from lib.finetune import run_variant
from lib.objectives import build_objective, save_objective
from lib.tasks import UNLABELED, Example
from lib.packed import PackedTokens
from lib.trainer import Trainer
from tests import test_distill, test_finetune
from tests.test_objectives import SPECIAL, tiny_params
from tests.test_trainer import CFG, FP32, VOCAB, KillAt, NextToken, curve, packed  # noqa: F401 (packed: a fixture)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join(rank: int, world: int, port: int) -> distributed.Context:
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                          LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    return distributed.setup("cpu")


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(key, None)


def train(rank: int, world: int, port: int, data: str, checkpoints: str, out: str, dropout: float,
          kill_at: int | None, strategy: str, model: str) -> None:
    """One rank of a run (or the whole run when world is 1) of the stand-in module (model "next") or a
    tiny causal transformer with discriminative LRs ("clm"); rank 0 writes the curve to `out`, and
    the transformer's model folder beside it."""
    context = join(rank, world, port)
    torch.manual_seed(0)
    layer_groups, cfg = None, CFG
    if model == "clm":
        shape = ModelConfig(d_model=16, n_layers=2, n_heads=2, d_ff=32, dropout=dropout, max_positions=32)
        module = build_objective("clm", tiny_params(model=shape), VOCAB, SPECIAL)
        layer_groups, cfg = module.backbone().layer_groups(), dataclasses.replace(CFG, lr_decay=2.6)
    else:
        module = NextToken()
        module.drop.p = dropout
    batches = WindowBatches(PackedTokens(f"{data}/train"), cfg.seq_len + 1, cfg.batch_size, seed=1,
                            rows=context.share(cfg.batch_size, "pretrain.batch_size"))
    valid = fixed_windows(PackedTokens(f"{data}/valid"), cfg.seq_len + 1, cfg.batch_size, cfg.eval_batches)
    trainer = Trainer(module, cfg, dataclasses.replace(FP32, strategy=strategy), torch.device("cpu"), batches, valid,
                      Path(checkpoints), "a", seed=1, callbacks=(KillAt(kill_at),) if kill_at else (),
                      layer_groups=layer_groups, context=context)
    try:
        state = trainer.fit()
        distributed.unshard(module, context)
        if context.main:
            with open(out, "w") as f:
                json.dump(curve(state), f)
            if model == "clm":
                save_objective(module, Path(out).with_suffix(""))
    except KeyboardInterrupt:
        pass
    finally:
        leave()


def finetune(rank: int, world: int, port: int, variant: str, strategy: str, aux: bool, out: str) -> None:
    """One rank of a finetune run of `variant` on the toy task (aux: a causal model with GPT-1's
    auxiliary LM loss); rank 0 writes what it reports and the classifier it returns."""
    context = join(rank, world, port)
    cfg = dataclasses.replace(test_finetune.CFG, aux_lm_weight=0.5 if aux else 0.0)
    try:
        result, model = run_variant(variant, test_finetune.toy_task(), ["accuracy"], test_finetune.backbone(causal=aux),
                                    cfg, dataclasses.replace(test_finetune.IMPL, strategy=strategy),
                                    torch.device("cpu"), seed=1, pad_id=test_finetune.PAD, context=context)
        if context.main:
            with open(out, "w") as f:
                json.dump({"history": result.history, "eval": result.eval, "steps": result.steps}, f)
            save_file(distributed.full_state(model, None)[0], str(Path(out).with_suffix(".safetensors")))
    finally:
        leave()


def same_weights(one: Path, two: Path) -> None:
    a, b = load_file(str(one)), load_file(str(two))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def run(world: int, data, tmp_path, name: str, dropout: float = 0.0, kill_at: int | None = None,
        strategy: str = "ddp", model: str = "next") -> list | None:
    out = tmp_path / f"{name}.json"
    args = (world, free_port(), str(data), str(tmp_path / name), str(out), dropout, kill_at, strategy, model)
    if world == 1:
        train(0, *args)
    else:
        mp.spawn(train, args=args, nprocs=world, join=True)
    return json.loads(out.read_text()) if out.exists() else None


@pytest.fixture
def data(packed):  # noqa: F811
    return packed[0].prefix.parent


def same_curve(one: list, two: list) -> None:
    assert [step for step, _ in two] == [step for step, _ in one]
    for (step, a), (_, b) in zip(one, two):
        assert b == pytest.approx(a, rel=1e-4, abs=1e-5), step


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_follow_the_one_process_curve(data, tmp_path, strategy):
    """Each rank reads half of every batch and DDP averages the gradients (FSDP reduce-scatters them to
    each rank's shard): with the same global batch the loss curve is the single process's, up to float
    summation order."""
    one = run(1, data, tmp_path, "one")
    same_curve(one, run(2, data, tmp_path, "two", strategy=strategy))
    assert one[-1][1] < one[0][1] * 0.8  # it learned something


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_killed_under_torchrun_resumes_exactly(data, tmp_path, strategy):
    """Both ranks stopped after step 13 (checkpoint at step 10), started again: every rank restores its
    own RNG state (dropout differs per rank), so the curve equals an uninterrupted 2-process run."""
    whole = run(2, data, tmp_path, "whole", dropout=0.2, strategy=strategy)
    assert run(2, data, tmp_path, "killed", dropout=0.2, kill_at=13, strategy=strategy) is None
    resumed = run(2, data, tmp_path, "killed", dropout=0.2, strategy=strategy)
    assert resumed == whole


def test_a_sharded_transformer_trains_and_saves_as_one_process_does(data, tmp_path):
    """FSDP shards each transformer block and the root (tied embeddings, discriminative LRs per layer
    group): the curve and the saved model folder equal a single process's; a checkpoint it wrote
    resumes exactly."""
    one = run(1, data, tmp_path, "one", model="clm")
    two = run(2, data, tmp_path, "two", model="clm", strategy="fsdp")
    same_curve(one, two)
    same_weights(*(tmp_path / name / "model.safetensors" for name in ("one", "two")))
    assert run(2, data, tmp_path, "killed", kill_at=13, model="clm", strategy="fsdp") is None
    assert run(2, data, tmp_path, "killed", model="clm", strategy="fsdp") == two


def test_a_batch_that_does_not_split_over_the_processes_names_the_key():
    with pytest.raises(UserError, match=r"pretrain.batch_size: 5 does not split evenly over 2 processes"):
        distributed.Context(rank=0, world=2).share(5, "pretrain.batch_size")
    assert distributed.Context(rank=1, world=2).share(8, "k") == slice(4, 8)


def distill(rank: int, world: int, port: int, strategy: str, checkpoints: str, out: str) -> None:
    """One rank of distilling a toy teacher with every loss term on, over labeled and unlabeled
    examples; rank 0 writes what it reports and the student."""
    context = join(rank, world, port)
    try:
        task = test_finetune.toy_task()
        _, teacher = run_variant("from_scratch", task, ["accuracy"], test_finetune.backbone(n_layers=4),
                                 test_finetune.CFG, test_finetune.IMPL, torch.device("cpu"), 0, test_finetune.PAD)
        unlabeled = [Example(e.ids, e.segments, UNLABELED) for e in test_finetune.toy_task(n=100, seed=1).train]
        cfg = dataclasses.replace(test_distill.DISTILL, pkd_weight=1.0, hidden_layers="all", hidden_weight=0.5)
        impl = dataclasses.replace(test_finetune.IMPL, strategy=strategy)
        result, student = distill_task(teacher, task, unlabeled, ["accuracy"], cfg, impl, torch.device("cpu"),
                                       0, test_finetune.PAD, Path(checkpoints), "fp", context=context)
        if context.main:
            with open(out, "w") as f:
                json.dump({"history": result.history, "student": result.student,
                           "params": [result.student_params, result.teacher_params]}, f)
            save_file(distributed.full_state(student, None)[0], str(Path(out).with_suffix(".safetensors")))
    finally:
        leave()


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_distill_on_two_processes_matches_one(tmp_path, strategy):
    """With fsdp the teacher is sharded too: its outputs, the student's training and its scores equal
    one process's, and the student comes back whole."""
    results = []
    for world in (1, 2):
        args = (strategy, str(tmp_path / f"ckpt{world}"), str(tmp_path / f"{world}.json"))
        if world == 1:
            distill(0, 1, 0, *args)
        else:
            mp.spawn(distill, args=(world, free_port(), *args), nprocs=world, join=True)
        results.append(json.loads((tmp_path / f"{world}.json").read_text()))
    one, two = results
    assert two["student"] == one["student"] and two["params"] == one["params"]
    same_weights(tmp_path / "1.safetensors", tmp_path / "2.safetensors")
    for a, b in zip(one["history"], two["history"], strict=True):
        for key in ("soft_loss", "hard_loss", "hidden_loss", "pkd_loss", "train_loss"):
            assert b[key] == pytest.approx(a[key], rel=1e-4), key


@pytest.mark.parametrize("variant, strategy, aux", [("ulmfit", "ddp", False), ("plain", "ddp", False),
                                                    ("ulmfit", "fsdp", False), ("frozen", "fsdp", False),
                                                    ("plain", "fsdp", True)])
def test_finetune_on_two_processes_matches_one(tmp_path, variant, strategy, aux):
    """The ulmfit variant unfreezes layer groups as it goes: DDP must sync them once they train, FSDP
    must gather and reduce them. The auxiliary LM loss reads the LM head after the forward. Sharded,
    the classifier comes back whole, as one process's."""
    results = []
    for world in (1, 2):
        out = tmp_path / f"{world}.json"
        if world == 1:
            finetune(0, 1, 0, variant, strategy, aux, str(out))
        else:
            mp.spawn(finetune, args=(world, free_port(), variant, strategy, aux, str(out)), nprocs=world, join=True)
        results.append(json.loads(out.read_text()))
    same_weights(tmp_path / "1.safetensors", tmp_path / "2.safetensors")
    one, two = results
    assert two["steps"] == one["steps"] and two["eval"] == one["eval"]
    for a, b in zip(one["history"], two["history"]):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
        assert b["dev_accuracy"] == a["dev_accuracy"]

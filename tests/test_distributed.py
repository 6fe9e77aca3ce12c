"""Data parallel training with torchrun's environment on CPU (gloo, 2 processes), replicated (DDP) and
sharded (FSDP2): the same curve as one process with the same global batch, and an exact resume after
both ranks are killed. Starting two processes that import torch costs more than these tiny runs, so a test
starts its two ranks once and runs each of its cases on them, one after another (`on`)."""
import copy
import dataclasses
import functools
import importlib
import json
import os
import socket
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from lib.config.errors import UserError
from lib.config.params import ImplConfig, ModelConfig
from lib.core import distributed
from lib.core.errors import run_main
from lib.data.packed import PackedTokens
from lib.data.windows import WindowBatches, fixed_windows
from lib.models.folder import model_folder
from lib.objectives import build_objective, save_objective
from lib.tasks.base import UNLABELED
from lib.tasks.classification import Example
from lib.training.budget_loop import Trainer
from lib.training.distill import distill_task
from lib.training.variants import run_variant
from tests import test_distill, test_finetune
from tests.helpers import TOY_SPECIAL, write_params
from tests.test_objectives import tiny_params
from tests.test_budget_loop import CFG, FP32, VOCAB, KillAt, NextToken, curve, packed  # noqa: F401 (packed: a fixture)


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


def ranks(rank: int, world: int, port: int, jobs: list) -> None:
    """One rank of a process group (the whole run when world is 1) that runs `jobs`, (function, args)
    pairs whose function takes this rank's context first, one after another, each building its own
    model, data and trainer."""
    context = join(rank, world, port)
    try:
        for function, args in jobs:
            function(context, *args)
    finally:
        leave()


def on(world: int, *jobs) -> None:
    """Runs `jobs` (see ranks) in this process (world 1) or on `world` spawned ranks."""
    if world == 1:
        ranks(0, 1, 0, list(jobs))
    else:
        mp.spawn(ranks, args=(world, free_port(), list(jobs)), nprocs=world, join=True)


def train(context: distributed.Context, data: str, checkpoints: str, out: str, dropout: float,
          kill_at: int | None, strategy: str, model: str) -> None:
    """One rank of a run (or the whole run with one process) of the stand-in module (model "next") or a
    tiny causal transformer with discriminative LRs ("clm"); rank 0 writes the curve to `out`, and
    the transformer's model folder beside it. Stopped at `kill_at` (KillAt), it returns and writes
    nothing, as a killed run would."""
    torch.manual_seed(0)
    layer_groups, cfg = None, CFG
    if model == "clm":
        shape = ModelConfig(d_model=16, n_layers=2, n_heads=2, d_ff=32, dropout=dropout, max_positions=32)
        module = build_objective("clm", tiny_params(model=shape), VOCAB, TOY_SPECIAL)
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
                with model_folder(Path(out).with_suffix("")) as folder:
                    save_objective(module, folder)
    except KeyboardInterrupt:
        pass


def finetune(context: distributed.Context, variant: str, strategy: str, aux: bool, out: str) -> None:
    """One rank of a finetune run of `variant` on the toy task (aux: a causal model with GPT-1's
    auxiliary LM loss); rank 0 writes what it reports and the classifier it returns."""
    cfg = dataclasses.replace(test_finetune.CFG, aux_lm_weight=0.5 if aux else 0.0)
    result, model = run_variant(variant, test_finetune.toy_task(), ["accuracy"], test_finetune.backbone(causal=aux),
                                cfg, dataclasses.replace(test_finetune.IMPL, strategy=strategy),
                                torch.device("cpu"), 1, test_finetune.PAD, Path(out).with_suffix(".epochs"), "fp",
                                context=context)
    if context.main:
        with open(out, "w") as f:
            json.dump({"history": result.history, "eval": result.eval, "steps": result.steps}, f)
        save_file(distributed.full_state(model, None)[0], str(Path(out).with_suffix(".safetensors")))


def same_weights(one: Path, two: Path) -> None:
    a, b = load_file(str(one)), load_file(str(two))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def run(data, tmp_path, name: str, dropout: float = 0.0, kill_at: int | None = None, strategy: str = "ddp",
        model: str = "next", out: str | None = None) -> tuple:
    """A `train` job: checkpoints in tmp_path/name, the curve in tmp_path/<out or name>.json."""
    return train, (str(data), str(tmp_path / name), str(tmp_path / f"{out or name}.json"), dropout, kill_at, strategy,
                   model)


def curve_of(tmp_path, name: str) -> list | None:
    out = tmp_path / f"{name}.json"
    return json.loads(out.read_text()) if out.exists() else None


@pytest.fixture
def data(packed):  # noqa: F811
    return packed[0].prefix.parent


def same_curve(one: list, two: list, what: str = "") -> None:
    assert [step for step, _ in two] == [step for step, _ in one], what
    for (step, a), (_, b) in zip(one, two):
        assert b == pytest.approx(a, rel=1e-4, abs=1e-5), (what, step)


STRATEGIES = ["ddp", "fsdp"]


def test_two_processes_follow_the_one_process_curve(data, tmp_path):
    """Each rank reads half of every batch and DDP averages the gradients (FSDP reduce-scatters them to
    each rank's shard): with the same global batch the loss curve is the single process's, up to float
    summation order."""
    on(1, run(data, tmp_path, "one"))
    on(2, *(run(data, tmp_path, strategy, strategy=strategy) for strategy in STRATEGIES))
    one = curve_of(tmp_path, "one")
    for strategy in STRATEGIES:
        same_curve(one, curve_of(tmp_path, strategy), strategy)
    assert one[-1][1] < one[0][1] * 0.8  # it learned something


def test_killed_under_torchrun_resumes_exactly(data, tmp_path):
    """Both ranks stopped after step 13 (checkpoint at step 10), started again with a new model, data and
    trainer: every rank restores its own RNG state (dropout differs per rank), so the curve equals an
    uninterrupted 2-process run; replicated and sharded."""
    jobs = []
    for strategy in STRATEGIES:
        jobs += [run(data, tmp_path, f"{strategy}-whole", dropout=0.2, strategy=strategy),
                 run(data, tmp_path, f"{strategy}-killed", dropout=0.2, kill_at=13, strategy=strategy,
                     out=f"{strategy}-stopped"),
                 run(data, tmp_path, f"{strategy}-killed", dropout=0.2, strategy=strategy)]
    on(2, *jobs)
    for strategy in STRATEGIES:
        assert curve_of(tmp_path, f"{strategy}-stopped") is None, strategy  # stopped before its outputs
        assert curve_of(tmp_path, f"{strategy}-killed") == curve_of(tmp_path, f"{strategy}-whole"), strategy


def test_a_sharded_transformer_trains_and_saves_as_one_process_does(data, tmp_path):
    """FSDP shards each transformer block and the root (tied embeddings, discriminative LRs per layer
    group): the curve and the saved model folder equal a single process's; a checkpoint it wrote
    resumes exactly."""
    on(1, run(data, tmp_path, "one", model="clm"))
    on(2, run(data, tmp_path, "two", model="clm", strategy="fsdp"),
       run(data, tmp_path, "killed", kill_at=13, model="clm", strategy="fsdp", out="stopped"),
       run(data, tmp_path, "killed", model="clm", strategy="fsdp"))
    two = curve_of(tmp_path, "two")
    same_curve(curve_of(tmp_path, "one"), two)
    same_weights(*(tmp_path / name / "model.safetensors" for name in ("one", "two")))
    assert curve_of(tmp_path, "stopped") is None
    assert curve_of(tmp_path, "killed") == two


def test_a_batch_that_does_not_split_over_the_processes_names_the_key():
    with pytest.raises(UserError, match=r"pretrain.batch_size: 5 does not split evenly over 2 processes"):
        distributed.Context(rank=0, world=2).share(5, "pretrain.batch_size")
    assert distributed.Context(rank=1, world=2).share(8, "k") == slice(4, 8)


@pytest.mark.parametrize("stage, splits", [("pretrain", False), ("adapt", False), ("finetune", True),
                                           ("distill", True)])
def test_a_batch_that_does_not_split_stops_the_stage_before_torchrun_starts(stage, splits, default_params, tmp_path,
                                                                          monkeypatch, capsys):
    """Each rank reading its share found it too, but once per rank, under torchrun's report of failed
    processes. finetune and distill split batches of any size."""
    default_params["impl"]["nproc"] = 3  # does not divide the batch_size of 32
    params = write_params(tmp_path / "params.yaml", default_params)
    launched = []
    monkeypatch.setattr(distributed.subprocess, "call", lambda command: launched.append(command) or 0)
    monkeypatch.setattr(sys, "argv", [stage, "--params", str(params),
                                      *(arg for name in ("out", "metrics", "plots", "checkpoints")
                                        for arg in (f"--{name}", str(tmp_path / name)))])
    main = importlib.import_module(f"stages.{stage}").main
    if splits:
        run_main(main)
        assert len(launched) == 1
        return
    with pytest.raises(SystemExit) as done:
        run_main(main)
    assert done.value.code == 2 and not launched
    assert capsys.readouterr().err.splitlines() == [
        f"error: {stage}.batch_size: 32 does not split evenly over 3 processes (impl.nproc); use a multiple of 3"]


def test_a_torchrun_launch_leaves_nothing_in_the_temp_folder(tmp_path, monkeypatch):
    """torchrun keeps its ranks' error files in a folder it makes there (torchelastic_*) and never removes."""
    temp = tmp_path / "temp"
    temp.mkdir()
    (tmp_path / "does_nothing.py").write_text("")
    monkeypatch.setenv("TMPDIR", str(temp))  # torchrun's temp folder
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # this process's
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["stage"])
    assert distributed.relaunch(ImplConfig(nproc=2), "does_nothing", {})
    assert list(temp.iterdir()) == []


@functools.cache
def toy_teacher() -> torch.nn.Module:
    """A classifier trained on the toy task by one process, the same in every process: trained once per
    process, each distillation gets a copy (sharding changes the module it is given)."""
    _, teacher = run_variant("from_scratch", test_finetune.toy_task(), ["accuracy"], test_finetune.backbone(n_layers=4),
                             test_finetune.CFG, test_finetune.IMPL, torch.device("cpu"), 0, test_finetune.PAD,
                             Path(tempfile.mkdtemp()), "fp")
    return teacher


def distill(context: distributed.Context, strategy: str, checkpoints: str, out: str) -> None:
    """One rank of distilling a toy teacher with every loss term on, over labeled and unlabeled
    examples; rank 0 writes what it reports and the student."""
    task = test_finetune.toy_task()
    teacher = copy.deepcopy(toy_teacher())
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


def test_distill_on_two_processes_matches_one(tmp_path):
    """With fsdp the teacher is sharded too: its outputs, the student's training and its scores equal
    one process's, and the student comes back whole; replicated and sharded."""
    for world in (1, 2):
        on(world, *((distill, (strategy, str(tmp_path / f"ckpt{world}{strategy}"), str(tmp_path / f"{world}{strategy}.json")))
                    for strategy in STRATEGIES))
    for strategy in STRATEGIES:
        one, two = (json.loads((tmp_path / f"{world}{strategy}.json").read_text()) for world in (1, 2))
        assert two["student"] == one["student"] and two["params"] == one["params"], strategy
        same_weights(tmp_path / f"1{strategy}.safetensors", tmp_path / f"2{strategy}.safetensors")
        for a, b in zip(one["history"], two["history"], strict=True):
            for key in ("soft_loss", "hard_loss", "hidden_loss", "pkd_loss", "train_loss"):
                assert b[key] == pytest.approx(a[key], rel=1e-4), (strategy, key)


@functools.cache
def typed_teacher(task_type: str) -> torch.nn.Module:
    """A teacher of test_distill's toy task of `task_type`, trained once per process (as toy_teacher)."""
    task = test_distill.TYPE_TASKS[task_type][0]()
    _, teacher = run_variant("from_scratch", task, [test_distill.TYPE_TASKS[task_type][1]],
                             test_finetune.backbone(n_layers=4), test_finetune.CFG, test_finetune.IMPL,
                             torch.device("cpu"), 0, test_finetune.PAD, Path(tempfile.mkdtemp()), "fp")
    return teacher


def distill_typed(context: distributed.Context, task_type: str, strategy: str, checkpoints: str, out: str) -> None:
    """One rank of distilling a toy teacher of `task_type` with every loss term on; rank 0 writes the history."""
    make, metric, _ = test_distill.TYPE_TASKS[task_type]
    cfg = dataclasses.replace(test_distill.DISTILL, pkd_weight=1.0, hidden_layers="all", hidden_weight=0.5, epochs=2)
    impl = dataclasses.replace(test_finetune.IMPL, strategy=strategy)
    result, _ = distill_task(copy.deepcopy(typed_teacher(task_type)), make(), [], [metric], cfg, impl,
                             torch.device("cpu"), 0, test_finetune.PAD, Path(checkpoints), "fp", context=context)
    if context.main:
        Path(out).write_text(json.dumps({"history": result.history, "student": result.student}))


def test_distill_of_other_types_on_two_processes_matches_one(tmp_path):
    """Tagging weighs each rank's soft and hard terms by its share of the batch's tagged words, and
    multiple choice runs the state losses over every choice sequence: two processes give one's losses."""
    cases = [(task_type, strategy) for task_type in ("tagging", "multiple_choice") for strategy in STRATEGIES]
    for world in (1, 2):
        on(world, *((distill_typed, (task_type, strategy, str(tmp_path / f"ckpt{world}{task_type}{strategy}"),
                                     str(tmp_path / f"{world}{task_type}{strategy}.json")))
                    for task_type, strategy in cases))
    for task_type, strategy in cases:
        one, two = (json.loads((tmp_path / f"{world}{task_type}{strategy}.json").read_text()) for world in (1, 2))
        assert two["student"] == one["student"], (task_type, strategy)
        for a, b in zip(one["history"], two["history"], strict=True):
            for key in ("soft_loss", "hard_loss", "hidden_loss", "pkd_loss", "train_loss"):
                assert b[key] == pytest.approx(a[key], rel=1e-4), (task_type, strategy, key)


FINETUNE_CASES = [("ulmfit", "ddp", False), ("plain", "ddp", False), ("ulmfit", "fsdp", False),
                  ("frozen", "fsdp", False), ("plain", "fsdp", True)]  # variant, strategy, aux


def test_finetune_on_two_processes_matches_one(tmp_path):
    """The ulmfit variant unfreezes layer groups as it goes: DDP must sync them once they train, FSDP
    must gather and reduce them. The auxiliary LM loss reads the LM head after the forward. Sharded,
    the classifier comes back whole, as one process's. Each case in FINETUNE_CASES, on one process and on
    two."""
    for world in (1, 2):
        on(world, *((finetune, (*case, str(tmp_path / f"{world}-{i}.json"))) for i, case in enumerate(FINETUNE_CASES)))
    for i, case in enumerate(FINETUNE_CASES):
        same_weights(tmp_path / f"1-{i}.safetensors", tmp_path / f"2-{i}.safetensors")
        one, two = (json.loads((tmp_path / f"{world}-{i}.json").read_text()) for world in (1, 2))
        assert two["steps"] == one["steps"] and two["eval"] == one["eval"], case
        for a, b in zip(one["history"], two["history"]):
            assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4), case
            assert b["dev_accuracy"] == a["dev_accuracy"], case

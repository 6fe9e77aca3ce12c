"""The token-budget loop (lib/training/budget_loop.py) on a tiny stand-in module: budget, schedule, NaN
handling, checkpoints, exact resume."""
import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from lib.config.errors import UserError
from lib.config.params import Corpora, CorpusConfig, ImplConfig, ModelConfig, Params, TrainConfig
from lib.core.progress import Progress
from lib.data.packed import PackedTokens, PackedWriter
from lib.data.windows import WindowBatches, fixed_windows
from lib.objectives import build_objective
from lib.training.budget_loop import Trainer, flops_budget, planned_tokens, schedule_of
from lib.training.checkpoint import KEEP, checkpoints
from lib.training.optim import build_optimizer, discriminative_groups, slanted_triangular

VOCAB = 40


class NextToken(nn.Module):
    """Predicts token t+1 from token t, with dropout so that the RNG state matters for resume."""

    def __init__(self, poison_after: int | None = None):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.norm = nn.LayerNorm(16)
        self.drop = nn.Dropout(0.2)
        self.out = nn.Linear(16, VOCAB)
        self.calls, self.poison_after = 0, poison_after

    def forward(self, batch):
        self.calls += 1
        tokens = batch.tokens
        logits = self.out(self.drop(self.norm(self.embed(tokens[:, :-1]))))
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        if self.poison_after is not None and self.calls > self.poison_after:
            loss = loss * float("nan")
        return loss, {"loss": loss.detach(), "accuracy": (logits.argmax(-1) == tokens[:, 1:]).float().mean()}


@pytest.fixture
def packed(tmp_path):
    rng = np.random.default_rng(0)
    for split, n_docs in (("train", 200), ("valid", 20)):
        with PackedWriter(tmp_path / split, VOCAB, eos_id=3) as writer:
            # counting sequences: the next token is learnable from the current one
            docs = [[5 + (start + i) % (VOCAB - 5) for i in range(rng.integers(10, 60))]
                    for start in rng.integers(0, VOCAB, size=n_docs)]
            writer.add(docs, [[1] * len(d) for d in docs])
    return PackedTokens(tmp_path / "train"), PackedTokens(tmp_path / "valid")


CFG = TrainConfig(seq_len=16, batch_size=4, lr=3e-2, warmup_steps=3, budget_tokens=16 * 4 * 24, eval_every=8,
                  eval_batches=2, log_every=1, checkpoint_every=5)
FP32 = ImplConfig(precision="fp32", compile="off")


def trainer(packed, ckpt, cfg=CFG, module=None, callbacks=(), fingerprint="a", progress=None):
    torch.manual_seed(0)
    module = module or NextToken()
    train = WindowBatches(packed[0], cfg.seq_len + 1, cfg.batch_size, seed=1)
    valid = fixed_windows(packed[1], cfg.seq_len + 1, cfg.batch_size, cfg.eval_batches)
    return Trainer(module, cfg, FP32, torch.device("cpu"), train, valid, ckpt, fingerprint, seed=1, callbacks=callbacks,
                   progress=progress)


def curve(state):
    return [(r["step"], round(r.get("train_loss", r.get("val_loss")), 6)) for r in state.history]


class KillAt:
    """Stands in for SIGKILL: stops the process-equivalent at a step, after its checkpoints."""

    def __init__(self, step):
        self.step = step

    def on_log(self, step, row):
        if step == self.step:
            raise KeyboardInterrupt

    def on_eval(self, step, row):
        pass


def test_progress_counts_the_planned_tokens_and_a_resumed_run_its_own_part(packed, tmp_path):
    with pytest.raises(KeyboardInterrupt):
        trainer(packed, tmp_path / "ckpt", callbacks=(KillAt(13),)).fit()  # last checkpoint: step 10
    progress = Progress("pretrain", planned_tokens(CFG), "tokens")
    trainer(packed, tmp_path / "ckpt", progress=progress).fit()
    assert progress.total == CFG.budget_tokens == progress.done and progress.done_at_start == 10 * 16 * 4
    assert planned_tokens(CFG.__class__(seq_len=16, batch_size=4, budget_tokens=100)) == 128  # whole steps


def test_budget_schedule_and_learning(packed, tmp_path):
    state = trainer(packed, tmp_path / "ckpt").fit()
    assert state.step == 24 and state.tokens == CFG.budget_tokens
    vals = [r["val_loss"] for r in state.history if "val_loss" in r]
    assert [r["step"] for r in state.history if "val_loss" in r] == [8, 16, 24]
    assert vals[0] > vals[1] > vals[2] and vals[2] < math.log(VOCAB) - 1.0


def test_resume_after_kill_equals_uninterrupted_run(packed, tmp_path):
    uninterrupted = trainer(packed, tmp_path / "a").fit()
    with pytest.raises(KeyboardInterrupt):
        trainer(packed, tmp_path / "b", callbacks=(KillAt(13),)).fit()  # last checkpoint: step 10
    resumed_trainer = trainer(packed, tmp_path / "b")
    resumed = resumed_trainer.fit()
    assert resumed_trainer.module.calls == (24 - 10) + 2 * 2  # steps 11..24 and evals at 16, 24: no replay
    assert curve(resumed) == curve(uninterrupted)


def test_checkpoint_of_another_configuration_is_not_resumed(packed, tmp_path):
    with pytest.raises(KeyboardInterrupt):
        trainer(packed, tmp_path / "c", callbacks=(KillAt(7),)).fit()
    fresh = trainer(packed, tmp_path / "c", fingerprint="other")
    fresh.fit()
    assert fresh.module.calls == 24 + 3 * 2


def test_nan_loss_stops_with_step_and_keeps_checkpoint(packed, tmp_path):
    cfg = TrainConfig(**{**CFG.__dict__, "max_bad_steps": 2})
    with pytest.raises(UserError, match=r"loss is nan at step 9, 3 bad steps in a row"):
        trainer(packed, tmp_path / "d", cfg=cfg, module=NextToken(poison_after=6)).fit()
    assert [json.loads((c / "state.json").read_text())["step"] for c in checkpoints(tmp_path / "d")] == [5]


def test_budget_minutes_stops_early(packed, tmp_path):
    cfg = TrainConfig(**{**CFG.__dict__, "budget_minutes": 1e-9})
    state = trainer(packed, tmp_path / "e", cfg=cfg).fit()
    assert state.step == 1 and "val_loss" in state.history[-1]


def test_warmup_then_decay_shapes():
    cfg = TrainConfig(warmup_steps=10, min_lr_ratio=0.1, schedule="linear")
    linear = schedule_of(cfg).multiplier(110)
    assert linear(0) == pytest.approx(0.1) and linear(9) == pytest.approx(1.0)
    assert linear(60) == pytest.approx(0.55) and linear(110) == pytest.approx(0.1)
    cosine = schedule_of(TrainConfig(warmup_steps=10, min_lr_ratio=0.0, schedule="cosine")).multiplier(110)
    assert cosine(60) == pytest.approx(0.5) and cosine(110) == pytest.approx(0.0, abs=1e-12)


def test_stlr_shape():
    """Howard & Ruder's example: T steps, peak at cut_frac * T, 1/ratio at both ends, linear between."""
    stlr = slanted_triangular(total_steps=1000, cut_frac=0.1, ratio=32)
    values = [stlr(t) for t in range(1001)]
    assert values[0] == pytest.approx(1 / 32) and values[1000] == pytest.approx(1 / 32)
    assert max(values) == pytest.approx(1.0) and values.index(max(values)) == 100
    assert values[50] == pytest.approx((1 + 0.5 * 31) / 32) and values[550] == pytest.approx((1 + 0.5 * 31) / 32)
    rising, falling = values[:101], values[100:]
    assert all(a < b for a, b in zip(rising, rising[1:])) and all(a > b for a, b in zip(falling, falling[1:]))
    assert schedule_of(TrainConfig(schedule="stlr", cut_frac=0.1, stlr_ratio=32)).multiplier(1000)(100) == 1.0


def test_discriminative_lrs_divide_by_lr_decay_per_group():
    module = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.Linear(2, 2),
                                 torch.nn.LayerNorm(2))
    layers = [list(module[i].parameters()) for i in range(3)]  # the LayerNorm is in no group: joins the top
    groups = discriminative_groups(module, layers, lr=1e-2, lr_decay=2.6, weight_decay=0.1)
    lr_of = {id(p): g["lr"] for g in groups for p in g["params"]}
    assert lr_of[id(module[2].weight)] == pytest.approx(1e-2)
    assert lr_of[id(module[1].weight)] == pytest.approx(1e-2 / 2.6)
    assert lr_of[id(module[0].bias)] == pytest.approx(1e-2 / 2.6 ** 2)
    assert lr_of[id(module[3].weight)] == pytest.approx(1e-2)
    assert len(lr_of) == sum(1 for _ in module.parameters())  # every parameter exactly once
    assert {g["weight_decay"] for g in groups if any(p is module[0].bias for p in g["params"])} == {0.0}


def test_no_weight_decay_on_biases_norms_and_optionally_embeddings():
    module = NextToken()
    cfg = TrainConfig(weight_decay=0.05, beta1=0.8, beta2=0.9, eps=1e-7)
    decay, no_decay = build_optimizer(module, cfg, torch.device("cpu"), 1e-3, decay_embeddings=False).param_groups
    assert {id(p) for p in decay["params"]} == {id(module.out.weight)} and decay["weight_decay"] == 0.05
    assert no_decay["weight_decay"] == 0.0 and len(no_decay["params"]) == 4
    assert (decay["betas"], decay["eps"]) == ((0.8, 0.9), 1e-7)  # from the config, not hard-coded
    decay, _ = build_optimizer(module, cfg, torch.device("cpu"), 1e-3).param_groups
    assert {id(p) for p in decay["params"]} == {id(module.out.weight), id(module.embed.weight)}


def test_batches_are_a_function_of_the_step(packed):
    batches = WindowBatches(packed[0], 17, 4, seed=1)
    assert torch.equal(batches.batch(5).tokens, batches.batch(5).tokens)
    assert not torch.equal(batches.batch(5).tokens, batches.batch(6).tokens)
    batch = batches.batch(0)
    assert batch.tokens.shape == batch.word_starts.shape == (4, 17) and batch.tokens.dtype == torch.int64


def test_fixed_validation_windows_do_not_overlap(packed):
    batches = fixed_windows(packed[1], 17, 4, n_batches=100)
    windows = torch.cat([batch.tokens for batch in batches])
    assert len(windows) == packed[1].n_tokens // 17
    stream = torch.from_numpy(packed[1].tokens.astype(np.int64))
    assert torch.equal(windows[1], stream[17:34])


def test_too_little_data_is_one_line(packed):
    with pytest.raises(UserError, match="fewer than one window"):
        WindowBatches(packed[1], 10**6, 4, seed=1)


def test_only_the_last_checkpoints_are_kept(packed, tmp_path):
    with pytest.raises(KeyboardInterrupt):
        trainer(packed, tmp_path / "k", callbacks=(KillAt(23),)).fit()
    steps = [json.loads((c / "state.json").read_text())["step"] for c in checkpoints(tmp_path / "k")]
    assert steps == [15, 20] and KEEP == 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_a_corrupted_checkpoint_is_reported_and_the_one_before_is_used(packed, tmp_path, capsys, damage):
    """Killed after step 20's checkpoint, the newest one damaged on disk: the rerun says so in one line,
    resumes from step 15's and still ends on the uninterrupted run's curve."""
    whole = trainer(packed, tmp_path / "whole").fit()
    with pytest.raises(KeyboardInterrupt):
        trainer(packed, tmp_path / "k", callbacks=(KillAt(23),)).fit()
    weights = checkpoints(tmp_path / "k")[-1] / "module.safetensors"
    data = weights.read_bytes()
    if damage == "truncate":
        weights.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        weights.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    else:
        weights.unlink()
    capsys.readouterr()
    resumed = trainer(packed, tmp_path / "k")
    state = resumed.fit()
    out = capsys.readouterr()
    assert "resuming from step 15" in out.out
    [line] = [l for l in out.err.splitlines() if "corrupted" in l]
    assert "ckpt-000004" in line and "module.safetensors" in line and "trying the one before it" in line
    assert curve(state) == curve(whole)


def test_a_flops_budget_buys_tokens_by_the_objective_cost():
    assert flops_budget(CFG, 1e6, "pretrain") is CFG  # budget_flops null: the token budget decides
    cfg = CFG.__class__(seq_len=16, batch_size=4, budget_flops=1e9)
    assert flops_budget(cfg, 1e6, "pretrain").budget_tokens == 1000
    assert flops_budget(cfg, 4e6, "pretrain").budget_tokens == 250  # 4x the cost: a quarter of the tokens
    with pytest.raises(UserError, match=r"^pretrain.budget_flops: 1e\+09 buys 10 tokens at 1e\+08 FLOPs per token, "
                                        r"less than one step \(64 tokens\); raise it$"):
        flops_budget(cfg, 1e8, "pretrain")


def test_a_bilm_resumes_both_directions_exactly(packed, tmp_path):
    """bilm's checkpoint holds both stacks, the shared embeddings and softmax once: a killed run resumes
    to the uninterrupted run's curve."""
    def bilm():
        torch.manual_seed(0)
        corpus = CorpusConfig(source="unused")
        model = ModelConfig(d_model=16, n_layers=2, n_heads=2, d_ff=32, dropout=0.1, max_positions=32)
        params = Params(corpora=Corpora(pretrain=corpus, domain=corpus), tasks={}, model=model)
        return build_objective("bilm", params, VOCAB, {"pad": 0, "unk": 1, "bos": 2, "eos": 3, "mask": 4})

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model gains nothing from threads on a busy machine
    try:
        uninterrupted = trainer(packed, tmp_path / "a", module=bilm()).fit()
        with pytest.raises(KeyboardInterrupt):
            trainer(packed, tmp_path / "b", module=bilm(), callbacks=(KillAt(13),)).fit()  # last checkpoint: step 10
        resumed = trainer(packed, tmp_path / "b", module=bilm()).fit()
    finally:
        torch.set_num_threads(threads)
    assert curve(resumed) == curve(uninterrupted)

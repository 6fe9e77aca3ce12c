"""The optimizer step's non-finite-loss rule (lib/training/optim.py), and the epoch loop's
(lib/training/epoch_loop.py) best epoch, patience and exact resume, through the variants trained in epochs."""
import dataclasses
import math

import pytest
import torch

from lib.config.errors import UserError
from lib.config.params import FinetuneConfig
from lib.training.epoch_loop import EpochLoop
from lib.training.finetune import FullTrainer
from lib.training.optim import Stepper, build_optimizer
from lib.training.variants import VARIANTS, run_variant
from tests.test_finetune import CFG, IMPL, PAD, backbone, toy_task


def linear_step(cfg: FinetuneConfig) -> tuple[torch.nn.Linear, torch.optim.Optimizer, Stepper]:
    torch.manual_seed(0)
    module = torch.nn.Linear(2, 1)
    optimizer = build_optimizer(module, cfg, torch.device("cpu"), 0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return module, scheduler, Stepper(module, optimizer, scheduler, cfg, "finetune: toy", " (kept: nothing)")


def test_a_non_finite_loss_skips_its_batch_and_too_many_in_a_row_stop_the_run():
    module, scheduler, stepper = linear_step(FinetuneConfig(max_bad_steps=2))
    before = module.weight.detach().clone()
    module(torch.ones(1, 2)).sum().backward()
    assert stepper.step(math.nan, 1, 0) == 1  # skipped: no update, the gradient dropped, the schedule moved on
    assert torch.equal(module.weight, before) and module.weight.grad is None and scheduler.last_epoch == 1
    module(torch.ones(1, 2)).sum().backward()
    # a good step resets the count: only losses in a row stop the run
    assert stepper.step(0.5, 2, 1) == 0 and not torch.equal(module.weight, before)
    assert stepper.step(math.inf, 3, 0) == 1 and stepper.step(math.inf, 4, 1) == 2
    with pytest.raises(UserError, match=r"finetune: toy: loss is nan at step 5, 3 bad steps in a row; "
                                         r"lower the lr or check the data \(kept: nothing\)"):
        stepper.step(math.nan, 5, 2)


def test_finetune_takes_adamw_settings_from_its_params(tmp_path):
    cfg = dataclasses.replace(CFG, beta1=0.8, beta2=0.95, eps=1e-7, weight_decay=0.05)
    plan = VARIANTS["plain"].setup(backbone(), 2, cfg)
    trainer = FullTrainer(plan.model, plan, toy_task(), cfg, IMPL, torch.device("cpu"), PAD, 0, tmp_path, "fp",
                          "accuracy")
    groups = trainer.loop.optimizer.param_groups
    assert {(g["betas"], g["eps"]) for g in groups} == {((0.8, 0.95), 1e-7)}
    assert {g["weight_decay"] for g in groups} == {0.05, 0.0}


@pytest.mark.parametrize("variant", ["ulmfit", "plain", "elmo"])
def test_a_killed_finetune_run_resumes_after_its_last_epoch_to_the_same_result(tmp_path, variant):
    cfg = dataclasses.replace(CFG, epochs=3, patience=3, ulmfit=dataclasses.replace(CFG.ulmfit, unfreeze_every=3),
                              head_dropout=0.1)  # dropout: RNG resumes too

    def run(directory, on_epoch=lambda row: None):
        return run_variant(variant, toy_task(), ["accuracy"], backbone(), cfg, IMPL, torch.device("cpu"), 1, PAD,
                           tmp_path / directory, "fp", on_epoch)

    whole, whole_model = run("whole")

    def kill_after_first(row):
        if row["epoch"] == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run("killed", kill_after_first)
    epochs = []
    resumed, resumed_model = run("killed", lambda row: epochs.append(row["epoch"]))
    assert epochs == [2, 3]  # epoch 1 was not trained again
    assert resumed.history == whole.history and resumed.eval == whole.eval and resumed.steps == whole.steps
    assert resumed.learned == whole.learned  # elmo's layer weights; nothing for the others
    for (name, a), b in zip(whole_model.state_dict().items(), resumed_model.state_dict().values()):
        assert torch.equal(a, b), name
    other, _ = run_variant(variant, toy_task(), ["accuracy"], backbone(), cfg, IMPL, torch.device("cpu"), 1, PAD,
                           tmp_path / "killed", "another configuration")
    assert [row["epoch"] for row in other.history] == [1, 2, 3]  # another fingerprint starts fresh


def test_the_loop_keeps_the_best_epoch_and_stops_after_patience(tmp_path):
    module = torch.nn.Linear(2, 2)
    cfg = FinetuneConfig()
    optimizer = build_optimizer(module, cfg, torch.device("cpu"), 0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    loop = EpochLoop(module, module, optimizer, scheduler, cfg, epochs=10, patience=2, metric="accuracy",
                     checkpoint_dir=tmp_path, fingerprint="fp", where="toy")
    scores = iter([0.5, 0.7, 0.6, 0.7, 0.9])
    weights = []

    def train_epoch(epoch):
        with torch.no_grad():
            module.weight.fill_(epoch)
        weights.append(epoch)
        return {"train_loss": 1.0 / epoch}

    state = loop.run(train_epoch, lambda: {"accuracy": next(scores)})
    assert weights == [1, 2, 3, 4]  # 0.6 and 0.7 do not beat 0.7: two epochs without a better score
    assert (state.best_epoch, state.best_score, state.bad_epochs) == (2, 0.7, 2)
    assert torch.all(module.weight == 2)  # the best epoch's weights are back
    assert [row["dev_accuracy"] for row in state.history] == [0.5, 0.7, 0.6, 0.7]

"""Distillation: the loss terms on hand-made values, the student's initialisation from the teacher,
the teacher's outputs computed once, resume after a kill, and a student that learns the toy task."""
import copy
import dataclasses
import math

import pytest
import torch

import lib.distill as distill
from lib.classifier import Classifier, HeadConfig
from lib.config import DistillConfig, ImplConfig
from lib.distill import (build_student, distill_task, hidden_loss, patient_loss, soft_loss, student_plan,
                         teacher_outputs)
from lib.errors import UserError
from lib.finetune import run_variant
from lib.tasks import UNLABELED, Example
from tests.test_finetune import CFG, PAD, backbone, toy_task

IMPL = ImplConfig(precision="fp32", compile="off")
DISTILL = DistillConfig(tasks=["toy"], layers=2, epochs=3, batch_size=16, lr=2e-3, patience=3)


def test_soft_loss_is_t_squared_times_kl_of_the_tempered_distributions():
    student, teacher = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 2.0]])
    T = 2.0
    p = torch.softmax(teacher / T, -1)[0]  # teacher
    q = torch.softmax(student / T, -1)[0]
    expected = T * T * float((p * (p / q).log()).sum())
    assert soft_loss(student, teacher, T).item() == pytest.approx(expected, rel=1e-6)
    assert soft_loss(teacher, teacher, 3.0).item() == pytest.approx(0.0, abs=1e-7)
    # by hand: logits/T = [0.5, 0] vs [0, 1]
    p0, q0 = 1 / (1 + math.e), math.exp(0.5) / (math.exp(0.5) + 1)
    by_hand = 4 * (p0 * math.log(p0 / q0) + (1 - p0) * math.log((1 - p0) / (1 - q0)))
    assert soft_loss(student, teacher, T).item() == pytest.approx(by_hand, rel=1e-6)


def test_hidden_and_patient_losses():
    a = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]]])  # (1, 3, 2); the third token is padding
    b = torch.tensor([[[2.0, 0.0], [1.0, 0.0], [0.0, 0.0]]])
    mask = torch.tensor([[True, True, False]])
    assert hidden_loss(a, b, mask, "cosine").item() == pytest.approx((0 + 1) / 2)  # cos 1 and cos 0
    assert hidden_loss(a, b, mask, "mse").item() == pytest.approx(((1 + 0) / 2 + (1 + 1) / 2) / 2)
    s = torch.tensor([[[3.0, 0.0], [0.0, 2.0]]])  # (1, 2 layers, 2)
    t = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])
    assert patient_loss(s, t).item() == pytest.approx(0.0 + 2.0)  # |e1 - e1|^2 + |e2 - e1|^2


def test_student_plan_spreads_or_takes_the_bottom():
    assert student_plan(dataclasses.replace(DISTILL, layers=6), 12) == ([0, 2, 4, 7, 9, 11], [1, 3, 5, 8, 10, 12])
    assert student_plan(dataclasses.replace(DISTILL, layers=2, init="bottom"), 4) == ([0, 1], [1, 2])
    assert student_plan(dataclasses.replace(DISTILL, layers=2, init="random"), 4) == ([], [1, 4])
    assert student_plan(dataclasses.replace(DISTILL, layers=2, layer_map=[2, 4]), 4)[1] == [2, 4]
    with pytest.raises(UserError, match="distill.layers"):
        student_plan(dataclasses.replace(DISTILL, layers=5), 4)
    with pytest.raises(UserError, match=r"distill.layer_map\[1\]"):
        student_plan(dataclasses.replace(DISTILL, layers=2, layer_map=[1, 9]), 4)


def test_student_copies_the_chosen_teacher_blocks():
    teacher = Classifier(backbone(n_layers=4), HeadConfig(2, "concat", hidden=16))
    student = build_student(teacher, dataclasses.replace(DISTILL, layers=2), [0, 3])
    assert student.backbone.cfg.n_layers == 2
    t, s = teacher.state_dict(), student.state_dict()
    for name in s:
        source = name.replace("blocks.1.", "blocks.3.")
        torch.testing.assert_close(s[name], t[source], rtol=0, atol=0)
    assert student.backbone.head.decoder.weight is student.backbone.embeddings.token.weight  # still tied
    narrow = build_student(teacher, dataclasses.replace(DISTILL, width=0.5, init="random"), [])
    assert narrow.backbone.cfg.d_model == 16 and narrow.backbone.cfg.n_layers == 2


def test_teacher_outputs_match_the_teacher_and_keep_real_tokens_only():
    teacher = Classifier(backbone(causal=True, n_layers=3), HeadConfig(2, "concat", hidden=16)).eval()
    examples = toy_task().train[:20]
    cache = teacher_outputs(teacher, examples, [3], [1, 2], 8, PAD, torch.device("cpu"), IMPL)
    one = examples[5]
    ids = torch.tensor([one.ids])
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        logits, _ = teacher(ids, torch.zeros_like(ids), mask)
        _, states = teacher.encode(ids, torch.zeros_like(ids), mask, output_hidden_states=True)
    torch.testing.assert_close(cache.logits[5], logits[0], atol=1e-5, rtol=1e-5)
    assert cache.hidden[5].shape == (1, len(one.ids), 32)
    torch.testing.assert_close(cache.hidden[5][0].float(), states[3][0], atol=0.05, rtol=0.02)  # stored as bf16
    torch.testing.assert_close(cache.summary[5, 1], states[2][0, -1], atol=1e-5, rtol=1e-5)  # causal: last token


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    task = toy_task()
    cfg = dataclasses.replace(CFG, epochs=6, patience=6)
    _, teacher = run_variant("from_scratch", task, ["accuracy"], backbone(n_layers=4), cfg, IMPL,
                             torch.device("cpu"), 0, PAD, tmp_path_factory.mktemp("teacher"), "fp")
    return task, teacher


def test_student_learns_from_the_teacher_and_uses_the_cache_once(tmp_path, monkeypatch, trained):
    task, teacher = trained
    unlabeled = [Example(e.ids, e.segments, UNLABELED) for e in toy_task(n=120, seed=1).train]
    calls = []
    real = distill.teacher_outputs
    monkeypatch.setattr(distill, "teacher_outputs", lambda *a, **k: calls.append(1) or real(*a, **k))
    cfg = dataclasses.replace(DISTILL, pkd_weight=1.0, hidden_layers="all")
    result, student = distill_task(teacher, task, unlabeled, ["accuracy"], cfg, IMPL, torch.device("cpu"), 0, PAD,
                                   tmp_path, "fp")
    assert len(calls) == 1  # one teacher pass for all epochs
    assert result.transfer == {"labeled": len(task.train), "unlabeled": len(unlabeled)}
    assert result.teacher["eval"]["accuracy"] > 0.9
    assert result.student["eval"]["accuracy"] > 0.9
    assert {"soft_loss", "hard_loss", "hidden_loss", "pkd_loss", "train_loss"} <= set(result.history[0])
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"]
    assert student.backbone.cfg.n_layers == 2 and result.student_params < result.teacher_params


def test_a_killed_distillation_resumes_to_the_same_student(tmp_path, trained):
    task, teacher = trained
    cfg = dataclasses.replace(DISTILL, epochs=3, hidden_weight=0.5)
    teacher = copy.deepcopy(teacher)
    teacher.backbone.cfg.dropout = 0.1  # the student (built from this config) then draws dropout from the RNG
    whole, _ = distill_task(teacher, task, [], ["accuracy"], cfg, IMPL, torch.device("cpu"), 0, PAD,
                            tmp_path / "whole", "fp")

    class Killed(Exception):
        pass

    def kill_after_first(row):
        if row["epoch"] == 1:
            raise Killed

    with pytest.raises(Killed):
        distill_task(teacher, task, [], ["accuracy"], cfg, IMPL, torch.device("cpu"), 0, PAD,
                     tmp_path / "killed", "fp", kill_after_first)
    epochs = []
    resumed, _ = distill_task(teacher, task, [], ["accuracy"], cfg, IMPL, torch.device("cpu"), 0, PAD,
                              tmp_path / "killed", "fp", lambda row: epochs.append(row["epoch"]))
    assert epochs == [2, 3]  # epoch 1 was not trained again
    assert [r["train_loss"] for r in resumed.history] == [r["train_loss"] for r in whole.history]
    assert resumed.student == whole.student
    epochs.clear()
    distill_task(teacher, task, [], ["accuracy"], cfg, IMPL, torch.device("cpu"), 0, PAD, tmp_path / "killed",
                 "another-config", lambda row: epochs.append(row["epoch"]))
    assert epochs == [1, 2, 3]  # another configuration's checkpoint is not resumed

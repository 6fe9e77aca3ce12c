"""Distillation: the loss terms on hand-made values, the student's initialisation from the teacher,
the teacher's outputs computed once, resume after a kill, and a student that learns the toy task; for
every other task type, its soft loss, its cache, a student that learns from its teacher, and the stage
on a regression task."""
import copy
import dataclasses
import json
import math

import pytest
import torch

import lib.training.distill as distill
import lib.training.distill_runs as distill_runs
from lib.config.errors import UserError
from lib.config.params import DistillConfig, FinetuneConfig, ImplConfig, Params, ParamsError, TaskConfig
from lib.core import tracking
from lib.core.distributed import Context
from lib.tasks import TYPES, check_tasks, multiple_choice, regression, span_qa, tagging
from lib.tasks.base import UNLABELED, TaskData
from lib.tasks.capabilities import soft_loss
from lib.tasks.classification import Example
from lib.tasks.model import HeadConfig, TaskModel, load_task_model, save_task_model
from lib.tasks.scoring import score_split
from lib.tasks.span_qa import masked_soft_loss
from lib.training.distill import build_student, distill_task, hidden_loss, patient_loss, student_plan, teacher_outputs
from lib.training.variants import run_variant
from tests.helpers import write_jsonl_gz
from tests import tasktype_helpers
from tests.test_finetune import BOS, CFG, EOS, PAD, VOCAB, backbone, toy_task

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
    teacher = TaskModel(backbone(n_layers=4), HeadConfig(2, "concat", hidden=16))
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
    teacher = TaskModel(backbone(causal=True, n_layers=3), HeadConfig(2, "concat", hidden=16)).eval()
    task = toy_task()
    examples = task.train[:20]
    cache = teacher_outputs(teacher, task, examples, [3], [1, 2], 8, PAD, torch.device("cpu"), IMPL)
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


# ---- every task type -----------------------------------------------------------------------------------------------
# Toy tasks of each type built by hand from token ids (VOCAB, PAD, BOS, EOS of tests/test_finetune.py), each
# learnable from token 7: tagging tags it, span_qa's answer is it, multiple choice's right ending holds it,
# regression's score counts it. A word or context token t reads "w<t>".

def _tokens(g: torch.Generator, low: int = 3, high: int = 10) -> list[int]:
    return torch.randint(8, VOCAB, (int(torch.randint(low, high, (1,), generator=g)),), generator=g).tolist()


def _split(task_type: str, examples: list, label_names=(), references=None, n_train=120, n_dev=40, **info):
    refs = references or {}
    return TaskData("toy", list(label_names), examples[:n_train], examples[n_train:n_train + n_dev],
                    examples[n_train + n_dev:], "test", {}, {}, task_type, info,
                    {"dev": refs.get("dev", []), "eval": refs.get("eval", [])})


def regression_task(n: int = 200) -> TaskData:
    g = torch.Generator().manual_seed(0)
    examples = []
    for i in range(n):
        tokens = _tokens(g, 5, 10)
        for k in range(i % 4):
            tokens[k * 2] = 7
        ids = [BOS, *tokens, EOS]
        examples.append(regression.Example(ids, [0] * len(ids), float(i % 4)))
    values = torch.tensor([e.value for e in examples[:120]])
    return _split("regression", examples, mean=float(values.mean()), std=float(values.std(correction=0)))


def tagging_task(n: int = 200) -> TaskData:
    g = torch.Generator().manual_seed(0)
    names = ["O", "B-X", "I-X"]
    features, sentences = [], []
    for _ in range(n):
        tokens = _tokens(g)
        tokens[int(torch.randint(0, len(tokens), (1,), generator=g))] = 7
        tags = ["B-X" if t == 7 else "O" for t in tokens]
        features.append(tagging.Features([BOS, *tokens, EOS], [tagging.IGNORE, *(names.index(t) for t in tags),
                                                              tagging.IGNORE], list(range(1, len(tokens) + 1)),
                                         len(tokens)))
        sentences.append(tagging.Sentence([f"w{t}" for t in tokens], tags))
    return _split("tagging", features, names, {"dev": sentences[120:160], "eval": sentences[160:]})


def span_task(n: int = 200) -> TaskData:
    """A question (token 5) over a context that holds token 7 once, its answer."""
    g = torch.Generator().manual_seed(0)
    windows, questions = [], []
    for i in range(n):
        tokens = _tokens(g)
        at = int(torch.randint(0, len(tokens), (1,), generator=g))
        tokens[at] = 7
        words = [f"w{t}" for t in tokens]
        offsets, char = [], 0
        for word in words:
            offsets.append((char, char + len(word)))
            char += len(word) + 1
        context = " ".join(words)
        question = span_qa.Question(str(i), "w5", context, [span_qa.Answer("w7", offsets[at][0])])
        ids = [BOS, 5, EOS, *tokens, EOS]
        index = i - (0 if i < 120 else 120 if i < 160 else 160)  # each split's windows count its own questions
        windows.append(span_qa.Window(index, ids, [0, 0, 0] + [1] * (len(tokens) + 1),
                                      [None] * 3 + offsets + [None], 3 + at, 3 + at))
        questions.append(question)
    return _split("span_qa", windows, references={"dev": questions[120:160], "eval": questions[160:]},
                  unanswerable=False, max_answer_len=5)


def choice_task(n: int = 200, n_choices: int = 3) -> TaskData:
    g = torch.Generator().manual_seed(0)
    features = []
    for i in range(n):
        context, label = _tokens(g, 3, 6), i % n_choices
        ids = []
        for c in range(n_choices):
            ending = _tokens(g, 2, 4)
            if c == label:
                ending[0] = 7
            ids.append([BOS, *context, EOS, *ending, EOS])
        features.append(multiple_choice.Choices(ids, [[0] * (len(context) + 2) + [1] * (len(s) - len(context) - 2)
                                                      for s in ids], label))
    return _split("multiple_choice", features, n_choices=n_choices)


TYPE_TASKS = {"regression": (regression_task, "pearson", 0.8), "tagging": (tagging_task, "f1", 0.8),
              "span_qa": (span_task, "f1", 0.8), "multiple_choice": (choice_task, "accuracy", 0.8)}


@pytest.fixture(scope="module", params=list(TYPE_TASKS))
def typed_teacher(request, tmp_path_factory):
    """(task, metric, bar, a 4-layer teacher finetuned on it from scratch) of each type but classification."""
    make, metric, bar = TYPE_TASKS[request.param]
    task = make()
    cfg = dataclasses.replace(CFG, epochs=6, patience=6)
    torch.set_num_threads(1)
    _, teacher = run_variant("from_scratch", task, [metric], backbone(n_layers=4), cfg, IMPL, torch.device("cpu"), 0,
                             PAD, tmp_path_factory.mktemp("teacher"), "fp")
    return task, metric, bar, teacher


def test_a_student_of_every_type_learns_from_its_teacher_alone(tmp_path, typed_teacher):
    """A randomly initialised student with no gold labels (hard_weight 0) and no state loss learns the
    task from the teacher's soft targets only."""
    task, metric, bar, teacher = typed_teacher
    cfg = dataclasses.replace(DISTILL, init="random", hard_weight=0.0, hidden_weight=0.0, epochs=6, patience=6)
    torch.manual_seed(0)
    untrained = build_student(teacher, cfg, [])
    assert score_split(untrained, task, "eval", [metric], 32, PAD, torch.device("cpu"), IMPL)[0][metric] < bar
    result, student = distill_task(teacher, task, [], [metric], cfg, IMPL, torch.device("cpu"), 0, PAD, tmp_path, "fp")
    assert result.teacher["eval"][metric] > bar, result.teacher
    assert result.student["eval"][metric] > bar, (result.student, result.history)
    assert (result.confusion is not None) == (task.type in ("tagging", "multiple_choice"))  # words, endings
    assert set(result.history[0]) >= {"soft_loss", "train_loss"} and "hard_loss" not in result.history[0]
    assert result.history[-1]["soft_loss"] < result.history[0]["soft_loss"]


def test_every_loss_term_runs_for_every_type(tmp_path, typed_teacher):
    """The hard loss (the type's own), the hidden-state and Patient-KD losses (multiple choice: per choice
    sequence) on a student copied from the teacher; the student keeps most of the teacher's score."""
    task, metric, bar, teacher = typed_teacher
    cfg = dataclasses.replace(DISTILL, pkd_weight=1.0, hidden_layers="all", epochs=2)
    result, _ = distill_task(teacher, task, [], [metric], cfg, IMPL, torch.device("cpu"), 0, PAD, tmp_path, "fp")
    assert {"soft_loss", "hard_loss", "hidden_loss", "pkd_loss", "train_loss"} <= set(result.history[0])
    assert all(math.isfinite(v) for row in result.history for v in row.values())
    assert result.student["eval"][metric] > bar, (result.student, result.history)


def token_soft_loss(student, teacher, positions, temperature):
    """Tagging's soft loss at `positions`: its batch marks the others with the IGNORE label."""
    labels = torch.where(positions, 1, tagging.IGNORE)
    return TYPES["tagging"].soft_loss(student, teacher, {"labels": labels}, temperature)


def span_soft_loss(student, teacher, candidates, temperature):
    return TYPES["span_qa"].soft_loss(student, teacher, {"candidates": candidates}, temperature)


def test_token_soft_loss_averages_over_the_tagged_positions_only():
    torch.manual_seed(0)
    student, teacher = torch.randn(2, 4, 3), torch.randn(2, 4, 3)
    positions = torch.tensor([[False, True, True, False], [False, True, False, False]])
    by_position = [soft_loss(student[b, t][None], teacher[b, t][None], 2.0).item()
                   for b, t in positions.nonzero().tolist()]
    assert token_soft_loss(student, teacher, positions, 2.0).item() == pytest.approx(sum(by_position) / 3, rel=1e-5)
    other = student.clone()
    other[~positions] = 100.0  # padding, [bos], a word's later subwords: not read
    assert token_soft_loss(other, teacher, positions, 2.0).item() == pytest.approx(
        token_soft_loss(student, teacher, positions, 2.0).item(), rel=1e-6)
    same = teacher.clone()
    same[~positions] = -5.0
    assert token_soft_loss(same, teacher, positions, 3.0).item() == pytest.approx(0.0, abs=1e-6)
    none = torch.zeros(2, 4, dtype=torch.bool)
    zero = token_soft_loss(student.requires_grad_(), teacher, none, 2.0)
    assert zero.item() == 0.0 and zero.requires_grad


def test_span_soft_loss_is_the_kl_over_the_candidate_positions_of_start_and_end():
    student = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [9.0, -9.0], [0.5, 0.5]]])  # (1, T=4, start/end)
    teacher = torch.tensor([[[0.0, 1.0], [2.0, 0.0], [-9.0, 9.0], [0.0, 0.0]]])
    candidates = torch.tensor([[True, True, False, True]])  # position 2: a question token
    T = 2.0

    def by_hand(s, t):  # the KL of the softmaxes over positions 0, 1, 3 only
        keep = [0, 1, 3]
        p, q = torch.softmax(t[keep] / T, 0), torch.softmax(s[keep] / T, 0)
        return float((p * (p / q).log()).sum()) * T * T

    expected = (by_hand(student[0, :, 0], teacher[0, :, 0]) + by_hand(student[0, :, 1], teacher[0, :, 1])) / 2
    assert span_soft_loss(student, teacher, candidates, T).item() == pytest.approx(expected, rel=1e-5)
    same = teacher.clone()
    same[0, 2] = torch.tensor([50.0, -50.0])  # differs only where no answer can begin or end
    assert span_soft_loss(same, teacher, candidates, T).item() == pytest.approx(0.0, abs=1e-6)
    leaf = student.clone().requires_grad_()
    span_soft_loss(leaf, teacher, candidates, T).backward()
    assert torch.isfinite(leaf.grad).all() and (leaf.grad[0, 2] == 0).all()  # no nan from the masked positions
    every = torch.ones(1, 4, dtype=torch.bool)  # with every position a candidate: the plain soft loss, T^2 and all
    for t in (1.0, 3.0):
        assert masked_soft_loss(student[..., 0], teacher[..., 0], every, t).item() == pytest.approx(
            soft_loss(student[..., 0], teacher[..., 0], t).item(), rel=1e-5)


def test_regression_soft_loss_is_the_mse_of_the_scores_whatever_the_temperature():
    student, teacher = torch.tensor([[0.5], [-1.0]]), torch.tensor([[1.5], [-1.0]])
    for T in (1.0, 4.0):
        assert TYPES["regression"].soft_loss(student, teacher, {}, T).item() == pytest.approx(0.5)
    assert TYPES["regression"].soft_loss(teacher, teacher, {}, 2.0).item() == 0.0


def test_multiple_choice_soft_loss_is_over_a_questions_choices():
    student, teacher = torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([[0.0, 2.0, 0.0]])
    assert TYPES["multiple_choice"].soft_loss(student, teacher, {}, 2.0).item() == pytest.approx(
        soft_loss(student, teacher, 2.0).item())
    assert TYPES["multiple_choice"].soft_loss(teacher + 3.0, teacher, {}, 2.0).item() == pytest.approx(0.0, abs=1e-6)


def test_teacher_outputs_of_per_token_and_choice_types():
    """Tagging: per example (T_i, n_tags), its length only; multiple choice: per example (n_choices,) scores, and
    the states per choice sequence, each cropped to that sequence's length."""
    task = tagging_task(20)
    teacher = TaskModel(backbone(n_layers=2), HeadConfig(3, "tokens", block=False, dropout=0.0)).eval()
    cache = teacher_outputs(teacher, task, task.train, [2], [1], 8, PAD, torch.device("cpu"), IMPL)
    one = task.train[3]
    ids = torch.tensor([one.ids])
    with torch.no_grad():
        logits, _ = teacher(ids, torch.zeros_like(ids), torch.ones_like(ids, dtype=torch.bool))
    assert cache.logits[3].shape == (len(one.ids), 3)
    torch.testing.assert_close(cache.logits[3], logits[0], atol=1e-5, rtol=1e-5)
    assert cache.hidden[3].shape == (1, len(one.ids), 32) and cache.summary.shape == (20, 1, 32)

    task = choice_task(10)
    teacher = TaskModel(backbone(n_layers=2), HeadConfig(1, "token", block=False, dropout=0.0)).eval()
    cache = teacher_outputs(teacher, task, task.train, [2], [1], 4, PAD, torch.device("cpu"), IMPL)
    assert len(cache.logits) == 10 and cache.logits[0].shape == (3,)
    assert len(cache.hidden) == 30 and cache.summary.shape == (30, 1, 32)
    q = task.train[4]
    for c in range(3):
        ids = torch.tensor([q.ids[c]])
        with torch.no_grad():
            score, (_, states) = teacher(ids, torch.tensor([q.segments[c]]), torch.ones_like(ids, dtype=torch.bool),
                                         output_hidden_states=True)
        torch.testing.assert_close(cache.logits[4][c], score[0, 0], atol=1e-5, rtol=1e-5)
        assert cache.hidden[4 * 3 + c].shape == (1, len(q.ids[c]), 32)
        torch.testing.assert_close(cache.summary[4 * 3 + c, 0], states[1][0, 0], atol=1e-5, rtol=1e-5)


def test_unlabeled_transfer_text_is_for_classification_only(tmp_path):
    task = regression_task(200)
    teacher = TaskModel(backbone(n_layers=2), HeadConfig(1, "token", block=False, dropout=0.0))
    with pytest.raises(UserError, match=r"distill.unlabeled.toy"):
        distill_task(teacher, task, [Example([BOS, 9, EOS], [0, 0, 0], UNLABELED)], ["pearson"], DISTILL, IMPL,
                     torch.device("cpu"), 0, PAD, tmp_path, "fp")
    tasks = {"sts": TaskConfig(source="glue/stsb", type="regression"), "sst": TaskConfig(source="glue/sst2")}
    check_tasks(Params(corpora=None, tasks=tasks, distill=DistillConfig(unlabeled={"sst": "unsupervised"})))
    with pytest.raises(ParamsError, match=r"distill.unlabeled.sts: 'test' names unlabeled text for a regression"):
        check_tasks(Params(corpora=None, tasks=tasks, distill=DistillConfig(unlabeled={"sts": "test"})))


def test_the_stage_distils_a_regression_task_in_its_teachers_units(tmp_path):
    """distill_runs.distill_once on a regression task read from a source folder: the task is read as
    its type reads it, the student learns in the teacher's target scale (the teacher's saved info wins
    over a recomputed one) and is saved with the type and that info; a teacher of another type is refused."""
    g, vocabulary = torch.Generator().manual_seed(0), tasktype_helpers.WORDS
    for split, n in (("train", 150), ("validation", 30)):
        rows = []
        for _ in range(n):
            words = [vocabulary[int(i)] for i in torch.randint(0, len(vocabulary), (6,), generator=g)]
            score = float(torch.randint(0, 4, (1,), generator=g))
            words[:int(score)] = ["king"] * int(score)
            rows.append({"sentence1": " ".join(words), "sentence2": "the city", "label": score})
        write_jsonl_gz(tmp_path / "sts" / f"{split}.jsonl.gz", rows)
    task_cfg = TaskConfig(source=str(tmp_path / "sts"), type="regression", text_field="sentence1",
                          text_pair_field="sentence2", max_len=24, metrics=["pearson"])
    tokenizer, special = tasktype_helpers.trained("bpe", tmp_path / "tokenizer")
    params = Params(corpora=None, tasks={"sts": task_cfg}, finetune=FinetuneConfig(tasks=["sts"]), impl=IMPL,
                    distill=dataclasses.replace(DISTILL, tasks=["sts"], epochs=2))
    task = TYPES["regression"].load("sts", task_cfg, tokenizer, special, dev_fraction=0.1, dev_max=100)
    teacher = TaskModel(backbone(n_layers=2, vocab_size=tokenizer.get_vocab_size(), max_positions=32),
                         HeadConfig(1, "token", block=False, dropout=0.0))
    saved_info = {**task.info, "mean": task.info["mean"] + 0.25}  # as if the teacher had learnt another scale
    meta = {"task": "sts", "type": "regression", "info": saved_info, "label_names": [], "variant": "plain", "seed": 0,
            "encoding": {"max_len": 24}}
    save_task_model(teacher, tmp_path / "teacher", tmp_path / "tokenizer", meta)
    teacher, info = load_task_model(tmp_path / "teacher")
    result = distill_runs.distill_once("sts", task_cfg, teacher, info, tmp_path / "teacher", params,
                                         torch.device("cpu"), tmp_path / "ckpt", "fp", tracking.StageRun(), Context())
    assert result.transfer == {"labeled": len(task.train), "unlabeled": 0} and result.confusion is None
    assert math.isfinite(result.student["dev"]["pearson"])
    saved = json.loads((tmp_path / "ckpt" / "student" / "classifier.json").read_text())
    assert saved["type"] == "regression" and saved["info"] == pytest.approx(saved_info)
    student, _ = load_task_model(tmp_path / "ckpt" / "student")
    assert student.backbone.cfg.n_layers == DISTILL.layers
    assert distill_runs.summarise(result, ["pearson"], info)["metric"] == "pearson"

    with pytest.raises(UserError, match=r"tasks.sts.type: regression, but the teacher .* was finetuned as "
                                        r"classification"):
        distill_runs.distill_once("sts", task_cfg, teacher, {**info, "type": "classification"}, tmp_path / "teacher",
                                    params, torch.device("cpu"), tmp_path / "ckpt2", "fp", tracking.StageRun(),
                                    Context())

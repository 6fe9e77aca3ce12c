"""Every task type through the finetune loop: read from a local folder (bad rows skipped and counted,
dev hashed out of train), trained by lib.training.variants.run_variant's plain, ulmfit and frozen variants on a
tiny backbone, and scored on its evaluation split with its own metrics, far above what guessing gets."""
from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
import torch

from lib.config.params import (ElmoConfig, FinetuneConfig, FromScratchConfig, ImplConfig, PlainConfig, TaskConfig,
                               UlmfitConfig)
from lib.models.architectures import build_model
from lib.models.config import TransformerConfig
from lib.tasks import TYPES, task_metrics
from lib.training.variants import run_variant
from tests.tasktype_helpers import WORDS, one_thread, trained  # noqa: F401

CITIES, PEOPLE = ["Paris", "Normandy"], ["Rollo"]
PLAIN = [w for w in WORDS if w not in CITIES + PEOPLE]
CFG = FinetuneConfig(tasks=[], variants=["plain"], epochs=4, batch_size=16, plain=PlainConfig(lr=3e-3),
                     ulmfit=UlmfitConfig(lr=1e-2, unfreeze_every=4), from_scratch=FromScratchConfig(lr=3e-3),
                     elmo=ElmoConfig(lr=1e-2), dev_fraction=0.2, dev_max=60, head_hidden=16, head_dropout=0.0,
                     patience=4)
IMPL = ImplConfig(precision="fp32", compile=False)


def sentence(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(PLAIN) for _ in range(n)]


def tagging_row(rng: random.Random) -> dict:
    words = sentence(rng, rng.randint(3, 8))
    tags = ["O"] * len(words)
    for i in rng.sample(range(len(words)), 2):
        name = rng.choice(CITIES + PEOPLE)
        words[i], tags[i] = name, "B-PER" if name in PEOPLE else "B-LOC"
    return {"tokens": words, "ner_tags": tags}


def span_row(rng: random.Random, n: int) -> dict:
    words = sentence(rng, 12)
    at = rng.randrange(len(words))
    words[at] = rng.choice(CITIES)
    context = " ".join(words)
    start = len(" ".join(words[:at])) + (1 if at else 0)
    return {"id": f"q{n}", "question": "which city", "context": context,
            "answers": {"text": [words[at]], "answer_start": [start]}}


def regression_row(rng: random.Random) -> dict:
    kings = rng.randint(0, 4)
    b = sentence(rng, 4) + ["king"] * kings
    rng.shuffle(b)
    return {"a": " ".join(sentence(rng, 4)), "b": " ".join(b), "score": float(kings)}


def choice_row(rng: random.Random) -> dict:
    endings = [" ".join(sentence(rng, 3)) for _ in range(4)]
    label = rng.randrange(4)
    endings[label] += " king"
    return {"start": " ".join(sentence(rng, 5)), "endings": endings, "label": label}


# type: (row maker, a malformed row and the reason it is skipped for, TaskConfig fields, chance score)
TYPES_UNDER_TEST = {
    "tagging": (lambda rng, n: tagging_row(rng), ({"tokens": ["a", "b"], "ner_tags": ["O"]}, "length_mismatch"),
                dict(text_field="tokens", label_field="ner_tags"), 0.0),
    "span_qa": (span_row, ({"id": "bad", "question": "which city", "context": "no city here",
                            "answers": {"text": ["Paris"], "answer_start": [0]}}, "no_answer_left"),
                dict(text_field="question", text_pair_field="context", label_field="answers", max_len=24, stride=8,
                     max_question_len=4), 0.0),
    "regression": (lambda rng, n: regression_row(rng), ({"a": "x y", "b": "y z", "score": "n/a"}, "label_not_a_number"),
                   dict(text_field="a", text_pair_field="b", label_field="score"), 0.0),
    "multiple_choice": (lambda rng, n: choice_row(rng), ({"start": "x", "endings": ["a", "b"], "label": 0}, "n_choices"),
                        dict(text_field="start", text_pair_field="endings", label_field="label"), 0.25),
}


def write_split(folder: Path, split: str, rows: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / f"{split}.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


def task_config(task_type: str, folder: Path) -> TaskConfig:
    cfg = TaskConfig(source=str(folder), type=task_type, **{"max_len": 32, **TYPES_UNDER_TEST[task_type][2]})
    cfg.validate(f"tasks.{task_type}")
    return cfg


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return trained("bpe", tmp_path_factory.mktemp("tok") / "bpe")


@pytest.mark.parametrize("task_type", list(TYPES_UNDER_TEST))
def test_each_type_reads_counts_bad_rows_and_learns(tmp_path, tokenizer, one_thread, task_type):
    make, (bad, reason), _, chance = TYPES_UNDER_TEST[task_type]
    rng = random.Random(0)
    folder = tmp_path / task_type
    write_split(folder, "train", [make(rng, n) for n in range(240)] + [bad])
    write_split(folder, "validation", [make(rng, 1000 + n) for n in range(80)])
    cfg = task_config(task_type, folder)
    tok, special = tokenizer
    kind = TYPES[task_type]
    task = kind.load(task_type, cfg, tok, special, dev_fraction=CFG.dev_fraction, dev_max=CFG.dev_max, max_train=150)
    assert task.skipped[f"train.{reason}"] == 1 and task.type == task_type
    assert task.eval is not None and len(task.references["eval"] or task.eval) == 80
    torch.manual_seed(0)
    backbone = build_model(TransformerConfig(vocab_size=tok.get_vocab_size(), d_model=32, n_layers=1, n_heads=2,
                                             d_ff=64, dropout=0.0, max_positions=32))
    for variant in ("plain", "ulmfit", "frozen"):
        result, model = run_variant(variant, task, task_metrics(cfg), backbone, CFG, IMPL, torch.device("cpu"), 1,
                                    special["pad"], tmp_path / f"ck-{variant}", "fp")
        assert set(result.eval) == set(task_metrics(cfg))
        assert (result.confusion is not None) == (task_type in ("tagging", "multiple_choice"))  # words, endings
        assert result.eval[task_metrics(cfg)[0]] > chance + 0.3, (variant, result.eval, result.history)


def test_the_same_examples_land_in_dev_whatever_the_train_limit(tmp_path, tokenizer):
    """Dev is carved by a hash of each item's text (of a QA item: its context, so no paragraph is on
    both sides), not by position: a smaller train subset leaves dev as it was."""
    rng = random.Random(1)
    folder = tmp_path / "qa"
    rows = [span_row(rng, n) for n in range(60)]
    rows += [{**row, "id": f"{row['id']}-again", "question": "which city again"} for row in rows[:30]]
    write_split(folder, "train", rows)
    write_split(folder, "validation", rows[:5])
    cfg = TaskConfig(source=str(folder), type="span_qa", text_field="question", text_pair_field="context",
                     label_field="answers", max_len=24, stride=8, max_question_len=4)
    tok, special = tokenizer
    full = TYPES["span_qa"].load("qa", cfg, tok, special, dev_fraction=0.3, dev_max=100)
    small = TYPES["span_qa"].load("qa", cfg, tok, special, dev_fraction=0.3, dev_max=100, max_train=10)
    assert [q.id for q in full.references["dev"]] == [q.id for q in small.references["dev"]]
    assert small.size("train") == 10 < full.size("train") and len(small.train) >= 10  # questions; windows
    dev_contexts = {q.context for q in full.references["dev"]}
    assert dev_contexts and not dev_contexts & {q.context for q in full.references["train"]}


@pytest.mark.parametrize("task_type", list(TYPES_UNDER_TEST))
def test_a_causal_model_takes_each_shape(tmp_path, tokenizer, one_thread, task_type):
    """GPT-1's recipe: sequence-level types read the last real token's state, per-token types every
    position's (which sees only what is left of it)."""
    make, _, _, chance = TYPES_UNDER_TEST[task_type]
    rng = random.Random(2)
    folder = tmp_path / task_type
    write_split(folder, "train", [make(rng, n) for n in range(240)])
    write_split(folder, "validation", [make(rng, 1000 + n) for n in range(80)])
    cfg = task_config(task_type, folder)
    tok, special = tokenizer
    task = TYPES[task_type].load(task_type, cfg, tok, special, dev_fraction=CFG.dev_fraction, dev_max=CFG.dev_max,
                                 max_train=150, causal=True)
    torch.manual_seed(0)
    backbone = build_model(TransformerConfig(vocab_size=tok.get_vocab_size(), d_model=32, n_layers=1, n_heads=2,
                                             d_ff=64, dropout=0.0, max_positions=32, causal=True))
    result, _ = run_variant("plain", task, task_metrics(cfg), backbone, CFG, IMPL, torch.device("cpu"), 1, special["pad"],
                            tmp_path / "ck", "fp")
    assert result.eval[task_metrics(cfg)[0]] > chance + 0.3, (result.eval, result.history)

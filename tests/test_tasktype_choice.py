"""SWAG-style multiple choice: malformed rows are counted skips, each question's choices are encoded as
lib.data.encoding pairs and batched as (B, n_choices, T), and the loss makes the choices compete."""
from __future__ import annotations

import pytest
import torch

from lib.data.encoding import encode as encode_texts
from lib.metrics.scores import choice_accuracy
from lib.tasks.multiple_choice import TYPE, Question, collate, encode, loss, read_rows
from tests.tasktype_helpers import bpe_on, fit_on_one_batch, one_thread, toy_task  # noqa: F401

SPECIAL = {"pad": 0, "unk": 1, "bos": 2, "eos": 3, "mask": 4}
WORDS = "the chicken cannot fly it he she went home crosses road flies sold couches dog days of summer".split()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return bpe_on(WORDS, tmp_path_factory.mktemp("choice") / "tokenizer")


def row(endings: list | str = ("flies", "crosses the road", "sold couches", "went home"), label=1,
        context: str | None = "The chicken cannot fly. It") -> dict:
    return {"startphrase": context, "endings": list(endings) if isinstance(endings, tuple) else endings,
            "label": label}


def test_malformed_rows_are_counted_skips():
    rows = [row(), row(endings=["flies", "went home"]), row(label=4), row(label=-1), row(label="1"),
            row(label=True), row(label=None), row(endings="flies"), row(context=" "),
            row(endings=["flies", "", "sold couches", "went home"]), row(label=3)]
    items, skipped = read_rows(rows)
    assert [item.label for item in items] == [1, 3]
    assert items[0] == Question("The chicken cannot fly. It", ["flies", "crosses the road", "sold couches",
                                                                "went home"], 1)
    assert skipped == {"n_choices": 1, "label_out_of_range": 2, "label_not_an_int": 3, "endings_not_a_list": 1,
                       "empty_text": 2}


def test_n_choices_comes_from_the_first_row_or_is_given():
    three = row(endings=["a", "b", "c"], label=2)
    assert read_rows([three, row()])[1] == {"n_choices": 1}  # the first row sets 3
    items, skipped = read_rows([three, row()], n_choices=4)
    assert len(items) == 1 and len(items[0].endings) == 4 and skipped == {"n_choices": 1}


def test_choices_are_pairs_grouped_and_padded(tokenizer):
    items = [Question("the chicken cannot fly it", ["flies", "crosses the road", "sold couches", "went home"], 1),
             Question("the dog", ["went home", "flies", "sold the couches of summer days", "crosses"], 2),
             Question("she", ["flies", "sold", "went", "crosses the road home"], 3)]
    features, truncated = encode(items, tokenizer, SPECIAL, 64, "head")
    assert truncated == 0 and [f.label for f in features] == [1, 2, 3]
    for item, feature in zip(items, features):
        ids, segments, _ = encode_texts(tokenizer, [item.context] * 4, item.endings, 64, "head", 2, 3)
        assert feature.ids == ids and feature.segments == segments  # [bos] context [eos] ending [eos]
    batch = collate(features, pad_id=SPECIAL["pad"])
    width = max(len(seq) for f in features for seq in f.ids)
    for name in ("input_ids", "segment_ids", "attention_mask"):
        assert batch[name].shape == (3, 4, width)
    assert batch["attention_mask"].dtype == torch.bool and batch["labels"].tolist() == [1, 2, 3]
    for b, feature in enumerate(features):
        for c, ids in enumerate(feature.ids):
            assert batch["input_ids"][b, c, :len(ids)].tolist() == ids
            assert (batch["input_ids"][b, c, len(ids):] == SPECIAL["pad"]).all()
            assert batch["attention_mask"][b, c].sum().item() == len(ids)
    assert encode(items, tokenizer, SPECIAL, 6, "head")[1] > 0  # sequences cut to max_len are counted


def test_the_gradient_raises_the_right_choice_and_lowers_the_others():
    scores = torch.zeros(2, 4, requires_grad=True)
    batch = {"labels": torch.tensor([2, 0])}
    value = loss(scores, batch)
    assert value.item() == pytest.approx(torch.log(torch.tensor(4.0)).item())  # uniform over 4 choices
    value.backward()
    descent = -scores.grad
    for b, label in enumerate(batch["labels"].tolist()):
        assert descent[b, label] > 0
        assert all(descent[b, c] < 0 for c in range(4) if c != label)


def test_a_tiny_backbone_with_the_head_learns_the_right_endings(tokenizer, one_thread):
    """The type's forward runs the encoder over the (B * n_choices, T) flattened batch and views the
    scores back as (B, n_choices): a few steps fit three questions exactly."""
    items = [Question("the chicken cannot fly it", ["flies", "crosses the road", "sold couches", "went home"], 1),
             Question("the dog", ["went home", "flies", "sold the couches", "crosses"], 2),
             Question("she", ["flies", "sold", "went", "crosses the road home"], 0)]
    features, _ = encode(items, tokenizer, SPECIAL, 64, "head")
    task = toy_task("multiple_choice", features)
    scores = fit_on_one_batch(tokenizer.get_vocab_size(), task, collate(features, SPECIAL["pad"]), steps=30)
    assert scores.shape == (3, 4)
    predictions = TYPE.predict(scores, features, task)
    assert choice_accuracy(predictions, [1, 2, 0]) == 1.0


def test_a_malformed_first_row_does_not_set_the_number_of_choices():
    rows = [{"startphrase": "a", "endings": ["x", "y", "z"], "label": 0}] + [
        {"startphrase": "b", "endings": ["w", "x", "y", "z"], "label": 1}] * 3
    items, skipped = read_rows(rows)
    assert len(items) == 3 and skipped == {"n_choices": 1}

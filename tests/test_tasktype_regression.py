"""STS-B-style regression: bad labels are counted skips, the pair layout is lib.data.encoding's, batches pad to
their longest example, the head predicts around the train mean, and correlations of perfect predictions."""
from __future__ import annotations

import math

import pytest
import torch

from lib.config.errors import UserError
from lib.data.encoding import encode as encode_texts
from lib.metrics.scores import pearson, spearman
from lib.tasks.regression import TYPE, Scored, collate, encode, read_rows, target_scale
from tests.tasktype_helpers import bpe_on, fit_on_one_batch, one_thread, toy_task  # noqa: F401

SPECIAL = {"pad": 0, "unk": 1, "bos": 2, "eos": 3, "mask": 4}
WORDS = "a man woman is playing the guitar flute dog runs on grass cat sleeps sofa".split()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return bpe_on(WORDS, tmp_path_factory.mktemp("regression") / "tokenizer")


def row(label, a: str = "a man is playing", b: str = "a man plays") -> dict:
    return {"sentence1": a, "sentence2": b, "label": label}


def test_bad_labels_are_counted_not_raised():
    rows = [row(3.8), row("2.5"), row(4), row("high"), row(None), row(math.nan), row("nan"), row(True),
            row([1.0]), row(10**400), row(-1), row(1.0, b="  ")]
    items, skipped = read_rows(rows)
    assert items == [Scored("a man is playing", "a man plays", v) for v in (3.8, 2.5, 4.0)]
    assert skipped == {"label_not_a_number": 3, "label_missing": 1, "label_not_finite": 3, "unlabeled": 1,
                       "empty_text": 1}
    # -1 is a score where the scale allows it
    assert [item.value for item in read_rows([row(-1)], unlabeled=None)[0]] == [-1.0]


def test_encode_is_the_pair_layout_of_lib_tasks(tokenizer):
    items = [Scored("a man is playing the guitar", "a man plays", 3.0), Scored("a dog runs", "a cat sleeps", 0.5)]
    examples, truncated = encode(items, tokenizer, SPECIAL, 64, "head")
    ids, segments, _ = encode_texts(tokenizer, [i.a for i in items], [i.b for i in items], 64, "head", 2, 3)
    assert [e.ids for e in examples] == ids and [e.segments for e in examples] == segments
    assert [e.value for e in examples] == [3.0, 0.5] and truncated == 0
    assert encode(items, tokenizer, SPECIAL, 6, "head")[1] == 2


def test_collate_pads_to_the_longest_with_float_labels(tokenizer):
    items = [Scored("a man", "a dog", 1.0), Scored("a man is playing the guitar on the grass", "a cat", 4.5)]
    examples, _ = encode(items, tokenizer, SPECIAL, 64, "head")
    batch = collate(examples, pad_id=SPECIAL["pad"])
    width = max(len(e.ids) for e in examples)
    assert batch["input_ids"].shape == batch["segment_ids"].shape == batch["attention_mask"].shape == (2, width)
    assert batch["labels"].dtype == torch.float32 and batch["labels"].tolist() == [1.0, 4.5]
    short = len(examples[0].ids)
    assert batch["attention_mask"][0].tolist() == [True] * short + [False] * (width - short)
    assert (batch["input_ids"][0, short:] == SPECIAL["pad"]).all()


def test_the_output_is_a_standardised_score():
    """The model's output is a standardised score: 0 is the train mean, 1 one std above it, and the
    loss is the MSE in those units."""
    items = [Scored("a", "b", v) for v in (1.0, 2.0, 3.0, 4.0, 5.0)]
    mean, std = target_scale(items, "tasks.stsb")
    assert (mean, std) == pytest.approx((3.0, math.sqrt(2.0)))
    task = toy_task("regression", [], mean=mean, std=std)
    standardised = torch.tensor([[-1.5], [0.0], [2.0]])
    assert TYPE.predict(standardised, [], task) == pytest.approx((standardised[:, 0] * std + mean).tolist())
    batch = {"labels": standardised[:, 0] * std + mean}
    assert TYPE.loss(standardised, batch, task).item() == pytest.approx(0.0, abs=1e-12)
    assert TYPE.loss(standardised + 1.0, batch, task).item() == pytest.approx(1.0)


def test_constant_targets_are_a_user_error():
    with pytest.raises(UserError, match="tasks.stsb: every train label is 2.0"):
        target_scale([Scored("a", "b", 2.0)] * 3, "tasks.stsb")


def test_perfect_predictions_correlate_fully():
    labels = [0.0, 1.2, 3.4, 5.0]
    assert pearson(labels, labels) == pytest.approx(1.0)
    assert spearman(labels, labels) == pytest.approx(1.0)


def test_a_tiny_backbone_with_the_head_fits_the_scores(tokenizer, one_thread):
    """The head on a real backbone's [bos] state: a few steps fit four pairs' scores closely."""
    items = [Scored("a man is playing the guitar", "a man plays the guitar", 4.8),
             Scored("a dog runs on the grass", "a cat sleeps on the sofa", 0.4),
             Scored("a woman is playing the flute", "a man is playing the guitar", 1.6),
             Scored("a cat sleeps", "the cat sleeps on a sofa", 3.5)]
    examples, _ = encode(items, tokenizer, SPECIAL, 64, "head")
    mean, std = target_scale(items, "tasks.stsb")
    task = toy_task("regression", examples, mean=mean, std=std)
    outputs = fit_on_one_batch(tokenizer.get_vocab_size(), task, collate(examples, SPECIAL["pad"]), steps=80)
    assert TYPE.predict(outputs, examples, task) == pytest.approx([item.value for item in items], abs=0.3)

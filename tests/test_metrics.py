"""Scoring: classification, multiple choice, tagging (against seqeval), SQuAD (hand-computed), correlations
(against scipy)."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
import scipy.stats
import seqeval.metrics
import torch

from lib.metrics.scores import (apply_no_answer_threshold, best_no_answer_threshold, choice_accuracy, compute_metrics,
                                entity_scores, entity_spans, exact_match, normalize_answer, pearson, spearman, squad_scores,
                                token_f1)


# compute_metrics ------------------------------------------------------------------------------------

def test_binary_metrics_from_a_known_confusion_matrix():
    labels = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
    predictions = [1, 1, 1, 0, 1, 1, 0, 0, 0, 0]  # tp 3, fn 1, fp 2, tn 4
    metrics = compute_metrics(["accuracy", "f1", "mcc"], predictions, labels, 2)
    assert metrics == pytest.approx({"accuracy": 0.7, "f1": 6 / 9, "mcc": (3 * 4 - 2 * 1) / math.sqrt(5 * 4 * 6 * 5)})
    assert compute_metrics(["mcc"], torch.tensor(labels), torch.tensor(labels), 2) == {"mcc": 1.0}
    inverted = [1 - y for y in labels]
    assert compute_metrics(["mcc", "f1"], inverted, labels, 2) == pytest.approx({"mcc": -1.0, "f1": 0.0})


def test_constant_prediction_has_mcc_zero():
    labels = [0, 1, 1, 0, 1]
    assert compute_metrics(["accuracy", "f1", "mcc"], [1] * 5, labels, 2) == pytest.approx(
        {"accuracy": 0.6, "f1": 0.75, "mcc": 0.0})
    assert compute_metrics(["f1", "mcc"], [0] * 5, labels, 2) == {"f1": 0.0, "mcc": 0.0}


def test_multiclass_metrics():
    labels, predictions = [0, 0, 1, 1, 2, 2], [0, 1, 1, 1, 2, 0]  # confusion [[1,1,0],[0,2,0],[1,0,1]]
    metrics = compute_metrics(["accuracy", "f1", "mcc"], predictions, labels, 3)
    macro_f1 = (2 / 4 + 4 / 5 + 2 / 3) / 3
    mcc = (4 * 6 - (2 * 2 + 2 * 3 + 2 * 1)) / math.sqrt((36 - (4 + 9 + 1)) * (36 - 12))
    assert metrics == pytest.approx({"accuracy": 4 / 6, "f1": macro_f1, "mcc": mcc})
    # a class absent from labels and predictions does not drag the macro average down
    assert compute_metrics(["f1"], [0, 1, 0], [0, 1, 0], 4) == {"f1": 1.0}


def test_bad_metric_inputs():
    with pytest.raises(ValueError, match="unknown metric"):
        compute_metrics(["auc"], [0], [0], 2)
    with pytest.raises(ValueError, match="same length"):
        compute_metrics(["accuracy"], [0, 1], [0], 2)
    with pytest.raises(ValueError, match="0..1"):
        compute_metrics(["accuracy"], [0, 2], [0, 1], 2)


# multiple choice ------------------------------------------------------------------------------------

def test_choice_accuracy_takes_the_first_of_tied_choices():
    scores = [[0.1, 0.7, 0.2], [0.3, 0.3, 0.1], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]  # argmax 1, 0 (tie), 2, 0
    assert choice_accuracy(scores, [1, 1, 2, 1]) == 0.5
    assert choice_accuracy(torch.tensor(scores), torch.tensor([1, 0, 2, 0])) == 1.0
    with pytest.raises(ValueError, match="examples, choices"):
        choice_accuracy([0.1, 0.9], [1])
    with pytest.raises(ValueError, match="0..2"):
        choice_accuracy(scores, [1, 1, 3, 1])


# token tagging --------------------------------------------------------------------------------------

def test_entity_spans_read_ill_formed_sequences_as_conlleval():
    assert entity_spans(["B-PER", "I-PER", "O", "B-LOC"]) == {("PER", 0, 1), ("LOC", 3, 3)}
    assert entity_spans(["I-PER", "I-PER", "O"]) == {("PER", 0, 1)}  # an I-X without B-X starts one
    assert entity_spans(["B-PER", "I-LOC", "I-LOC"]) == {("PER", 0, 0), ("LOC", 1, 2)}  # I-Y after B-X: a new one
    assert entity_spans(["B-PER", "B-PER", "I-PER"]) == {("PER", 0, 0), ("PER", 1, 2)}
    assert entity_spans(["O", "I-MISC", "B-MISC", "I-MISC", "I-ORG"]) == {
        ("MISC", 1, 1), ("MISC", 2, 3), ("ORG", 4, 4)}
    assert entity_spans(["B-I-X", "I-I-X"]) == {("I-X", 0, 1)}  # the type is all after the first "-"
    assert entity_spans([]) == set() and entity_spans(["O", "O"]) == set()
    for bad in ("X", "B-", "E-PER", "b-PER"):
        with pytest.raises(ValueError, match="not IOB2"):
            entity_spans(["O", bad])


def test_entity_scores_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    predicted = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "I-ORG"]]  # PER right; LOC missed; ORG twice wrong
    # gold 3 entities, predicted 3, 1 right: the ORG of sentence 2 has the wrong end
    assert_same_scores(entity_scores(gold, predicted), {
        "f1": 1 / 3, "precision": 1 / 3, "recall": 1 / 3, "per_type": {"LOC": 0.0, "ORG": 0.0, "PER": 1.0}})
    assert entity_scores([["O"]], [["O"]]) == {"f1": 0.0, "precision": 0.0, "recall": 0.0, "per_type": {}}
    with pytest.raises(ValueError, match="1 gold sequences but 2"):
        entity_scores([["O"]], [["O"], ["O"]])
    with pytest.raises(ValueError, match="sequence 0: 1 gold tags but 2"):
        entity_scores([["O"]], [["O", "O"]])


def assert_same_scores(ours: dict, expected: dict):
    """entity_scores' dicts equal up to rounding (pytest.approx compares no nested dicts)."""
    assert {k: v for k, v in ours.items() if k != "per_type"} == pytest.approx(
        {k: v for k, v in expected.items() if k != "per_type"})
    assert ours["per_type"] == pytest.approx(expected["per_type"])


def seqeval_scores(gold: list[list[str]], predicted: list[list[str]]) -> dict:
    """entity_scores' dict from seqeval in its default (conlleval) mode."""
    report = seqeval.metrics.classification_report(gold, predicted, output_dict=True, zero_division=0)
    return {"f1": seqeval.metrics.f1_score(gold, predicted, zero_division=0),
            "precision": seqeval.metrics.precision_score(gold, predicted, zero_division=0),
            "recall": seqeval.metrics.recall_score(gold, predicted, zero_division=0),
            "per_type": {kind: values["f1-score"] for kind, values in report.items() if not kind.endswith(" avg")}}


EDGE_CASES = [  # (gold, predicted): ill-formed predictions, boundaries, types only on one side
    ([["B-PER", "I-PER", "O"]], [["I-PER", "I-PER", "O"]]),
    ([["B-PER", "I-PER", "O"]], [["B-PER", "I-LOC", "O"]]),
    ([["B-PER", "B-PER"]], [["B-PER", "I-PER"]]),
    ([["O", "B-LOC", "I-LOC"]], [["O", "I-LOC", "I-LOC"]]),
    ([["B-LOC", "I-LOC", "I-LOC"]], [["B-LOC", "I-LOC", "B-LOC"]]),
    ([["B-MISC"], ["I-MISC"]], [["B-MISC"], ["B-MISC"]]),  # an entity ends with its sentence
    ([["B-ORG", "I-ORG", "I-PER", "O"]], [["B-ORG", "I-ORG", "I-PER", "O"]]),
    ([["O", "O"]], [["B-ORG", "O"]]),
    ([["B-ORG", "O"]], [["O", "O"]]),
]


@pytest.mark.parametrize("gold, predicted", EDGE_CASES)
def test_entity_scores_equal_seqeval_on_edge_cases(gold, predicted):
    assert_same_scores(entity_scores(gold, predicted), seqeval_scores(gold, predicted))


def test_entity_scores_equal_seqeval_on_random_sequences():
    rng = random.Random(0)
    tags = ["O"] + [f"{prefix}-{kind}" for prefix in "BI" for kind in ("PER", "LOC", "ORG", "MISC")]

    def noisy(sequence: list[str]) -> list[str]:  # mostly the gold tags, so the scores spread over 0..1
        return [rng.choice(tags) if rng.random() < 0.3 else tag for tag in sequence]

    for _ in range(40):  # 40 corpora of 10 sentences: 400 random sentences
        gold = [[rng.choice(tags) for _ in range(rng.randint(1, 15))] for _ in range(10)]
        predicted = [noisy(sequence) for sequence in gold]
        assert_same_scores(entity_scores(gold, predicted), seqeval_scores(gold, predicted))


# extractive QA --------------------------------------------------------------------------------------

def test_squad_answer_normalization_and_scores_by_hand():
    assert normalize_answer("The  Cat!") == "cat" and normalize_answer("an apple, a day") == "apple day"
    assert normalize_answer("theatre") == "theatre"  # articles are whole words only
    assert exact_match("The Cat!", "cat") == 1.0 and exact_match("cats", "cat") == 0.0
    # [big, cat, sat] vs [cat, sat, down]: 2 in common, precision 2/3, recall 2/3
    assert token_f1("the big cat sat", "a cat sat down") == pytest.approx(2 / 3)
    assert token_f1("cat cat", "cat") == pytest.approx(2 * (1 / 2) * 1 / (1 / 2 + 1))  # a bag: one cat in common
    assert token_f1("dog", "cat") == 0.0
    # "" is no answer: right only against no answer; "The" normalizes to nothing and so reads as no answer
    assert exact_match("", "") == token_f1("", "") == token_f1("The", "") == 1.0
    assert exact_match("", "cat") == token_f1("", "cat") == token_f1("cat", "") == 0.0


def test_squad_scores_take_the_best_gold_and_split_answerable_questions():
    predictions = {"q1": "cat", "q2": "the big cat sat", "q3": "", "q4": "dog", "q5": "cat sat"}
    golds = {"q1": ["The Cat!", "cat"], "q2": ["a cat sat down"], "q3": [], "q4": [], "q5": ["the cat", "cat sat on"]}
    # per question (EM, F1): q1 (1, 1); q2 (0, 2/3); q3 (1, 1); q4 (0, 0);
    # q5 (0, 0.8): vs "cat" precision 1/2, recall 1, F1 2/3; vs "cat sat on" precision 1, recall 2/3, F1 0.8
    assert squad_scores(predictions, golds) == pytest.approx({
        "exact_match": 2 / 5, "f1": (1 + 2 / 3 + 1 + 0 + 0.8) / 5, "count": 5,
        "has_answer_exact_match": 1 / 3, "has_answer_f1": (1 + 2 / 3 + 0.8) / 3, "has_answer_count": 3,
        "no_answer_exact_match": 1 / 2, "no_answer_f1": 1 / 2, "no_answer_count": 2})
    # SQuAD 1.1: every question answerable, no NoAns group
    assert squad_scores({"q1": "a cat"}, {"q1": ["cat"]}) == {
        "exact_match": 1.0, "f1": 1.0, "count": 1, "has_answer_exact_match": 1.0, "has_answer_f1": 1.0,
        "has_answer_count": 1}
    # a gold answer that normalizes to nothing is dropped (SQuAD 2.0's script), so "" does not match it
    assert squad_scores({"q1": ""}, {"q1": ["The", "cat"]})["exact_match"] == 0.0
    with pytest.raises(ValueError, match=r"missing \['q2'\], unknown \['q3'\]"):
        squad_scores({"q1": "", "q3": ""}, {"q1": [], "q2": []})


def test_the_no_answer_threshold_by_hand():
    predictions = {"a": "cat", "b": "dog", "c": "red dog", "d": "sun"}  # the best non-null span of each
    golds = {"a": ["cat"], "b": [], "c": ["big red dog"], "d": []}  # c: EM 0, F1 0.8 (precision 1, recall 2/3)
    no_answer = {"a": -2.0, "b": -1.0, "c": -1.5, "d": 1.5}
    # all unanswered: b and d right, 2. Answering in ascending order a, c, b, d: EM totals 3, 3, 2, 1,
    # best 3 after a (τ = -2); F1 totals 3, 3.8, 2.8, 1.8, best 3.8 after c (τ = -1.5)
    best = best_no_answer_threshold(predictions, golds, no_answer)
    assert best == pytest.approx({"best_exact_match": 3 / 4, "best_exact_match_threshold": -2.0,
                                  "best_f1": 3.8 / 4, "best_f1_threshold": -1.5})
    final = apply_no_answer_threshold(predictions, no_answer, best["best_f1_threshold"])
    assert final == {"a": "cat", "b": "", "c": "red dog", "d": ""}
    assert squad_scores(final, golds)["f1"] == pytest.approx(best["best_f1"])
    final = apply_no_answer_threshold(predictions, no_answer, best["best_exact_match_threshold"])
    assert squad_scores(final, golds)["exact_match"] == pytest.approx(best["best_exact_match"])
    # answering nothing is best: the official script's threshold is then 0.0
    assert best_no_answer_threshold({"x": "a dog", "y": "cat"}, {"x": [], "y": []}, {"x": 0.3, "y": 0.7}) == {
        "best_exact_match": 1.0, "best_exact_match_threshold": 0.0, "best_f1": 1.0, "best_f1_threshold": 0.0}
    with pytest.raises(ValueError, match="one score for each question"):
        best_no_answer_threshold(predictions, golds, {"a": 0.0})


# regression -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(10))
def test_correlations_equal_scipy_on_data_with_ties(seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 6, 60).astype(np.float64)  # STS-B-like scores 0..5, many ties
    predictions = np.round(labels + rng.normal(0, 1.5, 60), 1)
    assert pearson(predictions, labels) == pytest.approx(scipy.stats.pearsonr(predictions, labels)[0])
    assert spearman(predictions, labels) == pytest.approx(scipy.stats.spearmanr(predictions, labels)[0])
    assert spearman(torch.tensor(predictions), labels.tolist()) == spearman(predictions, labels)


def test_correlation_edge_cases():
    assert pearson([1, 2, 3], [2, 4, 7]) < 1.0 == spearman([1, 2, 3], [2, 4, 7])
    assert spearman([3, 2, 1], [1, 5, 9]) == pytest.approx(-1.0)
    # constant input: undefined, 0.0; 0.1 is not exact in binary, so its mean differs from it in rounding
    assert pearson([0.1] * 7, range(7)) == spearman([0.1] * 7, range(7)) == pearson([1, 2], [3, 3]) == 0.0
    assert pearson([5.0], [1.0]) == 0.0
    with pytest.raises(ValueError, match="same length"):
        pearson([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="non-empty"):
        spearman([], [])

"""Scoring, as pure functions of predictions and gold labels; every score is a fraction, not a percent.

Each task type is scored the way its benchmark's reference does, so results compare with published ones:
- classification: `compute_metrics` gives accuracy, F1 and MCC from a confusion matrix;
- multiple choice: `choice_accuracy`, the accuracy of the highest-scored choice;
- token tagging (CoNLL-2003 NER): `entity_scores`, entity-level F1 as conlleval and seqeval's default mode;
- extractive QA (SQuAD 1.1 / 2.0): `squad_scores`, exact match and token F1 as the official evaluation
  script, and `best_no_answer_threshold` / `apply_no_answer_threshold` for SQuAD 2.0's no-answer threshold;
- regression (STS-B): `pearson` and `spearman`.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any, Sequence

import numpy as np
import torch


def compute_metrics(names: Sequence[str], predictions, labels, n_classes: int) -> dict[str, float]:
    """{name: value} for each of `names` (accuracy, f1, mcc), as fractions, not percent.

    f1 is the F1 of class 1 for a binary task (GLUE's MRPC convention) and the macro average over the
    classes that occur in labels or predictions otherwise (scikit-learn's default). mcc is Matthews'
    correlation in its multiclass form (Gorodkin 2004), equal to the usual one for two classes; 0 where
    it is undefined, e.g. a constant prediction."""
    unknown = [name for name in names if name not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric '{unknown[0]}'; known: {', '.join(METRICS)}")
    confusion = confusion_matrix(predictions, labels, n_classes)
    return {name: float(METRICS[name](confusion.astype(np.float64))) for name in names}


def confusion_matrix(predictions, labels, n_classes: int) -> np.ndarray:
    """n_classes x n_classes counts, rows = true class, columns = predicted class."""
    predicted, true = _as_array(predictions), _as_array(labels)
    if predicted.shape != true.shape or predicted.ndim != 1 or not len(true):
        raise ValueError(f"need two non-empty 1-D sequences of the same length, got {predicted.shape}, {true.shape}")
    if min(predicted.min(), true.min()) < 0 or max(predicted.max(), true.max()) >= n_classes:
        raise ValueError(f"class indices must be in 0..{n_classes - 1}")
    return np.bincount(true * n_classes + predicted, minlength=n_classes**2).reshape(n_classes, n_classes)


def _as_array(values, dtype: type = np.int64) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=dtype)


def _accuracy(confusion: np.ndarray) -> float:
    return np.trace(confusion) / confusion.sum()


def _f1(confusion: np.ndarray) -> float:
    tp = np.diag(confusion)
    denominator = confusion.sum(axis=0) + confusion.sum(axis=1)  # 2tp + fp + fn
    f1 = np.divide(2 * tp, denominator, out=np.zeros_like(tp), where=denominator > 0)
    if len(confusion) == 2:
        return f1[1]
    return f1[denominator > 0].mean()


def _mcc(confusion: np.ndarray) -> float:
    total, correct = confusion.sum(), np.trace(confusion)
    true, predicted = confusion.sum(axis=1), confusion.sum(axis=0)
    denominator = np.sqrt((total**2 - predicted @ predicted) * (total**2 - true @ true))
    return (correct * total - true @ predicted) / denominator if denominator > 0 else 0.0


METRICS = {"accuracy": _accuracy, "f1": _f1, "mcc": _mcc}


# multiple choice ------------------------------------------------------------------------------------

def choice_accuracy(scores, labels) -> float:
    """Accuracy of the highest-scored choice: `scores` is examples x choices, `labels` the right choice's
    index. A tie goes to the first of the tied choices (numpy's argmax), so equal scores never count twice."""
    scores = _as_array(scores, np.float64)
    if scores.ndim != 2:
        raise ValueError(f"need scores of shape (examples, choices), got {scores.shape}")
    return compute_metrics(["accuracy"], scores.argmax(axis=1), labels, scores.shape[1])["accuracy"]


# token tagging --------------------------------------------------------------------------------------

def entity_spans(tags: Sequence[str]) -> set[tuple[str, int, int]]:
    """The entities of one IOB2 tag sequence ("B-PER", "I-PER", "O") as (type, start, end), end inclusive.

    An ill-formed sequence is read as conlleval and seqeval's default mode read it, since CoNLL-2003
    results are reported that way: an entity starts at every B-X and at an I-X that does not continue an
    entity of type X (after O, at the start, or after B-Y / I-Y), and ends before the first tag that
    does not continue it."""
    spans, kind, start = set(), None, 0
    for i, tag in enumerate(tags):
        if tag == "O":
            prefix, tag_kind = "O", None
        elif tag[:2] in ("B-", "I-") and len(tag) > 2:
            prefix, tag_kind = tag[0], tag[2:]
        else:
            raise ValueError(f"tag {tag!r} at {i} is not IOB2 (O, B-<type> or I-<type>)")
        if kind is not None and (prefix != "I" or tag_kind != kind):
            spans.add((kind, start, i - 1))
            kind = None
        if tag_kind is not None and kind is None:
            kind, start = tag_kind, i
    if kind is not None:
        spans.add((kind, start, len(tags) - 1))
    return spans


def entity_scores(gold_sequences: Sequence[Sequence[str]],
                  predicted_sequences: Sequence[Sequence[str]]) -> dict[str, Any]:
    """{"f1", "precision", "recall"} over all entities (micro average: an entity counts when its type
    and both ends match a gold one) and "per_type": {type: F1} for every type in gold or predictions,
    equal to seqeval's f1_score etc. in its default mode and to conlleval. A score whose denominator is
    0 (no entity predicted, none in gold) is 0, as seqeval's."""
    if len(gold_sequences) != len(predicted_sequences):
        raise ValueError(f"{len(gold_sequences)} gold sequences but {len(predicted_sequences)} predicted")
    gold, predicted = set(), set()
    for n, (gold_tags, predicted_tags) in enumerate(zip(gold_sequences, predicted_sequences)):
        if len(gold_tags) != len(predicted_tags):
            raise ValueError(f"sequence {n}: {len(gold_tags)} gold tags but {len(predicted_tags)} predicted")
        gold |= {(n, *span) for span in entity_spans(gold_tags)}
        predicted |= {(n, *span) for span in entity_spans(predicted_tags)}
    scores = _prf(len(gold & predicted), len(predicted), len(gold))
    types = sorted({span[1] for span in gold | predicted})
    per_type = {}
    for kind in types:
        gold_kind = {span for span in gold if span[1] == kind}
        predicted_kind = {span for span in predicted if span[1] == kind}
        per_type[kind] = _prf(len(gold_kind & predicted_kind), len(predicted_kind), len(gold_kind))["f1"]
    return {**scores, "per_type": per_type}


def _prf(correct: int, predicted: int, gold: int) -> dict[str, float]:
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"f1": f1, "precision": precision, "recall": recall}


# extractive QA --------------------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's normalization: lowercase, drop ASCII punctuation, drop the articles a/an/the, collapse
    whitespace (in that order, as the official scripts)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when prediction and gold normalize to the same text, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """F1 of the normalized tokens (a bag: a repeated token counts as often as both sides have it). An
    empty side means "no answer": 1.0 when both are empty, else 0.0 (SQuAD 2.0's script)."""
    predicted_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not predicted_tokens or not gold_tokens:
        return float(predicted_tokens == gold_tokens)
    same = sum((Counter(predicted_tokens) & Counter(gold_tokens)).values())
    if not same:
        return 0.0
    precision, recall = same / len(predicted_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _gold_answers(answers: Sequence[str]) -> list[str]:
    """SQuAD 2.0's script: gold answers that normalize to nothing are dropped, and a question left with
    none (an unanswerable one) has the single gold answer "", which only the empty prediction matches."""
    return [a for a in answers if normalize_answer(a)] or [""]


def _question_scores(predictions: dict[str, str], golds: dict[str, Sequence[str]]) -> dict[str, tuple[float, float]]:
    """{qid: (exact match, F1)}, each the maximum over the question's gold answers."""
    if set(predictions) != set(golds):
        missing, extra = sorted(set(golds) - set(predictions)), sorted(set(predictions) - set(golds))
        raise ValueError(f"predictions and golds differ: missing {missing[:5]}, unknown {extra[:5]}")
    scores = {}
    for qid, answers in golds.items():
        answers = _gold_answers(answers)
        scores[qid] = (max(exact_match(predictions[qid], a) for a in answers),
                       max(token_f1(predictions[qid], a) for a in answers))
    return scores


def golds(questions: Sequence) -> dict[str, list[str]]:
    """{question id: its gold answer texts} ([] for unanswerable), as squad_scores takes them."""
    return {q.id: [a.text for a in q.answers] for q in questions}


def squad_scores(predictions: dict[str, str], golds: dict[str, Sequence[str]]) -> dict[str, float]:
    """{"exact_match", "f1", "count"} averaged over questions, as SQuAD 2.0's official script; with
    "has_answer_*" over the questions with gold answers and "no_answer_*" over those without, each group
    there only when it has questions (as the script's HasAns / NoAns). `predictions` maps every question
    id of `golds` to its answer text, "" for "no answer"; `golds` maps it to its gold answers, [] for none.

    On SQuAD 1.1 this equals the v1.1 script's numbers unless a gold answer normalizes to nothing (e.g.
    "The"): v1.1 keeps it, and a prediction that normalizes to nothing then has EM 1, F1 0."""
    scores = _question_scores(predictions, golds)
    groups = {"": list(golds),
              "has_answer_": [qid for qid, answers in golds.items() if answers],
              "no_answer_": [qid for qid, answers in golds.items() if not answers]}
    result = {}
    for prefix, qids in groups.items():
        if qids:
            result[f"{prefix}exact_match"] = sum(scores[qid][0] for qid in qids) / len(qids)
            result[f"{prefix}f1"] = sum(scores[qid][1] for qid in qids) / len(qids)
            result[f"{prefix}count"] = len(qids)
    return result


def best_no_answer_threshold(predictions: dict[str, str], golds: dict[str, Sequence[str]],
                             no_answer_scores: dict[str, float]) -> dict[str, float]:
    """SQuAD 2.0's threshold τ on the no-answer score (score(null) - the best non-null span's score): a
    question is answered "" when its score > τ, else with its span in `predictions`. Picked as the official
    script's find_best_thresh, separately for exact match and F1: start from every question unanswered,
    answer them one by one in ascending no-answer score, and keep the score at which the total is best
    (the first such). -> {"best_exact_match", "best_exact_match_threshold", "best_f1", "best_f1_threshold"}.

    Its quirks are kept so that the numbers match published ones: when answering nothing at all is best,
    τ is 0.0; and a question whose no-answer score ties τ's is answered by `apply_no_answer_threshold`
    even where the sweep reached its best before it."""
    scores = _question_scores(predictions, golds)
    if set(no_answer_scores) != set(golds):
        raise ValueError("no_answer_scores must have one score for each question of golds")
    result = {}
    for index, name in enumerate(("exact_match", "f1")):
        total = best = sum(1 for answers in golds.values() if not answers)  # every question unanswered
        threshold = 0.0
        for qid in sorted(no_answer_scores, key=no_answer_scores.get):
            if golds[qid]:
                total += scores[qid][index]
            elif predictions[qid]:
                total -= 1  # an unanswerable question loses its point once it gets a span
            if total > best:
                best, threshold = total, no_answer_scores[qid]
        result[f"best_{name}"] = best / len(golds)
        result[f"best_{name}_threshold"] = float(threshold)
    return result


def apply_no_answer_threshold(predictions: dict[str, str], no_answer_scores: dict[str, float],
                              threshold: float) -> dict[str, str]:
    """The final answers: "" (no answer) where the no-answer score is above `threshold`, else the span."""
    return {qid: "" if no_answer_scores[qid] > threshold else answer for qid, answer in predictions.items()}


# regression -----------------------------------------------------------------------------------------

def pearson(predictions, labels) -> float:
    """Pearson's correlation; 0.0 (not nan) when either side is constant, where it is undefined, so that
    a collapsed model scores as uncorrelated and a mean over runs stays a number."""
    x, y = _pair(predictions, labels)
    if (x == x[0]).all() or (y == y[0]).all():  # exactly constant: centring would leave rounding noise
        return 0.0
    x, y = x - x.mean(), y - y.mean()
    return float(np.clip(x @ y / np.sqrt((x @ x) * (y @ y)), -1.0, 1.0))  # rounding can pass ±1


def spearman(predictions, labels) -> float:
    """Spearman's rank correlation: Pearson's on ranks, tied values sharing their average rank (as
    scipy.stats.spearmanr); 0.0 (not nan) when either side is constant, as `pearson`."""
    x, y = _pair(predictions, labels)
    return pearson(_average_ranks(x), _average_ranks(y))


def _pair(predictions, labels) -> tuple[np.ndarray, np.ndarray]:
    x, y = _as_array(predictions, np.float64), _as_array(labels, np.float64)
    if x.shape != y.shape or x.ndim != 1 or not len(x):
        raise ValueError(f"need two non-empty 1-D sequences of the same length, got {x.shape}, {y.shape}")
    return x, y


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, each run of equal values sharing the mean of the ranks it spans."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    begins = np.r_[True, ordered[1:] != ordered[:-1]]  # where each run of equal values begins
    starts, run = np.flatnonzero(begins), np.cumsum(begins) - 1  # run: the run of each sorted value
    lengths = np.diff(np.r_[starts, len(values)])
    ranks = np.empty(len(values))
    ranks[order] = (starts + (lengths + 1) / 2)[run]
    return ranks

"""Reference points that need no finetuning, one per task type, so a finetuned model's score reads
against the floor a cheap model already reaches. Each task type (lib/tasks) says which is its own and
scores its predictions as a model's; here are the models, pure functions of the type's items (train
items to fit on, items to predict):

- classification: `tfidf_baseline`, the bag-of-n-grams classifier a transformer must beat to have
  earned its pretraining (Maas et al.'s and Wang et al.'s baselines). It trains on the task's train rows
  only, picks the inverse regularisation C by the dev score of the task's first metric (the same dev
  set hashed out of train that picks the finetuned models' best epoch; never the evaluation split), and
  reports dev and evaluation metrics. The two texts of a pair get their own vocabularies, so "word in
  the premise" and "word in the hypothesis" are different features, plus three word-overlap fractions:
  bags of n-grams cannot see whether the two texts share words, which is most of what such a model can
  know about paraphrase or entailment (on this data the overlap features raise RTE accuracy from 48%
  to 58% and MRPC F1 from 82.6 to 83.1). (The zero-shot LM, which needs a pretrained model rather than
  train rows, is lib/evaluation/zero_shot.py.)
- tagging (CoNLL-2003): `lexicon_tags`, each word's most frequent train tag, unknown capitalised words
  tagged as train's words seen once (the usual stand-in for unseen words), made well-formed IOB2;
- extractive QA (SQuAD 1.1 / 2.0): `OverlapQA`, a short span beside the question's words in the context
  sentence that shares most of them (a sliding-window baseline in the spirit of Rajpurkar et al. 2016),
  and, for 2.0, "no answer" where that sentence shares too little of the question;
- regression (STS-B): `tfidf_similarity`, the TF-IDF cosine of the two sentences mapped linearly to
  the label scale;
- multiple choice (CODAH): `tfidf_choice_scores`, each ending's TF-IDF cosine to the context, the
  most or the least similar ending chosen as train says.
"""
from __future__ import annotations

import math
import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import scipy.sparse as sp
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS, TfidfVectorizer
from sklearn.linear_model import LogisticRegression

from lib.metrics.scores import (apply_no_answer_threshold, best_no_answer_threshold, choice_accuracy,
                                compute_metrics, confusion_matrix, entity_spans, golds, squad_scores)

WORD = re.compile(r"\w+")
SENTENCE = re.compile(r"[^.!?]+(?:[.!?]+|$)")  # a run up to and including its end punctuation
SPAN_WORDS = (1, 2, 3, 4, 5)  # the answer lengths, in words, that OverlapQA.fit tries


# TF-IDF + logistic regression -------------------------------------------------------------------

def tfidf_baseline(train: Sequence, dev: Sequence, evaluation: Sequence | None, n_classes: int, metrics: list[str],
                   *, word_ngrams: tuple[int, int] = (1, 2),
                   char_ngrams: tuple[int, int] | None = None, min_df: int = 2, max_features: int | None = None,
                   c_grid: Sequence[float] = (0.25, 1.0, 4.0, 16.0), seed: int = 0) -> dict[str, Any]:
    """Fit TF-IDF features (sublinear tf; word n-grams, plus char_wb n-grams when `char_ngrams` is
    given) and a logistic regression per C of `c_grid` on `train`; keep the C with the best dev
    score of metrics[0] (the first of c_grid on a tie). `max_features` caps each vectorizer's vocabulary.
    The rows are classification's (texts a, b (None for single texts) and a class index, `label`).

    -> {"dev": {metric: value}, "eval": {metric: value} or None when the evaluation split is unlabeled,
    "confusion": the evaluation confusion matrix (rows true, columns predicted) or None, "c": the C chosen,
    "features": the number of features, "seconds": wall time of featurising, fitting and predicting}."""
    if not c_grid:
        raise ValueError("c_grid is empty; give at least one C")
    start = time.perf_counter()
    pair = train[0].b is not None
    splits = [train, dev] + ([evaluation] if evaluation is not None else [])
    blocks: list[list[sp.spmatrix]] = [[] for _ in splits]
    sides: list[Callable[[Any], str]] = [lambda row: row.a] + ([lambda row: row.b] if pair else [])
    for side in sides:
        for vectorizer in _vectorizers(word_ngrams, char_ngrams, min_df, max_features):
            blocks[0].append(vectorizer.fit_transform([side(row) for row in train]))
            for block, split in zip(blocks[1:], splits[1:]):
                block.append(vectorizer.transform([side(row) for row in split]))
    if pair:
        for block, split in zip(blocks, splits):
            block.append(sp.csr_matrix(_overlap(split)))
    features = [sp.hstack(block, format="csr") for block in blocks]
    labels = [np.array([row.label for row in split]) for split in splits]

    # liblinear's dual coordinate descent (binary only) fits IMDb's 400k n-grams 5-10x faster than its
    # primal solver or lbfgs, to the same dev accuracy: the dual has a variable per example, and here
    # features outnumber examples
    binary = n_classes == 2
    best_score, best_c, best_model = -np.inf, None, None
    for c in c_grid:
        model = LogisticRegression(C=c, solver="liblinear" if binary else "lbfgs", dual=binary, max_iter=1000,
                                   random_state=seed)
        model.fit(features[0], labels[0])
        score = compute_metrics(metrics[:1], model.predict(features[1]), labels[1], n_classes)[metrics[0]]
        if score > best_score:
            best_score, best_c, best_model = score, c, model
    dev = compute_metrics(metrics, best_model.predict(features[1]), labels[1], n_classes)
    scores = confusion = None
    if evaluation is not None:
        predicted = best_model.predict(features[2])
        scores = compute_metrics(metrics, predicted, labels[2], n_classes)
        confusion = confusion_matrix(predicted, labels[2], n_classes).tolist()
    return {"dev": dev, "eval": scores, "confusion": confusion, "c": best_c,
            "features": int(features[0].shape[1]), "seconds": time.perf_counter() - start}


def _vectorizers(word_ngrams: tuple[int, int], char_ngrams: tuple[int, int] | None, min_df: int,
                 max_features: int | None) -> list[TfidfVectorizer]:
    # sublinear tf (1 + log tf): a word said ten times is not ten times the evidence
    common = dict(min_df=min_df, max_features=max_features, sublinear_tf=True)
    vectorizers = [TfidfVectorizer(analyzer="word", ngram_range=tuple(word_ngrams), **common)]
    if char_ngrams is not None:
        vectorizers.append(TfidfVectorizer(analyzer="char_wb", ngram_range=tuple(char_ngrams), **common))
    return vectorizers


def _overlap(rows: Sequence) -> np.ndarray:
    """(n, 3): the fractions of b's word types found in a, of a's found in b, and their Jaccard index."""
    out = np.zeros((len(rows), 3), dtype=np.float32)
    for i, row in enumerate(rows):
        a, b = set(WORD.findall(row.a.lower())), set(WORD.findall(row.b.lower()))
        shared = len(a & b)
        out[i] = shared / max(len(b), 1), shared / max(len(a), 1), shared / max(len(a | b), 1)
    return out


# tagging ----------------------------------------------------------------------------------------

def lexicon_tags(train: Sequence, sentences: Sequence[Sequence[str]]) -> list[list[str]]:
    """IOB2 tags for each of `sentences` (word lists), learned from `train`'s tagged sentences.

    A word seen in train takes its most frequent tag there (the first seen on a tie); an unseen word,
    the most frequent tag of the train words that lowercase as it does ("GERMANY" in a headline takes
    that of "Germany"). A word still unknown that is capitalised and not the sentence's first takes the
    most frequent tag of the capitalised words seen only once in train, which stand in for unseen ones:
    on CoNLL-2003 that is I-PER (an unknown capitalised word is most often a surname), and it raises test
    F1 from 55.3 (tagging them O) to 63.9. Any other word is O. The tags are then rewritten as
    lib.metrics.scores.entity_spans reads them, as seqeval does: an I-X that starts an entity (after O or
    another type) becomes B-X, so the output is well-formed IOB2 and scores the same."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for sentence in train:
        for word, tag in zip(sentence.words, sentence.tags, strict=True):
            counts[word][tag] += 1
    lowercase: dict[str, Counter] = defaultdict(Counter)
    for word, tags in counts.items():
        lowercase[word.lower()].update(tags)
    known = {word: tags.most_common(1)[0][0] for word, tags in counts.items()}
    known_lowercase = {word: tags.most_common(1)[0][0] for word, tags in lowercase.items()}
    once = Counter(next(iter(tags)) for word, tags in counts.items() if tags.total() == 1 and word[:1].isupper())
    unseen_capitalised = once.most_common(1)[0][0] if once else "O"

    def tag(word: str, first: bool) -> str:
        if word in known:
            return known[word]
        if word.lower() in known_lowercase:
            return known_lowercase[word.lower()]
        return unseen_capitalised if word[:1].isupper() and not first else "O"

    return [well_formed([tag(word, i == 0) for i, word in enumerate(tokens)]) for tokens in sentences]


def well_formed(tags: Sequence[str]) -> list[str]:
    """`tags` with each entity, as entity_spans reads it, written B-X I-X ... (same entities, valid IOB2)."""
    out = ["O"] * len(tags)
    for kind, start, end in entity_spans(tags):
        out[start:end + 1] = [f"B-{kind}"] + [f"I-{kind}"] * (end - start)
    return out


# extractive QA ----------------------------------------------------------------------------------

@dataclass
class OverlapQA:
    """Answers from word overlap. The context sentence that shares the most of the question's content
    words (stopwords dropped, each word weighted by its IDF over train's context sentences, so "the
    1973 crisis" is found by "1973", not "crisis") holds the answer; in it, the answer is the
    `span_words`-word window nearest those shared words that contains none of the question's words
    (answers are rarely in the question) and neither starts nor ends with a stopword (answers rarely
    do; SQuAD's normalisation drops leading articles anyway).

    For SQuAD 2.0 the no-answer score is the share of the question's IDF weight the sentence misses:
    above `threshold`, the answer is "" (no answer). -inf answers nothing: where train says that is best
    (its unanswerable questions were written to share the words of a plausible sentence, and a wrong
    span costs an unanswerable question its whole point while a right one earns little F1)."""
    idf: dict[str, float]
    span_words: int
    threshold: float | None = None  # None: always answer (SQuAD 1.1)
    default_idf: float = field(init=False)

    def __post_init__(self):
        self.default_idf = max(self.idf.values(), default=1.0)  # an unseen word is as rare as the rarest

    @classmethod
    def fit(cls, train: Sequence, no_answer: bool = False) -> OverlapQA:
        """IDF from train's contexts; span_words (of SPAN_WORDS) by train F1 on the answerable questions;
        with `no_answer`, the threshold as SQuAD 2.0's script picks it, on train."""
        idf = _sentence_idf({question.context for question in train})
        answerable = [question for question in train if question.answers]
        if not answerable:
            raise ValueError("no train question has an answer to choose the span length by")
        best = max(SPAN_WORDS, key=lambda k: squad_scores(cls(idf, k).answers(answerable), golds(answerable))["f1"])
        model = cls(idf, best)
        if not no_answer:
            return model
        spans, missing = model.spans(train)
        gold = golds(train)
        chosen = best_no_answer_threshold(spans, gold, missing)
        # The script's threshold is 0.0 also where answering nothing is best (its best is then the share
        # of unanswerable questions, exactly); 0.0 would still answer the questions missing no word.
        nothing = chosen["best_f1"] == sum(1 for answers in gold.values() if not answers) / len(gold)
        model.threshold = -math.inf if nothing else chosen["best_f1_threshold"]
        return model

    def answers(self, questions: Sequence) -> dict[str, str]:
        """{question id: answer text, "" for no answer}, for lib.metrics.scores.squad_scores with its golds."""
        spans, missing = self.spans(questions)
        return spans if self.threshold is None else apply_no_answer_threshold(spans, missing, self.threshold)

    def spans(self, questions: Sequence) -> tuple[dict[str, str], dict[str, float]]:
        """({id: best span}, {id: no-answer score, the share of question weight the sentence misses})."""
        spans, missing = {}, {}
        for item in questions:
            asked = {w for w in _words(item.question) if w not in ENGLISH_STOP_WORDS}
            weight = self._overlap(asked, asked)
            sentences = _sentences(item.context)
            scored = [(self._overlap(asked, (w for w, _, _ in words)), words) for words in sentences]
            shared, sentence = max(scored, key=lambda pair: pair[0], default=(0.0, []))
            start, end = self._window(sentence, asked)
            spans[item.id] = item.context[start:end]
            missing[item.id] = 1.0 - shared / weight if weight else 1.0
        return spans, missing

    def _idf(self, word: str) -> float:
        return self.idf.get(word, self.default_idf)

    def _overlap(self, question: set[str], words: Iterable[str]) -> float:
        """The IDF weight of the question's words among `words`, summed in sorted order: a set's order
        changes with the hash seed, and float sums in another order could break ties another way."""
        return sum(self._idf(w) for w in sorted(question.intersection(words)))

    def _window(self, sentence: list[tuple[str, int, int]], question: set[str]) -> tuple[int, int]:
        """Character offsets of the best window of the sentence's (word, start, end) (0, 0 when none)."""
        hits = [i for i, (word, _, _) in enumerate(sentence) if word in question]
        best, best_distance = None, math.inf
        for first in range(max(len(sentence) - self.span_words + 1, 0)):
            last = first + self.span_words - 1
            window = [word for word, _, _ in sentence[first:last + 1]]
            if question & set(window) or window[0] in ENGLISH_STOP_WORDS or window[-1] in ENGLISH_STOP_WORDS:
                continue
            distance = min((min(abs(h - first), abs(h - last)) for h in hits), default=0)
            if distance < best_distance:  # the first of equally near windows
                best, best_distance = (first, last), distance
        if best is None:
            return 0, 0
        return sentence[best[0]][1], sentence[best[1]][2]


def _words(text: str) -> list[str]:
    return [w.lower() for w in WORD.findall(text)]


def _sentences(context: str) -> list[list[tuple[str, int, int]]]:
    """The context's sentences as lists of (lowercased word, start, end), offsets into `context`."""
    return [[(w.group().lower(), s.start() + w.start(), s.start() + w.end()) for w in WORD.finditer(s.group())]
            for s in SENTENCE.finditer(context)]


def _sentence_idf(contexts: set[str]) -> dict[str, float]:
    """log(sentences / sentences with the word) over the sentences of `contexts`: a word found in every
    sentence of an article tells no sentence apart."""
    frequency, n = Counter(), 0
    for context in contexts:
        for sentence in _sentences(context):
            frequency.update({word for word, _, _ in sentence})
            n += 1
    return {word: math.log(n / count) for word, count in frequency.items()}


# regression -------------------------------------------------------------------------------------

def tfidf_similarity(train: Sequence, items: Sequence) -> list[float]:
    """Each pair's TF-IDF cosine (vocabulary and IDF from train's sentences), mapped to the label scale by
    a least-squares line fit on train. The line changes neither correlation; it makes the numbers
    scores (an RMSE would compare)."""
    vectorizer = TfidfVectorizer(sublinear_tf=True).fit([text for item in train for text in (item.a, item.b)])

    def cosines(pairs: Sequence) -> np.ndarray:
        a, b = vectorizer.transform([p.a for p in pairs]), vectorizer.transform([p.b for p in pairs])
        return np.asarray(a.multiply(b).sum(axis=1)).ravel()  # rows are L2-normalised: the dot is the cosine

    slope, intercept = np.polyfit(cosines(train), [item.value for item in train], 1)
    return (slope * cosines(items) + intercept).tolist()


# multiple choice --------------------------------------------------------------------------------

def tfidf_choice_scores(train: Sequence, items: Sequence) -> np.ndarray:
    """(questions, choices) scores for lib.metrics.scores.choice_accuracy: each ending's TF-IDF cosine to its
    context (vocabulary and IDF from train's contexts and endings), negated where train's right endings
    are more often the least similar. That is so on CODAH, whose wrong endings were written to fool
    models and often reuse the context's words (there the most similar ending is right below chance);
    the direction is learned on train, not assumed. A tie (no shared word at all) goes to the first."""
    vectorizer = TfidfVectorizer(sublinear_tf=True).fit(
        [text for item in train for text in (item.context, *item.endings)])
    train_cosines = _choice_cosines(vectorizer, train)
    labels = [item.label for item in train]
    similar = choice_accuracy(train_cosines, labels) >= choice_accuracy(-train_cosines, labels)
    cosines = _choice_cosines(vectorizer, items)
    return cosines if similar else -cosines


def _choice_cosines(vectorizer: TfidfVectorizer, items: Sequence) -> np.ndarray:
    contexts = vectorizer.transform([item.context for item in items])
    cosines = np.zeros((len(items), len(items[0].endings)) if items else (0, 0))
    for choice in range(cosines.shape[1]):
        endings = vectorizer.transform([item.endings[choice] for item in items])
        cosines[:, choice] = np.asarray(contexts.multiply(endings).sum(axis=1)).ravel()
    return cosines

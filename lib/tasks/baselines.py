"""What the new task types earn without a transformer: one cheap, train-only baseline each, so a finetuned
model's score can be read against the floor a lexicon or word overlap already reaches.

Each is a pure function of rows as the task type's module reads them (train items to fit on, items to
predict) whose predictions go to lib.evaluation.metrics as a model's would:
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
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS, TfidfVectorizer

from lib.evaluation.metrics import (apply_no_answer_threshold, best_no_answer_threshold, choice_accuracy, entity_spans,
                         squad_scores)
from lib.tasks.multiple_choice import Question
from lib.tasks.regression import Scored
from lib.tasks.span_qa import Question as QAQuestion
from lib.tasks.span_qa import golds
from lib.tasks.tagging import Sentence

WORD = re.compile(r"\w+")
SENTENCE = re.compile(r"[^.!?]+(?:[.!?]+|$)")  # a run up to and including its end punctuation
SPAN_WORDS = (1, 2, 3, 4, 5)  # the answer lengths, in words, that OverlapQA.fit tries


# tagging ----------------------------------------------------------------------------------------

def lexicon_tags(train: Sequence[Sentence], sentences: Sequence[Sequence[str]]) -> list[list[str]]:
    """IOB2 tags for each of `sentences` (word lists), learned from `train`'s tagged sentences.

    A word seen in train takes its most frequent tag there (the first seen on a tie); an unseen word,
    the most frequent tag of the train words that lowercase as it does ("GERMANY" in a headline takes
    that of "Germany"). A word still unknown that is capitalised and not the sentence's first takes the
    most frequent tag of the capitalised words seen only once in train, which stand in for unseen ones:
    on CoNLL-2003 that is I-PER (an unknown capitalised word is most often a surname), and it raises test
    F1 from 55.3 (tagging them O) to 63.9. Any other word is O. The tags are then rewritten as
    lib.evaluation.metrics.entity_spans reads them, as seqeval does: an I-X that starts an entity (after O or
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
    def fit(cls, train: Sequence[QAQuestion], no_answer: bool = False) -> OverlapQA:
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

    def answers(self, questions: Sequence[QAQuestion]) -> dict[str, str]:
        """{question id: answer text, "" for no answer}, for lib.evaluation.metrics.squad_scores with span_qa.golds."""
        spans, missing = self.spans(questions)
        return spans if self.threshold is None else apply_no_answer_threshold(spans, missing, self.threshold)

    def spans(self, questions: Sequence[QAQuestion]) -> tuple[dict[str, str], dict[str, float]]:
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

def tfidf_similarity(train: Sequence[Scored], items: Sequence[Scored]) -> list[float]:
    """Each pair's TF-IDF cosine (vocabulary and IDF from train's sentences), mapped to the label scale by
    a least-squares line fit on train. The line changes neither correlation; it makes the numbers
    scores (an RMSE would compare)."""
    vectorizer = TfidfVectorizer(sublinear_tf=True).fit([text for item in train for text in (item.a, item.b)])

    def cosines(pairs: Sequence[Scored]) -> np.ndarray:
        a, b = vectorizer.transform([p.a for p in pairs]), vectorizer.transform([p.b for p in pairs])
        return np.asarray(a.multiply(b).sum(axis=1)).ravel()  # rows are L2-normalised: the dot is the cosine

    slope, intercept = np.polyfit(cosines(train), [item.value for item in train], 1)
    return (slope * cosines(items) + intercept).tolist()


# multiple choice --------------------------------------------------------------------------------

def tfidf_choice_scores(train: Sequence[Question], items: Sequence[Question]) -> np.ndarray:
    """(questions, choices) scores for lib.evaluation.metrics.choice_accuracy: each ending's TF-IDF cosine to its
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


def _choice_cosines(vectorizer: TfidfVectorizer, items: Sequence[Question]) -> np.ndarray:
    contexts = vectorizer.transform([item.context for item in items])
    cosines = np.zeros((len(items), len(items[0].endings)) if items else (0, 0))
    for choice in range(cosines.shape[1]):
        endings = vectorizer.transform([item.endings[choice] for item in items])
        cosines[:, choice] = np.asarray(contexts.multiply(endings).sum(axis=1)).ravel()
    return cosines

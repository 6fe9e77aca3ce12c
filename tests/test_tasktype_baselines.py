"""The new task types' baselines: each does what it says on hand-made rows, and on real rows beats a
trivial floor computed here (all "O", the context's first words, a constant, the commonest position)."""
from __future__ import annotations

import gzip
import itertools
import json
import math

import pytest

from lib.metrics.scores import choice_accuracy, entity_scores, entity_spans, pearson, squad_scores
from lib.tasks import multiple_choice, regression, span_qa, tagging
from lib.metrics.baselines import OverlapQA, lexicon_tags, tfidf_choice_scores, tfidf_similarity, well_formed
from lib.tasks.multiple_choice import Question
from lib.tasks.regression import Scored
from lib.tasks.span_qa import Answer, golds
from lib.tasks.span_qa import Question as QAQuestion
from lib.tasks.tagging import Sentence
from tests.helpers import SHARED_DATA


def read(name: str, split: str, limit: int | None = None) -> list[dict]:
    with gzip.open(SHARED_DATA / name / f"{split}.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in itertools.islice(f, limit)]


def needs(name: str):
    return pytest.mark.skipif(not (SHARED_DATA / name).is_dir(), reason=f"needs ../shared/data/{name}")


# tagging ----------------------------------------------------------------------------------------

def test_lexicon_tags_take_each_words_most_frequent_tag():
    train = [Sentence(["Paris", "is", "big"], ["B-LOC", "O", "O"]),
             Sentence(["Paris", "Hilton", "sang"], ["B-PER", "I-PER", "O"]),
             Sentence(["in", "Paris", "."], ["O", "B-LOC", "O"]),
             Sentence(["Smith", "and", "Jones", "met"], ["B-PER", "O", "B-PER", "O"]),
             Sentence(["Dr", "Brown", "left"], ["O", "B-PER", "O"])]
    sentences = [["Paris", "sang"],  # seen words: their most frequent tags
                 ["PARIS", "is", "big"],  # unseen: the tag of the words that lowercase as it does
                 ["Hilton", "left"],  # I-PER alone starts an entity: written B-PER
                 ["Zorg", "met", "Quux"],  # unseen capitalised: the tag of train's capitalised words seen once
                 ["blorp", "met"]]  # unseen lowercase: O
    predicted = lexicon_tags(train, sentences)
    assert predicted[0] == ["B-LOC", "O"]
    assert predicted[1] == ["B-LOC", "O", "O"]
    assert predicted[2] == ["B-PER", "O"]
    # capitalised words seen once: Hilton I-PER, Jones B-PER, Smith B-PER, Dr O, Brown B-PER -> B-PER;
    # the first word of a sentence is capitalised anyway and gets no such guess
    assert predicted[3] == ["O", "O", "B-PER"]
    assert predicted[4] == ["O", "O"]


def test_well_formed_keeps_the_entities_seqeval_reads():
    tags = ["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-ORG", "B-MISC", "I-MISC"]
    fixed = well_formed(tags)
    assert fixed == ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "B-ORG", "B-MISC", "I-MISC"]
    assert entity_spans(fixed) == entity_spans(tags)


@needs("conll2003")
def test_lexicon_tags_beat_all_o_on_real_sentences():
    train, _ = tagging.read_rows(read("conll2003", "train", 3000))
    test, _ = tagging.read_rows(read("conll2003", "test", 200))
    gold = [sentence.tags for sentence in test]
    floor = entity_scores(gold, [["O"] * len(tags) for tags in gold])["f1"]
    assert entity_scores(gold, lexicon_tags(train, [sentence.words for sentence in test]))["f1"] > floor


# extractive QA ----------------------------------------------------------------------------------

def qa(qid: str, context: str, question: str, answers: list[str]) -> QAQuestion:
    return QAQuestion(qid, question, context, [Answer(a, context.find(a)) for a in answers])


NAMES = ["Jane Doe", "Ada Byron", "Max Planck", "Rosa Parks", "Alan Kay", "Lise Meitner"]


def founded(n: int, name: str) -> QAQuestion:
    """The answer sits in the second sentence, right after the question's words."""
    company = f"Firm{n}"
    context = f"The weather in town{n} was mild that year. {company} was founded by {name}."
    return qa(f"q{n}", context, f"Who founded {company}?", [name])


def test_overlap_qa_answers_beside_the_question_words_in_the_best_sentence():
    model = OverlapQA.fit([founded(n, name) for n, name in enumerate(NAMES)])
    assert model.span_words == 2 and model.threshold is None  # two-word answers: k = 2 scores best on train
    row = founded(99, "Grace Hopper")
    assert model.answers([row]) == {"q99": "Grace Hopper"}


def test_overlap_qa_learns_no_answer_where_the_context_shares_no_question_word():
    train = [founded(n, name) for n, name in enumerate(NAMES)]
    train += [qa(f"u{n}", f"Rain fell on town{n}. It was cold.", f"Who founded Firm{n}?", []) for n in range(6)]
    model = OverlapQA.fit(train, no_answer=True)
    assert model.threshold is not None and model.threshold < 1.0
    unanswerable = qa("u99", "Snow fell on the hills. It was cold.", "Who founded Firm99?", [])
    assert model.answers([founded(99, "Grace Hopper"), unanswerable]) == {"q99": "Grace Hopper", "u99": ""}


def test_overlap_qa_answers_nothing_where_train_says_so():
    """Train's spans never earn a point and its unanswerable questions share all their words with the
    context: no threshold beats silence, not even the script's default 0.0, where every question scores 0."""
    train = [qa(f"q{n}", founded(n, name).context, f"Who founded Firm{n}?", ["that year"])
             for n, name in enumerate(NAMES)]
    train += [qa(f"u{n}", f"Firm{n} was founded by {name}.", f"Who founded Firm{n}?", [])
              for n, name in enumerate(NAMES)]
    model = OverlapQA.fit(train, no_answer=True)
    assert model.threshold == -math.inf
    assert model.answers([founded(99, "Grace Hopper")]) == {"q99": ""}


@pytest.mark.parametrize("name", [pytest.param("squad", marks=needs("squad")),
                                  pytest.param("squad_v2", marks=needs("squad_v2"))])
def test_overlap_qa_beats_the_contexts_first_words_on_real_questions(name):
    train, _ = span_qa.read_rows(read(name, "train", 300))
    questions = [q for q in span_qa.read_rows(read(name, "validation", 300))[0] if q.answers]
    model = OverlapQA.fit(train)
    first_words = {q.id: " ".join(q.context.split()[:model.span_words]) for q in questions}
    gold = golds(questions)
    assert squad_scores(model.answers(questions), gold)["f1"] > squad_scores(first_words, gold)["f1"]


@needs("squad_v2")
def test_the_no_answer_threshold_is_no_worse_than_silence_on_train():
    train, _ = span_qa.read_rows(read("squad_v2", "train", 300))
    gold = golds(train)
    silence = squad_scores({qid: "" for qid in gold}, gold)["f1"]
    assert squad_scores(OverlapQA.fit(train, no_answer=True).answers(train), gold)["f1"] >= silence


# regression -------------------------------------------------------------------------------------

def test_tfidf_similarity_rises_with_shared_words():
    words = "cat dog bird fish lion bear wolf frog".split()
    train = [Scored(" ".join(words[:4]), " ".join(words[:shared] + words[4:8 - shared]), float(shared))
             for shared in range(5) for _ in range(3)]
    items = [Scored("cat dog bird fish", " ".join(words[:shared] + words[4:8 - shared]), 0.0) for shared in range(5)]
    predicted = tfidf_similarity(train, items)
    assert predicted == sorted(predicted) and len(set(predicted)) == 5
    assert predicted[0] == pytest.approx(0.0, abs=0.5) and predicted[-1] == pytest.approx(4.0, abs=0.5)


@needs("stsb")
def test_tfidf_similarity_beats_a_constant_on_real_pairs():
    train, _ = regression.read_rows(read("stsb", "train"))
    pairs, _ = regression.read_rows(read("stsb", "validation", 200))
    gold = [pair.value for pair in pairs]
    floor = pearson([sum(gold) / len(gold)] * len(gold), gold)  # a constant is uncorrelated: 0
    assert pearson(tfidf_similarity(train, pairs), gold) > floor


# multiple choice --------------------------------------------------------------------------------

def test_tfidf_choice_follows_the_direction_train_shows():
    def question(label: int, similar: bool) -> Question:
        endings = ["went to the market", "sang a song", "climbed the tree", "read the book"]
        endings[label] = "ate the cake slowly" if similar else "painted a fence"
        context = "She ate the cake." if similar else "She ate the cake slowly and went to sing a tree book song."
        return Question(context, endings, label)

    similar = [question(n % 4, similar=True) for n in range(8)]
    assert choice_accuracy(tfidf_choice_scores(similar, similar), [q.label for q in similar]) == 1.0
    dissimilar = [question(n % 4, similar=False) for n in range(8)]  # the right ending shares no word
    assert choice_accuracy(tfidf_choice_scores(dissimilar, dissimilar), [q.label for q in dissimilar]) == 1.0


@needs("codah")
def test_tfidf_choice_beats_the_commonest_position_on_real_questions():
    train, _ = multiple_choice.read_rows(read("codah", "train"))
    questions, skipped = multiple_choice.read_rows(read("codah", "validation"), len(train[0].endings))
    labels = [q.label for q in questions]
    commonest = max(range(4), key=[q.label for q in train].count)
    floor = sum(label == commonest for label in labels) / len(labels)
    assert not skipped and choice_accuracy(tfidf_choice_scores(train, questions), labels) > floor

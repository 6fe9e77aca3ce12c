"""Extractive QA: reading (answer repair, drops, skips), the window layout and stride, offsets back to the
context's characters (our three tokenizer algorithms and MiniLM's WordPiece), targets, head and loss, and
decoding with the no-answer score; plus a smoke run over the first questions of SQuAD 1.1 and 2.0 validation."""
from __future__ import annotations

import gzip
import itertools
import json
import random

import pytest
import torch

from lib.config.errors import UserError
from lib.metrics.scores import apply_no_answer_threshold, normalize_answer, squad_scores
from lib.tasks.span_qa import (NO_ANSWER, Answer, Question, collate, decode, encode, golds, loss,
                                   read_rows)
from tests.helpers import SHARED_DATA
from tests.tasktype_helpers import WORDS, bpe, fit_on_one_batch, minilm, one_thread, tokenizer, toy_task  # noqa: F401

MAX_LEN, STRIDE, MAX_QUESTION = 64, 20, 8  # answers of up to STRIDE tokens are whole in some window


def long_context(n_words: int = 120, seed: int = 1) -> tuple[str, list[int]]:
    """(a context of `n_words` random WORDS, the character offset of each word)."""
    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(n_words)]
    starts = list(itertools.accumulate((len(w) + 1 for w in words[:-1]), initial=0))
    return " ".join(words), starts


def answer_questions(context: str, starts: list[int], spans: list[tuple[int, int]]) -> list[Question]:
    """A question per (first word, last word) span, its answer those words of `context`."""
    questions = []
    for n, (first, last) in enumerate(spans):
        end = starts[last] + len(context[starts[last]:].split(" ", 1)[0])
        questions.append(Question(f"q{n}", "who ruled the duchy of Normandy", context,
                                  [Answer(context[starts[first]:end], starts[first])]))
    return questions


def perfect_logits(windows) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Start and end logits that put 10 on each window's targets and -10 elsewhere."""
    starts, ends = [], []
    for w in windows:
        start, end = torch.full((len(w.ids),), -10.0), torch.full((len(w.ids),), -10.0)
        start[w.start], end[w.end] = 10.0, 10.0
        starts.append(start)
        ends.append(end)
    return starts, ends


def test_answer_repair_drops_and_skips_are_counted():
    context = "Rollo ruled Normandy. Later Rollo died in Rouen."
    rows = [
        {"id": "ok", "question": "Who?", "context": context, "answers": {"text": ["Rollo"], "answer_start": [0]}},
        # "Rollo" is at 0 and 28: 25 is nearer the second
        {"id": "moved", "question": "Who?", "context": context, "answers": {"text": ["Rollo"], "answer_start": [25]}},
        {"id": "one_gone", "question": "Where?", "context": context,
         "answers": {"text": ["Paris", "Rouen"], "answer_start": [3, 3]}},
        {"id": "all_gone", "question": "Where?", "context": context,
         "answers": {"text": ["Paris"], "answer_start": [3]}},
        {"id": "impossible", "question": "When?", "context": context, "answers": {"text": [], "answer_start": []}},
        {"id": "no_question", "question": " ", "context": context, "answers": {"text": [], "answer_start": []}},
        {"id": "no_context", "question": "Who?", "context": "", "answers": {"text": [], "answer_start": []}},
        {"id": "ok", "question": "Who again?", "context": context, "answers": {"text": [], "answer_start": []}},
    ]
    questions, counts = read_rows(rows)
    by_id = {q.id: q for q in questions}
    assert list(by_id) == ["ok", "moved", "one_gone", "impossible"]
    assert by_id["ok"].answers == [Answer("Rollo", 0)] and by_id["moved"].answers == [Answer("Rollo", 28)]
    assert by_id["one_gone"].answers == [Answer("Rouen", 42)] and by_id["impossible"].answers == []
    assert counts == {"answer_repaired": 2, "answer_dropped": 2, "no_answer_left": 1, "empty_question": 1,
                      "empty_context": 1, "duplicate_id": 1}


def test_window_layout(tokenizer):
    tokenizer, special = tokenizer
    # a context shorter than its question is fine
    question = Question("q", "which army of the north founded the duchy of Normandy", "Rollo", [Answer("Rollo", 0)])
    windows, counts = encode([question], tokenizer, special, MAX_LEN, STRIDE, MAX_QUESTION)
    [w] = windows
    asked = tokenizer.encode(question.question, add_special_tokens=False).ids
    context = tokenizer.encode("Rollo", add_special_tokens=False).ids
    assert counts["truncated_questions"] == int(len(asked) > MAX_QUESTION)
    head = asked[:MAX_QUESTION]
    assert w.ids == [special["bos"], *head, special["eos"], *context, special["eos"]]
    assert w.segments == [0] * (len(head) + 2) + [1] * (len(context) + 1)
    assert w.offsets[:len(head) + 2] == [None] * (len(head) + 2) and w.offsets[-1] is None
    assert "Rollo"[w.offsets[w.start][0]:w.offsets[w.end][1]] == "Rollo"


def test_long_context_windows_overlap_by_stride(tokenizer):
    tokenizer, special = tokenizer
    context, _ = long_context()
    windows, counts = encode([Question("q", "who ruled", context, [])], tokenizer, special, MAX_LEN, STRIDE,
                             MAX_QUESTION)
    context_ids = tokenizer.encode(context, add_special_tokens=False).ids
    pieces = [[token for token, segment in zip(w.ids, w.segments) if segment == 1][:-1] for w in windows]
    assert counts["windows"] == len(windows) >= 3 and all(len(w.ids) <= MAX_LEN for w in windows)
    assert pieces[0] == context_ids[:len(pieces[0])] and all(len(p) > STRIDE for p in pieces)
    for before, after in zip(pieces, pieces[1:]):
        assert before[-STRIDE:] == after[:STRIDE]  # `stride` tokens of overlap
    rebuilt = pieces[0] + [i for p in pieces[1:] for i in p[STRIDE:]]
    assert rebuilt == context_ids
    assert all(w.start == w.end == NO_ANSWER for w in windows)


def test_gold_spans_decode_to_the_gold_text_across_windows(tokenizer):
    tokenizer, special = tokenizer
    context, starts = long_context()
    spans = [(i, min(i + length, len(starts) - 1)) for i in range(0, len(starts), 3) for length in (0, 1)]
    questions = answer_questions(context, starts, spans)
    windows, counts = encode(questions, tokenizer, special, MAX_LEN, STRIDE, MAX_QUESTION)
    assert counts["answer_in_no_window"] == 0
    held = {n: sum(w.start != NO_ANSWER for w in windows if w.question == n) for n in range(len(questions))}
    assert all(held.values()) and max(held.values()) >= 2  # some answers are whole in two windows: the overlap
    # and some answers cross the end of a window, whole only in the next one
    assert any(w.start == NO_ANSWER and any(v.start != NO_ANSWER for v in windows if v.question == w.question)
               for w in windows)
    texts, no_answer = decode(*perfect_logits(windows), windows, questions)
    assert texts == {q.id: q.answers[0].text for q in questions}  # exactly, not only after normalizing
    assert all(score < 0 for score in no_answer.values())
    assert squad_scores(texts, golds(questions))["exact_match"] == 1.0


def test_unanswerable_questions_target_no_answer_and_decode_to_empty(tokenizer):
    tokenizer, special = tokenizer
    context, starts = long_context()
    answered = answer_questions(context, starts, [(50, 51)])[0]
    unanswerable = Question("none", "who founded Paris", context, [])
    windows, _ = encode([answered, unanswerable], tokenizer, special, MAX_LEN, STRIDE, MAX_QUESTION)
    assert all(w.start == w.end == NO_ANSWER for w in windows if w.question == 1)
    texts, no_answer = decode(*perfect_logits(windows), windows, [answered, unanswerable])
    assert no_answer["none"] > 0 > no_answer[answered.id]  # min over windows: the one holding the answer wins
    final = apply_no_answer_threshold(texts, no_answer, 0.0)
    assert final == {answered.id: answered.answers[0].text, "none": ""}


def test_decoding_picks_the_higher_of_no_answer_and_best_span(bpe):
    tokenizer, special = bpe
    question = Question("q", "who", "Rollo ruled Normandy", [Answer("Normandy", 12)])
    [w], _ = encode([question], tokenizer, special, MAX_LEN, STRIDE, MAX_QUESTION)
    for null, span, expected in ((3.0, 2.0, ""), (2.0, 3.0, "Normandy")):
        starts, ends = torch.zeros(len(w.ids)), torch.zeros(len(w.ids))
        starts[NO_ANSWER] = ends[NO_ANSWER] = null / 2
        starts[w.start] = ends[w.end] = span / 2
        texts, no_answer = decode([starts], [ends], [w], [question])
        assert texts == {"q": "Normandy"} and no_answer["q"] == pytest.approx(null - span)
        assert apply_no_answer_threshold(texts, no_answer, 0.0) == {"q": expected}


def test_spans_respect_max_answer_len_and_the_context(bpe):
    tokenizer, special = bpe
    context, starts = long_context(10)
    question = Question("q", "who", context, [])
    [w], _ = encode([question], tokenizer, special, 64, STRIDE, MAX_QUESTION)
    candidates = [i for i, span in enumerate(w.offsets) if span is not None]
    first, near, far = candidates[0], candidates[2], candidates[5]
    start_logits, end_logits = torch.zeros(len(w.ids)), torch.zeros(len(w.ids))
    start_logits[1] = end_logits[1] = 100.0  # a question token: never an answer
    start_logits[first], end_logits[far], end_logits[near] = 5.0, 9.0, 4.0
    texts, _ = decode([start_logits], [end_logits], [w], [question], max_answer_len=far - first)
    assert texts["q"] == context[w.offsets[first][0]:w.offsets[near][1]]
    texts, _ = decode([start_logits], [end_logits], [w], [question], max_answer_len=far - first + 1)
    assert texts["q"] == context[w.offsets[first][0]:w.offsets[far][1]]


def test_loss_and_collate(bpe):
    tokenizer, special = bpe
    context, starts = long_context()
    questions = answer_questions(context, starts, [(10, 11), (80, 80)])
    windows, _ = encode(questions, tokenizer, special, MAX_LEN, STRIDE, MAX_QUESTION)
    batch = collate(windows, special["pad"])
    assert batch["input_ids"].shape == batch["candidates"].shape == (len(windows), max(len(w.ids) for w in windows))
    question_side = batch["segment_ids"] == 0
    assert batch["candidates"][:, NO_ANSWER].all() and not (batch["candidates"] & question_side)[:, 1:].any()
    perfect = [torch.nn.utils.rnn.pad_sequence(logits, batch_first=True) for logits in perfect_logits(windows)]
    assert loss(perfect, batch).item() < 1e-3
    perfect[0][~batch["candidates"]] = 50.0  # logits off the candidates do not count
    assert loss(perfect, batch).item() < 1e-3


def test_a_window_without_room_for_context_is_refused(bpe):
    tokenizer, special = bpe
    with pytest.raises(UserError, match=r"tasks.squad: max_len 32 leaves 13 context tokens .* stride 16"):
        encode([], tokenizer, special, 32, 16, 16, key="tasks.squad")


def read_first(name: str, n: int) -> list[dict]:
    with gzip.open(SHARED_DATA / name / "validation.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in itertools.islice(f, n)]


# The share of answer windows whose gold token span normalizes to the gold text, as measured on the first
# 200 validation questions (on all of them: squad 2811 / 2837 = 0.9908, squad_v2 975 / 981 = 0.9939). The
# misses are answers that are part of a token ("Israel" in "Israelis"): no token span gives them exactly.
MEASURED = {"squad": 198 / 200, "squad_v2": 81 / 82}


@pytest.mark.skipif(not (SHARED_DATA / "squad_v2").is_dir(), reason="needs ../shared/data/squad and squad_v2")
@pytest.mark.parametrize("name", ["squad", "squad_v2"])
def test_squad_first_200_questions_with_minilm(name):
    tokenizer, special = minilm()
    questions, counts = read_rows(read_first(name, 200))
    assert len(questions) == 200 and not counts["answer_dropped"]
    windows, counts = encode(questions, tokenizer, special, 384, 128, 64)
    assert counts["answer_in_no_window"] == 0
    answer_windows = [w for w in windows if w.start != NO_ANSWER]
    same = sum(normalize_answer(questions[w.question].context[w.offsets[w.start][0]:w.offsets[w.end][1]])
               == normalize_answer(questions[w.question].answers[0].text) for w in answer_windows)
    assert same / len(answer_windows) == MEASURED[name]
    if name == "squad":
        assert same / len(answer_windows) >= 0.99
    assert all(w.start == NO_ANSWER for w in windows if not questions[w.question].answers)
    texts, no_answer = decode(*perfect_logits(windows), windows, questions)
    scores = squad_scores(apply_no_answer_threshold(texts, no_answer, 0.0), golds(questions))
    assert scores["exact_match"] == 1.0  # the part-of-a-token misses match another annotator's answer


def test_a_tiny_backbone_with_the_head_learns_the_spans(bpe, one_thread):
    """The head and loss on a real backbone's hidden states: a few steps fit an answer, one in two
    windows, and an unanswerable question exactly."""
    tokenizer, special = bpe
    context, starts = long_context(40)
    questions = answer_questions(context, starts, [(3, 4), (30, 30)])
    questions[1].question = "when was the city founded"  # the same question twice could not be told apart
    questions.append(Question("none", "which king settled in Paris", context, []))
    windows, _ = encode(questions, tokenizer, special, MAX_LEN, STRIDE, MAX_QUESTION)
    task = toy_task("span_qa", windows)
    outputs = fit_on_one_batch(tokenizer.get_vocab_size(), task, collate(windows, special["pad"]), steps=80,
                               max_positions=MAX_LEN)
    assert outputs.shape == (len(windows), max(len(w.ids) for w in windows), 2)  # a start and an end logit
    texts, no_answer = decode(*(list(logits) for logits in outputs.unbind(-1)), windows, questions)
    assert apply_no_answer_threshold(texts, no_answer, 0.0) == {**{q.id: q.answers[0].text for q in questions[:2]},
                                                                "none": ""}

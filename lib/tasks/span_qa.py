"""Extractive question answering (SQuAD 1.1 and 2.0): a span of the context, or no answer, as BERT.

- Rows are in the Hugging Face squad layout {id, question, context, answers: {text, answer_start}};
  a SQuAD 2.0 unanswerable question has no answers. An answer whose text is not at its answer_start is
  moved to the occurrence of its text nearest to answer_start and counted ("answer_repaired"); one
  whose text is not in the context at all is dropped and counted ("answer_dropped"); a question that
  had answers and has none left is skipped ("no_answer_left"), since keeping it would turn it into an
  unanswerable one. Empty questions or contexts, and a repeated question id (predictions are keyed by
  id), are skipped and counted. A context shorter than its question is kept.
- Each question gives one or more windows `[bos] question [eos] context-piece [eos]`, segments 0 up to
  the first eos and 1 after, at most `max_len` tokens. The question keeps its first `max_question_len`
  tokens; the context is cut into pieces that fill the rest, each starting `stride` tokens before the
  previous one ended (`stride` is the overlap, as HF run_qa.py's doc_stride), so an answer near a cut
  is whole in some window. Texts are encoded without the tokenizer's specials (the layout is ours).
- Each context token keeps its character span in the context, trimmed of white space (byte-level BPE
  tokens carry their leading space); question tokens, specials, and tokens that are only white space
  have None and can not begin or end an answer. An answer that is part of a token ("Israel" in
  "Israelis") can only be found as the whole token: with MiniLM's tokenizer the gold tokens of 99.08%
  of SQuAD 1.1's validation answer windows (2811 of 2837) and 99.39% of SQuAD 2.0's (975 of 981) give
  back the gold text after SQuAD's normalization.
- Training targets: the first and last token of the first gold answer where the window holds the whole
  answer, else position 0 ([bos], BERT's [CLS]) for both: "no answer in this window", as BERT for
  SQuAD 2.0 and HF for SQuAD 1.1 windows without the answer. An answerable question that no window
  holds whole (an answer longer than `stride` across a cut, or on white space only) is counted. The loss is the mean of the start and end
  cross-entropies over the positions decoding may pick (context tokens and position 0), so training
  and decoding choose among the same positions.
- Decoding, per question over all its windows: the best span (start <= end, at most `max_answer_len`
  tokens, both ends on context tokens) by start logit + end logit, its text cut from the original
  context by the offsets; the no-answer score is the minimum over windows of start_logit[0] +
  end_logit[0] (BERT's run_squad.py: the window most sure there is an answer speaks for the question).
  decode returns the span text and no-answer score - span score; lib.metrics.scores' best_no_answer_threshold
  and apply_no_answer_threshold turn those into SQuAD 2.0 answers ("" above the threshold), and
  squad_scores scores them. On SQuAD 1.1 the span text is the answer.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.nn.functional as F

from lib.config.errors import UserError
from lib.config.params import EvaluateConfig, TaskConfig
from lib.data.sources import split_columns
from lib.data.tokenizer import check_plain
from lib.metrics.baselines import OverlapQA
from lib.metrics.scores import apply_no_answer_threshold, best_no_answer_threshold, golds, squad_scores
from lib.models.families.base import QUESTION_ANSWERING
from lib.tasks.base import TaskData
from lib.tasks.base import TaskType, read_split
from lib.tasks.capabilities import Baselined, Calibrated, Distilled, Exported, Extra, Reported

NO_ANSWER = 0  # the [bos] position: the target and the score of "no answer"


def _threshold_json(threshold: float) -> float | str:
    """The threshold as metrics/evaluate.json holds it: JSON has no infinity, so "-inf" (a baseline that
    answers no question) is a string."""
    return threshold if math.isfinite(threshold) else str(threshold)


# SQuAD 2.0's no-answer threshold (the Calibrated setting, picked on dev) and the HasAns / NoAns scores
# beside the overall ones, per split: the type's section of the report
THRESHOLD = Extra("threshold", per_split=True, as_json=_threshold_json)
BREAKDOWN = Extra("breakdown", per_split=True)


@dataclass
class Answer:
    text: str
    start: int  # character offset in the context


@dataclass
class Question:
    id: str
    question: str
    context: str
    answers: list[Answer]  # [] for an unanswerable question (SQuAD 2.0)


@dataclass
class Window:
    question: int  # index of its Question in what encode was given
    ids: list[int]
    segments: list[int]
    offsets: list[tuple[int, int] | None]  # each token's character span in the context; None off the context
    start: int  # target: first token of the gold answer, NO_ANSWER where the window does not hold it whole
    end: int


def read_rows(rows: Iterable[dict[str, Any]]) -> tuple[list[Question], Counter]:
    """(questions, counts by reason: skipped rows "duplicate_id", "empty_question", "empty_context",
    "no_answer_left"; answers "answer_repaired", "answer_dropped")."""
    questions, counts, seen = [], Counter(), set()
    for row in rows:
        question, context = row.get("question") or "", row.get("context") or ""
        if str(row.get("id")) in seen:  # predictions are keyed by id
            counts["duplicate_id"] += 1
            continue
        if not question.strip():
            counts["empty_question"] += 1
            continue
        if not context.strip():
            counts["empty_context"] += 1
            continue
        given = row.get("answers") or {}
        texts, starts = given.get("text") or [], given.get("answer_start") or []
        answers = []
        for i, text in enumerate(texts):
            start = starts[i] if i < len(starts) else None
            found = _locate(context, text, start)
            counts["answer_dropped"] += found is None
            counts["answer_repaired"] += found is not None and found != start
            if found is not None:
                answers.append(Answer(text, found))
        if texts and not answers:
            counts["no_answer_left"] += 1
            continue
        questions.append(Question(str(row.get("id")), question, context, answers))
        seen.add(questions[-1].id)
    return questions, counts


def _locate(context: str, text: str, start: Any) -> int | None:
    """Where `text` is in `context`: at `start` if it is there, else its occurrence nearest to `start`;
    None when it is nowhere (or empty)."""
    if not isinstance(text, str) or not text:
        return None
    if isinstance(start, int) and start >= 0 and context.startswith(text, start):
        return start
    hint = start if isinstance(start, int) else 0
    found, at = None, context.find(text)
    while at != -1:
        if found is None or abs(at - hint) < abs(found - hint):
            found = at
        at = context.find(text, at + 1)
    return found


def encode(questions: Sequence[Question], tokenizer, special: dict[str, int], max_len: int, stride: int,
           max_question_len: int, key: str = "span_qa") -> tuple[list[Window], Counter]:
    """(windows, counts: "questions", "windows", "truncated_questions", "answer_in_no_window": answerable
    questions whose first answer no window holds whole). Raises UserError, naming `key`, when max_len
    leaves no more than `stride` context tokens per window."""
    context_len = max_len - max_question_len - 3
    if context_len <= stride:
        raise UserError(f"{key}: max_len {max_len} leaves {context_len} context tokens per window after a "
                        f"{max_question_len}-token question and 3 specials, not more than stride {stride}; "
                        "raise max_len or lower stride or max_question_len")
    check_plain(tokenizer)
    contexts = list(dict.fromkeys(q.context for q in questions))  # contexts are shared: encode each once
    encoded = dict(zip(contexts, tokenizer.encode_batch(contexts, add_special_tokens=False)))
    spans = {context: [_trim(context, *span) for span in encoded[context].offsets] for context in contexts}
    question_ids = tokenizer.encode_batch([q.question for q in questions], add_special_tokens=False)
    windows, counts = [], Counter(questions=len(questions))
    for n, (question, asked) in enumerate(zip(questions, question_ids)):
        head = asked.ids[:max_question_len]
        counts["truncated_questions"] += len(head) < len(asked.ids)
        context_ids, offsets = encoded[question.context].ids, spans[question.context]
        answer = None
        if question.answers:
            first = question.answers[0]
            answer = _token_span(offsets, first.start, first.start + len(first.text))
        own = [_window(n, [special["bos"], *head, special["eos"]], context_ids, offsets, begin, end, answer,
                       special["eos"]) for begin, end in _pieces(len(context_ids), max_len - len(head) - 3, stride)]
        counts["answer_in_no_window"] += bool(question.answers) and all(w.start == NO_ANSWER for w in own)
        windows += own
    counts["windows"] = len(windows)
    return windows, counts


def _window(question: int, prefix: list[int], context_ids: list[int], offsets: list[tuple[int, int] | None],
            begin: int, end: int, answer: tuple[int, int] | None, eos_id: int) -> Window:
    """`prefix` ([bos] question [eos]) + context tokens [begin, end) + [eos], with the answer's tokens as
    targets where the window holds all of them."""
    inside = answer is not None and begin <= answer[0] and answer[1] < end
    shift = len(prefix) - begin  # context token i is at position i + shift
    start, stop = (answer[0] + shift, answer[1] + shift) if inside else (NO_ANSWER, NO_ANSWER)
    return Window(question=question, ids=[*prefix, *context_ids[begin:end], eos_id],
                  segments=[0] * len(prefix) + [1] * (end - begin + 1),
                  offsets=[None] * len(prefix) + offsets[begin:end] + [None], start=start, end=stop)


def _trim(context: str, start: int, end: int) -> tuple[int, int] | None:
    """A token's character span without white space at either end; None when nothing else is left."""
    while start < end and context[start].isspace():
        start += 1
    while end > start and context[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else None


def _token_span(offsets: list[tuple[int, int] | None], start: int, end: int) -> tuple[int, int] | None:
    """(first, last) context token overlapping characters [start, end); None when no token does."""
    touching = [i for i, span in enumerate(offsets) if span is not None and span[0] < end and span[1] > start]
    return (touching[0], touching[-1]) if touching else None


def _pieces(n_tokens: int, length: int, stride: int) -> list[tuple[int, int]]:
    """[begin, end) of each window's context tokens: `length` long, each beginning `stride` tokens before
    the previous one ends, the last reaching the end (one empty piece for an empty context)."""
    pieces = [(0, min(length, n_tokens))]
    while pieces[-1][1] < n_tokens:
        begin = pieces[-1][1] - stride
        pieces.append((begin, min(begin + length, n_tokens)))
    return pieces


def collate(windows: Sequence[Window], pad_id: int) -> dict[str, torch.Tensor]:
    """input_ids, segment_ids, attention_mask (bool), start_positions, end_positions and candidates (bool:
    the positions an answer may begin or end at, position 0 for "no answer"), padded to the longest window."""
    longest = max(len(w.ids) for w in windows)
    input_ids = torch.full((len(windows), longest), pad_id, dtype=torch.long)
    segment_ids = torch.zeros_like(input_ids)
    candidates = torch.zeros_like(input_ids, dtype=torch.bool)
    for row, w in enumerate(windows):
        input_ids[row, :len(w.ids)] = torch.tensor(w.ids)
        segment_ids[row, :len(w.segments)] = torch.tensor(w.segments)
        candidates[row, :len(w.offsets)] = torch.tensor([span is not None for span in w.offsets])
    candidates[:, NO_ANSWER] = True
    attention_mask = torch.arange(longest) < torch.tensor([len(w.ids) for w in windows])[:, None]
    return {"input_ids": input_ids, "segment_ids": segment_ids, "attention_mask": attention_mask,
            "start_positions": torch.tensor([w.start for w in windows]),
            "end_positions": torch.tensor([w.end for w in windows]), "candidates": candidates}


def loss(outputs: tuple[torch.Tensor, torch.Tensor], batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean of the start and end cross-entropies over the candidate positions."""
    allowed = batch["candidates"]
    start, end = (logits.float().masked_fill(~allowed, float("-inf")) for logits in outputs)
    return (F.cross_entropy(start, batch["start_positions"]) + F.cross_entropy(end, batch["end_positions"])) / 2


def decode(start_logits: Sequence[torch.Tensor], end_logits: Sequence[torch.Tensor], windows: Sequence[Window],
           questions: Sequence[Question], max_answer_len: int = 30) -> tuple[dict[str, str], dict[str, float]]:
    """({question id: best span's text}, {question id: no-answer score - best span score}) for every
    question; `start_logits[i]`, `end_logits[i]`: window i's (T,) logits (rows of a padded batch will do).
    A question whose windows hold no context token gets "" and score +inf."""
    best: dict[int, tuple[float, int, int]] = {}  # question -> (span score, first char, end char)
    null: dict[int, float] = {}
    for starts, ends, w in zip(start_logits, end_logits, windows, strict=True):
        starts, ends = starts[:len(w.ids)].float(), ends[:len(w.ids)].float()
        null[w.question] = min(null.get(w.question, float("inf")), (starts[NO_ANSWER] + ends[NO_ANSWER]).item())
        span = _best_span(starts, ends, [o is not None for o in w.offsets], max_answer_len)
        if span is not None and span[0] > best.get(w.question, (float("-inf"),))[0]:
            score, first, last = span
            best[w.question] = (score, w.offsets[first][0], w.offsets[last][1])
    texts, no_answer_scores = {}, {}
    for n, question in enumerate(questions):
        score, begin, end = best.get(n, (float("-inf"), 0, 0))
        texts[question.id] = question.context[begin:end]
        no_answer_scores[question.id] = null.get(n, float("inf")) - score
    return texts, no_answer_scores


def _best_span(starts: torch.Tensor, ends: torch.Tensor, candidate: list[bool],
               max_answer_len: int) -> tuple[float, int, int] | None:
    """(score, first token, last token) of the best span of one window, or None when it has no candidate."""
    allowed = torch.tensor(candidate, device=starts.device)
    if not allowed.any():
        return None
    starts, ends = starts.masked_fill(~allowed, float("-inf")), ends.masked_fill(~allowed, float("-inf"))
    # scores[i, k]: the span from token i to token i + k
    padded = torch.cat([ends, ends.new_full((max_answer_len - 1,), float("-inf"))])
    scores = starts[:, None] + padded.unfold(0, max_answer_len, 1)
    flat = scores.argmax().item()
    first, length = divmod(flat, max_answer_len)
    return scores.flatten()[flat].item(), first, first + length


class SpanQA(Exported, Distilled, Baselined, Calibrated, Reported, TaskType):
    """Start and end logits from the head's two outputs at every position; questions fall into train or
    dev by their context, so no paragraph is in both. Predictions are per window, decoded per question
    when a split is scored; on SQuAD 2.0 data (a train question without answers) the no-answer
    threshold is the best one on dev, and the evaluation split is answered with dev's."""

    name = "span_qa"
    metrics = default_metrics = ("f1", "exact_match")
    pair_role = "context"
    per_token = True
    head_dropout = False  # BertForQuestionAnswering's qa_outputs: a linear layer on the states, no dropout
    task_model = QUESTION_ANSWERING  # a linear layer on every state to start and end logits
    pipeline_tag = "question-answering"
    baseline = "overlap_qa"
    baseline_label = "word-overlap QA"
    timed = "one window of {seq_len} tokens per call (a longer context takes several)"
    kept_extras = (THRESHOLD, BREAKDOWN)

    def read(self, cfg: TaskConfig, split: str, key: str, train: list | None) -> tuple[list[Question], dict[str, int]]:
        fields = {"question": "text_field", "context": "text_pair_field", "answers": "label_field"}
        has_id = "id" in split_columns(cfg.source, split, key)
        undecodable = Counter()
        rows = ({**row, "id": row["id"] if has_id else n}
                for n, row in enumerate(read_split(cfg, split, key, fields, undecodable, ["id"] if has_id else [])))
        questions, counts = read_rows(rows)
        return questions, {**undecodable, **counts}

    def hash_text(self, item: Question) -> str:
        return item.context

    def prepare(self, cfg: TaskConfig, train: list[Question], key: str) -> tuple[list[str], dict[str, Any]]:
        return [], {"unanswerable": any(not q.answers for q in train), "max_answer_len": cfg.max_answer_len,
                    "stride": cfg.stride, "max_question_len": cfg.max_question_len}

    def encode(self, items, cfg, tokenizer, special, label_names, info, key,
               causal=False) -> tuple[list[Window], int]:
        windows, counts = encode(items, tokenizer, special, cfg.max_len, cfg.stride, cfg.max_question_len, key)
        return windows, counts["truncated_questions"]

    def n_outputs(self, task: TaskData) -> int:
        return 2

    def collate(self, examples: Sequence[Window], pad_id: int, task: TaskData) -> dict[str, torch.Tensor]:
        return collate(examples, pad_id)

    def loss(self, outputs: torch.Tensor, batch: dict[str, torch.Tensor], task: TaskData) -> torch.Tensor:
        return loss(outputs.unbind(-1), batch)

    def predict(self, outputs: torch.Tensor, examples: Sequence[Window], task: TaskData) -> list[torch.Tensor]:
        return [window_logits[:len(w.ids)].float().cpu() for window_logits, w in zip(outputs, examples)]

    def score(self, task: TaskData, split: str, predictions: list[torch.Tensor], metrics: list[str],
              calibration: dict[str, Any] | None = None) -> tuple[dict[str, float], dict[str, Any]]:
        questions, windows = task.references[split], task.dev if split == "dev" else task.eval
        texts, no_answer = decode([p[:, 0] for p in predictions], [p[:, 1] for p in predictions], windows, questions,
                                  task.info["max_answer_len"])
        extras: dict[str, Any] = {}
        if task.info["unanswerable"]:
            threshold = (calibration or {}).get(THRESHOLD.name)
            if threshold is None:
                threshold = best_no_answer_threshold(texts, golds(questions), no_answer)["best_f1_threshold"]
            texts = apply_no_answer_threshold(texts, no_answer, threshold)
            extras[THRESHOLD.name] = threshold
        scores = squad_scores(texts, golds(questions))
        return {m: scores[m] for m in metrics}, {**extras, BREAKDOWN.name: scores}

    def report_section(self, result: Any, row_label: Callable[[str, Any], str]) -> list[str]:
        """SQuAD 2.0's breakdown (HasAns, NoAns, overall EM / F1) and each model's no-answer threshold, per
        split, where a split has unanswerable questions."""
        rows = []
        for split, scored in result.splits.items():
            for model, breakdown in scored.extras.get(BREAKDOWN.name, {}).items():
                if "no_answer_f1" not in breakdown:
                    continue
                threshold = scored.extras.get(THRESHOLD.name, {}).get(model)
                shown = ("–" if threshold is None else "−∞ (answers no question)" if threshold == "-inf"
                         else f"{threshold:.3f}")
                cells = [f"{100 * breakdown[f'{group}exact_match']:.1f} / {100 * breakdown[f'{group}f1']:.1f}"
                         if f"{group}f1" in breakdown else "–" for group in ("has_answer_", "no_answer_", "")]
                rows.append(f"| {row_label(model, scored)} | {split} | " + " | ".join(cells) + f" | {shown} |")
        if not rows:
            return []
        return ["| model | split | HasAns EM / F1 | NoAns EM / F1 | overall EM / F1 | no-answer threshold |",
                "|---|---|---:|---:|---:|---:|", *rows, "",
                "A question is answered \"no answer\" when its no-answer score exceeds the threshold, picked on dev "
                "(the baseline's on train) as SQuAD 2.0's script picks it, and applied unchanged to the split.", ""]

    def soft_loss(self, student: torch.Tensor, teacher: torch.Tensor, batch: dict[str, torch.Tensor],
                  temperature: float) -> torch.Tensor:
        """(B, T, 2) start and end logits -> the mean of masked_soft_loss over the start and over the end
        distributions, both over the candidate positions (those an answer may begin or end at, and 0 for
        "no answer"), as the loss chooses among them."""
        return sum(masked_soft_loss(student[..., k], teacher[..., k], batch["candidates"], temperature)
                   for k in (0, 1)) / 2

    def baseline_scores(self, task: TaskData, train: list[Question], metrics: list[str], settings: EvaluateConfig):
        """The baseline answers with text, not logits: scored here as `score` scores decoded answers."""
        items = task.references["eval"]
        model = OverlapQA.fit(train, no_answer=bool(task.info.get("unanswerable")))
        scores = squad_scores(model.answers(items), golds(items))
        extras = {THRESHOLD.name: model.threshold} if model.threshold is not None else {}
        return {m: scores[m] for m in metrics}, {**extras, BREAKDOWN.name: scores}


def masked_soft_loss(student: torch.Tensor, teacher: torch.Tensor, allowed: torch.Tensor,
                     temperature: float) -> torch.Tensor:
    """(B, T) logits, (B, T) bool -> KL(teacher_T || student_T) of the distributions over each row's
    allowed positions only, mean over the rows, times T^2. The others get probability 0 in both and
    add nothing (filled after the log-softmax, so that no -inf - -inf makes a nan)."""
    def log_probs(logits: torch.Tensor) -> torch.Tensor:
        return F.log_softmax((logits / temperature).masked_fill(~allowed, float("-inf")), -1).masked_fill(~allowed, 0.0)

    student_log, teacher_log = log_probs(student), log_probs(teacher)
    p = teacher_log.exp().masked_fill(~allowed, 0.0)
    return (p * (teacher_log - student_log)).sum(-1).mean() * temperature**2


TYPE = SpanQA()

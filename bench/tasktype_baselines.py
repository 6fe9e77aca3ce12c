"""Scores of lib.metrics.baselines on the shared data, the floor a finetuned model of each new task
type should clear. Fit on each dataset's train split; prints one JSON line per dataset and split.

    python bench/tasktype_baselines.py [--data ../shared/data]

CoNLL-2003 is scored on test (testb, as the literature reports it); SQuAD and SQuAD 2.0 on their
validation split, which is part of the official dev set ("SQuAD v1.1 dev, article split": see their
PROVENANCE.md, never compare with the leaderboard); STS-B and CODAH on validation and test.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

from lib.metrics.scores import choice_accuracy, entity_scores, pearson, spearman, squad_scores  # noqa: E402
from lib.tasks import multiple_choice, regression, span_qa, tagging  # noqa: E402
from lib.metrics.baselines import OverlapQA, lexicon_tags, tfidf_choice_scores, tfidf_similarity  # noqa: E402


def read(data: Path, name: str, split: str) -> list[dict]:
    with gzip.open(data / name / f"{split}.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def report(name: str, split: str, scores: dict, start: float, **extra) -> None:
    rounded = {k: round(v, 4) if isinstance(v, float) else v for k, v in scores.items()}
    seconds = round(time.perf_counter() - start, 1)
    print(json.dumps({"data": name, "split": split, **rounded, **extra, "seconds": seconds}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    data = parser.parse_args().data

    start = time.perf_counter()
    train, _ = tagging.read_rows(read(data, "conll2003", "train"))
    test, skipped = tagging.read_rows(read(data, "conll2003", "test"))
    scores = entity_scores([s.tags for s in test], lexicon_tags(train, [s.words for s in test]))
    report("conll2003", "test", {k: scores[k] for k in ("f1", "precision", "recall")}, start, skipped=dict(skipped))

    for name in ("squad", "squad_v2"):
        start = time.perf_counter()
        model = OverlapQA.fit(span_qa.read_rows(read(data, name, "train"))[0], no_answer=name == "squad_v2")
        questions, counts = span_qa.read_rows(read(data, name, "validation"))
        scores = squad_scores(model.answers(questions), span_qa.golds(questions))
        report(name, "validation", scores, start, span_words=model.span_words, threshold=model.threshold,
               skipped=dict(counts))

    start = time.perf_counter()
    train_pairs, _ = regression.read_rows(read(data, "stsb", "train"))
    for split in ("validation", "test"):
        pairs, skipped = regression.read_rows(read(data, "stsb", split))
        predicted, gold = tfidf_similarity(train_pairs, pairs), [pair.value for pair in pairs]
        report("stsb", split, {"pearson": pearson(predicted, gold), "spearman": spearman(predicted, gold),
                               "count": len(pairs)}, start, skipped=dict(skipped))

    start = time.perf_counter()
    train_questions, _ = multiple_choice.read_rows(read(data, "codah", "train"))
    for split in ("validation", "test"):
        questions, skipped = multiple_choice.read_rows(read(data, "codah", split), len(train_questions[0].endings))
        scores = tfidf_choice_scores(train_questions, questions)
        report("codah", split, {"accuracy": choice_accuracy(scores, [q.label for q in questions]),
                                "count": len(questions)}, start, skipped=dict(skipped))


if __name__ == "__main__":
    main()

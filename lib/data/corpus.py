"""Clean a configured corpus into `train` and `valid` JSONL.gz files, and read them back.

Layout written by the clean stage: `<out>/<corpus>/{train,valid}.jsonl.gz`, one {"text": ...}
object per line, which later stages stream through `lib.data.sources` like any other local source.
"""
from __future__ import annotations

import gzip
import hashlib
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from lib.config.errors import UserError
from lib.config.params import CorpusConfig
from lib.core.io import JsonlGzWriter
from lib.core.progress import Progress
from lib.data.clean import CleanStats, DocumentCleaner
from lib.data.sources import read_rows, read_texts

CORPORA = ("pretrain", "domain")  # the fields of lib.config.params.Corpora, in the order they are cleaned
TRAIN, VALID = "train", "valid"
SUFFIX = ".jsonl.gz"


def in_valid_split(text: str, valid_fraction: float) -> bool:
    """Deterministic, order-free split: a document's hash decides, so reruns and reorders agree."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") < valid_fraction * 2**64


def eval_texts(spec: dict[str, dict], raw_dir: Path) -> Iterator[str]:
    """Every text of every task's evaluation splits, as the data stage's lib.data.raw.eval_text_spec names them,
    for decontamination: each text field's value (both texts of a pair; span_qa's question and context); by
    the field's kind, a tagging task's words joined by single spaces, a multiple_choice task's context
    followed by each of its endings, and every text of a seq2seq task's source and target records (the
    types' `field_kinds`, lib/tasks, say why). A value of another type is a UserError
    naming the task's field key."""
    for name, task in spec.items():
        source, kinds = str(raw_dir / task["folder"]), task.get("kinds", {})
        keys = {key: f"tasks.{name}.{key}" for key in task["fields"]}
        for split in task["splits"]:
            for row in read_rows(source, split, task["fields"], f"tasks.{name}.eval_splits", field_keys=keys):
                where = {key: f"{keys[key]}: field '{task['fields'][key]}' of '{source}' split '{split}'"
                         for key in keys}
                for key, value in row.items():
                    kind = kinds.get(key, "text")
                    if kind == "words":
                        yield " ".join(_strings(value, where[key], "list of words"))
                    elif kind == "endings":  # each completes the context, text_field's value
                        context = _text(row.get("text_field"), where.get("text_field", ""))
                        yield from (" ".join(filter(None, (context, ending)))
                                    for ending in _strings(value, where[key], "list of endings"))
                    elif kind == "texts":
                        yield from _nested_texts(value)
                    else:
                        yield _text(value, where[key])


def _nested_texts(value: object) -> Iterator[str]:
    """Every text in a field that holds a text or a record of them: a translation {en: ..., de: ...}, SQuAD's
    answers {text: [...], answer_start: [...]} (the numbers are not text and are passed over)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _nested_texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _nested_texts(item)


def _text(value: object, where: str) -> str:
    """One text field's value (null -> ''), else a UserError `where` ... holds <type> values."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise UserError(f"{where} holds {type(value).__name__} values, not text; name a text field")
    return value


def _strings(value: object, where: str, what: str) -> list[str]:
    """A list-of-strings field's value (null -> []), else a UserError `where` ... holds <type> values."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        held = type(value).__name__ if not isinstance(value, list) else \
            f"lists of {next(type(v).__name__ for v in value if not isinstance(v, str))}"
        raise UserError(f"{where} holds {held} values, not a {what}; name the field of its {what}")
    return value


def clean_corpus(corpus: CorpusConfig, key: str, cleaner: DocumentCleaner, out_dir: Path,
                 progress: Progress | None = None) -> dict:
    """Clean `corpus` into out_dir/{train,valid}.jsonl.gz; return its statistics. `progress` counts
    the documents read.

    A source validation split is cleaned first, so training documents that duplicate a validation
    document are the ones dropped and the validation set stays as the source defines it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stats = CleanStats()
    chars = dict.fromkeys((TRAIN, VALID), 0)
    start = time.perf_counter()
    with JsonlGzWriter(out_dir / f"{TRAIN}{SUFFIX}") as train, JsonlGzWriter(out_dir / f"{VALID}{SUFFIX}") as valid:
        writers = {TRAIN: train, VALID: valid}

        def write(split: str, text: str) -> None:
            writers[split].write({"text": text})
            chars[split] += len(text)
            if progress is not None:
                progress.tick(stats.docs_in)

        if corpus.valid_split is not None:
            for text in cleaner.run(_read(corpus, [corpus.valid_split], key), stats):
                write(VALID, text)
            for text in cleaner.run(_read(corpus, corpus.splits, key), stats):
                write(TRAIN, text)
        else:
            for text in cleaner.run(_read(corpus, corpus.splits, key), stats):
                write(VALID if in_valid_split(text, corpus.valid_fraction) else TRAIN, text)
    seconds = time.perf_counter() - start
    for split, writer in writers.items():
        if writer.rows == 0:
            raise UserError(f"{key}: no {split} documents left after cleaning ({stats.docs_in} read); "
                            f"use more data{' or a larger valid_fraction' if split == VALID else ''}, "
                            "or loosen the clean rules (see metrics)")
    return {**stats.as_dict(), "seconds": round(seconds, 3),
            "mb_per_s": round(stats.chars_in / 1e6 / max(seconds, 1e-9), 2),
            **{f"{split}_docs": w.rows for split, w in writers.items()},
            **{f"{split}_chars": n for split, n in chars.items()}}


def planned_docs(corpus: CorpusConfig, rows: dict[str, int]) -> int:
    """The documents clean_corpus reads of `corpus`, given the rows of each split of its source."""
    splits = [corpus.valid_split] * (corpus.valid_split is not None) + corpus.splits
    return sum(min(rows.get(split, 0), corpus.max_docs or rows.get(split, 0)) for split in splits)


def _read(corpus: CorpusConfig, splits: Iterable[str], key: str) -> Iterator[str]:
    for split in splits:
        yield from read_texts(corpus.source, split, corpus.text_field, f"{key}.splits", corpus.max_docs,
                              field_key=f"{key}.text_field")


def read_clean(clean_dir: Path, corpus: str, split: str) -> Iterator[str]:
    """Texts of a cleaned corpus split, as written by clean_corpus."""
    return read_texts(str(clean_dir / corpus / f"{split}{SUFFIX}"), TRAIN, "text", f"{clean_dir}/{corpus}")


def count_clean(clean_dir: Path, corpus: str, split: str) -> int:
    """How many texts read_clean yields: one JSON line each, counted in one decompression pass without
    parsing, so the tokenizer's progress can show a total and an ETA."""
    with gzip.open(clean_dir / corpus / f"{split}{SUFFIX}", "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))

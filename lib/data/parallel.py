"""Parallel text (XLM, `corpora.parallel`): sentence pairs cleaned side by side, and the documents the
tokenizer stage makes of them.

The clean stage writes `<clean>/parallel/<name>/{train,valid}.jsonl.gz`, one `{"<a>": ..., "<b>": ...}`
row per pair, keyed by the corpus's two language codes. Pairs are sentences (Multi30k's are image
captions of ~60 characters), not documents, so the document filters (min_chars, junk, near-duplicates)
do not apply: each side goes through the documents' rewrite rules (clean_text), and a pair is dropped
when a side is empty or undecodable, when either side contains an evaluation text of a task (STS-B
holds Flickr captions and Multi30k is Flickr30k's), or when it repeats an earlier pair (case and spacing
aside). Validation pairs are cleaned first, so a training pair that repeats one is the one dropped.
"""
from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lib.config.errors import UserError
from lib.config.params import CleanConfig, Corpora, ParallelCorpusConfig
from lib.core.io import JsonlGzWriter
from lib.core.progress import Progress
from lib.data.clean import REWRITE_RULES, clean_text
from lib.data.corpus import SUFFIX, TRAIN, VALID, count_clean, read_clean
from lib.data.dedup import ContaminationIndex, exact_key, word_hashes
from lib.data.sources import read_rows

PARALLEL = "parallel"  # the folder of the parallel corpora in data/clean and data/tokens
PAIR_DROP_REASONS = ("empty", "undecodable", "contaminated", "exact_dup")


@dataclass
class PairStats:
    """Counts of one corpus's cleaning. `rewritten`: sides each rule changed; `dropped`: pairs dropped
    for each reason (the first that applies)."""

    pairs_in: int = 0
    pairs_out: int = 0
    rewritten: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {"pairs_in": self.pairs_in, "pairs_out": self.pairs_out,
                "rewritten": {rule: self.rewritten[rule] for rule in REWRITE_RULES},
                "dropped": {reason: self.dropped[reason] for reason in PAIR_DROP_REASONS}}


class PairCleaner:
    """Cleans a stream of pairs; its exact-duplicate memory lasts across `run` calls (validation, then train)."""

    def __init__(self, cfg: CleanConfig, contamination: ContaminationIndex | None) -> None:
        self.cfg = cfg
        self.contamination = contamination if cfg.decontaminate.enabled else None
        self._seen: set[bytes] = set()

    def run(self, pairs: Iterable[tuple[str, str]], stats: PairStats) -> Iterator[tuple[str, str]]:
        for raw in pairs:
            stats.pairs_in += 1
            sides = []
            for text in raw:
                text, rules = clean_text(text, self.cfg)
                stats.rewritten.update(rules)
                sides.append(text)
            reason = self._reason(sides)
            if reason is not None:
                stats.dropped[reason] += 1
                continue
            stats.pairs_out += 1
            yield sides[0], sides[1]

    def _reason(self, sides: list[str]) -> str | None:
        if not all(sides):
            return "empty"
        if any("\ufffd" in side for side in sides):  # what decoding put in place of invalid bytes
            return "undecodable"
        if self.contamination is not None and any(self.contamination.contains_words(word_hashes(side))
                                                  for side in sides):
            return "contaminated"
        key = b"".join(map(exact_key, sides)) if self.cfg.exact_dedup else None
        if key in self._seen:
            return "exact_dup"
        if key is not None:
            self._seen.add(key)
        return None


def read_pairs(corpus: ParallelCorpusConfig, split: str, key: str, split_key: str) -> Iterator[tuple[str, str]]:
    """The (first, second) language's texts of each record of `split` of the corpus's source (at most
    max_pairs), a null text as ''; a translation field that lacks one of the languages or holds no texts is a
    UserError naming the params key."""
    field_key = f"{key}.translation_field"
    where = f"field '{corpus.translation_field}' of '{corpus.source}' split '{split}'"
    for row in read_rows(corpus.source, split, {"translation": corpus.translation_field}, split_key,
                         corpus.max_pairs, {"translation": field_key}):
        translation = row["translation"]
        if not isinstance(translation, dict):
            raise UserError(f"{field_key}: {where} holds {type(translation).__name__} values, not a mapping of "
                            'language code to text ({"en": ..., "de": ...}); name the field of the translations')
        missing = [code for code in corpus.languages if code not in translation]
        if missing:
            raise UserError(f"{key}.languages: {missing[0]} is not a language of {where} (it has: "
                            f"{', '.join(map(str, translation))}); name two of those")
        texts = [translation[code] for code in corpus.languages]
        if not all(text is None or isinstance(text, str) for text in texts):
            raise UserError(f"{field_key}: {where} holds a translation that is not text; name the field of the "
                            "translations")
        yield texts[0] or "", texts[1] or ""


def clean_parallel(corpus: ParallelCorpusConfig, key: str, cleaner: PairCleaner, out_dir: Path) -> dict:
    """Clean `corpus` into out_dir/{train,valid}.jsonl.gz (its valid_split, then its splits); return its
    statistics. A split left without pairs is a UserError naming the corpus."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stats = PairStats()
    start = time.perf_counter()
    progress = Progress(f"clean: {key}", None, "pairs")
    parts = {VALID: [(corpus.valid_split, f"{key}.valid_split")], TRAIN: [(s, f"{key}.splits") for s in corpus.splits]}
    written = {}
    for part, splits in parts.items():
        with JsonlGzWriter(out_dir / f"{part}{SUFFIX}") as writer:
            pairs = itertools.chain.from_iterable(read_pairs(corpus, split, key, split_key) for split, split_key in splits)
            for first, second in cleaner.run(pairs, stats):
                writer.write(dict(zip(corpus.languages, (first, second))))
                progress.tick(stats.pairs_in)
        written[part] = writer.rows
        if writer.rows == 0:
            raise UserError(f"{key}: no {part} pairs left after cleaning ({stats.pairs_in} read); use more data or "
                            "loosen the clean rules (see metrics)")
    return {**stats.as_dict(), **{f"{part}_pairs": n for part, n in written.items()},
            "seconds": round(time.perf_counter() - start, 3)}


def read_clean_pairs(clean_dir: Path, name: str, corpus: ParallelCorpusConfig, split: str) -> Iterator[tuple[str, str]]:
    """The pairs of a cleaned parallel corpus's split (train, valid), as clean_parallel wrote them."""
    a, b = corpus.languages
    for row in read_rows(str(clean_dir / PARALLEL / name / f"{split}{SUFFIX}"), TRAIN, {a: a, b: b},
                         f"{clean_dir}/{PARALLEL}/{name}"):
        yield row[a], row[b]


def pair_documents(clean_dir: Path, corpora: Corpora, split: str) -> Iterator[tuple[str, str]]:
    """(language, text) of each side of every pair of every parallel corpus in params order: pair i's
    first side, then its second, so that pair i is documents 2i and 2i + 1."""
    for name, corpus in corpora.parallel.items():
        a, b = corpus.languages
        for first, second in read_clean_pairs(clean_dir, name, corpus, split):
            yield a, first
            yield b, second


def monolingual(clean_dir: Path, corpora: Corpora, split: str) -> Iterator[tuple[str, str]]:
    """(language, text) of each distinct side of the parallel corpora: the sentences of each language as
    monolingual text, one language after another. Grouped so, a window of masked LM never holds a sentence
    beside its translation: that would be translation LM, and `mlm` on this stream is TLM's control.
    Each sentence once: Multi30k's English captions are the same in its en-de and en-fr corpora."""
    languages = dict.fromkeys(code for corpus in corpora.parallel.values() for code in corpus.languages)
    for language in languages:
        seen: set[bytes] = set()
        for side, text in pair_documents(clean_dir, corpora, split):
            key = exact_key(text)
            if side == language and key not in seen:
                seen.add(key)
                yield language, text


def documents(clean_dir: Path, corpora: Corpora, name: str, split: str) -> tuple[Iterable, int]:
    """The documents the tokenizer stage encodes into data/tokens/<name>/<split>, and how many. PARALLEL:
    the pairs' sides (pair_documents). A language-model corpus (pretrain, domain): its cleaned texts;
    with parallel corpora each as (language, text), the pretraining text followed by their monolingual
    sentences (XLM's masked LM reads every language)."""
    if name == PARALLEL:
        pairs = sum(count_clean(clean_dir / PARALLEL, corpus, split) for corpus in corpora.parallel)
        return pair_documents(clean_dir, corpora, split), 2 * pairs
    texts, count = read_clean(clean_dir, name, split), count_clean(clean_dir, name, split)
    if not corpora.parallel:
        return texts, count
    tagged = zip(itertools.repeat(getattr(corpora, name).language), texts)
    if name != "pretrain":
        return tagged, count
    sentences = sum(1 for _ in monolingual(clean_dir, corpora, split))
    return itertools.chain(tagged, monolingual(clean_dir, corpora, split)), count + sentences


def pair_tokens(clean_dir: Path, corpora: Corpora, split: str, offsets: np.ndarray) -> dict[str, dict[str, int]]:
    """Per parallel corpus, the pairs of `split` and their tokens (eos separators not counted), read off the
    document offsets of its pair token file, where the corpora lie one after another in params order."""
    counts, first = {}, 0
    for name in corpora.parallel:
        pairs = count_clean(clean_dir / PARALLEL, name, split)
        end = first + 2 * pairs
        counts[name] = {"pairs": pairs, "tokens": int(offsets[end] - offsets[first]) - 2 * pairs}
        first = end
    return counts

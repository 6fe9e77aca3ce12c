"""ERNIE 1.0 knowledge units (Sun et al. 2019): phrases and named entities, masked whole by `mlm.knowledge`.

Both are mined once, by the tokenizer stage, from the pretraining corpus's train text (the text the
tokenizer learns from), never from an evaluation set, and with no labeled data:
- phrases: collocations, word bigrams whose normalised PMI (Bouma 2009) is high, counted case-blind;
- entities: capitalised multi-word spans ("New York City", "Barack Obama"), counted as written. A
  sentence's first word is capitalised whatever it is, so a span never starts there ("The" of "The New
  York Times" opening a sentence is left out; "New York Times" is kept).
Words here are runs of word characters, single punctuation marks and line breaks (WORD): punctuation and
line breaks end phrases and entities.

`unit_starts` then turns a document's word-start flags into unit-start flags: the tokens of every phrase
(or entity) found in it lose their start flags but the first, so masking (lib/objectives/masking.py)
takes the phrase as one word. Flags are only ever cleared, so a unit is always whole words of the
tokenizer. Phrases that overlap join into one unit: "new york" and "york city" make "new york city" one.
"""
from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lib.config.errors import UserError
from lib.core.io import write_json

UNITS = ("phrase", "entity")  # the kinds of unit, each with a flag file beside the token files (lib/data/packed.py)
WORD = re.compile(r"\w+|[^\w\s]|\n")
SENTENCE_END = frozenset(".!?\n")
# A pair seen a few times with two rare words gets the highest PMI there is by chance alone; 5 is the
# usual floor for PMI collocations.
PHRASE_MIN_COUNT = 5
# Normalised PMI is 1 when the two words only ever occur together and 0 when they are independent;
# on Wikipedia at 0.5 "such as" (0.67) and "new york" (0.78) pass, "of the" (0.31) does not.
PHRASE_MIN_NPMI = 0.5
ENTITY_MIN_COUNT = 3  # a capitalised span seen this often is a name rather than a title-cased accident
MAX_ENTITY_WORDS = 6  # longer capitalised runs are headings and titles, not names
MAX_UNITS = 50_000  # of each kind, the most frequent: enough for the corpus, small enough to read


@dataclass
class Knowledge:
    """Mined units, each with its count in the mined text: phrase -> (count, npmi), entity -> count.
    A unit is its words joined by single spaces; phrases lowercased."""

    phrases: dict[str, tuple[int, float]]
    entities: dict[str, int]

    def save(self, path: Path) -> None:
        """A JSON file a person can read: most frequent first."""
        write_json(path, {
            "phrases": [[p, c, round(npmi, 3)] for p, (c, npmi) in self.phrases.items()],
            "entities": [[e, c] for e, c in self.entities.items()],
            "mined": {"phrase_min_count": PHRASE_MIN_COUNT, "phrase_min_npmi": PHRASE_MIN_NPMI,
                      "entity_min_count": ENTITY_MIN_COUNT, "max_entity_words": MAX_ENTITY_WORDS,
                      "max_units": MAX_UNITS}})

    @classmethod
    def load(cls, path: Path) -> Knowledge:
        try:
            saved = json.loads(Path(path).read_text(encoding="utf-8"))
            return cls({p: (c, npmi) for p, c, npmi in saved["phrases"]}, {e: c for e, c in saved["entities"]})
        except FileNotFoundError:
            raise UserError(f"{path}: not found; run the tokenizer stage (dvc repro tokenizer)") from None
        except (ValueError, KeyError, TypeError) as err:
            raise UserError(f"{path}: not a knowledge file ({err!r}); run the tokenizer stage again") from None


def knowledge_units(choice: str) -> tuple[str, ...]:
    """The units an mlm.knowledge choice masks whole: none -> (), both -> every kind."""
    return {"none": (), "both": UNITS}.get(choice, (choice,))


def mine(texts: Iterable[str]) -> Knowledge:
    """Phrases and entities of `texts` (see the module's docstring)."""
    words, pairs, spans = Counter(), Counter(), Counter()
    for text in texts:
        doc = WORD.findall(text)
        lower = [w.lower() for w in doc]
        words.update(lower)
        pairs.update(map(" ".join, zip(lower, lower[1:])))  # in C: the hot loop stays out of Python
        spans.update(capitalised_spans(doc))
    n = max(sum(words.values()), 1)  # pairs too are counted per word: "x y" only ever together gives 1 exactly
    phrases = {}
    for pair, count in pairs.items():
        if count < PHRASE_MIN_COUNT:
            continue
        a, b = pair.split(" ")
        if not (a.isalpha() and b.isalpha()):
            continue
        npmi = normalised_pmi(count / n, words[a] / n, words[b] / n)
        if npmi >= PHRASE_MIN_NPMI:
            phrases[pair] = (count, npmi)
    entities = {span: count for span, count in spans.items() if count >= ENTITY_MIN_COUNT}
    return Knowledge(dict(sorted(phrases.items(), key=lambda kv: -kv[1][0])[:MAX_UNITS]),
                     dict(Counter(entities).most_common(MAX_UNITS)))


def normalised_pmi(p_xy: float, p_x: float, p_y: float) -> float:
    """log(p(xy) / (p(x) p(y))) / -log p(xy), in [-1, 1] (1: x and y only ever occur together)."""
    return math.log(p_xy / (p_x * p_y)) / -math.log(p_xy) if p_xy < 1 else 1.0


def capitalised(word: str) -> bool:
    return word[:1].isupper()


def capitalised_spans(words: list[str]) -> list[str]:
    """The runs of 2..MAX_ENTITY_WORDS capitalised words of `words`, none starting a sentence."""
    spans, run = [], []
    previous = "\n"
    for word in [*words, "\n"]:  # the line break ends the last run
        if capitalised(word) and (run or previous not in SENTENCE_END):
            run.append(word)
        else:
            if 2 <= len(run) <= MAX_ENTITY_WORDS:
                spans.append(" ".join(run))
            run = []
        previous = word
    return spans


def phrase_spans(lower: list[str], phrases: dict) -> list[tuple[int, int]]:
    """(first, end) word indices of every known phrase in the lowercased words (overlaps included)."""
    return [(i, i + 2) for i, pair in enumerate(map(" ".join, zip(lower, lower[1:]))) if pair in phrases]


def entity_spans(words: list[str], entities: dict) -> list[tuple[int, int]]:
    """(first, end) word indices of known entities in `words`, longest first from the left within each
    run of capitalised words. Unlike mining, a known entity is found at a sentence's start too."""
    caps = [capitalised(word) for word in words] + [False]
    spans = []
    for start in [i for i in range(len(words) - 1) if caps[i] and caps[i + 1] and not (i and caps[i - 1])]:
        end = caps.index(False, start)
        i = start
        while i < end - 1:
            j = next((j for j in range(min(end, i + MAX_ENTITY_WORDS), i + 1, -1)
                      if " ".join(words[i:j]) in entities), None)
            if j is None:
                i += 1
            else:
                spans.append((i, j))
                i = j
    return spans


def unit_starts(text: str, token_of: Callable[[int], int | None], word_starts: np.ndarray,
                knowledge: Knowledge) -> dict[str, np.ndarray]:
    """Per kind of unit (UNITS), the document's unit-start flags: `word_starts` (uint8, one per token)
    with 0 at every token of a unit found in `text` but its first. `token_of(i)`: the token that holds
    character i of `text` (a tokenizers Encoding's char_to_token), asked only at the units' ends."""
    words = WORD.findall(text)
    found = {"phrase": phrase_spans([w.lower() for w in words], knowledge.phrases),
             "entity": entity_spans(words, knowledge.entities)}
    # character offsets as plain ints: a list of a million live match objects makes the garbage
    # collector walk it again and again (it tripled the time)
    starts = [match.start() for match in WORD.finditer(text)]
    flags = {}
    for unit, spans in found.items():
        flags[unit] = word_starts.copy()
        for i, j in spans:
            first, last = token_of(starts[i]), token_of(starts[j - 1] + len(words[j - 1]) - 1)
            if first is not None and last is not None:  # None: a character the tokenizer dropped
                flags[unit][first + 1: last + 1] = 0
    return flags

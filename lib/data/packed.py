"""Packed token files (nanoGPT-style): a corpus split as one flat token array, read by memory map.

For a path prefix P:
- `P.bin`: token ids, uint16 when the vocabulary fits (<= 65536 ids), else uint32; every document is
  followed by the eos id, which separates documents;
- `P.idx`: raw int64 start offsets of the documents in P.bin, n_docs + 1 of them (the last = n_tokens),
  so document i with its eos is P.bin[idx[i]:idx[i + 1]];
- `P.wstart`: uint8, 1 where a token starts a word (a pre-tokenizer word; eos and special tokens count
  as words), for whole-word masking;
- `P.<unit>` for each knowledge unit the writer was given (phrase, entity: lib/data/knowledge.py): uint8,
  like P.wstart but 0 inside a unit too, for masking units whole (mlm.knowledge);
- `P.lang` when the writer was given languages (XLM, corpora.parallel): uint8, each token's language as
  an index into the metadata's `languages` (a document's eos takes its language);
- `P.json`: dtype, n_tokens, n_docs, vocab_size, eos_id, units, languages, and `tokenizer`: the SHA-256 of the
  tokenizer.json that encoded them, so a reader can tell token files of another vocabulary.
The writer streams to temporary files that are renamed into place when it closes; P.json comes last.
"""
from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
from tokenizers import Tokenizer

from lib.config.errors import UserError
from lib.core.io import atomic_file, batched, write_json
from lib.core.progress import Progress
from lib.data.knowledge import UNITS, Knowledge, unit_starts

OFFSET_DTYPE = np.dtype(np.int64)
FLAG_DTYPE = np.dtype(np.uint8)
LANGUAGE_DTYPE = np.dtype(np.uint8)


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id of the vocabulary."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


def packed_path(prefix: str | Path, suffix: str) -> Path:
    prefix = Path(prefix)
    return prefix.with_name(prefix.name + suffix)


class PackedWriter:
    """Appends documents to the packed files of `prefix`; use as a context manager.

    On a clean exit (or `close()`) the files appear whole; if the block raises, nothing is left behind
    and any earlier files of `prefix` stay as they were.
    """

    def __init__(self, prefix: str | Path, vocab_size: int, eos_id: int, tokenizer: str | None = None,
                 units: Sequence[str] = (), languages: Sequence[str] = ()) -> None:
        """With `languages` (codes), every document added names its language and P.lang is written."""
        if not 0 <= eos_id < vocab_size:
            raise ValueError(f"eos_id {eos_id} is outside the vocabulary (size {vocab_size})")
        if len(languages) > np.iinfo(LANGUAGE_DTYPE).max + 1 or len(set(languages)) != len(languages):
            raise ValueError(f"languages {list(languages)}: expected at most 256 distinct codes")
        self.prefix, self.vocab_size, self.eos_id, self.tokenizer = Path(prefix), vocab_size, eos_id, tokenizer
        self.units, self.languages = tuple(units), tuple(languages)
        self.dtype = token_dtype(vocab_size)
        self.n_tokens = self.n_docs = 0
        self._files = contextlib.ExitStack()
        self._bin, self._wstart, self._idx, *units_files = (
            self._files.enter_context(atomic_file(packed_path(prefix, suffix), "wb"))
            for suffix in (".bin", ".wstart", ".idx", *(f".{unit}" for unit in self.units)))
        self._units = dict(zip(self.units, units_files))
        self._lang = self._files.enter_context(atomic_file(packed_path(prefix, ".lang"), "wb")) \
            if self.languages else None
        self._idx.write(np.zeros(1, OFFSET_DTYPE).tobytes())  # the first document starts at 0
        self._eos = np.array([eos_id], np.int64)
        self._one = np.ones(1, FLAG_DTYPE)

    def add(self, ids_list: Sequence[Sequence[int]], word_start_list: Sequence[Sequence[int]],
            unit_start_lists: dict[str, Sequence[Sequence[int]]] | None = None,
            languages: Sequence[str] | None = None) -> None:
        """Append documents: their token ids and, token for token, their word-start flags (0/1) and
        the unit-start flags of each of the writer's units; with a writer of languages, each
        document's language code."""
        ids = [np.asarray(doc, np.int64) for doc in ids_list]
        if (languages is None) != (self._lang is None) or (languages is not None and len(languages) != len(ids)):
            raise ValueError(f"expected {'one language per document' if self.languages else 'no languages'}")
        if languages is not None and not set(languages) <= set(self.languages):
            raise ValueError(f"languages {sorted(set(languages) - set(self.languages))} are not the writer's "
                             f"{list(self.languages)}")
        flags = {"word": word_start_list, **(unit_start_lists or {})}
        if set(flags) != {"word", *self.units}:
            raise ValueError(f"expected word-start flags and unit-start flags of {list(self.units)}, got {list(flags)}")
        flags = {kind: [np.asarray(doc, FLAG_DTYPE) for doc in docs] for kind, docs in flags.items()}
        lengths = np.array([len(doc) + 1 for doc in ids], np.int64)  # + 1: the eos separator
        if any(len(ids) != len(docs) or any(len(i) != len(f) for i, f in zip(ids, docs)) for docs in flags.values()):
            raise ValueError("each document needs exactly one word-start (and unit-start) flag per token")
        if not ids:
            return
        tokens = np.concatenate([part for doc in ids for part in (doc, self._eos)])
        if tokens.min() < 0 or tokens.max() >= self.vocab_size:
            raise ValueError(f"token ids must be in [0, {self.vocab_size}), got {tokens.min()}..{tokens.max()}")
        self._bin.write(tokens.astype(self.dtype).tobytes())
        for kind, file in {"word": self._wstart, **self._units}.items():
            file.write(np.concatenate([part for doc in flags[kind] for part in (doc, self._one)]).tobytes())
        if self._lang is not None:
            codes = np.array([self.languages.index(code) for code in languages], LANGUAGE_DTYPE)
            self._lang.write(np.repeat(codes, lengths).tobytes())
        self._idx.write((self.n_tokens + np.cumsum(lengths)).tobytes())
        self.n_tokens += int(lengths.sum())
        self.n_docs += len(ids)

    def close(self) -> None:
        """Rename the files into place and write P.json."""
        packed_path(self.prefix, ".json").unlink(missing_ok=True)  # stale metadata must not describe new files
        self._files.close()
        write_json(packed_path(self.prefix, ".json"), {
            "dtype": self.dtype.name, "n_tokens": self.n_tokens, "n_docs": self.n_docs,
            "vocab_size": self.vocab_size, "eos_id": self.eos_id, "units": list(self.units),
            "languages": list(self.languages), "tokenizer": self.tokenizer})

    def __enter__(self) -> PackedWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if exc_info[0] is None:
            self.close()
        else:
            self._files.__exit__(*exc_info)  # each atomic_file deletes its temporary file


class PackedTokens:
    """Read-only memory maps of the packed files of `prefix`."""

    def __init__(self, prefix: str | Path) -> None:
        self.prefix = Path(prefix)
        meta_path = packed_path(prefix, ".json")
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            self.dtype = np.dtype(meta["dtype"])
            self.n_tokens: int = meta["n_tokens"]
            self.n_docs: int = meta["n_docs"]
            self.vocab_size: int = meta["vocab_size"]
            self.eos_id: int = meta["eos_id"]
            self.tokenizer: str | None = meta.get("tokenizer")
            self.units: list[str] = meta.get("units", [])
            self.languages: list[str] = meta.get("languages", [])
        except FileNotFoundError:
            raise UserError(f"{meta_path}: not found; encode the corpus first") from None
        except (ValueError, KeyError, TypeError) as err:
            raise UserError(f"{meta_path}: not packed-token metadata ({err!r}); re-encode the corpus") from None
        self.tokens = self._map(".bin", self.dtype, self.n_tokens)
        self.word_starts = self._map(".wstart", FLAG_DTYPE, self.n_tokens)
        self.doc_offsets = self._map(".idx", OFFSET_DTYPE, self.n_docs + 1)
        self._unit_maps: dict[str, np.ndarray] = {}
        # each token's language, an index into self.languages; None for a corpus of no named languages
        self.language_ids = self._map(".lang", LANGUAGE_DTYPE, self.n_tokens) if self.languages else None
        offsets = self.doc_offsets
        if offsets[0] != 0 or offsets[-1] != self.n_tokens or np.any(offsets[1:] <= offsets[:-1]):
            raise UserError(f"{packed_path(prefix, '.idx')}: document offsets do not rise from 0 to "
                            f"{self.n_tokens} tokens; the file is damaged, re-encode the corpus")

    def _map(self, suffix: str, dtype: np.dtype, count: int) -> np.ndarray:
        path = packed_path(self.prefix, suffix)
        if not path.is_file():
            raise UserError(f"{path}: not found; re-encode the corpus")
        size, expected = path.stat().st_size, count * dtype.itemsize
        if size != expected:
            raise UserError(f"{path}: {size} bytes, but {packed_path(self.prefix, '.json').name} says {count} "
                            f"{dtype.name} values ({expected} bytes); the file is damaged, re-encode the corpus")
        if count == 0:  # an empty file cannot be memory-mapped
            return np.zeros(0, dtype)
        return np.memmap(path, dtype, mode="r", shape=(count,))

    def __len__(self) -> int:
        return self.n_docs

    def unit_starts(self, unit: str) -> np.ndarray:
        """The unit-start flags of a knowledge unit (phrase, entity), memory-mapped."""
        if unit not in self.units:
            raise UserError(f"{packed_path(self.prefix, '.json')}: no {unit} flags for mlm.knowledge; "
                            "encode the corpora again (dvc repro tokenizer)")
        if unit not in self._unit_maps:
            self._unit_maps[unit] = self._map(f".{unit}", FLAG_DTYPE, self.n_tokens)
        return self._unit_maps[unit]

    def check_tokenizer(self, tokenizer: str, where: str | Path) -> None:
        """These files must have been encoded by the tokenizer whose tokenizer.json has SHA-256 `tokenizer`
        (the one in `where`): ids of another vocabulary would index the wrong embeddings, or none."""
        if self.tokenizer != tokenizer:
            raise UserError(f"{packed_path(self.prefix, '.json')}: encoded with another tokenizer than "
                            f"{Path(where) / 'tokenizer.json'}; encode the corpora again (dvc repro tokenizer)")

    def doc(self, i: int) -> np.ndarray:
        """The tokens of document i, without its eos separator."""
        i = range(self.n_docs)[i]  # IndexError out of range; negative counts from the end
        return self.tokens[self.doc_offsets[i]: self.doc_offsets[i + 1] - 1]


@dataclass
class EncodeStats:
    docs: int = 0
    tokens: int = 0  # document tokens; the eos separators are not counted
    words: int = 0  # whitespace-separated words of the texts
    unk: int = 0  # tokens that are the unk id
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_word(self) -> float:
        return self.tokens / self.words if self.words else 0.0


def encode_to_packed(tokenizer: Tokenizer, texts: Iterable[str] | Iterable[tuple[str, str]], prefix: str | Path,
                     vocab_size: int, eos_id: int, batch_docs: int, unk_id: int | None = None,
                     tokenizer_sha256: str | None = None, progress: Progress | None = None,
                     knowledge: Knowledge | None = None, languages: Sequence[str] = ()) -> EncodeStats:
    """Tokenize `texts` in batches of `batch_docs` and write them to the packed files of `prefix`.

    Documents get no bos/eos template (the packing adds one eos after each). The stats count `unk_id`,
    by default the unknown-token id of the tokenizer's model (byte-level BPE has none).
    `tokenizer_sha256` (of the saved tokenizer.json) is recorded for PackedTokens.check_tokenizer.
    `progress` counts the documents encoded. With `knowledge`, the unit-start flags of its phrases and
    entities are written too (P.phrase, P.entity). With `languages` (codes), `texts` yields (language,
    text) pairs, and each document's language is written (P.lang).
    """
    if unk_id is None:
        unk_id = model_unk_id(tokenizer)
    tokenizer = unpadded(tokenizer)
    stats = EncodeStats()
    start = time.perf_counter()
    units = UNITS if knowledge is not None else ()
    with PackedWriter(prefix, vocab_size, eos_id, tokenizer_sha256, units, languages) as writer:
        for batch in batched(texts, batch_docs):
            codes = [code for code, _ in batch] if languages else None
            batch = [text for _, text in batch] if languages else batch
            encodings = tokenizer.encode_batch(batch, add_special_tokens=False)  # in Rust, on every core
            ids = [encoding.ids for encoding in encodings]
            starts = [word_starts(encoding.word_ids) for encoding in encodings]
            found = [unit_starts(text, encoding.char_to_token, flags, knowledge)
                     for text, encoding, flags in zip(batch, encodings, starts)] if units else []
            writer.add(ids, starts, {unit: [doc[unit] for doc in found] for unit in units}, codes)
            stats.docs += len(batch)
            stats.tokens += sum(map(len, ids))
            stats.words += sum(len(text.split()) for text in batch)
            if unk_id is not None:
                stats.unk += sum(doc.count(unk_id) for doc in ids)
            if progress is not None:
                progress.tick(stats.docs, f"  {stats.tokens:,} tokens")
    stats.seconds = time.perf_counter() - start
    return stats


def word_starts(word_ids: list[int | None]) -> np.ndarray:
    """1 for the first token of each word, 0 for the tokens that continue it."""
    words = np.array(word_ids, np.float64)  # None (a special token) becomes nan, unequal to everything
    starts = np.ones(len(words), FLAG_DTYPE)
    starts[1:] = words[1:] != words[:-1]
    return starts


def model_unk_id(tokenizer: Tokenizer) -> int | None:
    """The id a tokenizer's model gives to unknown input, if it has one."""
    model = json.loads(tokenizer.to_str())["model"]  # the Python model objects do not all expose it
    if model.get("unk_id") is not None:  # Unigram
        return model["unk_id"]
    return tokenizer.token_to_id(model["unk_token"]) if model.get("unk_token") else None  # WordPiece, BPE


def unpadded(tokenizer: Tokenizer) -> Tokenizer:
    """`tokenizer`, or a copy of it that neither pads nor truncates: packed documents keep their length."""
    if tokenizer.padding is None and tokenizer.truncation is None:
        return tokenizer
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_padding()
    copy.no_truncation()
    return copy

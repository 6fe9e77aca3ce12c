"""Duplicate and contamination detection: exact keys, MinHash + LSH, evaluation-text index.

Everything works on words: the lowercased `\\w+` runs of a text, each hashed to 64 bits by
`word_hashes` in a few numpy passes over the text's code points (no Python loop per word or per
character). Hashes are fixed functions of the text, never Python's per-process `hash()`, so worker
processes and later runs agree.

Why MinHash is computed here rather than with `datasketch` (2.0.0, installed): datasketch needs
each shingle as a bytes object and hashes them one by one in Python (sha1) before its numpy
permutation step. Measured on the first 2,000 Wikipedia articles (30.8M chars, one core): shingle
strings + `MinHash.update_batch` ran at 6.7 MB/s (the shingle strings alone at 20 MB/s);
`MinHasher.signature` below runs at 56 MB/s, word hashing included.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

import numpy as np

N_CODE_POINTS = 0x110000
_U64 = np.uint64
_CHAR_BASE = 0x100000001B3  # odd multiplier of the per-word polynomial hash over code points
_WORD_BASE = _U64(0x9E3779B97F4A7C15)  # odd multiplier combining word hashes into window hashes
_EMPTY_VALUE = 0xFFFFFFFF  # every MinHash slot of a text without words
_MINHASH_CHUNK = 2048  # shingles per vectorised step: caps the work buffer at 2048 x num_perm
_ANCHOR_FILTER_BITS = 20  # 1 MiB boolean prefilter over anchor hashes (see ContaminationIndex)


def char_table(pattern: str) -> np.ndarray:
    """Boolean table over all code points: True where the one-character regex `pattern` matches."""
    every = np.arange(N_CODE_POINTS, dtype=np.uint32).tobytes().decode("utf-32-le", "surrogatepass")
    table = np.zeros(N_CODE_POINTS, bool)
    for run in re.finditer(f"(?:{pattern})+", every):
        table[run.start():run.end()] = True
    return table


def code_points(text: str) -> np.ndarray:
    """The code points of `text` as uint32, without a Python loop (lone surrogates pass through)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), np.uint32)


def _lowercase(code: int) -> int:
    """The lowercase code point of `code`, or `code` where lowercasing gives several (e.g. U+0130)."""
    low = chr(code).lower()
    return ord(low) if len(low) == 1 else code


def _fold_table() -> np.ndarray:
    """Per code point: its lowercase for a word character (regex \\w), 0 for any other character."""
    table = np.zeros(N_CODE_POINTS, np.uint32)
    word_chars = np.flatnonzero(char_table(r"\w")).tolist()
    table[word_chars] = [_lowercase(c) for c in word_chars]
    return table


_FOLD = _fold_table()  # built at import (~50 ms) so that forked workers share it


def _power_series(base: int, n: int) -> np.ndarray:
    """base**i mod 2**64 for i in range(n) (numpy's uint64 products wrap, which is the modulus)."""
    series = np.full(n, base, _U64)
    series[0] = 1
    return np.cumprod(series, out=series)


class _Powers:
    """P**i and P**-i mod 2**64 for the character positions seen so far, grown on demand."""

    def __init__(self) -> None:
        self.up = self.down = np.ones(0, _U64)

    def upto(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.up) < n:
            size = max(n, 2 * len(self.up), 1 << 16)
            self.up = _power_series(_CHAR_BASE, size)
            self.down = _power_series(pow(_CHAR_BASE, -1, 1 << 64), size)
        return self.up[:n], self.down[:n]


_POWERS = _Powers()


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, in place: spreads every input bit over all 64 output bits."""
    x ^= x >> _U64(30)
    x *= _U64(0xBF58476D1CE4E5B9)
    x ^= x >> _U64(27)
    x *= _U64(0x94D049BB133111EB)
    x ^= x >> _U64(31)
    return x


def exact_key(text: str) -> bytes:
    """8-byte blake2b of `text` lowercased with whitespace runs collapsed: equal for case/space variants."""
    normal = " ".join(text.lower().split())
    return hashlib.blake2b(normal.encode("utf-8", "surrogatepass"), digest_size=8).digest()


def word_hashes(text: str) -> np.ndarray:
    """A uint64 hash of each lowercased `\\w+` word of `text`, in text order.

    A word's hash is a polynomial over its code points, sum(c_j * P**(j - start)) mod 2**64, read
    off prefix sums of c_j * P**j for all words at once, then mixed.
    """
    folded = _FOLD[code_points(text)]  # lowercase code point inside words, 0 between them
    n = len(folded)
    in_word = np.zeros(n + 2, np.int8)
    np.not_equal(folded, 0, out=in_word[1:-1].view(bool))
    edges = np.flatnonzero(np.diff(in_word))  # alternating word starts and ends
    starts, ends = edges[0::2], edges[1::2]
    up, down = _POWERS.upto(n)
    prefix = np.zeros(n + 1, _U64)
    np.cumsum(np.multiply(folded, up, dtype=_U64), out=prefix[1:])  # chars between words add 0
    return _mix((prefix[ends] - prefix[starts]) * down[starts])


def window_hashes(words: np.ndarray, width: int) -> np.ndarray:
    """A uint64 hash of every run of `width` consecutive word hashes (len(words) - width + 1 runs)."""
    n = len(words) - width + 1
    if n <= 0:
        return np.zeros(0, _U64)
    out = words[:n].copy()
    for k in range(1, width):  # Horner's rule over the window, all windows at once
        out *= _WORD_BASE
        out += words[k:k + n]
    return out


class MinHasher:
    """MinHash signatures of word shingles, by seeded universal hashing vectorised in numpy.

    Permutation i maps a shingle's 32-bit hash x to (a_i * x + b_i) mod 2**32 with odd a_i (a
    bijection); the signature holds each permutation's minimum over the document's shingles.
    """

    def __init__(self, num_perm: int = 128, shingle_words: int = 5, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.num_perm = num_perm
        self.shingle_words = shingle_words
        self.mul = rng.integers(0, 1 << 32, num_perm, dtype=np.uint32) | np.uint32(1)
        self.add = rng.integers(0, 1 << 32, num_perm, dtype=np.uint32)

    def signature(self, text: str) -> np.ndarray:
        """The uint32 signature (num_perm values) of `text`."""
        return self.signature_of_words(word_hashes(text))

    def signature_of_words(self, words: np.ndarray) -> np.ndarray:
        """Signature from `word_hashes`; a text shorter than one shingle is one shingle of all its words."""
        signature = np.full(self.num_perm, _EMPTY_VALUE, np.uint32)
        if not len(words):
            return signature
        shingles = window_hashes(words, min(self.shingle_words, len(words)))
        shingles = (shingles >> _U64(32)).astype(np.uint32)
        buffer = np.empty((min(len(shingles), _MINHASH_CHUNK), self.num_perm), np.uint32)
        for start in range(0, len(shingles), _MINHASH_CHUNK):
            chunk = shingles[start:start + _MINHASH_CHUNK, None]
            values = np.multiply(chunk, self.mul, out=buffer[:len(chunk)])
            values += self.add
            np.minimum(signature, values.min(axis=0), out=signature)
        return signature


class LSHIndex:
    """Near-duplicate index over MinHash signatures, banded for candidate lookup.

    Each band has a dict from band value to the newest document with it; `_next` (numpy) links
    every document to the previous one with the same band value, so a bucket costs one dict entry
    however many documents share it.
    """

    def __init__(self, num_perm: int = 128, bands: int = 16, threshold: float = 0.8) -> None:
        if num_perm % bands:
            raise ValueError(f"bands ({bands}) must divide num_perm ({num_perm})")
        self.threshold = threshold
        self._band = np.dtype((np.void, 4 * num_perm // bands))  # one band of a uint32 signature as bytes
        self._newest: list[dict[bytes, int]] = [{} for _ in range(bands)]
        self._signatures = np.empty((1024, num_perm), np.uint32)
        self._next = np.empty((1024, bands), np.int64)  # previous document in the same bucket, or -1
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def is_near_duplicate_then_add(self, signature: np.ndarray) -> bool:
        """True if an indexed document's estimated Jaccard similarity is >= threshold; else index it."""
        keys = np.ascontiguousarray(signature, np.uint32).view(self._band).tolist()
        newest = [docs.get(key, -1) for docs, key in zip(self._newest, keys)]
        candidates = self._bucket_members(newest)
        if candidates and (self._signatures[candidates] == signature).mean(axis=1).max() >= self.threshold:
            return True
        self._add(signature, keys, newest)
        return False

    def _bucket_members(self, newest: list[int]) -> list[int]:
        """All documents of the buckets whose newest documents are `newest` (-1: an empty bucket)."""
        members = set()
        for band, doc in enumerate(newest):
            while doc >= 0:
                members.add(doc)
                doc = int(self._next[doc, band])
        return list(members)

    def _add(self, signature: np.ndarray, keys: list[bytes], newest: list[int]) -> None:
        doc = self._size
        if doc == len(self._signatures):
            self._signatures = np.concatenate([self._signatures, np.empty_like(self._signatures)])
            self._next = np.concatenate([self._next, np.empty_like(self._next)])
        self._signatures[doc] = signature
        self._next[doc] = newest
        for docs, key in zip(self._newest, keys):
            docs[key] = doc
        self._size += 1


class ContaminationIndex:
    """Evaluation examples, to find documents that contain one as a contiguous run of words.

    Texts are compared on their `\\w+` word sequence, lowercased, so case, punctuation and spacing
    differences do not hide a match. Each example is keyed by the hash of its first `min_words`
    words (its anchor); a document's hashes of every `min_words`-word window are looked up among
    the anchors, and each hit is verified against the example's full word-hash sequence. Examples
    shorter than `min_words` are counted in `skipped` and not indexed: they are too generic.
    Clean examples with the documents' rewrite rules first (`clean.build_contamination_index`).
    """

    def __init__(self, texts: Iterable[str], min_words: int = 8) -> None:
        self.min_words = min_words
        self.indexed = 0
        self.skipped = 0
        self._examples: dict[int, list[np.ndarray]] = {}  # anchor -> word hashes of its examples
        for text in texts:
            words = word_hashes(text)
            if len(words) < min_words:
                self.skipped += 1
                continue
            self.indexed += 1
            anchor = int(window_hashes(words[:min_words], min_words)[0])
            self._examples.setdefault(anchor, []).append(words)
        # a 1 MiB table of anchors' top bits rejects almost every window with one gather, so
        # only a few windows per document reach the dict lookup
        self._maybe = np.zeros(1 << _ANCHOR_FILTER_BITS, bool)
        anchors = np.fromiter(self._examples, _U64, len(self._examples))
        self._maybe[anchors >> _U64(64 - _ANCHOR_FILTER_BITS)] = True

    def __len__(self) -> int:
        return self.indexed

    def summary(self) -> dict[str, int]:
        """What was indexed, for metrics files."""
        return {"indexed": self.indexed, "skipped": self.skipped, "min_words": self.min_words}

    def contains(self, text: str) -> bool:
        """True iff `text` contains an indexed example's words contiguously."""
        return self.contains_words(word_hashes(text))

    def contains_words(self, words: np.ndarray) -> bool:
        """`contains` on a text's `word_hashes`."""
        windows = window_hashes(words, self.min_words)
        hits = np.flatnonzero(self._maybe[windows >> _U64(64 - _ANCHOR_FILTER_BITS)])
        for pos in hits.tolist():
            for example in self._examples.get(int(windows[pos]), ()):
                if np.array_equal(words[pos:pos + len(example)], example):
                    return True
        return False

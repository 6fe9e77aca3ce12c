"""Exact keys, word hashing, MinHash + LSH and the contamination index on hand-made texts."""
import pickle
import random
import re

import numpy as np
import pytest

from lib.data.dedup import ContaminationIndex, LSHIndex, MinHasher, exact_key, window_hashes, word_hashes


def random_words(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 9))) for _ in range(n)]


def test_exact_key_ignores_case_and_whitespace_only():
    key = exact_key("The cat sat.\nOn the mat.")
    assert len(key) == 8
    assert exact_key("  the CAT   sat.\n\n\ton the mat. ") == key
    assert exact_key("The cat sat. On the mat!") != key


def test_word_hashes_follow_lowercased_regex_words():
    text = "Hello, hello! Straße ﬁne_tune 42 café-au-lait"
    words = re.findall(r"\w+", text.lower())
    hashes = word_hashes(text)
    assert hashes.dtype == np.uint64 and len(hashes) == len(words)
    by_word = dict(zip(words, hashes.tolist()))
    assert len(set(by_word.values())) == len(by_word)  # distinct words, distinct hashes
    assert hashes[0] == hashes[1]  # "Hello" and "hello"
    assert np.array_equal(word_hashes("HELLO -- hello"), hashes[:2])
    assert len(word_hashes("")) == 0 and len(word_hashes(" ... ")) == 0


def test_window_hashes_count_and_equality():
    words = word_hashes("a b c a b c d")
    windows = window_hashes(words, 3)
    assert len(windows) == 5
    assert windows[0] == windows[3] and windows[0] != windows[1]
    assert len(window_hashes(words, 8)) == 0


def test_minhash_is_seeded_and_deterministic():
    text = " ".join(random_words(100, seed=1))
    assert np.array_equal(MinHasher(64, 5, seed=7).signature(text), MinHasher(64, 5, seed=7).signature(text))
    assert not np.array_equal(MinHasher(64, 5, seed=7).signature(text), MinHasher(64, 5, seed=8).signature(text))


def test_minhash_estimates_jaccard():
    words = random_words(400, seed=2)
    other = words[:200] + random_words(200, seed=3)  # shares 196 of 5-word shingles: J = 196/(396+396-196)
    hasher = MinHasher(256, 5, seed=0)
    estimate = np.mean(hasher.signature(" ".join(words)) == hasher.signature(" ".join(other)))
    assert estimate == pytest.approx(196 / 596, abs=0.1)


def test_minhash_short_and_empty_texts():
    hasher = MinHasher(32, 5, seed=0)
    empty = hasher.signature("")
    assert empty.dtype == np.uint32 and np.all(empty == empty[0])
    assert np.array_equal(hasher.signature("!?"), empty)
    short = hasher.signature("two words")  # fewer words than a shingle: one shingle of both
    assert not np.array_equal(short, empty)
    assert np.array_equal(short, hasher.signature("Two, words."))
    assert not np.array_equal(short, hasher.signature("two other"))


def test_minhash_of_long_text_equals_unchunked_minimum():
    hasher = MinHasher(16, 3, seed=5)
    words = word_hashes(" ".join(random_words(5000, seed=4)))  # more shingles than one chunk
    shingles = (window_hashes(words, 3) >> np.uint64(32)).astype(np.uint32)
    expected = (shingles[:, None] * hasher.mul + hasher.add).min(axis=0)
    assert np.array_equal(hasher.signature_of_words(words), expected)


def test_lsh_finds_near_duplicates_and_only_indexes_new_documents():
    hasher = MinHasher(128, 5, seed=0)
    words = random_words(200, seed=5)
    index = LSHIndex(128, 16, 0.8)
    assert not index.is_near_duplicate_then_add(hasher.signature(" ".join(words)))
    changed = words[:100] + ["different"] + words[101:]
    assert index.is_near_duplicate_then_add(hasher.signature(" ".join(changed)))
    assert len(index) == 1
    assert not index.is_near_duplicate_then_add(hasher.signature(" ".join(random_words(200, seed=6))))
    assert len(index) == 2


def test_lsh_grows_past_its_initial_capacity():
    rng = np.random.default_rng(0)
    signatures = rng.integers(0, 1 << 32, (3000, 32), dtype=np.uint32)
    index = LSHIndex(32, 8, 0.9)
    assert not any(index.is_near_duplicate_then_add(s) for s in signatures)
    assert len(index) == 3000
    assert index.is_near_duplicate_then_add(signatures[5].copy())


SENTENCE = "it 's a charming and often affecting journey that never lets up ."


def test_contamination_counts_indexed_and_skipped():
    index = ContaminationIndex([SENTENCE, "great movie .", "", SENTENCE.upper()], min_words=8)
    assert len(index) == 2
    assert index.summary() == {"indexed": 2, "skipped": 2, "min_words": 8}


def test_contamination_matches_words_not_punctuation_or_case():
    index = ContaminationIndex([SENTENCE], min_words=8)
    filler = " ".join(random_words(50, seed=7))
    assert index.contains(f"{filler} It's a CHARMING -- and often affecting journey, that never lets up! {filler}")
    assert index.contains("It's a charming and often affecting journey that never lets up")  # whole text
    assert not index.contains(f"{filler} it's a charming and often affecting journey {filler}")  # a prefix only
    assert not index.contains(f"{filler} a charming and often {filler}")
    assert not index.contains("it 's a charming and often affecting journey that never")  # cut at the end


def test_contamination_index_survives_pickling():
    index = pickle.loads(pickle.dumps(ContaminationIndex([SENTENCE], min_words=8)))
    assert index.contains(f"so {SENTENCE} so") and not index.contains("nothing to see here at all, really")

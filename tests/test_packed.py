"""Packed token files: writer/reader round trip, damage detection, atomic writes, corpus encoding."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from lib.config.errors import UserError
from lib.config.params import TokenizerConfig
from lib.data.packed import PackedTokens, PackedWriter, encode_to_packed, model_unk_id, packed_path, word_starts
from lib.data.tokenizer import train_tokenizer

EOS = 3
SUFFIXES = (".bin", ".idx", ".wstart", ".json")


def random_docs(n: int, vocab_size: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Documents of random ids (never eos, one empty) with random word-start flags."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(EOS + 1, vocab_size, rng.integers(0 if i == 1 else 1, 50)).tolist() for i in range(n)]
    flags = [[1] + rng.integers(0, 2, max(len(doc) - 1, 0)).tolist() if doc else [] for doc in docs]
    return docs, flags


def write(prefix: Path, docs, flags, vocab_size: int, chunk: int = 3) -> None:
    with PackedWriter(prefix, vocab_size, EOS) as writer:
        for start in range(0, len(docs), chunk):
            writer.add(docs[start:start + chunk], flags[start:start + chunk])


def test_round_trip(tmp_path):
    docs, flags = random_docs(10, vocab_size=1000)
    write(tmp_path / "train", docs, flags, vocab_size=1000)
    packed = PackedTokens(tmp_path / "train")
    assert (len(packed), packed.n_tokens) == (10, sum(map(len, docs)) + 10)
    assert packed.tokens.dtype == np.uint16
    for i, (doc, flag) in enumerate(zip(docs, flags)):
        start, end = packed.doc_offsets[i], packed.doc_offsets[i + 1]
        assert packed.doc(i).tolist() == doc
        assert packed.tokens[end - 1] == EOS and packed.word_starts[end - 1] == 1  # the separator
        assert packed.word_starts[start:end - 1].tolist() == flag
    assert packed.doc(-1).tolist() == docs[-1]
    assert packed.doc_offsets[0] == 0 and packed.doc_offsets[-1] == packed.n_tokens
    with pytest.raises(IndexError):
        packed.doc(10)


@pytest.mark.parametrize("vocab_size, dtype", [(65536, np.uint16), (65537, np.uint32)])
def test_dtype_follows_the_vocabulary(tmp_path, vocab_size, dtype):
    top = vocab_size - 1
    write(tmp_path / "x", [[top, 5], [top]], [[1, 0], [1]], vocab_size=vocab_size)
    packed = PackedTokens(tmp_path / "x")
    assert packed.tokens.dtype == dtype and packed.doc(0).tolist() == [top, 5]
    assert (tmp_path / "x.bin").stat().st_size == 5 * np.dtype(dtype).itemsize


def test_empty_corpus(tmp_path):
    write(tmp_path / "empty", [], [], vocab_size=100)
    packed = PackedTokens(tmp_path / "empty")
    assert (len(packed), packed.n_tokens, packed.tokens.size) == (0, 0, 0)


def test_bad_input_is_refused(tmp_path):
    with PackedWriter(tmp_path / "x", 100, EOS) as writer:
        with pytest.raises(ValueError, match="flag"):
            writer.add([[5, 6]], [[1]])
        with pytest.raises(ValueError, match="token ids"):
            writer.add([[5, 100]], [[1, 1]])


def test_languages_per_document(tmp_path):
    """XLM's corpora: each token (and its document's eos) carries its document's language."""
    with PackedWriter(tmp_path / "x", 100, EOS, languages=["en", "de"]) as writer:
        writer.add([[5, 6], [7]], [[1, 0], [1]], languages=["de", "en"])
        writer.add([[8]], [[1]], languages=["de"])
        with pytest.raises(ValueError, match="not the writer's"):
            writer.add([[8]], [[1]], languages=["fr"])
        with pytest.raises(ValueError, match="one language per document"):
            writer.add([[8]], [[1]])
    packed = PackedTokens(tmp_path / "x")
    assert packed.languages == ["en", "de"]
    assert packed.language_ids.tolist() == [1, 1, 1, 0, 0, 1, 1]
    with PackedWriter(tmp_path / "y", 100, EOS) as writer:
        with pytest.raises(ValueError, match="no languages"):
            writer.add([[5]], [[1]], languages=["en"])
        writer.add([[5]], [[1]])
    assert PackedTokens(tmp_path / "y").language_ids is None
    packed_path(tmp_path / "x", ".lang").write_bytes(b"\x00")
    with pytest.raises(UserError, match="x.lang"):
        PackedTokens(tmp_path / "x")


@pytest.mark.parametrize("suffix, damage", [(".bin", "truncate"), (".wstart", "truncate"), (".idx", "truncate"),
                                            (".idx", "scramble"), (".json", "scramble"), (".bin", "delete"),
                                            (".json", "delete")])
def test_reader_detects_damage(tmp_path, suffix, damage):
    docs, flags = random_docs(5, vocab_size=1000)
    write(tmp_path / "train", docs, flags, vocab_size=1000)
    path = packed_path(tmp_path / "train", suffix)
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:-2])
    elif damage == "scramble":
        path.write_bytes(path.read_bytes()[::-1])
    else:
        path.unlink()
    with pytest.raises(UserError, match=path.name):
        PackedTokens(tmp_path / "train")


def test_interrupted_writer_leaves_nothing(tmp_path):
    docs, flags = random_docs(5, vocab_size=1000)
    with pytest.raises(KeyboardInterrupt):
        with PackedWriter(tmp_path / "train", 1000, EOS) as writer:
            writer.add(docs, flags)
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_interrupted_rewrite_keeps_the_old_files(tmp_path):
    docs, flags = random_docs(5, vocab_size=1000)
    write(tmp_path / "train", docs, flags, vocab_size=1000)
    with pytest.raises(RuntimeError):
        with PackedWriter(tmp_path / "train", 1000, EOS) as writer:
            writer.add(docs[:1], flags[:1])
            raise RuntimeError("killed")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted("train" + s for s in SUFFIXES)
    assert PackedTokens(tmp_path / "train").doc(4).tolist() == docs[4]


def test_model_unk_id(wordpiece, tmp_path):
    assert model_unk_id(wordpiece) == 1
    bpe = train_tokenizer(["some text"], TokenizerConfig(vocab_size=300), tmp_path / "bpe")
    assert model_unk_id(bpe) is None  # bytes cover everything


def test_word_starts():
    assert word_starts([None, 0, 0, 1, 1, 1, None, 2]).tolist() == [1, 1, 0, 1, 0, 0, 1, 1]
    assert word_starts([]).tolist() == []


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
    texts = ["the quick brown fox jumps over the lazy dog, again and again."] * 50
    cfg = TokenizerConfig(algorithm="wordpiece", vocab_size=200, min_frequency=1)
    return train_tokenizer(texts, cfg, tmp_path_factory.mktemp("tok") / "wordpiece")


def test_encode_to_packed(tmp_path, wordpiece):
    texts = ["the quick fox", "", "lazy dogs jump over the quickest brown fox, again!", "zebra é"] * 3
    padded = Tokenizer.from_str(wordpiece.to_str())  # a user's tokenizer may pad and truncate by default:
    padded.enable_padding(pad_id=0)                    # packed documents must keep their true length anyway
    padded.enable_truncation(4)
    stats = encode_to_packed(padded, iter(texts), tmp_path / "train", wordpiece.get_vocab_size(),
                             eos_id=EOS, batch_docs=2)
    packed = PackedTokens(tmp_path / "train")
    expected = [wordpiece.encode(text, add_special_tokens=False) for text in texts]
    assert len(packed) == stats.docs == len(texts)
    assert stats.tokens == sum(len(e.ids) for e in expected) == packed.n_tokens - len(texts)
    assert stats.words == sum(len(text.split()) for text in texts)
    assert stats.unk == sum(e.ids.count(1) for e in expected) > 0  # "zebra" has unseen letters
    for i, encoding in enumerate(expected):
        assert packed.doc(i).tolist() == encoding.ids
        start = packed.doc_offsets[i]
        flags = packed.word_starts[start:start + len(encoding.ids)].tolist()
        assert flags == [not token.startswith("##") for token in encoding.tokens]
    assert stats.seconds > 0 and stats.tokens_per_word > 1


def test_token_files_name_the_tokenizer_that_made_them(tmp_path):
    """Token files of another vocabulary would index the wrong embeddings: the reader refuses them in one line."""
    docs, flags = random_docs(5, vocab_size=1000)
    with PackedWriter(tmp_path / "train", 1000, EOS, tokenizer="a" * 64) as writer:
        writer.add(docs, flags)
    packed = PackedTokens(tmp_path / "train")
    packed.check_tokenizer("a" * 64, tmp_path / "tok")
    with pytest.raises(UserError, match=r"^.*train\.json: encoded with another tokenizer than .*tok/tokenizer\.json; "
                                        r"encode the corpora again \(dvc repro tokenizer\)$"):
        packed.check_tokenizer("b" * 64, tmp_path / "tok")

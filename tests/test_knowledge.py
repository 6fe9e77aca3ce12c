"""ERNIE knowledge units: mining phrases and entities, their flag files, the batches that carry them."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from lib.config.errors import UserError
from lib.config.params import MLMConfig, ParamsError, TokenizerConfig
from lib.data.knowledge import Knowledge, knowledge_units, mine, unit_starts
from lib.data.packed import PackedTokens, PackedWriter, encode_to_packed, packed_path
from lib.data.tokenizer import train_tokenizer
from lib.data.windows import WindowBatches, fixed_windows
from lib.objectives.masking import mask_tokens

EOS = 3
FILLER = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def planted_corpus() -> list[str]:
    """Sentences of random filler words, with a collocation, an entity mid-sentence and a capitalised
    pair that only ever opens a sentence planted in them."""
    rng = random.Random(0)
    docs = []
    for d in range(40):
        sentences = []
        for s in range(10):
            words = [rng.choice(FILLER) for _ in range(8)]
            if s == 3:
                words[4:4] = ["quantum", "chromodynamics"]
            if s == 5 and d % 4 == 0:
                words[2:2] = ["Ada", "Lovelace"]
            if s == 7 and d % 4 == 1:
                words[:0] = ["Meanwhile", "Paris"]
            sentences.append(" ".join(words) + ".")
        docs.append(" ".join(sentences))
    return docs


def test_mining_finds_collocations_and_entities_not_sentence_starts():
    knowledge = mine(planted_corpus())
    assert knowledge.phrases["quantum chromodynamics"][0] == 40
    assert knowledge.phrases["quantum chromodynamics"][1] == pytest.approx(1.0)
    # frequent pairs of independent words are not phrases, however often they meet (PMI near 0)
    pairs = [f"{a} {b}" for a in FILLER for b in FILLER]
    assert not set(pairs) & set(knowledge.phrases)
    assert knowledge.entities == {"Ada Lovelace": 10}  # not "Meanwhile Paris", which opens its sentences


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
    texts = ["we saw new york and ada lovelace there, again and again. New York, said Ada Lovelace."] * 50
    cfg = TokenizerConfig(algorithm="wordpiece", vocab_size=60, min_frequency=1)  # words of several pieces
    return train_tokenizer(texts, cfg, tmp_path_factory.mktemp("tok") / "wordpiece")


KNOWLEDGE = Knowledge({"new york": (10, 0.9), "and again": (10, 0.6)}, {"Ada Lovelace": 5, "New York": 5})
TEXTS = ["we saw new york and again.", "Ada Lovelace saw New York, ada lovelace said.", "", "there"]


def units_of(tokenizer, ids: np.ndarray, flags: np.ndarray) -> list[str]:
    """The decoded units of a document: tokens from one flagged start to the next."""
    starts = [i for i, flag in enumerate(flags) if flag] + [len(ids)]
    return [tokenizer.decode(ids[a:b].tolist()) for a, b in zip(starts, starts[1:])]


def test_unit_flag_files_line_up_with_the_tokens(tmp_path, wordpiece):
    encode_to_packed(wordpiece, iter(TEXTS), tmp_path / "train", wordpiece.get_vocab_size(), EOS, batch_docs=3,
                     knowledge=KNOWLEDGE)
    packed = PackedTokens(tmp_path / "train")
    phrase, entity = packed.unit_starts("phrase"), packed.unit_starts("entity")
    assert len(phrase) == len(entity) == packed.n_tokens == len(packed.tokens)
    assert (phrase <= packed.word_starts).all() and (entity <= packed.word_starts).all()  # units are whole words
    assert (phrase[packed.tokens == EOS] == 1).all() and (entity[packed.tokens == EOS] == 1).all()
    assert packed.word_starts[packed.doc_offsets[0] + 2:packed.doc_offsets[0] + 8].sum() > 2  # multi-piece words
    expected = {
        "phrase": [["we", "saw", "new york", "and again", "."],
                   ["Ada", "Lovelace", "saw", "New York", ",", "ada", "lovelace", "said", "."], [], ["there"]],
        "entity": [["we", "saw", "new", "york", "and", "again", "."],
                   ["Ada Lovelace", "saw", "New York", ",", "ada", "lovelace", "said", "."], [], ["there"]]}
    for unit, docs in expected.items():
        flags = packed.unit_starts(unit)
        for i, words in enumerate(docs):
            start, end = packed.doc_offsets[i], packed.doc_offsets[i + 1] - 1
            assert units_of(wordpiece, packed.tokens[start:end], flags[start:end]) == words, unit


def test_unit_starts_only_clear_word_starts():
    """A unit's first token keeps its flag, the rest lose theirs, even where a tokenizer word holds
    more than a unit's word ("(New" as one word)."""
    text = "(New York) Bay"
    # tokens "(New" "York" ")" "Bay", as a whitespace pre-tokenizer would flag them
    token_of = {0: 0, 1: 0, 2: 0, 3: 0, 5: 1, 6: 1, 7: 1, 8: 1, 9: 2, 11: 3, 12: 3, 13: 3}.get
    flags = unit_starts(text, token_of, np.array([1, 1, 0, 1], np.uint8), KNOWLEDGE)
    assert flags["phrase"].tolist() == [1, 0, 0, 1] and flags["entity"].tolist() == [1, 0, 0, 1]


def test_batches_carry_unit_starts(tmp_path):
    tokens = [[5, 6, 7, 8, 9, 10, 11, 12]]
    words = [[1, 1, 1, 0, 1, 1, 1, 1]]
    phrase = [[1, 0, 1, 0, 1, 1, 0, 1]]
    entity = [[1, 1, 1, 0, 0, 1, 0, 0]]
    with PackedWriter(tmp_path / "train", 100, EOS, units=("phrase", "entity")) as writer:
        writer.add(tokens, words, {"phrase": phrase, "entity": entity})
    packed = PackedTokens(tmp_path / "train")
    flags = {units: fixed_windows(packed, 9, 1, 1, units=units)[0].word_starts[0].tolist()
             for units in [(), ("phrase",), ("entity",), ("phrase", "entity")]}
    assert flags == {(): [1, 1, 1, 0, 1, 1, 1, 1, 1], ("phrase",): [1, 0, 1, 0, 1, 1, 0, 1, 1],
                     ("entity",): [1, 1, 1, 0, 0, 1, 0, 0, 1], ("phrase", "entity"): [1, 0, 1, 0, 0, 1, 0, 0, 1]}
    batch = WindowBatches(packed, 9, 2, seed=0, units=knowledge_units("both")).batch(0)
    assert batch.word_starts.tolist() == [flags[("phrase", "entity")]] * 2


def test_a_masked_phrase_is_masked_whole_end_to_end(tmp_path, wordpiece):
    """Text to flag files to batches to masks: 'new york' is never masked in part."""
    encode_to_packed(wordpiece, iter(["we saw new york and again. " * 20]), tmp_path / "train",
                     wordpiece.get_vocab_size(), EOS, batch_docs=1, knowledge=KNOWLEDGE)
    packed = PackedTokens(tmp_path / "train")
    batch = fixed_windows(packed, packed.n_tokens, 1, 1, units=("phrase",))[0]
    tokens, starts = batch.tokens, batch.word_starts
    york = torch.tensor(wordpiece.encode("new york", add_special_tokens=False).ids)
    at = [i for i in range(tokens.shape[1] - len(york) + 1) if torch.equal(tokens[0, i:i + len(york)], york)]
    assert len(at) == 20
    special = {"pad": 0, "unk": 1, "bos": 2, "eos": 3, "mask": 4}
    whole = partly = 0
    torch.manual_seed(0)
    for _ in range(50):
        cfg = MLMConfig(knowledge="phrase")
        selected = mask_tokens(tokens, starts, special, wordpiece.get_vocab_size(), cfg).selected
        counts = [int(selected[0, i:i + len(york)].sum()) for i in at]
        whole += sum(c == len(york) for c in counts)
        partly += sum(0 < c < len(york) for c in counts)
    assert partly == 0 and whole > 20


def test_writer_refuses_missing_unit_flags_and_leaves_nothing_on_error(tmp_path):
    with pytest.raises(RuntimeError):
        with PackedWriter(tmp_path / "train", 100, EOS, units=("phrase",)) as writer:
            writer.add([[5, 6]], [[1, 1]], {"phrase": [[1, 0]]})
            with pytest.raises(ValueError, match="unit-start flags"):
                writer.add([[5, 6]], [[1, 1]])
            raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


def test_token_files_without_unit_flags_say_to_re_encode(tmp_path):
    with PackedWriter(tmp_path / "train", 100, EOS) as writer:
        writer.add([[5, 6]], [[1, 1]])
    packed = PackedTokens(tmp_path / "train")
    assert not packed_path(tmp_path / "train", ".phrase").exists()
    with pytest.raises(UserError, match=r"train\.json: no phrase flags for mlm\.knowledge; .*dvc repro tokenizer"):
        fixed_windows(packed, 3, 1, 1, units=("phrase",))


def test_knowledge_is_not_combined_with_spans():
    MLMConfig(knowledge="both", whole_word=True).validate("mlm")
    with pytest.raises(ParamsError, match=r"^mlm\.knowledge: phrase masks whole phrases or entities, not SpanBERT"):
        MLMConfig(knowledge="phrase", span=True).validate("mlm")


def test_knowledge_file_round_trip(tmp_path):
    KNOWLEDGE.save(tmp_path / "knowledge.json")
    assert Knowledge.load(tmp_path / "knowledge.json") == KNOWLEDGE
    with pytest.raises(UserError, match="knowledge.json: not found; run the tokenizer stage"):
        Knowledge.load(tmp_path / "missing" / "knowledge.json")

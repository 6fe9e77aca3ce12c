"""Tokenizer training, saving and loading: all three algorithms on a few hundred generated sentences."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import sentencepiece as spm
from tokenizers import Tokenizer

from lib.config.errors import UserError
from lib.config.params import TokenizerConfig
from lib.data.packed import model_unk_id
from lib.data.tokenizer import (SPM_FILE, TrainingText, load_tokenizer, read_meta, sentinel_tokens, special_ids,
                                train_tokenizer)

ALGORITHMS = ["bpe", "wordpiece", "unigram"]
WORDS = ("the a an of to in on for with from about history science music river city king queen war peace "
         "ancient modern island mountain café naïve language 1905 2024 people writes wrote reads studied "
         "Paris London Rome Einstein Newton").split()
SAMPLES = [
    "The king of Paris wrote about ancient history.",
    "Einstein studied modern science in 1905, then wrote to Newton!",
    "A café on the island: naïve people (and a queen).",
    "Rome\nLondon",
]


def sentences(n: int, seed: int = 0) -> list[str]:
    """Deterministic sentences over WORDS and made-up words, with punctuation."""
    rng = random.Random(seed)
    syllables = "ka lo mi ren tus bar vel qui dor sa ne tho".split()
    words = WORDS + ["".join(rng.choices(syllables, k=rng.randint(1, 3))) for _ in range(300)]
    out = []
    for _ in range(n):
        sentence = [rng.choice(words) for _ in range(rng.randint(4, 14))]
        out.append(" ".join(sentence).capitalize() + rng.choice([".", "!", "?", ","]))
    return out


CORPUS = sentences(400) + SAMPLES  # every character of the samples is seen in training


def config(algorithm: str, **overrides) -> TokenizerConfig:
    return TokenizerConfig(algorithm=algorithm, **{"vocab_size": 400, "min_frequency": 1, **overrides})


@pytest.fixture(scope="module", params=ALGORITHMS)
def trained(request, tmp_path_factory) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp(request.param) / "tokenizer"
    train_tokenizer(iter(CORPUS), config(request.param), out)
    return request.param, out


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_sentinels_follow_the_special_tokens_inside_the_vocabulary(algorithm, tmp_path):
    """T5's sentinels: ids 5.. in every algorithm, matched whole in text, named for transformers and in the
    meta, and counted inside vocab_size."""
    train_tokenizer(iter(CORPUS), config(algorithm, sentinels=3), tmp_path / "t")
    tokenizer = load_tokenizer(tmp_path / "t")
    assert [tokenizer.token_to_id(f"<extra_id_{i}>") for i in range(4)] == [5, 6, 7, None]
    assert sentinel_tokens(tokenizer) == ["<extra_id_0>", "<extra_id_1>", "<extra_id_2>"]
    assert tokenizer.encode("the <extra_id_1> king", add_special_tokens=False).ids.count(6) == 1
    assert read_meta(tmp_path / "t")["sentinels"] == [5, 6, 7] and tokenizer.get_vocab_size() <= 400
    named = json.loads((tmp_path / "t" / "special_tokens_map.json").read_text())
    assert named["additional_special_tokens"] == ["<extra_id_0>", "<extra_id_1>", "<extra_id_2>"]


def test_round_trip(trained):
    algorithm, out = trained
    tokenizer = load_tokenizer(out)
    for text in SAMPLES + CORPUS[:20]:
        decoded = tokenizer.decode(tokenizer.encode(text).ids)  # skips the special tokens
        if algorithm == "wordpiece":  # WordPiece forgets which punctuation had spaces around it
            assert "".join(decoded.split()) == "".join(text.split())
        else:
            assert decoded == text


def test_special_tokens_and_template(trained):
    algorithm, out = trained
    tokenizer = load_tokenizer(out)
    cfg = config(algorithm)
    assert [tokenizer.token_to_id(t) for t in cfg.special_tokens.as_list()] == [0, 1, 2, 3, 4]
    assert special_ids(tokenizer, cfg.special_tokens) == {"pad": 0, "unk": 1, "bos": 2, "eos": 3, "mask": 4}
    assert model_unk_id(tokenizer) == (None if algorithm == "bpe" else 1)  # what encode_to_packed counts
    single = tokenizer.encode("the king")
    assert single.ids[0] == 2 and single.ids[-1] == 3
    pair = tokenizer.encode("the king", "a queen")
    assert pair.ids.count(3) == 2 and pair.type_ids[-1] == 1 and pair.type_ids[0] == 0
    assert tokenizer.encode("a [MASK] king").ids.count(4) == 1  # special tokens are matched in text
    assert tokenizer.padding is None and tokenizer.truncation is None  # lengths taken from it are true
    meta = read_meta(out)
    assert meta["algorithm"] == algorithm and meta["vocab_size"] == tokenizer.get_vocab_size() <= 400
    assert meta["special_tokens"]["mask"] == {"token": "[MASK]", "id": 4}
    assert meta["train_chars"] == sum(map(len, CORPUS)) and meta["train_docs"] == len(CORPUS)


def test_a_line_break_ends_a_word(trained):
    _, out = trained
    encoding = load_tokenizer(out).encode("Rome\nLondon", add_special_tokens=False)
    london = next(i for i, (start, _) in enumerate(encoding.offsets) if start >= len("Rome\n"))
    assert encoding.word_ids[london] != encoding.word_ids[london - 1]  # whole-word masking relies on it


def test_transformers_loads_the_same(trained):
    transformers = pytest.importorskip("transformers")
    _, out = trained
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(out))
    for text in SAMPLES:
        assert hf(text)["input_ids"] == tokenizer.encode(text).ids
        assert hf(text, "the queen")["input_ids"] == tokenizer.encode(text, "the queen").ids
    assert (hf.pad_token_id, hf.unk_token_id, hf.bos_token_id, hf.eos_token_id, hf.mask_token_id) == (0, 1, 2, 3, 4)
    assert (hf.cls_token_id, hf.sep_token_id) == (2, 3)


def test_unigram_matches_sentencepiece(tmp_path):
    out = tmp_path / "tok"
    tokenizer = train_tokenizer(iter(CORPUS), config("unigram"), out)
    sp = spm.SentencePieceProcessor(model_file=str(out / SPM_FILE))
    tricky = [" leading space", "double  space", "trailing ", "new\nline", "unseen ü日本 chars", ""]
    for text in SAMPLES + tricky + CORPUS[:50]:
        assert tokenizer.encode(text, add_special_tokens=False).ids == sp.encode(text)
        assert tokenizer.decode(tokenizer.encode(text).ids) == text  # byte fallback: nothing is lost


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_lowercase(algorithm, tmp_path):
    tokenizer = train_tokenizer(iter(CORPUS), config(algorithm, lowercase=True), tmp_path / "tok")
    assert tokenizer.encode("The King of PARIS").ids == tokenizer.encode("the king of paris").ids
    assert tokenizer.decode(tokenizer.encode("The King of PARIS").ids) == "the king of paris"
    assert read_meta(tmp_path / "tok")["lowercase"] is True


def test_train_chars_caps_the_text():
    read = []

    def source():
        for text in CORPUS:
            read.append(text)
            yield text

    text = TrainingText(source(), max_chars=100)
    used = list(text)
    assert sum(map(len, used)) == text.chars == 100
    assert used[-1] == CORPUS[len(used) - 1][: 100 - sum(map(len, used[:-1]))]
    assert len(read) == len(used)  # stops reading once the cap is reached


def test_train_chars_in_meta(tmp_path):
    train_tokenizer(iter(CORPUS), config("bpe", train_chars=5000), tmp_path / "tok")
    assert read_meta(tmp_path / "tok")["train_chars"] == 5000


@pytest.mark.parametrize("algorithm, vocab_size", [("unigram", 50), ("unigram", 20000), ("wordpiece", 20)])
def test_unworkable_vocab_size_is_a_user_error(algorithm, vocab_size, tmp_path):
    with pytest.raises(UserError, match="tokenizer.vocab_size") as err:
        train_tokenizer(iter(CORPUS), config(algorithm, vocab_size=vocab_size), tmp_path / "tok")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "tok").exists() and not list(tmp_path.iterdir())  # nothing half-written


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_empty_text_is_a_user_error(algorithm, tmp_path):
    with pytest.raises(UserError, match="empty"):
        train_tokenizer(iter([]), config(algorithm), tmp_path / "tok")


def test_source_errors_are_not_hidden_by_sentencepiece(tmp_path):
    def broken():
        yield from CORPUS[:10]
        raise OSError("disk on fire")

    with pytest.raises(OSError, match="disk on fire"):
        train_tokenizer(broken(), config("unigram"), tmp_path / "tok")


def test_loading_a_missing_tokenizer_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_tokenizer(tmp_path)
    with pytest.raises(UserError, match="not found"):
        read_meta(tmp_path)


def test_config_files_name_the_special_tokens(trained):
    _, out = trained
    config_file = json.loads((out / "tokenizer_config.json").read_text())
    assert config_file["mask_token"] == "[MASK]" and config_file["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert json.loads((out / "special_tokens_map.json").read_text())["pad_token"] == "[PAD]"

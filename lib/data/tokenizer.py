"""Train, save and load the subword tokenizer: byte-level BPE, WordPiece or sentencepiece Unigram.

Whatever the algorithm, a trained folder holds
- `tokenizer.json`: a `tokenizers.Tokenizer` with the special tokens at ids 0..4 (pad, unk, bos, eos,
  mask) and a `bos $A eos` / `bos $A eos $B eos` post-processor; no padding or truncation (callers that
  batch set those: a tokenizer that pads by default miscounts every length taken from it);
- `tokenizer_config.json` + `special_tokens_map.json`, so `PreTrainedTokenizerFast.from_pretrained(dir)`
  (and `AutoTokenizer`) load it with the special tokens named;
- `tokenizer_meta.json`: algorithm, actual vocab size, lowercase, special tokens and ids, training text used;
- with `tokenizer.sentinels` (T5's span corruption reads them), that many sentinel tokens <extra_id_0>,
  ... at ids 5, 6, ..., special like the five roles, inside vocab_size (T5 appends its 100 after the
  sentencepiece vocabulary; here they are in every vocabulary, so every objective reads the same one);
- `spm.model` (unigram only): the sentencepiece model the Unigram tokenizer was built from. It does not
  lowercase: with `lowercase: true` it expects lowercased text.
"""
from __future__ import annotations

import io
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from lib.config.errors import UserError
from lib.config.params import SpecialTokens, TokenizerConfig
from lib.core.errors import describe
from lib.core.io import atomic_dir, file_sha256, write_json

TOKENIZER_FILE = "tokenizer.json"
META_FILE = "tokenizer_meta.json"
SPECIALS_FILE, HF_CONFIG_FILE = "special_tokens_map.json", "tokenizer_config.json"  # what transformers reads
TOKENIZER_FILES = (TOKENIZER_FILE, SPECIALS_FILE, HF_CONFIG_FILE, META_FILE)  # a tokenizer folder's, write_folder's
SPM_FILE = "spm.model"
ROLES = ("pad", "unk", "bos", "eos", "mask")  # the order of SpecialTokens.as_list(), i.e. ids 0..4
WORDPIECE_ALPHABET = 1000  # BERT's choice: rarer characters become [UNK] instead of taking vocabulary slots
SPM_MAX_SENTENCES = 2_000_000  # sentencepiece holds its sentences in memory; a random sample beyond this
SPM_MAX_LINE_BYTES = 1 << 16  # sentencepiece silently skips longer lines (its default is 4192 bytes)
SPACE = "\u2581"  # sentencepiece's visible space
SENTINEL = "<extra_id_{}>"  # T5's sentinel tokens, as its tokenizers name them
SPM_TOO_SMALL = re.compile(r"smaller than required_chars\. \d+ vs (\d+)")
SPM_TOO_LARGE = re.compile(r"too high \(\d+\)\. Please set it to a value <= (\d+)")


class TrainingText:
    """The training texts, cut off after `max_chars` characters, then every text of `uncapped`; counts
    what was used.

    Iterable once. Keeps the error of a failing source, because sentencepiece re-raises it as its own
    RuntimeError, which would otherwise read as a vocabulary problem.
    """

    def __init__(self, texts: Iterable[str], max_chars: int | None, uncapped: Iterable[str] = ()) -> None:
        self.texts, self.max_chars, self.uncapped = texts, max_chars, uncapped
        self.chars = self.docs = 0
        self.error: Exception | None = None

    def __iter__(self) -> Iterator[str]:
        try:
            for text in self.texts:
                if self.max_chars is not None:
                    text = text[: self.max_chars - self.chars]
                self.chars += len(text)
                self.docs += 1
                yield text
                if self.max_chars is not None and self.chars >= self.max_chars:
                    break
            for text in self.uncapped:
                self.chars += len(text)
                self.docs += 1
                yield text
        except Exception as err:
            self.error = err
            raise

    def check(self) -> None:
        """Re-raise the source's error, or refuse an empty text."""
        if self.error is not None:
            raise self.error
        if self.chars == 0:
            raise UserError("tokenizer: the training text is empty; check that the cleaned corpus has documents")


def train_tokenizer(texts: Iterable[str], cfg: TokenizerConfig, out_dir: str | Path,
                    uncapped: Iterable[str] = ()) -> Tokenizer:
    """Train a `cfg.algorithm` tokenizer on the first `cfg.train_chars` characters of `texts` and every
    text of `uncapped` (XLM's parallel sentences: one vocabulary for every language), with `cfg.sentinels`
    sentinel tokens after the special tokens; save it (atomically) to `out_dir` and return it."""
    text = TrainingText(texts, cfg.train_chars, uncapped)
    extra = [SENTINEL.format(i) for i in range(cfg.sentinels)]
    with atomic_dir(out_dir) as tmp:
        tokenizer = TRAINERS[cfg.algorithm](text, cfg, tmp, extra)
        text.check()
        check_vocab_size(tokenizer, cfg)
        add_specials(tokenizer, cfg.special_tokens, extra)
        save(tokenizer, cfg, text, tmp)
    return tokenizer


def train_bpe(text: TrainingText, cfg: TokenizerConfig, out_dir: Path, extra: list[str]) -> Tokenizer:
    """Byte-level BPE (GPT-2/RoBERTa): every byte has a token, so nothing is ever unknown."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.Lowercase() if cfg.lowercase else None
    # No prefix space: decode(encode(x)) == x exactly, and a text's first word is tokenized like the
    # first word of every paragraph (after "\n" it has no space either), which fine-tuning sentences resemble.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return train_with(tokenizer, trainers.BpeTrainer, text, cfg, extra,
                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())


def train_wordpiece(text: TrainingText, cfg: TokenizerConfig, out_dir: Path, extra: list[str]) -> Tokenizer:
    """BERT's WordPiece: "##" marks a word's continuation pieces."""
    tokenizer = Tokenizer(models.WordPiece(unk_token=cfg.special_tokens.unk))
    # strip_accents follows lowercase (NFD + accent removal only for uncased), as in BERT
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=cfg.lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    return train_with(tokenizer, trainers.WordPieceTrainer, text, cfg, extra, limit_alphabet=WORDPIECE_ALPHABET)


def train_with(tokenizer: Tokenizer, trainer_class: type, text: TrainingText, cfg: TokenizerConfig,
               extra: list[str], **options: Any) -> Tokenizer:
    """Train `tokenizer` with a `tokenizers` trainer: the options every trainer takes, plus `options`;
    `extra`: special tokens after the five roles."""
    trainer = trainer_class(vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency, show_progress=False,
                            special_tokens=[*cfg.special_tokens.as_list(), *extra], **options)
    tokenizer.train_from_iterator(text, trainer)
    return tokenizer


def train_unigram(text: TrainingText, cfg: TokenizerConfig, out_dir: Path, extra: list[str]) -> Tokenizer:
    """Train a sentencepiece Unigram model, save it as spm.model and return the equivalent Tokenizer."""
    import sentencepiece as spm  # here: reading a saved tokenizer (prediction, a served model) needs no sentencepiece

    specials = cfg.special_tokens
    # One sentence per line: sentencepiece skips over-long sentences, and articles are long.
    lower = normalizers.Lowercase().normalize_str  # exactly what the Tokenizer will do to its input
    lines = (lower(line) if cfg.lowercase else line for doc in text for line in doc.split("\n") if line)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=lines, model_writer=model, model_type="unigram", vocab_size=cfg.vocab_size,
            pad_id=0, unk_id=1, bos_id=2, eos_id=3, pad_piece=specials.pad, unk_piece=specials.unk,
            bos_piece=specials.bos, eos_piece=specials.eos, control_symbols=[specials.mask, *extra],
            # The clean stage has NFKC-normalised the text; keep runs of spaces so that the
            # Tokenizer built below (which cannot drop them) gives the same ids.
            normalization_rule_name="identity", remove_extra_whitespaces=False,
            byte_fallback=True,  # characters outside the vocabulary become bytes, never [UNK]: lossless
            input_sentence_size=SPM_MAX_SENTENCES, shuffle_input_sentence=True,
            max_sentence_length=SPM_MAX_LINE_BYTES, num_threads=os.cpu_count() or 1,
            train_extremely_large_corpus=False, minloglevel=2)
    except RuntimeError as err:  # sentencepiece reports every failure this way
        text.check()
        raise UserError(spm_error_message(str(err), cfg)) from None
    (out_dir / SPM_FILE).write_bytes(model.getvalue())
    return unigram_from_spm(model.getvalue(), cfg.lowercase)


def spm_error_message(error: str, cfg: TokenizerConfig) -> str:
    """A sentencepiece training error as one line that says which way to move tokenizer.vocab_size."""
    key = f"tokenizer.vocab_size: {cfg.vocab_size}"
    if match := SPM_TOO_SMALL.search(error):
        return (f"{key} is too small for unigram on this text: the special tokens, 256 byte tokens and its "
                f"characters need {match[1]}; raise it to at least {match[1]}")
    if match := SPM_TOO_LARGE.search(error):
        return (f"{key} is too large for unigram on this text, which yields at most {match[1]} pieces; "
                f"lower it to {match[1]} or less, or train on more text (tokenizer.train_chars)")
    reason = error.rsplit("] ", 1)[-1].replace("\n", " ").strip()  # drop sentencepiece's source location
    return f"{key}: sentencepiece failed to train on this text ({reason}); change tokenizer.vocab_size"


def unigram_from_spm(model_proto: bytes, lowercase: bool) -> Tokenizer:
    """A `tokenizers` Unigram tokenizer that splits text exactly like the sentencepiece model."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=model_proto)
    vocab = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=sp.unk_id(), byte_fallback=True))
    # sentencepiece prefixes every text with a space, even one that starts with a space, and shows
    # spaces as "▁"; Metaspace's own prefixing skips such texts, so normalise as sentencepiece does.
    spm_like = [normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)]
    tokenizer.normalizer = normalizers.Sequence(([normalizers.Lowercase()] if lowercase else []) + spm_like)
    # Words start at "▁" and, as in the other algorithms, at a line break (no piece holds one: the
    # model was trained line by line), which the ids do not notice but word_ids (whole-word masking) do.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("\n", "isolated"), pre_tokenizers.Metaspace(prepend_scheme="never", split=True)])
    tokenizer.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()])
    return tokenizer


# Each returns the trained Tokenizer with its normalizer, pre-tokenizer and decoder, and may leave
# files of its own in the output folder.
TRAINERS: dict[str, Callable[[TrainingText, TokenizerConfig, Path, list[str]], Tokenizer]] = {
    "bpe": train_bpe, "wordpiece": train_wordpiece, "unigram": train_unigram}


def check_vocab_size(tokenizer: Tokenizer, cfg: TokenizerConfig) -> None:
    """The trainers of `tokenizers` exceed vocab_size rather than drop characters; refuse that."""
    actual = tokenizer.get_vocab_size()
    if actual > cfg.vocab_size:
        raise UserError(f"tokenizer.vocab_size: {cfg.vocab_size} is too small for {cfg.algorithm} on this text: "
                        f"the special tokens and its characters need {actual}; raise it to at least {actual}")


def add_specials(tokenizer: Tokenizer, specials: SpecialTokens, extra: list[str] = ()) -> None:
    """Special tokens (ids 0..4, then `extra`'s, matched in raw text) and the bos/eos template."""
    tokens = [*specials.as_list(), *extra]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tokens])
    ids = [tokenizer.token_to_id(t) for t in tokens]
    if ids != list(range(len(tokens))):  # each trainer puts them first; else a bug here
        raise RuntimeError(f"special tokens {tokens} got ids {ids}, expected 0..{len(tokens) - 1}")
    ids = special_ids(tokenizer, specials)
    bos, eos = specials.bos, specials.eos
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} $B:1 {eos}:1",
        special_tokens=[(bos, ids["bos"]), (eos, ids["eos"])])


def save(tokenizer: Tokenizer, cfg: TokenizerConfig, text: TrainingText, out_dir: Path) -> None:
    """A trained tokenizer's folder (see write_folder)."""
    write_folder(tokenizer, dict(zip(ROLES, cfg.special_tokens.as_list())), out_dir, {
        "algorithm": cfg.algorithm, "requested_vocab_size": cfg.vocab_size, "lowercase": cfg.lowercase,
        "train_docs": text.docs, "train_chars": text.chars})


def write_folder(tokenizer: Tokenizer, named: dict[str, str], out_dir: Path, meta: dict[str, Any]) -> None:
    """tokenizer.json, the two transformers config files and tokenizer_meta.json (`meta` + vocabulary
    size + each role's token and id), for a tokenizer trained here or taken from a published model.
    `named`: role (ROLES) -> its special token."""
    tokenizer.save(str(out_dir / TOKENIZER_FILE))
    hf_specials: dict[str, Any] = {f"{role}_token": named[role] for role in ROLES}
    hf_specials.update(cls_token=named["bos"], sep_token=named["eos"])  # BERT-style code asks for these
    sentinels = sentinel_tokens(tokenizer)
    if sentinels:
        hf_specials["additional_special_tokens"] = sentinels
    write_json(out_dir / SPECIALS_FILE, hf_specials)
    # "PreTrainedTokenizerFast" rather than transformers 5's "TokenizersBackend": both 4.x and 5.x load it.
    write_json(out_dir / HF_CONFIG_FILE, {
        "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False, **hf_specials})
    write_json(out_dir / META_FILE, {
        **meta, "vocab_size": tokenizer.get_vocab_size(),
        "special_tokens": {role: {"token": named[role], "id": tokenizer.token_to_id(named[role])} for role in ROLES},
        **({"sentinels": [tokenizer.token_to_id(t) for t in sentinels]} if sentinels else {})})


def sentinel_tokens(tokenizer: Tokenizer) -> list[str]:
    """T5's sentinel tokens <extra_id_0>, <extra_id_1>, ... that `tokenizer` has, in order."""
    tokens = []
    while tokenizer.token_to_id(SENTINEL.format(len(tokens))) is not None:
        tokens.append(SENTINEL.format(len(tokens)))
    return tokens


def copy_tokenizer(source: Path, folder: Path) -> None:
    """The tokenizer's files (TOKENIZER_FILES) from `source`, a tokenizer folder or a model folder that has
    them, into `folder`: every model folder carries the tokenizer it reads text with."""
    for name in TOKENIZER_FILES:
        if (Path(source) / name).is_file():
            shutil.copy2(Path(source) / name, Path(folder) / name)


def check_plain(tokenizer: Tokenizer) -> None:
    """Positions are counted on the tokenizer's output: one that pads or truncates on its own (a
    sentence-transformers tokenizer.json pads to 128) would miscount every one. lib.models.hf.import_tokenizer
    and the tokenizers trained here do neither."""
    if tokenizer.padding is not None or tokenizer.truncation is not None:
        raise ValueError("the tokenizer pads or truncates; call no_padding() and no_truncation() first")


def load_tokenizer(tokenizer_dir: str | Path) -> Tokenizer:
    """The Tokenizer saved by `train_tokenizer` in `tokenizer_dir`."""
    path = Path(tokenizer_dir) / TOKENIZER_FILE
    if not path.is_file():
        raise UserError(f"{path}: not found; train the tokenizer first")
    return Tokenizer.from_file(str(path))


def tokenizer_sha256(tokenizer_dir: str | Path) -> str:
    """The SHA-256 of the tokenizer.json in `tokenizer_dir`: which vocabulary token files were made with."""
    path = Path(tokenizer_dir) / TOKENIZER_FILE
    if not path.is_file():
        raise UserError(f"{path}: not found; train the tokenizer first")
    return file_sha256(path)


def read_meta(tokenizer_dir: str | Path) -> dict:
    """tokenizer_meta.json of a trained tokenizer folder."""
    path = Path(tokenizer_dir) / META_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: not found; train the tokenizer first") from None


def saved_special_ids(tokenizer_dir: str | Path) -> dict[str, int]:
    """Role -> id of the special tokens a saved tokenizer (tokenizer_meta.json in `tokenizer_dir`, beside
    every model the chain writes) was trained with: what a later stage, or a prediction, encodes with,
    whatever params.yaml's tokenizer section says now."""
    path = Path(tokenizer_dir) / META_FILE
    try:
        specials = json.loads(path.read_text(encoding="utf-8"))["special_tokens"]
        return {role: int(specials[role]["id"]) for role in ROLES}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UserError(f"{path}: no special token ids ({describe(err)}); copy it from the tokenizer the model "
                        "was trained with (data/tokens/tokenizer)") from None


def special_ids(tokenizer: Tokenizer, specials: SpecialTokens) -> dict[str, int]:
    """{'pad': 0, 'unk': 1, 'bos': 2, 'eos': 3, 'mask': 4}: the ids of the special tokens in `tokenizer`."""
    ids = {role: tokenizer.token_to_id(token) for role, token in zip(ROLES, specials.as_list())}
    missing = [token for token, i in zip(specials.as_list(), ids.values()) if i is None]
    if missing:
        raise UserError(f"tokenizer.special_tokens: {missing} not in the tokenizer's vocabulary; "
                        "retrain the tokenizer with these special tokens")
    return ids

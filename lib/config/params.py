"""params.yaml -> typed, validated dataclasses, once, at stage start.

Every section of params.yaml is a dataclass below. `load_params` checks the whole file: an unknown
key (with the closest valid one suggested), a wrong type or an impossible value stops the stage
with one line that names the key, before any work is done.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Sequence

import yaml

from lib.config.errors import UserError

HUB_PREFIX = "hf:"
LOCAL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".txt", ".txt.gz", ".csv", ".csv.gz", ".tsv", ".tsv.gz",
                  ".parquet")
# A float in YAML 1.2 that PyYAML (YAML 1.1) reads as a string: 2e-05 and 1e14 have no dot or no exponent
# sign. DVC writes `-S` values back this way (ruamel, YAML 1.2), so a float field takes them as numbers.
YAML12_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
# a task's or a parallel corpus's name is a folder and file name of its outputs
FOLDER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
RECIPES = Path(__file__).resolve().parent / "recipes"  # a named recipe is RECIPES/<name>.yaml
NOT_SET = object()  # a key a params mapping lacks, where a missing key and null differ


class ParamsError(UserError):
    pass


@dataclass
class CorpusConfig:
    """Unlabeled text for language-model training (cleaned by the `clean` stage)."""

    source: str  # a local file/folder, or hf:<org>/<name>[/<config>][@<revision>]
    splits: list[str] = field(default_factory=lambda: ["train"])  # read and cleaned as training text
    text_field: str = "text"
    valid_split: str | None = None  # a split of the source used as validation text, else hashed out of train
    valid_fraction: float = 0.01  # share of documents hashed into validation when valid_split is None
    max_docs: int | None = None  # read at most this many documents of each split of the source (of a hub
    # dataset: of each split the hub publishes; the data stage downloads no more than that)
    language: str = "en"  # its code, which tags its tokens when corpora.parallel makes the chain multilingual

    def validate(self, key: str) -> None:
        check_source(self.source, f"{key}.source")
        if not self.language.strip():
            raise ParamsError(f"{key}.language: empty; write a language code, e.g. en")
        if not self.splits:
            raise ParamsError(f"{key}.splits: empty; name at least one split, e.g. [train]")
        if self.valid_split is None and not 0.0 < self.valid_fraction < 1.0:
            raise ParamsError(f"{key}.valid_fraction: {self.valid_fraction} must be in (0, 1)")
        if self.valid_split in self.splits:
            raise ParamsError(f"{key}.valid_split: '{self.valid_split}' is also in {key}.splits; "
                              "validation text must not be training text")
        at_least_one_or_null(self, key, "max_docs")


@dataclass
class DataConfig:
    """Where the `data` stage finds hub datasets before it asks the hub (lib/data/raw.py)."""

    # a folder of offline copies, one folder per dataset named as in data/raw (e.g. imdb, sst2,
    # wikipedia_en), relative to the project root; null = always the hub
    mirror: str | None = "../shared/data"
    # offline copies of hub models for `init: hf:<org>/<name>`, one folder per <name>; null = the hub
    models_mirror: str | None = "../shared/models"


@dataclass
class ParallelCorpusConfig:
    """Sentence pairs in two languages, for XLM's translation LM (objective tlm). Each record holds, in
    `translation_field`, a mapping of language code to text: {"translation": {"en": "...", "de": "..."}},
    the Hugging Face translation layout. The clean stage cleans pairs side by side; the tokenizer stage
    trains on both sides and encodes them as pairs and as monolingual sentences."""

    source: str  # a local file/folder, or hf:<org>/<name>[/<config>][@<revision>]
    languages: list[str]  # the two codes of each record's translation, in the order the pair is written
    translation_field: str = "translation"
    splits: list[str] = field(default_factory=lambda: ["train"])  # read and cleaned as training pairs
    valid_split: str = "validation"  # a split of the source used as validation pairs
    max_pairs: int | None = None  # read at most this many pairs of each split of the source

    def validate(self, key: str) -> None:
        check_source(self.source, f"{key}.source")
        if len(self.languages) != 2 or len(set(self.languages)) != 2 or not all(
                code.strip() for code in self.languages):
            raise ParamsError(f"{key}.languages: [{', '.join(self.languages)}] must be two distinct language codes, "
                              "e.g. [en, de]")
        if not self.splits:
            raise ParamsError(f"{key}.splits: empty; name at least one split, e.g. [train]")
        if self.valid_split in self.splits:
            raise ParamsError(f"{key}.valid_split: '{self.valid_split}' is also in {key}.splits; "
                              "validation pairs must not be training pairs")
        at_least_one_or_null(self, key, "max_pairs")


@dataclass
class Corpora:
    pretrain: CorpusConfig  # general-domain text for pretraining (default: Wikipedia)
    domain: CorpusConfig  # target-domain text for adaptation (default: IMDb train + unsup)
    # name -> sentence pairs for XLM (objective tlm); {} = a monolingual chain, its token files untagged
    parallel: dict[str, ParallelCorpusConfig] = field(default_factory=dict)

    def validate(self, key: str) -> None:
        for name in self.parallel:
            check_folder_name(name, f"{key}.parallel", "corpus")

    def languages(self) -> list[str]:
        """The language codes the chain's token files are tagged with, in first-seen order (pretrain,
        domain, then each parallel corpus's); [] without parallel corpora: the token files are untagged."""
        if not self.parallel:
            return []
        codes = [self.pretrain.language, self.domain.language]
        return list(dict.fromkeys(codes + [code for corpus in self.parallel.values() for code in corpus.languages]))


@dataclass
class TaskConfig:
    """A labeled task. `clean` uses its evaluation splits to decontaminate the LM corpora.

    The fields a type reads (lib/tasks): classification and regression `text_field` (+
    `text_pair_field`) and `label_field`; tagging `text_field` (a list of words) and `label_field` (a
    list of IOB2 tags); span_qa `text_field` (the question), `text_pair_field` (the context) and
    `label_field` (answers {text, answer_start}); multiple_choice `text_field` (the context),
    `text_pair_field` (the list of endings) and `label_field` (the right ending's index); seq2seq
    `text_field` (the source; + `text_pair_field`, read as "<field>: <text> <field>: <text>") and
    `label_field` (the target: a text, SQuAD's answers, or a translation record's `target_language`)."""

    source: str
    type: str | None = None  # a task type of lib/tasks; null = lib.tasks.DEFAULT_TYPE (classification)
    text_field: str = "text"
    text_pair_field: str | None = None  # second text of sentence-pair tasks
    label_field: str = "label"
    eval_splits: list[str] = field(default_factory=lambda: ["validation"])  # the first is reported by finetune
    train_split: str = "train"
    label_names: list[str] | None = None  # names of label ids 0..n-1 (tagging: the tags); null = those found in train
    metrics: list[str] | None = None  # the first selects the best epoch; null = the type's default_metrics
    max_len: int = 128  # tokens per example (span_qa: per window), the special tokens included
    truncation: Literal["head", "tail", "head_tail"] = "head"  # which part of a long text is kept
    stride: int = 128  # span_qa: context tokens shared by consecutive windows of a long context
    max_question_len: int = 64  # span_qa: question tokens kept
    max_answer_len: int = 30  # span_qa: the longest answer, in tokens, decoding may pick
    data_label: str | None = None  # what the data is, beside the task's name wherever its scores are shown
    data_note: str | None = None  # a sentence on the data, printed with the task's scores in the report
    # the language of the task's text: with model.languages its tokens read that language's embedding;
    # null = the model's first language
    language: str | None = None
    # zero-shot transfer: the name of another task in `tasks` whose finetuned models (every variant and
    # seed) finetune scores on this task's eval_splits; this task trains nothing and needs no train split
    transfer_from: str | None = None
    # seq2seq: the language of the target text (a translation record's key); the source's is `language`
    target_language: str | None = None
    prefix: str | None = None  # seq2seq: T5's task prefix, put before every source ("translate English to German: ")
    max_target_len: int = 128  # seq2seq: target tokens per example, eos included; generation writes at most this many
    num_beams: int = 1  # seq2seq: beam search's width (1: greedy)
    length_penalty: float = 1.0  # seq2seq: a finished beam's score is its log-probability / length ** length_penalty

    def validate(self, key: str) -> None:
        check_source(self.source, f"{key}.source")
        if not self.eval_splits:
            raise ParamsError(f"{key}.eval_splits: empty; name the split to evaluate on, e.g. [validation]")
        if self.language is not None and not self.language.strip():
            raise ParamsError(f"{key}.language: empty; name a language code (e.g. de) or null")
        if self.transfer_from is None and self.train_split in self.eval_splits:
            raise ParamsError(f"{key}.train_split: '{self.train_split}' is also in {key}.eval_splits")
        if self.max_len < 8:
            raise ParamsError(f"{key}.max_len: {self.max_len} must be >= 8 (special tokens + some text)")
        if self.label_names is not None and len(set(self.label_names)) < 2:
            raise ParamsError(f"{key}.label_names: need at least 2 distinct names (or null)")
        at_least_one(self, key, "stride", "max_question_len", "max_answer_len", "num_beams")
        if self.max_target_len < 2:
            raise ParamsError(f"{key}.max_target_len: {self.max_target_len} must be >= 2 (a token and eos)")


@dataclass
class NearDedupConfig:
    """MinHash + LSH near-duplicate removal over word shingles."""

    enabled: bool = True
    num_perm: int = 128
    bands: int = 16  # num_perm / bands rows per band; candidate threshold ~ (1/bands)^(1/rows)
    shingle_words: int = 5
    threshold: float = 0.8  # estimated Jaccard similarity at or above which a document is a near-duplicate

    def validate(self, key: str) -> None:
        if self.num_perm < 1 or self.bands < 1 or self.num_perm % self.bands:
            raise ParamsError(f"{key}.bands: {self.bands} must divide {key}.num_perm ({self.num_perm})")
        at_least_one(self, key, "shingle_words")
        if not 0.0 < self.threshold <= 1.0:
            raise ParamsError(f"{key}.threshold: {self.threshold} must be in (0, 1]")


@dataclass
class DecontaminateConfig:
    """Drop LM training documents that contain an evaluation example of a task."""

    enabled: bool = True
    min_words: int = 8  # shorter evaluation examples are too generic to match on (counted, not used)

    def validate(self, key: str) -> None:
        at_least_one(self, key, "min_words")


@dataclass
class CleanConfig:
    unicode_nfkc: bool = True
    strip_html: bool = True
    remove_control_chars: bool = True
    collapse_whitespace: bool = True
    min_chars: int = 200
    max_chars: int = 1_000_000
    min_alpha_ratio: float = 0.6  # junk filter: share of letters among non-space characters
    exact_dedup: bool = True
    near_dedup: NearDedupConfig = field(default_factory=NearDedupConfig)
    decontaminate: DecontaminateConfig = field(default_factory=DecontaminateConfig)
    workers: int = 0  # processes for the per-document rules; 0 = one per CPU core
    batch_docs: int = 64  # documents per work item sent to a worker

    def validate(self, key: str) -> None:
        if self.min_chars < 0 or self.max_chars < max(self.min_chars, 1):
            raise ParamsError(f"{key}.max_chars: {self.max_chars} must be >= {key}.min_chars ({self.min_chars})")
        if not 0.0 <= self.min_alpha_ratio <= 1.0:
            raise ParamsError(f"{key}.min_alpha_ratio: {self.min_alpha_ratio} must be in [0, 1]")
        if self.workers < 0:
            raise ParamsError(f"{key}.workers: {self.workers} must be >= 0 (0 = one per CPU core)")
        at_least_one(self, key, "batch_docs")


@dataclass
class SpecialTokens:
    pad: str = "[PAD]"
    unk: str = "[UNK]"
    bos: str = "[CLS]"  # starts a sequence: BERT's [CLS], GPT's <s>
    eos: str = "[SEP]"  # ends a sequence / separates documents and segments
    mask: str = "[MASK]"

    def as_list(self) -> list[str]:
        """In id order: pad=0, unk=1, bos=2, eos=3, mask=4."""
        return [self.pad, self.unk, self.bos, self.eos, self.mask]

    def validate(self, key: str) -> None:
        tokens = self.as_list()
        if any(not t or t.isspace() for t in tokens):
            raise ParamsError(f"{key}: special tokens must be non-empty strings, got {tokens}")
        if len(set(tokens)) != len(tokens):
            raise ParamsError(f"{key}: special tokens must be distinct, got {tokens}")


@dataclass
class TokenizerConfig:
    algorithm: Literal["bpe", "wordpiece", "unigram"] = "bpe"  # byte-level BPE, WordPiece, sentencepiece Unigram
    vocab_size: int = 16384
    lowercase: bool = False
    min_frequency: int = 2  # bpe/wordpiece: merges seen fewer times are not learned
    train_chars: int | None = 20_000_000  # train on the first N chars of the cleaned corpus; null = all
    special_tokens: SpecialTokens = field(default_factory=SpecialTokens)
    # T5's sentinel tokens <extra_id_0>, ... after the special tokens (objective t5 reads them); in every
    # vocabulary, so that objectives compare on one
    sentinels: int = 0
    batch_docs: int = 256  # documents per encode_batch call

    def validate(self, key: str) -> None:
        if self.sentinels < 0:
            raise ParamsError(f"{key}.sentinels: {self.sentinels} must be >= 0")
        n_special = len(self.special_tokens.as_list()) + self.sentinels
        minimum = n_special + (256 if self.algorithm == "bpe" else 1)
        if self.vocab_size < minimum:
            why = f"{n_special} special and sentinel tokens" + (" + 256 byte tokens" if self.algorithm == "bpe" else " + 1")
            raise ParamsError(f"{key}.vocab_size: {self.vocab_size} is too small for {self.algorithm} "
                              f"(needs >= {minimum}: {why}); raise it")
        if self.vocab_size > 2**32 - 1:
            raise ParamsError(f"{key}.vocab_size: {self.vocab_size} must fit in 32 bits")
        at_least_one(self, key, "min_frequency", "batch_docs")
        at_least_one_or_null(self, key, "train_chars")


@dataclass
class ModelConfig:
    """The transformer (lib/models/config.py, lib/models/architectures/). vocab_size comes from the trained tokenizer."""

    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 1024
    dropout: float = 0.1
    max_positions: int = 512
    # t5: T5's bucketed relative position bias (Raffel et al. 2020), a learned bias per head and distance bucket
    position: Literal["learned", "sinusoidal", "rope", "alibi", "t5"] = "learned"
    norm: Literal["pre", "post"] = "pre"  # LayerNorm before each sublayer (GPT-2) or after it (BERT)
    tie_embeddings: bool = True  # the LM head reuses the token embedding matrix
    # the LM head: BERT's dense-GELU-LayerNorm before the decoder, or GPT-2's (and XLM's) decoder alone
    lm_head: Literal["mlp", "linear"] = "mlp"
    embedding_size: int | None = None  # ALBERT factorised embeddings: E < d_model, projected up; null = d_model
    share_layers: bool = False  # ALBERT cross-layer parameter sharing: one block applied n_layers times
    segment_vocab: int = 2  # segment (token type) embeddings for sentence pairs; 0 = none
    # XLM's language embeddings, one per code, added to every token's; [] = none. A token given no
    # language id reads the first language's.
    languages: list[str] = field(default_factory=list)

    def heads_fit(self) -> bool:
        """Whether the heads split d_model evenly, as they must where d_model sets their width."""
        return self.d_model % self.n_heads == 0

    def validate(self, key: str) -> None:
        at_least_one(self, key, "d_model", "n_layers", "n_heads", "d_ff", "max_positions")
        if len(set(self.languages)) != len(self.languages) or not all(
                isinstance(code, str) and code.strip() for code in self.languages):
            raise ParamsError(f"{key}.languages: {self.languages} must be distinct language codes (e.g. [en, de])")
        if not self.heads_fit():
            raise ParamsError(f"{key}.n_heads: {self.n_heads} must divide {key}.d_model ({self.d_model})")
        if self.position == "rope" and (self.d_model // self.n_heads) % 2:
            raise ParamsError(f"{key}.position: rope needs an even head size, d_model/n_heads = "
                              f"{self.d_model // self.n_heads}; change n_heads")
        if not 0.0 <= self.dropout < 1.0:
            raise ParamsError(f"{key}.dropout: {self.dropout} must be in [0, 1)")
        if self.embedding_size is not None and self.embedding_size < 1:
            raise ParamsError(f"{key}.embedding_size: {self.embedding_size} must be >= 1 (or null = d_model)")
        if self.segment_vocab < 0:
            raise ParamsError(f"{key}.segment_vocab: {self.segment_vocab} must be >= 0")


@dataclass
class EncoderDecoderConfig:
    """The model of the encoder-decoder objectives (t5, bart; lib/models/architectures/encoder_decoder.py): the
    model section's sizes in T5's or BART's shape."""

    # auto: the objective's own (t5 -> t5, bart -> bart); t5: RMS pre-norm, T5's relative position bias, no
    # biases, ReLU; bart: post-LN, learned positions, GELU. model.position, norm and lm_head do not apply.
    shape: Literal["auto", "t5", "bart"] = "auto"
    decoder_layers: int | None = None  # the decoder's depth; null = model.n_layers

    def validate(self, key: str) -> None:
        if self.decoder_layers is not None and self.decoder_layers < 1:
            raise ParamsError(f"{key}.decoder_layers: {self.decoder_layers} must be >= 1 (or null = model.n_layers)")


@dataclass
class MLMConfig:
    """BERT masking; `mask_token` and `random_token` are shares of the selected positions, the rest kept."""

    mask_rate: float = 0.15
    mask_token: float = 0.8
    random_token: float = 0.1
    whole_word: bool = False  # select whole words (the tokenizer's word-start flags)
    span: bool = False  # SpanBERT: select spans of geometric length
    span_p: float = 0.2  # geometric parameter of span lengths (mean 1/p, clipped to span_max)
    span_max: int = 10
    # ERNIE 1.0: mask mined phrases and/or named entities whole (lib/data/knowledge.py); implies whole_word
    knowledge: Literal["none", "phrase", "entity", "both"] = "none"
    sentence: Literal["none", "sop", "nsp"] = "none"  # a sentence-level task beside masked LM (objective: mlm)
    sentence_weight: float = 1.0  # its loss weight

    def validate(self, key: str) -> None:
        if self.sentence_weight <= 0:
            raise ParamsError(f"{key}.sentence_weight: {self.sentence_weight} must be > 0")
        if not 0.0 < self.mask_rate < 1.0:
            raise ParamsError(f"{key}.mask_rate: {self.mask_rate} must be in (0, 1)")
        if self.mask_token < 0 or self.random_token < 0 or self.mask_token + self.random_token > 1.0:
            raise ParamsError(f"{key}.mask_token + {key}.random_token: {self.mask_token} + {self.random_token} "
                              "must be shares in [0, 1] adding up to at most 1 (the rest is kept unchanged)")
        if self.whole_word and self.span:
            raise ParamsError(f"{key}.span: choose whole_word or span masking, not both")
        if self.knowledge != "none" and self.span:
            raise ParamsError(f"{key}.knowledge: {self.knowledge} masks whole phrases or entities, not SpanBERT "
                              f"spans; set {key}.span: false or {key}.knowledge: none")
        if not 0.0 < self.span_p <= 1.0 or self.span_max < 1:
            raise ParamsError(f"{key}.span_p/span_max: need 0 < span_p <= 1 and span_max >= 1")


@dataclass
class ElectraConfig:
    generator_width: float = 0.25  # generator d_model and d_ff as a share of the discriminator's (1/4-1/3)
    disc_weight: float = 50.0  # lambda: weight of the replaced-token-detection loss

    def validate(self, key: str) -> None:
        if not 0.0 < self.generator_width <= 1.0:
            raise ParamsError(f"{key}.generator_width: {self.generator_width} must be in (0, 1]")
        if self.disc_weight <= 0:
            raise ParamsError(f"{key}.disc_weight: {self.disc_weight} must be > 0")


@dataclass
class PLMConfig:
    partial_k: int = 6  # XLNet's K: each sequence predicts the last 1/K of its factorisation order

    def validate(self, key: str) -> None:
        if self.partial_k < 2:
            raise ParamsError(f"{key}.partial_k: {self.partial_k} must be >= 2 (1/K of the tokens are predicted "
                              "from the rest)")


@dataclass
class TLMConfig:
    pair_batch: int = 32  # XLM's translation pairs per micro-batch, beside pretrain's (or adapt's) token windows

    def validate(self, key: str) -> None:
        at_least_one(self, key, "pair_batch")


@dataclass
class SpanCorruptionConfig:
    """T5's span corruption (lib/objectives/noising.py): spans of the input replaced by sentinels."""

    noise_density: float = 0.15  # share of each row's tokens that are noise (T5's 15%)
    mean_span_length: float = 3.0  # mean length of a noise span in tokens (T5's 3)

    def validate(self, key: str) -> None:
        if not 0.0 < self.noise_density < 1.0:
            raise ParamsError(f"{key}.noise_density: {self.noise_density} must be in (0, 1)")
        if self.mean_span_length < 1.0:
            raise ParamsError(f"{key}.mean_span_length: {self.mean_span_length} must be >= 1")


@dataclass
class DenoisingConfig:
    """BART's noising (lib/objectives/noising.py); the defaults are the BART paper's text infilling with
    sentence permutation."""

    mask_ratio: float = 0.3  # share of each row's words picked for masking
    mask_unit: Literal["token", "word", "span"] = "span"  # span: whole-word spans of Poisson(poisson_lambda) words
    poisson_lambda: float = 3.0
    replace_length: int = 1  # a picked span becomes: 1 one mask, 0 nothing (deleted), -1 one mask per token
    random_ratio: float = 0.0  # share of the replacement masks that are a random token instead
    insert_ratio: float = 0.0  # extra tokens inserted, as a share of the row's length
    permute_sentences: float = 1.0  # share of each row's sentences shuffled among themselves
    rotate: float = 0.0  # probability a row is rotated to start at a random token

    def validate(self, key: str) -> None:
        if not 0.0 <= self.mask_ratio < 1.0:
            raise ParamsError(f"{key}.mask_ratio: {self.mask_ratio} must be in [0, 1)")
        if self.poisson_lambda <= 0:
            raise ParamsError(f"{key}.poisson_lambda: {self.poisson_lambda} must be > 0")
        if self.replace_length not in (-1, 0, 1):
            raise ParamsError(f"{key}.replace_length: {self.replace_length} must be -1 (a mask per token), "
                              "0 (delete) or 1 (one mask per span)")
        for name in ("random_ratio", "insert_ratio", "permute_sentences", "rotate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ParamsError(f"{key}.{name}: {getattr(self, name)} must be in [0, 1]")


@dataclass
class OptimizerConfig:
    """The optimizer and its step (lib/training/optim.py), the same keys in every stage that trains."""

    optimizer: str = "adamw"  # one of lib.training.optim.OPTIMIZERS
    weight_decay: float = 0.01  # on matrices, never on biases and norms
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-6
    clip_norm: float = 1.0  # 0 = no clipping
    max_bad_steps: int = 3  # non-finite losses in a row that are skipped before the run stops

    def check_optimizer(self, key: str) -> None:
        if self.weight_decay < 0 or self.clip_norm < 0 or self.max_bad_steps < 0:
            raise ParamsError(f"{key}: weight_decay, clip_norm and max_bad_steps must be >= 0")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1 and self.eps > 0):
            raise ParamsError(f"{key}.beta1/beta2/eps: need betas in [0, 1) and eps > 0")


@dataclass
class TrainConfig(OptimizerConfig):
    """One run of the trainer (lib/training/budget_loop.py). Its length is a budget: tokens, minutes, whichever first."""

    seq_len: int = 128
    batch_size: int = 32  # sequences per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 1e-3  # the peak LR (of the top layer group when lr_decay > 1)
    # one of lib.training.optim.SCHEDULES: linear/cosine: warmup_steps, then decay to min_lr_ratio * lr at the
    # token budget; stlr: ULMFiT's slanted triangular LR, up for cut_frac of the steps, then down to lr / stlr_ratio
    schedule: str = "linear"
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    cut_frac: float = 0.1
    stlr_ratio: float = 32.0
    lr_decay: float = 1.0  # discriminative LRs: each layer group's LR is the one above it / lr_decay
    decay_embeddings: bool = True  # weight decay on embedding matrices too (never on biases and norms)
    budget_tokens: int = 5_000_000  # training tokens; also the length of the LR schedule
    # set: the run's budget in training FLOPs instead, counted per objective (Objective.flops_per_token),
    # so objectives that cost more per token get fewer tokens; budget_tokens is then not used
    budget_flops: float | None = None
    budget_minutes: float | None = None  # stop earlier when this much wall-clock time has passed
    eval_every: int = 100  # steps between validations
    eval_batches: int = 8  # the fixed validation set: this many batches of windows of the validation split
    log_every: int = 10
    checkpoint_every: int = 100  # steps between (atomic) checkpoints

    def validate(self, key: str) -> None:
        self.check_optimizer(key)
        at_least_one(self, key, "seq_len", "batch_size", "grad_accum", "budget_tokens", "eval_every",
                     "eval_batches", "log_every", "checkpoint_every")
        if self.lr <= 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ParamsError(f"{key}.lr/min_lr_ratio: need lr > 0 and 0 <= min_lr_ratio <= 1")
        if self.warmup_steps < 0:
            raise ParamsError(f"{key}.warmup_steps: {self.warmup_steps} must be >= 0")
        if self.budget_flops is not None and self.budget_flops <= 0:
            raise ParamsError(f"{key}.budget_flops: {self.budget_flops} must be > 0 (or null to budget in tokens)")
        if self.budget_minutes is not None and self.budget_minutes <= 0:
            raise ParamsError(f"{key}.budget_minutes: {self.budget_minutes} must be > 0 (or null for none)")
        check_ulmfit_lr(self, key)
        step_tokens = self.seq_len * self.batch_size * self.grad_accum
        if self.budget_tokens < step_tokens:
            raise ParamsError(f"{key}.budget_tokens: {self.budget_tokens} is less than one step "
                              f"(seq_len * batch_size * grad_accum = {step_tokens}); raise it")


@dataclass
class PretrainConfig(TrainConfig):
    # with `init` set: keep passes the published model on unchanged; continue pretrains it further on
    # corpora.pretrain with the objective that fits it (lib.objectives.fitting_objective)
    with_init: Literal["keep", "continue"] = "keep"


@dataclass
class AdaptConfig(TrainConfig):
    """ULMFiT step 2: continue the pretraining objective on the target domain's unlabeled text."""

    enabled: bool = True  # false: the pretrained model goes on unchanged (to measure what adapting adds)
    schedule: str = "stlr"
    lr_decay: float = 2.6


def check_lr_warmup(section: Any, key: str) -> None:
    """A finetune variant's peak LR and the share of its steps that warm up to it."""
    if section.lr <= 0:
        raise ParamsError(f"{key}.lr: {section.lr} must be > 0")
    if not 0 <= section.warmup_frac < 1:
        raise ParamsError(f"{key}.warmup_frac: {section.warmup_frac} must be in [0, 1)")


# Each finetune variant's settings (lib/training/variants/<name>.py reads finetune.<name>)


@dataclass
class UlmfitConfig:
    """ulmfit: the adapted model, ULMFiT's concat-pooling block, gradual unfreezing, discriminative LRs, STLR."""

    lr: float = 5e-3  # the top layer group's (the head's) peak LR; each group below / lr_decay
    lr_decay: float = 2.6
    cut_frac: float = 0.1
    stlr_ratio: float = 32.0
    unfreeze_every: int = 0  # steps between unfreezing the next group from the top; 0 = every epoch
    gradual_unfreezing: bool = True  # false trains every group from the first step (ablation)
    stlr: bool = True  # false: warmup_frac warmup then linear decay, as plain (ablation)
    warmup_frac: float = 0.1  # with stlr false

    def validate(self, key: str) -> None:
        check_lr_warmup(self, key)
        check_ulmfit_lr(self, key)


@dataclass
class PlainConfig:
    """plain: the adapted model, transformers' head of its family, every layer, one LR, linear warmup and decay."""

    lr: float = 1e-3
    warmup_frac: float = 0.1  # linear warmup over this share of the steps, then linear decay to 0

    def validate(self, key: str) -> None:
        check_lr_warmup(self, key)


@dataclass
class FromScratchConfig(PlainConfig):
    """from_scratch: plain on random weights of the same shape; they need a larger LR than pretrained ones."""


@dataclass
class FrozenConfig:
    """frozen: a logistic-regression probe on the frozen backbone's features."""

    probe_c: list[float] = field(default_factory=lambda: [0.01, 0.1, 1.0, 10.0])  # inverse L2 strengths, best on dev

    def validate(self, key: str) -> None:
        if not self.probe_c or min(self.probe_c) <= 0:
            raise ParamsError(f"{key}.probe_c: {self.probe_c} must be a non-empty list of positive numbers")


@dataclass
class ElmoConfig:
    """elmo: the frozen backbone, a learned scalar mix of every layer's states and the concat block on them."""

    lr: float = 5e-3  # the mix's and the block's peak LR
    warmup_frac: float = 0.1  # linear warmup over this share of the steps, then linear decay to 0
    mix: bool = True  # false reads the last layer only: the same head without the mix (ablation)

    def validate(self, key: str) -> None:
        check_lr_warmup(self, key)


# what finetune runs rather than how it trains: with_init cannot change these
FINETUNE_SELECTION_KEYS = ("tasks", "variants", "seeds", "max_train_examples", "max_eval_examples", "dev_fraction",
                           "dev_max", "with_init")


@dataclass
class FinetuneConfig(OptimizerConfig):
    """ULMFiT step 3 and its baselines, per task x variant x seed; each variant's own settings in its section."""

    tasks: list[str] = field(default_factory=lambda: ["imdb", "sst2"])  # names in `tasks`
    # finetune variants of lib/training/variants, each set in its section below
    variants: list[str] = field(default_factory=lambda: ["ulmfit", "plain", "from_scratch", "frozen"])
    seeds: int = 2  # runs per task x variant, seeds seed, seed+1, ...
    epochs: int = 3
    batch_size: int = 32
    # per task, a fixed subset of train (quick runs): one number for every task, or {task: number}
    # (a task left out uses all); null = all
    max_train_examples: int | dict[str, int] | None = None
    # the same for the reported split: one number, or {task: number}; null = all
    max_eval_examples: int | dict[str, int] | None = None
    dev_fraction: float = 0.1  # of train, hashed out as the dev set that picks the best epoch
    dev_max: int = 2000
    head_hidden: int = 128  # ULMFiT classifier block: concat pool -> norm, dropout, linear, ReLU, norm, dropout, linear
    head_dropout: float = 0.1
    aux_lm_weight: float = 0.0  # GPT-1 lambda: auxiliary LM loss while finetuning (causal models only)
    patience: int = 2  # epochs without a better dev score before stopping
    ulmfit: UlmfitConfig = field(default_factory=UlmfitConfig)
    plain: PlainConfig = field(default_factory=PlainConfig)
    from_scratch: FromScratchConfig = field(default_factory=FromScratchConfig)
    frozen: FrozenConfig = field(default_factory=FrozenConfig)
    elmo: ElmoConfig = field(default_factory=ElmoConfig)
    # with `init` set, these values replace the keys above of the same name (a variant's section key by key):
    # a published transformer wants far gentler LRs than ULMFiT's, which were tuned for an LSTM (docs/results/:
    # the ablation from MiniLM)
    with_init: dict[str, Any] = field(default_factory=dict)

    def validate(self, key: str) -> None:
        self.check(key)
        hints = typing.get_type_hints(FinetuneConfig)
        for name, value in self.with_init.items():
            where = f"{key}.with_init.{name}"
            if name not in hints or name in FINETUNE_SELECTION_KEYS:
                allowed = [k for k in hints if k not in FINETUNE_SELECTION_KEYS]
                raise ParamsError(f"{where}: not a training setting; one of {', '.join(allowed)}")
            if not dataclasses.is_dataclass(hints[name]):
                self.with_init[name] = _coerce(value, hints[name], where)
                continue
            # a variant's section: the keys given replace those of finetune.<name>, checked as that section
            if not isinstance(value, dict):
                raise ParamsError(f"{where}: expected a mapping of {key}.{name}'s keys, got {_describe(value)}")
            section = build(hints[name], {**dataclasses.asdict(getattr(self, name)), **value}, where)
            self.with_init[name] = {str(k): getattr(section, str(k)) for k in value}
        self.with_init_applied().check(f"{key}.with_init")

    def with_init_applied(self) -> FinetuneConfig:
        """This config with with_init's values in place: what finetuning a published model uses."""
        return dataclasses.replace(self, **{
            name: dataclasses.replace(getattr(self, name), **value) if dataclasses.is_dataclass(getattr(self, name))
            else value for name, value in self.with_init.items()})

    def check(self, key: str) -> None:
        self.check_optimizer(key)
        at_least_one(self, key, "seeds", "epochs", "batch_size", "dev_max", "head_hidden", "patience")
        for name in ("tasks", "variants"):
            values = getattr(self, name)
            if not values or len(set(values)) != len(values):
                raise ParamsError(f"{key}.{name}: {values} must be a non-empty list without repeats")
        if not 0.0 < self.dev_fraction < 1.0:
            raise ParamsError(f"{key}.dev_fraction: {self.dev_fraction} must be in (0, 1)")
        for name in ("max_train_examples", "max_eval_examples"):
            value = getattr(self, name)
            for task, limit in (value if isinstance(value, dict) else {"": value}).items():
                if limit is not None and limit < 1:
                    raise ParamsError(f"{key}.{name}{'.' + task if task else ''}: {limit} must be >= 1 (or null for all)")
        if not 0.0 <= self.head_dropout < 1.0 or self.aux_lm_weight < 0:
            raise ParamsError(f"{key}: need 0 <= head_dropout < 1 and aux_lm_weight >= 0")

    def train_limit(self, task: str) -> int | None:
        """How many train examples of `task` finetuning (and what compares with it) uses; None = all."""
        return per_task(self.max_train_examples, task)

    def eval_limit(self, task: str) -> int | None:
        """How many examples of `task`'s reported split finetuning (and what compares with it) scores; None = all."""
        return per_task(self.max_eval_examples, task)


@dataclass
class DistillConfig(OptimizerConfig):
    """A smaller student per task, trained on the finetuned teacher's outputs (DistilBERT, Patient-KD)."""

    tasks: list[str] | None = None  # each must be in finetune.tasks; null = every task finetune trains; [] = none
    layers: int = 2  # student depth (an encoder-decoder's encoder)
    decoder_layers: int | None = None  # an encoder-decoder student's decoder depth; null = layers
    width: float = 1.0  # student d_model as a share of the teacher's; < 1 starts from random weights
    init: Literal["every_other", "bottom", "random"] = "every_other"  # which teacher blocks the student copies
    layer_map: list[int] | None = None  # teacher layer (1..n) each student layer imitates; null = its init's
    temperature: float = 2.0
    soft_weight: float = 1.0  # KL of the temperature-scaled distributions, times T^2
    hard_weight: float = 0.5  # cross-entropy with the gold label (labeled examples only)
    hidden_weight: float = 1.0  # hidden-state loss at the mapped layers, over the real tokens
    hidden_loss: Literal["cosine", "mse"] = "cosine"
    hidden_layers: Literal["last", "all"] = "last"  # DistilBERT matches the last layer only
    pkd_weight: float = 0.0  # Patient-KD: normalised pooled states of the intermediate mapped layers
    # seq2seq: the student's targets, the gold ones (word-level KD: soft is per target token) or the teacher's
    # beam outputs on the training sources (sequence-level KD, Kim & Rush 2016)
    targets: Literal["gold", "teacher"] = "gold"
    top_k: int = 8  # seq2seq word-level KD: the teacher's k likeliest tokens per target position are its target
    unlabeled: dict[str, str] = field(default_factory=dict)  # task -> split of its source labeled by the teacher
    max_unlabeled: int | None = 3000  # per task, fixed by text hash; null = all
    epochs: int = 3
    batch_size: int = 32
    lr: float = 5e-4
    warmup_frac: float = 0.1
    patience: int = 2

    def validate(self, key: str) -> None:
        self.check_optimizer(key)
        at_least_one(self, key, "layers", "epochs", "batch_size", "patience", "top_k")
        if self.decoder_layers is not None and self.decoder_layers < 1:
            raise ParamsError(f"{key}.decoder_layers: {self.decoder_layers} must be >= 1 (or null: as many as layers)")
        if self.tasks is not None and len(set(self.tasks)) != len(self.tasks):
            raise ParamsError(f"{key}.tasks: {self.tasks} must be a list without repeats ([]: no students; null: "
                              "every task in finetune.tasks)")
        if not 0.0 < self.width <= 1.0:
            raise ParamsError(f"{key}.width: {self.width} must be in (0, 1]")
        if self.width < 1.0 and self.init != "random":
            raise ParamsError(f"{key}.init: a narrower student (width {self.width}) cannot copy teacher blocks; "
                              "set init: random or width: 1.0")
        if self.layer_map is not None and len(self.layer_map) != self.layers:
            raise ParamsError(f"{key}.layer_map: {len(self.layer_map)} entries for {self.layers} student layers")
        if self.temperature <= 0 or self.lr <= 0 or not 0 <= self.warmup_frac < 1:
            raise ParamsError(f"{key}: need temperature > 0, lr > 0 and warmup_frac in [0, 1)")
        weights = {n: getattr(self, n) for n in ("soft_weight", "hard_weight", "hidden_weight", "pkd_weight")}
        if min(weights.values()) < 0 or not sum(weights.values()) > 0:
            raise ParamsError(f"{key}: the loss weights {weights} must be >= 0 and not all 0")
        if self.pkd_weight > 0 and self.layers < 2:
            raise ParamsError(f"{key}.pkd_weight: Patient-KD matches intermediate layers; a {self.layers}-layer "
                              "student has none (use layers >= 2 or pkd_weight: 0)")
        at_least_one_or_null(self, key, "max_unlabeled")


@dataclass
class ZeroShotConfig:
    """GPT-2-style zero-shot: which label word the LM finds likelier after a prompt."""

    template: str  # "{text}" (and "{text_pair}") filled in, e.g. "{text} It was"
    label_words: list[str]  # one per label index, e.g. [" terrible", " great"]

    def validate(self, key: str) -> None:
        if "{text}" not in self.template:
            raise ParamsError(f"{key}.template: '{self.template}' has no {{text}} placeholder")
        if len(self.label_words) < 2 or not all(w.strip() for w in self.label_words):
            raise ParamsError(f"{key}.label_words: need a non-blank word per label, got {self.label_words}")


@dataclass
class EvaluateConfig:
    """The final report: every model and baseline on each task's evaluation split, size and speed."""

    tfidf_c: list[float] = field(default_factory=lambda: [0.25, 1.0, 4.0, 16.0])  # picked on dev
    zero_shot: dict[str, ZeroShotConfig] = field(default_factory=dict)  # task -> prompt (causal LMs only)
    latency_seq_len: int = 128  # tokens per sequence when timing
    latency_repeats: int = 50
    throughput_batch: int = 32

    def validate(self, key: str) -> None:
        at_least_one(self, key, "latency_seq_len", "latency_repeats", "throughput_batch")
        if not self.tfidf_c or min(self.tfidf_c) <= 0:
            raise ParamsError(f"{key}.tfidf_c: {self.tfidf_c} must be a non-empty list of positive numbers")


@dataclass
class ImplConfig:
    """How to run, apart from what to compute: results do not depend on these except precision."""

    # auto = bf16 autocast on CUDA, and on CPU where a probe found it faster than fp32 (lib/core/runtime.py)
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    compile: Literal["auto", "on", "off"] = "auto"  # torch.compile; auto = on CUDA only
    nproc: int = 1  # processes (one per GPU) the training stages run under torchrun
    strategy: Literal["ddp", "fsdp"] = "ddp"  # fsdp: the training stages shard their models over them (FSDP2)
    threads: int = 0  # torch's CPU threads; 0 = auto: the usable cores, shared by DVC queue workers

    def validate(self, key: str) -> None:
        if self.nproc < 1:
            raise ParamsError(f"{key}.nproc: {self.nproc} must be >= 1")
        if self.threads < 0:
            raise ParamsError(f"{key}.threads: {self.threads} must be >= 0 (0 = as many as the usable cores)")


@dataclass
class TrackingConfig:
    enabled: bool = True
    experiment: str = "transfer-pipeline"  # the MLflow experiment every stage logs into


@dataclass
class Params:
    corpora: Corpora
    tasks: dict[str, TaskConfig]
    recipe: str = "cpu-demo"  # lib/config/recipes/<recipe>.yaml: its keys replace this file's (apply_recipe)
    seed: int = 1337
    device: Literal["auto", "cpu", "cuda"] = "auto"
    objective: str = "mlm"  # a pretraining objective of lib/objectives
    # a published model to start from (lib/models/hf.py): a folder in Hugging Face layout (relative to the
    # project root) or hf:<repo id>[@revision]; null = train the tokenizer and pretrain from scratch
    init: str | None = None
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    data: DataConfig = field(default_factory=DataConfig)
    clean: CleanConfig = field(default_factory=CleanConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    encoder_decoder: EncoderDecoderConfig = field(default_factory=EncoderDecoderConfig)
    mlm: MLMConfig = field(default_factory=MLMConfig)
    electra: ElectraConfig = field(default_factory=ElectraConfig)
    plm: PLMConfig = field(default_factory=PLMConfig)
    tlm: TLMConfig = field(default_factory=TLMConfig)
    t5: SpanCorruptionConfig = field(default_factory=SpanCorruptionConfig)
    bart: DenoisingConfig = field(default_factory=DenoisingConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    adapt: AdaptConfig = field(default_factory=AdaptConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    impl: ImplConfig = field(default_factory=ImplConfig)

    def unknown_task(self, key: str, task: str) -> ParamsError:
        """The error for `key` naming `task`, which is not in `tasks`, with the closest name there."""
        close = difflib.get_close_matches(task, self.tasks, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"tasks has: {', '.join(self.tasks)}"
        return ParamsError(f"{key}: '{task}' is not a task in `tasks`; {hint}")

    def check_languages(self) -> None:
        """Every language the token files are tagged with (Corpora.languages) has a language embedding."""
        if not self.corpora.parallel:
            return
        tagged = [(f"corpora.{name}.language", [getattr(self.corpora, name).language]) for name in ("pretrain", "domain")]
        tagged += [(f"corpora.parallel.{name}.languages", corpus.languages)
                   for name, corpus in self.corpora.parallel.items()]
        for key, codes in tagged:
            for code in codes:
                if code not in self.model.languages:
                    raise ParamsError(f"{key}: {code} is not in model.languages [{', '.join(self.model.languages)}]; "
                                      "add it")

    def check_transfer(self) -> None:
        """Each transfer task's source (tasks.<name>.transfer_from): a task that trains, finetuned whenever
        the transfer task is; the transfer task takes its metrics and label names where it names none. The
        task types' own checks (lib.tasks.check_tasks) compare the two tasks' types and label names."""
        for name, task in self.tasks.items():
            source, key = task.transfer_from, f"tasks.{name}.transfer_from"
            if source is None:
                continue
            if source not in self.tasks:
                raise self.unknown_task(key, source)
            if source == name or self.tasks[source].transfer_from is not None:
                raise ParamsError(f"{key}: '{source}' is {'this task' if source == name else 'a transfer task'} "
                                  "itself; name the task whose finetuned models this one is scored with")
            # reported in its source's metrics, of its source's classes: the stages and the tracked params see them
            for shared in ("metrics", "label_names"):
                if getattr(task, shared) is None:
                    setattr(task, shared, getattr(self.tasks[source], shared))
            if task.metrics != self.tasks[source].metrics:
                raise ParamsError(f"tasks.{name}.metrics: {task.metrics}, but a transfer task is reported in the "
                                  f"metrics of tasks.{source} ({self.tasks[source].metrics}); remove the key")
            if name in self.finetune.tasks and source not in self.finetune.tasks:
                raise ParamsError(f"finetune.tasks: has '{name}' but not '{source}', whose models it is scored "
                                  f"with ({key}); add '{source}'")

    def validate(self, key: str) -> None:
        if self.init is not None and not self.init.removeprefix(HUB_PREFIX).partition("@")[0].strip("/ "):
            raise ParamsError(f"init: '{self.init}' names no published model; write a folder, hf:<org>/<name>[@revision] "
                              "or null (pretrain from scratch)")
        for name in self.tasks:
            check_folder_name(name, "tasks", "task")
        self.check_languages()
        if self.init is not None:  # every stage and the tracked params see the values finetuning uses
            self.finetune = self.finetune.with_init_applied()
        for name in ("pretrain", "adapt"):
            seq_len = getattr(self, name).seq_len
            if seq_len > self.model.max_positions:
                raise ParamsError(f"{name}.seq_len: {seq_len} is above model.max_positions "
                                  f"({self.model.max_positions}); lower it or raise model.max_positions")
        for i, task in enumerate(self.finetune.tasks):
            if task not in self.tasks:
                raise self.unknown_task(f"finetune.tasks[{i}]", task)
            if self.tasks[task].max_len > self.model.max_positions and self.model.position not in ("alibi", "t5"):
                raise ParamsError(f"tasks.{task}.max_len: {self.tasks[task].max_len} is above model.max_positions "
                                  f"({self.model.max_positions}); lower it")
        # per-task settings may name tasks that are not selected (so that selecting another task is one
        # -S flag), but not tasks that do not exist: those are typos
        named = {f"finetune.{name}": getattr(self.finetune, name) for name in ("max_train_examples", "max_eval_examples")}
        for key, per in {**named, "distill.unlabeled": self.distill.unlabeled}.items():
            for task in per if isinstance(per, dict) else {}:
                if task not in self.tasks:
                    raise self.unknown_task(f"{key}.{task}", task)
        self.check_transfer()
        if self.distill.tasks is None:  # the stages and the tracked params see the list it stands for
            self.distill.tasks = [task for task in self.finetune.tasks if self.tasks[task].transfer_from is None]
        for i, task in enumerate(self.distill.tasks):
            if task not in self.finetune.tasks:
                raise ParamsError(f"distill.tasks[{i}]: '{task}' is not in finetune.tasks ({self.finetune.tasks}); "
                                  "a student needs its task's finetuned teacher")
            if self.tasks[task].transfer_from is not None:
                raise ParamsError(f"distill.tasks[{i}]: '{task}' is a transfer task (tasks.{task}.transfer_from: "
                                  f"{self.tasks[task].transfer_from}), which has no teacher of its own; remove it")
        for task, prompt in self.evaluate.zero_shot.items():
            if task not in self.tasks:
                raise ParamsError(f"evaluate.zero_shot.{task}: '{task}' is not a task in `tasks`")
            names = self.tasks[task].label_names
            if names is not None and len(names) != len(prompt.label_words):
                raise ParamsError(f"evaluate.zero_shot.{task}.label_words: {len(prompt.label_words)} words for "
                                  f"{len(names)} labels ({names})")


def per_task(limit: int | dict[str, int] | None, task: str) -> int | None:
    """A limit given as one number for every task or as {task: number} (a task left out: None), for `task`."""
    return limit.get(task) if isinstance(limit, dict) else limit


def at_least_one(section: Any, key: str, *names: str) -> None:
    """The named integer fields of `section` must be >= 1."""
    for name in names:
        if getattr(section, name) < 1:
            raise ParamsError(f"{key}.{name}: {getattr(section, name)} must be >= 1")


def at_least_one_or_null(section: Any, key: str, *names: str) -> None:
    """The named optional integer fields of `section` (a limit; null = no limit) must be >= 1 when set."""
    for name in names:
        value = getattr(section, name)
        if value is not None and value < 1:
            raise ParamsError(f"{key}.{name}: {value} must be >= 1 (or null for all)")


def check_ulmfit_lr(section: Any, key: str) -> None:
    """The STLR and discriminative-LR fields shared by TrainConfig and UlmfitConfig."""
    if not 0.0 < section.cut_frac < 1.0 or section.stlr_ratio < 1.0:
        raise ParamsError(f"{key}.cut_frac/stlr_ratio: need 0 < cut_frac < 1 and stlr_ratio >= 1")
    if section.lr_decay < 1.0:
        raise ParamsError(f"{key}.lr_decay: {section.lr_decay} must be >= 1 (1 = one LR for all layers)")


def check_folder_name(name: str, section: str, what: str) -> None:
    """Stages join the names of tasks and parallel corpora into paths (models/finetune/<task>,
    data/clean/parallel/<name>): a name like ../../x would write outside the project."""
    if not FOLDER_NAME.fullmatch(name) or ".." in name:
        raise ParamsError(f"{section}.{repr(name)[1:-1]}: not a usable {what} name (it names output folders and files); "
                          "use letters, digits, '_', '-' and '.', starting with a letter, digit or '_', without '..'")


def check_source(source: str, key: str) -> None:
    """The form of a source; the `data` stage reads it (a local path from the project root) and says
    in one line what is wrong with one it cannot read."""
    if not source.strip():
        raise ParamsError(f"{key}: empty; name a local file or folder of {'/'.join(LOCAL_SUFFIXES)} files, "
                          "or a hub dataset as hf:<org>/<name>[/<config>][@<revision>]")
    if source.startswith(HUB_PREFIX) and not source[len(HUB_PREFIX):].partition("@")[0].strip("/"):
        raise ParamsError(f"{key}: '{source}' names no dataset; write hf:<org>/<name>[/<config>][@<revision>]")


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key set twice in one mapping. PyYAML alone keeps the last value,
    while DVC (ruamel.yaml) refuses the file: a stage run by hand would otherwise run on params that
    `dvc repro` does not accept."""

    def construct_document(self, node: yaml.Node) -> Any:
        _refuse_duplicate_keys(node, "", set())
        return super().construct_document(node)


def _refuse_duplicate_keys(node: yaml.Node, key: str, walked: set[int]) -> None:
    if id(node) in walked:  # an alias of a node already walked (and so no endless walk of a recursive one)
        return
    walked.add(id(node))
    if isinstance(node, yaml.MappingNode):
        lines: dict[tuple[str, str], int] = {}
        for name, value in node.value:
            dotted, line = _join(key, str(name.value)), name.start_mark.line + 1
            # `<<` merges an anchored mapping, whose keys the mapping may set again: that is an override
            if isinstance(name, yaml.ScalarNode) and name.tag != "tag:yaml.org,2002:merge":
                if (name.tag, name.value) in lines:
                    raise ParamsError(f"{name.start_mark.name} line {line}: {dotted} is set twice "
                                      f"(lines {lines[name.tag, name.value]} and {line}); keep one")
                lines[name.tag, name.value] = line
            _refuse_duplicate_keys(value, dotted, walked)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicate_keys(item, f"{key}[{i}]", walked)


def read_yaml(path: str | Path) -> Any:
    """The YAML file `path`, read with UniqueKeyLoader: a key set twice is a ParamsError naming the file,
    the line and the dotted key."""
    with Path(path).open(encoding="utf-8") as f:
        return yaml.load(f, UniqueKeyLoader)


def load_params(path: str | Path = "params.yaml", checks: Sequence[Callable[[Params], None]] = (),
                committed: dict[str, Any] | None = None) -> Params:
    """The params of `path`, built and validated section by section, then by `checks`: what the registries
    a stage uses know of the names params choose (lib.tasks.check_tasks, lib.objectives.check_objective).
    With `committed`, the file as the run's baseline commit has it, a value changed since then where the
    recipe sets the key is refused (check_recipe_keeps). Every error is a ParamsError of one line naming
    the file and the key."""
    path = Path(path)
    try:
        raw = read_yaml(path)
    except FileNotFoundError:
        raise ParamsError(f"{path}: not found; run from the project root or pass --params") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ParamsError(f"{path}:{where}: not valid YAML ({getattr(err, 'problem', err)})") from None
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: expected a mapping of sections at the top level")
    try:
        if committed is not None:
            check_recipe_keeps(raw, committed)
        raw, recipe_file = apply_recipe(raw)
    except ParamsError as err:
        raise ParamsError(f"{path}: {err}") from None
    where = f"{path} with {recipe_file}" if recipe_file else str(path)
    try:
        params = build(Params, raw, "")
        for check in checks:
            check(params)
    except ParamsError as err:
        raise ParamsError(f"{where}: {err}") from None
    return params


def recipe_names() -> list[str]:
    return sorted(p.stem for p in RECIPES.glob("*.yaml"))


def read_recipe(name: Any) -> tuple[dict[str, Any], Path]:
    """The keys recipe `name` sets (a nested mapping, as in params.yaml) and its file."""
    names = recipe_names()
    if not isinstance(name, str):
        raise ParamsError(f"recipe: expected a recipe's name ({', '.join(names)}), got {_describe(name)}")
    check_choice(name, names, "recipe")
    file = RECIPES / f"{name}.yaml"
    try:
        keys = read_yaml(file) or {}
    except yaml.YAMLError as err:
        raise ParamsError(f"recipe: {file} is not valid YAML ({getattr(err, 'problem', err)})") from None
    if not isinstance(keys, dict) or "recipe" in keys:
        raise ParamsError(f"recipe: {file} must be a mapping of params.yaml's keys, without `recipe`")
    return keys, file


def apply_recipe(raw: dict[str, Any]) -> tuple[dict[str, Any], Path | None]:
    """params.yaml's mapping with its recipe's keys in place, and the recipe's file (None when it sets
    nothing). A recipe's key replaces params.yaml's: mappings merge key by key, anything else (lists,
    numbers, null) is replaced whole. So a key a recipe sets is changed in the recipe, not in params.yaml."""
    keys, file = read_recipe(raw.get("recipe", Params.recipe))
    return (_merged(raw, keys), file) if keys else (raw, None)


def recipe_keys(name: str) -> list[str]:
    """The dotted keys recipe `name` sets."""
    return sorted(flatten(read_recipe(name)[0]))


def recipe_changes(raw: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{dotted key: (params.yaml's value, the recipe's)} for each key whose value params.yaml's recipe
    changes; params.yaml's value is NOT_SET where the file lacks the key."""
    current = flatten(raw)
    return {key: (current.get(key, NOT_SET), value) for key, value in flatten(read_recipe(
        raw.get("recipe", Params.recipe))[0]).items() if current.get(key, NOT_SET) != value}


def check_recipe_keeps(raw: dict[str, Any], committed: dict[str, Any]) -> None:
    """Refuse a value of params.yaml that differs from `committed` (the file as the run's baseline commit
    has it: what `dvc exp run -S` or a hand edit changed) where the recipe sets the key: the recipe's value
    would replace it unseen, while `dvc exp show` records the value asked for."""
    before = flatten(committed)
    asked = {key: values for key, values in recipe_changes(raw).items() if values[0] != before.get(key, NOT_SET)}
    if asked:
        name = raw.get("recipe", Params.recipe)
        said = ", ".join(f"{key}={_shown(mine)} (the recipe: {_shown(theirs)})" for key, (mine, theirs) in asked.items())
        settings = " ".join(f"-S lib/config/recipes/{name}.yaml:{key}={_shown(mine)}" for key, (mine, _) in asked.items())
        raise ParamsError(f"recipe: this run changes {said}, which recipe {name} sets, and a recipe's keys replace "
                          f"params.yaml's; change them in the recipe's file instead: dvc exp run {settings}")


def recipe_line(raw: dict[str, Any], path: str | Path) -> str | None:
    """What params.yaml's recipe changes, in one line for a stage to print (None where it changes nothing)."""
    changes = recipe_changes(raw)
    if not changes:
        return None
    name = raw.get("recipe", Params.recipe)
    said = ", ".join(f"{key}={_shown(theirs)}" + ("" if mine is NOT_SET else f" (not {_shown(mine)})")
                     for key, (mine, theirs) in changes.items())
    return f"recipe {name} (lib/config/recipes/{name}.yaml) sets over {path}: {said}"


def _shown(value: Any) -> str:
    """A value as `-S` and params.yaml write it: YAML's flow style on one line."""
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("\n...").strip()


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        both_mappings = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = _merged(merged[key], value) if both_mappings else value
    return merged


def build(cls: type, data: Any, key: str) -> Any:
    """Build dataclass `cls` from a dict, checking keys and types, then run its validate(key)."""
    where = key or "top level"
    if not isinstance(data, dict):
        raise ParamsError(f"{where}: expected a mapping, got {_describe(data)}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    for name in data:
        if name not in known:
            close = difflib.get_close_matches(str(name), known, n=1)
            hint = f"; did you mean '{_join(key, close[0])}'?" if close else f"; valid keys: {', '.join(known)}"
            raise ParamsError(f"{_join(key, str(name))}: unknown key{hint}")
    values = {}
    for name, f in known.items():
        if name in data:
            values[name] = _coerce(data[name], hints[name], _join(key, name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ParamsError(f"{_join(key, name)}: required key is missing")
    obj = cls(**values)
    if hasattr(obj, "validate"):
        obj.validate(key)
    return obj


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        errors = []
        for option in options:
            try:
                return _coerce(value, option, key)
            except ParamsError as err:
                errors.append(err)
        raise errors[0]
    if origin is Literal:
        check_choice(value, args, key)
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ParamsError(f"{key}: expected a list, got {_describe(value)}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ParamsError(f"{key}: expected a mapping, got {_describe(value)}")
        return {str(k): _coerce(v, args[1], _join(key, str(k))) for k, v in value.items()}
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key)
    if tp is bool:
        if not isinstance(value, bool):
            raise ParamsError(f"{key}: expected true or false, got {_describe(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParamsError(f"{key}: expected an integer, got {_describe(value)}")
        return value
    if tp is float:
        if isinstance(value, str) and YAML12_FLOAT.fullmatch(value):
            return float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ParamsError(f"{key}: expected a number, got {_describe(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ParamsError(f"{key}: expected a string, got {_describe(value)}")
        return value
    raise TypeError(f"params type {tp} of {key} is not supported")  # a bug in this file, not user input


def check_choice(value: Any, choices: Iterable, key: str) -> None:
    """Raise ParamsError naming `key` unless `value` is one of `choices`, with the closest one suggested."""
    if value not in choices:
        names = [str(c) for c in choices]
        close = difflib.get_close_matches(str(value), names, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ParamsError(f"{key}: '{value}' is not one of {', '.join(names)}{hint}")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    text = repr(value)
    return f"{type(value).__name__} {text[:40] + '...' if len(text) > 40 else text}"


def stage_params(params: Params, stage: str) -> dict[str, Any]:
    """{dotted key: value} of the params `stage` lists in dvc.yaml: what DVC reruns the stage for, and
    so what its resume fingerprint and its MLflow run record, from that one list. dvc.yaml is the one
    of the project the stage runs in (the working directory or a parent)."""
    here = Path.cwd().resolve()
    path = next((p / "dvc.yaml" for p in (here, *here.parents) if (p / "dvc.yaml").is_file()), None)
    if path is None:
        raise ParamsError(f"dvc.yaml: not found in {here} or above; run the stage from the project root")
    stages = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("stages", {})
    if stage not in stages:
        raise ParamsError(f"{path}: no stage '{stage}'; the stage scripts and dvc.yaml are out of step")
    values = {}
    for key in stages[stage].get("params", []):
        value: Any = params
        for part in key.split("."):
            value = value[part] if isinstance(value, dict) else getattr(value, part)
        values[key] = value
    return values


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Dataclasses/dicts -> {'clean.near_dedup.num_perm': 128, ...}, for tracking."""
    if dataclasses.is_dataclass(obj):
        obj = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(flatten(v, _join(prefix, str(k))))
        return out
    return {prefix: obj}

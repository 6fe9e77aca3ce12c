"""Sequence to sequence: text in, text out, the task type of T5 and BART (translation, summarization,
generative QA), on a pretrained encoder-decoder (objective t5 or bart, or init from a T5 or BART).

- Rows: the source is `text_field`'s text (with `text_pair_field`, "<field>: <text> <field>: <text>", T5's
  "question: ... context: ..."), after `prefix` (T5's task prefix) where one is set. The target is
  `label_field`'s: a text; SQuAD's answers {text: [...], ...} (trained on the first, scored against
  all); or a translation record {en: ..., de: ...}, of which the source reads `language` and the target
  `target_language` (both may be the one field `translation`). Rows with an empty source or target are
  skipped and counted.
- Encoding: source tokens + [eos] (T5's layout; no [bos]), at most max_len, and target tokens + [eos],
  at most max_target_len; an example cut on either side is counted as truncated. The decoder reads
  the model's decoder start token and then the target shifted right (teacher forcing), and the loss is
  the cross-entropy over the target tokens, averaged over them (`units`: an example weighs its tokens).
- Predictions are generated (lib.models.generation), greedy or beam search as the task's num_beams and
  length_penalty say, at most as many tokens as the longest target in training (eos included, within
  max_target_len), not a fixed number: a model that was never shown a longer target has nothing
  longer to write, and a fixed 20 is what silently cut transformers' outputs for years. A generation
  that stops at that limit without eos is counted (`unfinished`), beside the scores.
- Scores (lib.metrics.generation): sacreBLEU and chrF with their signatures, ROUGE, and SQuAD's exact
  match and F1 on generated answers, the decoding settings written next to them.
"""
from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from lib.config.errors import UserError
from lib.config.params import EvaluateConfig, FinetuneConfig, TaskConfig
from lib.core.io import write_json
from lib.data.encoding import pad_rows
from lib.data.tokenizer import saved_special_ids
from lib.metrics.generation import GENERATION_METRICS, ROUGE_TYPES, copy_source, generation_scores, lead
from lib.models.architectures import EncoderDecoder, Transformer
from lib.models.config import TransformerConfig
from lib.models.folder import load_model, write_model
from lib.models.generation import Decoding, generate
from lib.models.hf import export_family
from lib.tasks.base import TaskData, TaskType, read_split
from lib.tasks.capabilities import Baselined, Distilled, Extra, Reported
from lib.tasks.model import EXPORTED, META_FILE, HeadConfig, HeadStyle

IGNORE = -100  # a label position the loss skips (padding)

# What every score of a split is read with: the decoding settings, sacreBLEU's signatures, and how
# many generations stopped at the length limit without eos
DECODING = Extra("decoding", per_split=True)
SIGNATURES = Extra("signatures", per_split=True)
UNFINISHED = Extra("unfinished", per_split=True)


@dataclass
class Pair:
    source: str  # as the encoder reads it: prefix and fields joined
    target: str  # what the decoder learns to write
    references: list[str]  # what a generation is scored against (SQuAD: every gold answer)


@dataclass
class Example:
    ids: list[int]  # the source's tokens and eos
    target: list[int]  # the target's tokens and eos


class Seq2SeqModel(nn.Module):
    """An encoder-decoder as a task model: no head, the decoder writes the target with the pretrained LM
    head. It offers what the fit loop and scoring use of lib.tasks.model.TaskModel: `backbone`, `mix`
    (none), `read_as` and `layer_groups`."""

    mix = head_cfg = None

    def __init__(self, backbone: EncoderDecoder):
        super().__init__()
        self.backbone = backbone
        self.language: int | None = None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, decoder_input_ids: torch.Tensor,
                predicted: torch.Tensor, output_hidden_states: bool = False):
        """(N, vocab) next-token logits at the `predicted` positions (B, T bool) of the decoder's input; with
        output_hidden_states, also the decoder's states (its embedding output and each layer's, (B, T, d))."""
        hidden = self.backbone(input_ids, decoder_input_ids, attention_mask=attention_mask,
                               output_hidden_states=output_hidden_states)
        if not output_hidden_states:
            return self.backbone.lm_logits(hidden[predicted])
        hidden, states = hidden
        return self.backbone.lm_logits(hidden[predicted]), states[-(self.backbone.cfg.decoder_layers + 1):]

    def read_as(self, language: str | None) -> str | None:
        """An encoder-decoder has no language embeddings (lib.models.architectures.encoder_decoder): every
        text reads the same tokens."""
        return None

    def layer_groups(self, with_lm_head: bool = False) -> list[list[nn.Parameter]]:
        """The encoder-decoder's groups, bottom to top; its LM head is tied to the token table, which the
        bottom group holds, so it trains with it (gradual unfreezing reaches it last)."""
        return self.backbone.layer_groups()


def read_rows(rows: Sequence[dict[str, Any]], cfg: TaskConfig, key: str) -> tuple[list[Pair], Counter]:
    """(pairs, skipped rows by reason "empty_source", "empty_target") of rows {source, target[, context]}."""
    pairs, skipped = [], Counter()
    for row in rows:
        source = _text(row["source"], cfg.language, f"{key}.language", cfg.text_field)
        if cfg.text_pair_field is not None:
            context = _text(row["context"], cfg.language, f"{key}.language", cfg.text_pair_field)
            source = f"{cfg.text_field}: {source} {cfg.text_pair_field}: {context}" if source and context else ""
        references = _references(row["target"], cfg, key)
        if not source.strip():
            skipped["empty_source"] += 1
        elif not references:
            skipped["empty_target"] += 1
        else:
            pairs.append(Pair((cfg.prefix or "") + source, references[0], references))
    return pairs, skipped


def _text(value: Any, language: str | None, language_key: str, field: str) -> str:
    """A field's text: the value itself, or a translation record's text in `language`."""
    if isinstance(value, dict):
        if language is None or language not in value:
            raise UserError(f"{language_key}: field '{field}' holds records of languages {', '.join(map(str, value))}; "
                            f"name the one to read" + (f" ({language} is not one)" if language else ""))
        value = value[language]
    if value is None:
        return ""
    if not isinstance(value, str):
        raise UserError(f"{language_key.rsplit('.', 1)[0]}: field '{field}' holds {type(value).__name__} values, "
                        "not text; name a text field")
    return value


def _references(value: Any, cfg: TaskConfig, key: str) -> list[str]:
    """The target's texts, non-empty ones only: SQuAD's answers' texts, a translation record's text in
    target_language, a class index's word in label_names (text-to-text classification; GLUE's -1 of an
    unlabeled row has none), or the text."""
    if isinstance(value, dict) and isinstance(value.get("text"), list):
        return [t for t in value["text"] if isinstance(t, str) and t.strip()]
    if isinstance(value, int) and not isinstance(value, bool):
        if cfg.label_names is None:
            raise UserError(f"{key}.label_names: field '{cfg.label_field}' holds class indices; name the word "
                            "each is written as, e.g. label_names: [negative, positive]")
        if value >= len(cfg.label_names):
            raise UserError(f"{key}.label_names: {cfg.label_names} has no word for class {value} of field "
                            f"'{cfg.label_field}'; name one per class")
        return [cfg.label_names[value]] if value >= 0 else []
    text = _text(value, cfg.target_language, f"{key}.target_language", cfg.label_field)
    return [text] if text.strip() else []


def encode(pairs: Sequence[Pair], tokenizer, eos: int, max_len: int, max_target_len: int) -> tuple[list[Example], int]:
    """(examples, how many had their source or target cut)."""
    sources = tokenizer.encode_batch([p.source for p in pairs], add_special_tokens=False) if pairs else []
    targets = tokenizer.encode_batch([p.target for p in pairs], add_special_tokens=False) if pairs else []
    examples, cut = [], 0
    for source, target in zip(sources, targets):
        cut += len(source.ids) > max_len - 1 or len(target.ids) > max_target_len - 1
        examples.append(Example([*source.ids[:max_len - 1], eos], [*target.ids[:max_target_len - 1], eos]))
    return examples, cut


def collate(examples: Sequence[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask (bool) padded to the longest source; labels (the targets, IGNORE where
    padded) to the longest target."""
    input_ids, attention_mask = pad_rows([torch.tensor(e.ids) for e in examples], pad_id)
    labels, _ = pad_rows([torch.tensor(e.target) for e in examples], IGNORE)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def decoder_inputs(labels: torch.Tensor, start: int) -> torch.Tensor:
    """The decoder's input under teacher forcing: `start`, then the labels shifted right. Where a target
    is padded any token will do (`start` here): the padding is after the target's end, where no
    prediction is read and the decoder's causal attention keeps it from every earlier position."""
    shifted = labels[:, :-1].masked_fill(labels[:, :-1] == IGNORE, start)
    return torch.cat([shifted.new_full((len(labels), 1), start), shifted], dim=1)


def max_new_tokens(task: TaskData) -> int:
    """The most tokens a generation writes: the longest target in training, eos included (each is
    within max_target_len), or max_target_len where the task has no train examples at hand."""
    if task.train:
        return max(len(e.target) for e in task.train)
    return task.info["max_target_len"]


def decoding(task: TaskData, tokens: int) -> Decoding:
    """The task's decoding (its num_beams and length_penalty) of at most `tokens` new tokens."""
    return Decoding(num_beams=task.info["num_beams"], length_penalty=task.info["length_penalty"],
                    max_new_tokens=tokens)


class Seq2Seq(Distilled, Baselined, Reported, TaskType):
    """Generation on an encoder-decoder; see the module docstring."""

    name = "seq2seq"
    metrics = GENERATION_METRICS
    default_metrics = ("bleu", "chrf")
    named_labels = True  # label_names: the words an integer label is written as (text-to-text classification)
    headless = True
    generates = True
    baseline = "copy_source"
    baseline_label = "copying the source (a summary: its first 3 sentences)"
    baseline_fits = False
    field_kinds = {"text_field": "texts", "text_pair_field": "texts", "label_field": "texts"}
    timed = ("one source of {seq_len} tokens per call, the decoder writing as many tokens as the mean training "
             "target, not stopping at eos (throughput: sources per second)")
    kept_extras = (DECODING, SIGNATURES, UNFINISHED)

    def read(self, cfg: TaskConfig, split: str, key: str, train: list | None) -> tuple[list[Pair], dict[str, int]]:
        fields = {"source": "text_field", "target": "label_field",
                  **({"context": "text_pair_field"} if cfg.text_pair_field else {})}
        undecodable = Counter()
        pairs, skipped = read_rows(list(read_split(cfg, split, key, fields, undecodable)), cfg, key)
        return pairs, {**undecodable, **skipped}

    def hash_text(self, item: Pair) -> str:
        return item.source

    def prepare(self, cfg: TaskConfig, train: list[Pair], key: str) -> tuple[list[str], dict[str, Any]]:
        return [], {"prefix": cfg.prefix, "max_target_len": cfg.max_target_len,
                    "num_beams": cfg.num_beams, "length_penalty": cfg.length_penalty}

    def encode(self, items, cfg, tokenizer, special, label_names, info, key, causal=False) -> tuple[list[Example], int]:
        return encode(items, tokenizer, special["eos"], cfg.max_len, cfg.max_target_len)

    def unlabeled(self, skipped: dict[str, int]) -> bool:
        return False  # a split without targets is an error here, not an unlabeled test split

    # model --------------------------------------------------------------------------------------
    def backbone(self, model: Transformer | EncoderDecoder, key: str) -> EncoderDecoder:
        if not isinstance(model, EncoderDecoder):
            raise UserError(f"{key}.type: a seq2seq task needs an encoder-decoder, and the model is a "
                            f"{'causal' if model.cfg.causal else 'bidirectional'} {type(model).__name__}; pretrain "
                            "with objective t5 or bart, or start from a T5 or BART (init)")
        return model

    def head(self, style: HeadStyle, backbone: TransformerConfig, n_outputs: int, cfg: FinetuneConfig) -> HeadConfig:
        """None is trained: the decoder writes with the pretrained LM head, whatever head a variant asks for."""
        return HeadConfig(n_outputs, "tokens", block=False, dropout=0.0)

    def build_model(self, backbone: EncoderDecoder, head: HeadConfig) -> Seq2SeqModel:
        return Seq2SeqModel(backbone)

    def read_model(self, folder: Path, info: dict[str, Any]) -> Seq2SeqModel:
        return Seq2SeqModel(load_model(folder))

    def write_model(self, model: Seq2SeqModel, folder: Path, meta: dict[str, Any]) -> str:
        """The encoder-decoder as lib.models.folder writes it (T5ForConditionalGeneration's or
        BartForConditionalGeneration's layout where transformers computes the same) and classifier.json."""
        family, why = export_family(model.backbone.cfg)
        line = f"{EXPORTED}{family.lm_classes[0]}" if family else f"lib layout only: {why}"
        write_model(model.backbone, folder, saved_special_ids(folder))
        write_json(folder / META_FILE, {**meta, "transformers": line})
        return line

    # training -----------------------------------------------------------------------------------
    def n_outputs(self, task: TaskData) -> int:
        return 0  # no head

    def collate(self, examples: Sequence[Example], pad_id: int, task: TaskData) -> dict[str, torch.Tensor]:
        return collate(examples, pad_id)

    def units(self, example: Example) -> int:
        return len(example.target)

    def forward(self, model: nn.Module, batch: dict[str, torch.Tensor], output_hidden_states: bool = False):
        """(the next-token logits at the target's tokens (N, vocab), None or (None, the decoder's states))."""
        labels = batch["labels"]
        decoder_input_ids = decoder_inputs(labels, _unwrapped(model).backbone.cfg.decoder_start)
        out = model(batch["input_ids"], batch["attention_mask"], decoder_input_ids, labels != IGNORE,
                    output_hidden_states)
        return (out[0], (None, out[1])) if output_hidden_states else (out, None)

    def loss(self, outputs: torch.Tensor, batch: dict[str, torch.Tensor], task: TaskData) -> torch.Tensor:
        labels = batch["labels"]
        return F.cross_entropy(outputs.float(), labels[labels != IGNORE])

    # distillation ------------------------------------------------------------------------------
    def kept_outputs(self, outputs: torch.Tensor, examples: list[Example], top_k: int) -> list[torch.Tensor]:
        """Per example (target tokens, 2 top_k): the teacher's top_k largest logits at each target token, then
        their token ids (as floats, exact below 2^24): word-level KD's target is the teacher's distribution
        over these, not the whole vocabulary's, which a transfer set of translations could not hold in memory
        (Tan et al. 2019 keep the top 8)."""
        values, ids = outputs.topk(min(top_k, outputs.shape[-1]), dim=-1)
        return list(torch.cat([values, ids.float()], -1).split([len(e.target) for e in examples]))

    def batch_targets(self, kept: list[torch.Tensor], length: int) -> torch.Tensor:
        return torch.cat(kept)  # the target tokens in the order the outputs hold them

    def state_mask(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return batch["labels"] != IGNORE  # the decoder's states at the target's tokens

    def soft_loss(self, student: torch.Tensor, teacher: torch.Tensor, batch: dict[str, torch.Tensor],
                  temperature: float) -> torch.Tensor:
        """Word-level KD (Kim & Rush 2016): per target token, KL(teacher_T || student_T) over the teacher's
        kept tokens (its distribution renormalised over them; the student's log-probabilities over the whole
        vocabulary), times T^2, averaged over the target tokens."""
        values, ids = teacher.chunk(2, dim=-1)
        target = F.log_softmax(values / temperature, -1)
        student = F.log_softmax(student / temperature, -1).gather(-1, ids.long())
        return (target.exp() * (target - student)).sum(-1).mean() * temperature**2

    def with_targets(self, examples: list[Example], written: list[list[int]], task: TaskData) -> list[Example]:
        """The teacher's generations, ended by eos, as the targets (cut to max_target_len as encode cuts)."""
        eos, limit = task.special["eos"], task.info["max_target_len"]
        return [Example(e.ids, [*ids[:limit - 1], eos]) for e, ids in zip(examples, written)]

    # scoring -----------------------------------------------------------------------------------
    def predict_batch(self, model: nn.Module, batch: dict[str, torch.Tensor], examples: Sequence[Example],
                      task: TaskData) -> list[list[int]]:
        return generate(_unwrapped(model).backbone, batch["input_ids"], batch["attention_mask"],
                        decoding(task, max_new_tokens(task)), eos=task.special["eos"])

    def timed_call(self, model: Seq2SeqModel, task: TaskData) -> Callable[..., object]:
        """A generation of the task's decoding of as many tokens as the mean training target, whatever the
        model writes: the same work on every call, so the time is the model's and the lengths', not its
        random source's (a random source may end at once)."""
        timed = decoding(task, self.written_tokens(task))
        return lambda input_ids, segment_ids, attention_mask: generate(model.backbone, input_ids, attention_mask,
                                                                       timed, eos=None)

    def written_tokens(self, task: TaskData) -> int:
        return round(statistics.fmean(len(e.target) for e in task.train))

    def score(self, task: TaskData, split: str, predictions: list[list[int]], metrics: list[str],
              calibration: dict[str, Any] | None = None) -> tuple[dict[str, float], dict[str, Any]]:
        hypotheses = [task.tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in predictions]
        references = [pair.references for pair in task.references[split]]
        scores, signatures = generation_scores(metrics, hypotheses, references)
        limit = max_new_tokens(task)
        return scores, {DECODING.name: dataclasses.asdict(decoding(task, limit)), SIGNATURES.name: signatures,
                        UNFINISHED.name: sum(len(p) >= limit for p in predictions)}

    def baseline_scores(self, task: TaskData, train: list[Pair], metrics: list[str],
                        settings: EvaluateConfig) -> tuple[dict[str, float], dict[str, Any]]:
        """The source itself as the output (without the task prefix), learned from nothing: what a
        translation shares with its source untranslated (names, numbers, cognates) and an answer with its
        question and paragraph. A task scored by ROUGE is a summary's, whose classic floor is its first
        three sentences (lead-3; a dialogue's first three turns), not the whole source."""
        pairs = task.references["eval"]
        prefix = task.info["prefix"] or ""
        sources = [p.source[len(prefix):] for p in pairs]
        copied = lead(sources, 3) if set(metrics) & set(ROUGE_TYPES) else copy_source(sources)
        scores, signatures = generation_scores(metrics, copied, [p.references for p in pairs])
        return scores, {SIGNATURES.name: signatures}

    def report_section(self, result: Any, row_label: Callable[[str, Any], str]) -> list[str]:
        """How each model's scores were generated, per split: the decoding, how many generations reached the
        length limit without an end token, and sacreBLEU's signatures."""
        rows, signatures = [], set()
        for split, scored in result.splits.items():
            for model, decoding in scored.extras.get(DECODING.name, {}).items():
                how = ("greedy" if decoding["num_beams"] == 1 else
                       f"{decoding['num_beams']} beams, length penalty {decoding['length_penalty']:g}")
                unfinished = scored.extras.get(UNFINISHED.name, {}).get(model, 0)
                rows.append(f"| {row_label(model, scored)} | {split} | {how} | {decoding['max_new_tokens']} | "
                            f"{unfinished} of {scored.examples} |")
            signatures |= {f"{metric}: `{signature}`" for per_model in scored.extras.get(SIGNATURES.name, {}).values()
                           for metric, signature in per_model.items()}
        if not rows:
            return []
        return ["| model | split | decoding | at most new tokens | stopped there without an end token |",
                "|---|---|---|---:|---:|", *rows, "",
                "The limit is the longest target in training: a model shown no longer target has nothing longer "
                "to write.", *([f"sacreBLEU's signatures: {'; '.join(sorted(signatures))}."] if signatures else []), ""]


def _unwrapped(model: nn.Module) -> Seq2SeqModel:
    """The Seq2SeqModel inside a data-parallel wrapper (DDP's .module), or the model itself."""
    return getattr(model, "module", model)


TYPE = Seq2Seq()

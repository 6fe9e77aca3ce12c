"""A task model on the pipeline's transformer (a sequence classifier, or per lib/tasks a
regressor, a per-token tagger or span finder, a choice scorer), and its saved form.

Features of a sequence: the final state of its [CLS] token (bidirectional models) or of its last real token
(causal models, GPT-1's "extract" position), or ULMFiT's concat pooling [that state, max-pool, mean-pool] over
the real tokens, padding excluded. Heads: ULMFiT's classifier block (norm, dropout, linear, ReLU, norm, dropout,
linear), one linear layer, or the head of transformers' sequence-classification models (`plain_head`: dense +
tanh before it, or one linear layer: without bias on a causal model's last token, with it on an XLM's first).
LayerNorm stands in for ULMFiT's BatchNorm: it does not depend on the batch, so a prediction does not change
with what it is batched with. Per-token types (tagging, span QA) put the head on every position's state instead.
With a scalar mix (ELMo's, the elmo variant) the states the features read are a learned mix of every layer's
(ScalarMix), not the last layer's.

The task types build this model (TaskType.build_model) and read it back (TaskType.read_model), so that a type
whose model is another (an encoder-decoder that generates) builds and reads its own in their place.

Saved as a folder: the backbone as lib.models.folder writes it (model.safetensors + config.json), the head,
classifier.json (head config, label names, how inputs are encoded, the task's type) and the tokenizer files,
so `load_task_model(folder)` rebuilds it in one call, through its type's `read_model`; a scalar mix is
mix.safetensors. Where the type is Exported (lib/tasks/capabilities.py) and transformers has the same backbone
and head (`task_model_family`: the plain head on a BERT, RoBERTa(-PreLayerNorm), ELECTRA, GPT-2, ESM or XLM
shape) the folder is also in transformers' layout for the task's type (the family's task model of the type's
`task_model` shape: *ForSequenceClassification, also for regression, *ForTokenClassification,
*ForQuestionAnswering, *ForMultipleChoice), the head's tensors in model.safetensors under its names; otherwise
the head is head.safetensors and classifier.json's "transformers" says why.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, processors
from torch import nn

from lib.config.errors import UserError
from lib.core.io import write_safetensors
from lib.data.tokenizer import HF_CONFIG_FILE, TOKENIZER_FILE, saved_special_ids
from lib.models.architectures import Transformer
from lib.models.config import TransformerConfig
from lib.models.families import FAMILIES
from lib.models.families.base import Family
from lib.models.folder import MODEL_FILE, load_model, load_weights, model_folder, read_config, write_model
from lib.models.hf import export_family, load_exported, read_weights
from lib.tasks.capabilities import Exported, Served

HEAD_FILE, META_FILE, MIX_FILE = "head.safetensors", "classifier.json", "mix.safetensors"
EXPORTED = "transformers: "  # how classifier.json's "transformers" line starts when the folder is a transformers one
POOLER_ACTIVATIONS = {"tanh": nn.Tanh, "gelu": nn.GELU}
# the heads a finetune variant asks a type for (TaskType.head): ULMFiT's classifier block, the head of
# transformers' model of the backbone's family, the frozen variant's linear probe
HeadStyle = Literal["block", "transformers", "probe"]


@dataclass
class HeadConfig:
    n_classes: int
    # concat pooling, the [CLS]/last token's state, or every position's state (tagging, QA spans)
    features: Literal["concat", "token", "tokens"] = "concat"
    block: bool = True  # ULMFiT's classifier block; false: one linear layer
    hidden: int = 128
    dropout: float = 0.1
    # without the block: a dense d->d layer and this activation before the linear layer (BERT's pooler,
    # RoBERTa's tanh head, ELECTRA's GELU one); None (what older classifier.json files mean): none
    pooler: Literal["tanh", "gelu"] | None = None
    bias: bool = True  # the last linear layer's bias (GPT-2's score layer has none)
    mix: bool = False  # the features read ELMo's learned scalar mix of every layer's states, not the last layer's

    def __post_init__(self):
        if self.pooler is not None and (self.block or self.pooler not in POOLER_ACTIVATIONS):
            raise ValueError(f"head pooler {self.pooler!r}: one of {', '.join(POOLER_ACTIVATIONS)}, without the block")


def plain_head(cfg: TransformerConfig, n_classes: int, dropout: float) -> HeadConfig:
    """The plain variants' head, what transformers' sequence-classification model of the backbone's
    family computes: on a causal model a linear layer without bias on the last real token (GPT-2's
    `score`); on a bidirectional one dropout, dense, tanh, dropout, linear on [CLS] (BERT's pooler and
    classifier, RoBERTa's ClassificationHead), GELU in place of tanh where the backbone is an ELECTRA, and
    no dense layer where it is an XLM (its SequenceSummary: one linear layer on the first token)."""
    if cfg.causal:
        return HeadConfig(n_classes, "token", block=False, dropout=dropout, bias=False)
    family = export_family(cfg)[0]
    return HeadConfig(n_classes, "token", block=False, dropout=dropout,
                      pooler=(family or Family).head_activation)  # a backbone of no family: the default, tanh


class ScalarMix(nn.Module):
    """ELMo's eq. 1: gamma * sum_j softmax(s)_j * h_j over the states h_0 (the embedding output) .. h_L
    (each layer's output), s and gamma learned per task; s starts at 0, the mean of the layers.

    Each state is layer-normalised (without a learned scale) before the mix, the option Peters et al.
    give for layers of different scales: a pre-LN stack's residual stream grows with depth, so
    unnormalised, a layer's weight would say as much about its scale as about its use, and the weights
    reported per task would not compare. (ULMFiT's block, the head after the mix, starts with a
    LayerNorm, which undoes gamma: gamma is kept, as eq. 1 has it, for heads that do not.)"""

    def __init__(self, n_states: int):
        super().__init__()
        self.scalars = nn.Parameter(torch.zeros(n_states))
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, states: list[torch.Tensor]) -> torch.Tensor:
        normed = torch.stack([F.layer_norm(h, h.shape[-1:]) for h in states])
        return self.gamma * torch.einsum("l,l...->...", self.scalars.softmax(0), normed)

    def learned(self) -> dict[str, Any]:
        """What the report shows: the layers' weights softmax(s), bottom (embeddings) to top, and gamma."""
        return {"layer_weights": self.scalars.softmax(0).tolist(), "gamma": self.gamma.item()}


def language_row(cfg: TransformerConfig, language: str | None) -> tuple[int | None, str | None]:
    """(the row of the backbone's language embeddings (XLM's) that text in `language` reads, a note where
    that is not its own): its language's row, the first language's where `language` is null or not
    among cfg.languages (the note then says so). (None, None) for a backbone without languages."""
    if not cfg.languages:
        return None, None
    if language is None or language in cfg.languages:
        return cfg.languages.index(language) if language else 0, None
    return 0, (f"language_embedding: {cfg.languages[0]} (the text is {language}, which is not in model.languages "
               f"{cfg.languages}: its tokens read the first language's embedding)")


class TaskModel(nn.Module):
    """`backbone` + the head `head` describes. A tanh pooler starts from the backbone's pretrained one
    (an imported BERT's), which then moves into the head (BertForSequenceClassification's pooler).
    `language`: the row of the backbone's language embeddings every input token reads (language_row;
    None: the backbone's default, its first language), set for the task a model trains on or is scored on."""

    def __init__(self, backbone: Transformer, head: HeadConfig):
        super().__init__()
        self.backbone, self.head_cfg = backbone, head
        self.language: int | None = None
        d = backbone.cfg.d_model * (3 if head.features == "concat" else 1)
        if head.block:
            self.head = nn.Sequential(nn.LayerNorm(d), nn.Dropout(head.dropout), nn.Linear(d, head.hidden), nn.ReLU(),
                                      nn.LayerNorm(head.hidden), nn.Dropout(head.dropout),
                                      nn.Linear(head.hidden, head.n_classes, bias=head.bias))
        elif head.pooler is not None:
            self.head = nn.Sequential(nn.Dropout(head.dropout), nn.Linear(d, d), POOLER_ACTIVATIONS[head.pooler](),
                                      nn.Dropout(head.dropout), nn.Linear(d, head.n_classes, bias=head.bias))
        else:
            self.head = nn.Sequential(nn.Dropout(head.dropout), nn.Linear(d, head.n_classes, bias=head.bias))
        self.mix = ScalarMix(backbone.cfg.n_layers + 1) if head.mix else None
        if head.pooler == "tanh" and backbone.pooler is not None and head.features == "token":
            self.head[1].load_state_dict(backbone.pooler.dense.state_dict())
            backbone.pooler, backbone.cfg = None, dataclasses.replace(backbone.cfg, pooler=False)

    def encode(self, input_ids: torch.Tensor, segment_ids: torch.Tensor, attention_mask: torch.Tensor,
               output_hidden_states: bool = False):
        """(B, T, d_model) final hidden states, or with a scalar mix the mix of every layer's; with
        output_hidden_states also every layer's (see Transformer)."""
        segments = segment_ids if self.backbone.cfg.segment_vocab else None
        languages = None if self.language is None else torch.full_like(input_ids, self.language)
        if self.mix is None:
            return self.backbone(input_ids, segments, attention_mask, output_hidden_states=output_hidden_states,
                                 language_ids=languages)
        _, states = self.backbone(input_ids, segments, attention_mask, output_hidden_states=True,
                                  language_ids=languages)
        mixed = self.mix(states)
        return (mixed, states) if output_hidden_states else mixed

    def read_as(self, language: str | None) -> str | None:
        """Read every input as text in `language` (language_row); returns the note where its tokens read
        another language's embedding."""
        self.language, note = language_row(self.backbone.cfg, language)
        return note

    def token_state(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, d) the state that sums up a sequence: [CLS]'s, or for a causal model the last real token's,
        the only one that has seen the whole sequence."""
        if self.backbone.cfg.causal:
            return hidden[torch.arange(len(hidden), device=hidden.device), attention_mask.sum(1) - 1]
        return hidden[:, 0]

    def features(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, F) sequence features from hidden states, padding excluded; (B, T, d) for "tokens"."""
        if self.head_cfg.features == "tokens":
            return hidden
        token = self.token_state(hidden, attention_mask)
        if self.head_cfg.features == "token":
            return token
        mask = attention_mask[..., None]
        max_pool = hidden.masked_fill(~mask, float("-inf")).amax(1)
        mean_pool = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
        return torch.cat([token, max_pool, mean_pool], dim=-1)

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor, attention_mask: torch.Tensor,
                output_hidden_states: bool = False) -> tuple[torch.Tensor, Any]:
        """(logits (B, n_classes), the final hidden states (B, T, d_model)); with output_hidden_states
        (logits, (final states, every layer's)), the latter as Transformer returns them."""
        hidden = self.encode(input_ids, segment_ids, attention_mask, output_hidden_states=output_hidden_states)
        final = hidden[0] if output_hidden_states else hidden
        return self.classify(self.features(final, attention_mask)), hidden

    def classify(self, features: torch.Tensor) -> torch.Tensor:
        """The head's outputs, in fp32 even under bf16 autocast. The frozen probe's head has its features'
        standardisation folded in: weights W / std and a bias that cancels W / std · mean, which bf16's 8
        significant bits cannot carry (an IMDb probe that scored 56.7% in finetune scored 48.3% served in
        bf16). The head is a small share of the model's compute."""
        with torch.autocast(features.device.type, enabled=False):
            return self.head(features.float())

    def layer_groups(self, with_lm_head: bool = False) -> list[list[nn.Parameter]]:
        """Bottom to top: the backbone's groups, with the head (and a scalar mix) joining the top one
        (its final norm). The LM head is left out unless an auxiliary LM loss trains it."""
        groups = self.backbone.layer_groups()
        lm_head = set() if with_lm_head else {id(p) for p in self.backbone.head.parameters()}
        mix = list(self.mix.parameters()) if self.mix is not None else []
        groups[-1] = [p for p in groups[-1] if id(p) not in lm_head] + list(self.head.parameters()) + mix
        return groups


def lm_loss(backbone: Transformer, hidden: torch.Tensor, input_ids: torch.Tensor,
            attention_mask: torch.Tensor) -> torch.Tensor:
    """GPT-1's auxiliary loss while finetuning: next-token cross-entropy over the real tokens."""
    logits = backbone.lm_logits(hidden[:, :-1])
    targets = input_ids[:, 1:].masked_fill(~attention_mask[:, 1:], -100)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)


def task_model_family(model: TaskModel, special_ids: dict[str, int], kind: Exported) -> tuple[Family | None, str]:
    """(the transformers family whose model for task type `kind` computes what `model` does, "") or (None,
    why there is none)."""
    cfg, head = model.backbone.cfg, model.head_cfg
    family, why = export_family(cfg)
    if family is None:
        return None, f"the backbone has no transformers equivalent ({why})"
    if head.mix:
        return None, "ELMo's scalar mix of the layers has no transformers equivalent"
    if head.features == "concat" or head.block:
        return None, f"ULMFiT's {'concat pooling' if head.features == 'concat' else 'classifier block'} has no " \
                     "transformers equivalent"
    if kind.task_model not in family.task_models:
        return None, f"transformers has no {kind.name} model of the {family.name} family that computes this head"
    if cfg.causal and not family.causal_task_models:
        causal = "/".join(f.title for f in FAMILIES.values() if f.causal_task_models)
        return None, (f"a causal {family.name}: of transformers' task models only {causal}'s are made for causal "
                      "attention (the others' sequence heads read the first token, which then sees only itself)")
    name = family.task_models[kind.task_model].cls
    if kind.per_token:
        if head.features != "tokens" or head.pooler is not None or not head.bias:
            return None, f"{name}'s head is one linear layer with bias on every position; this head is not"
        return family, ""
    why = family.sequence_head_mismatch(head.pooler, head.bias, special_ids, name)
    return (None, why) if why else (family, "")


def head_tensor_names(model: TaskModel, family: Family, kind: Exported) -> dict[str, str]:
    """Our head's tensor names -> theirs in `family`'s model for task type `kind`."""
    task_model = family.task_models[kind.task_model]
    out = str(len(model.head) - 1)
    layers = {"1": task_model.dense, out: task_model.out} if task_model.dense else {out: task_model.out}
    names = {}
    for name in model.head.state_dict():
        layer, _, leaf = name.partition(".")
        names[name] = f"{layers[layer]}.{leaf}"
    return names


def head_export(model: TaskModel, family: Family, meta: dict[str, Any], kind: Exported) -> tuple[dict, dict]:
    """(the head's tensors under transformers' names, the config.json keys) that make write_model's
    `family` folder the model for the task's type `kind`: the class, the labels, the output layer as that
    class reads it (Exported.export_output)."""
    head = model.head.state_dict()
    tensors = {theirs: head[ours].detach().cpu().contiguous()
               for ours, theirs in head_tensor_names(model, family, kind).items()}
    task_model = family.task_models[kind.task_model]
    tensors.update(output_layer(tensors, task_model.out, kind, meta.get("info", {})))
    labels = meta.get("label_names") or [f"LABEL_{i}" for i in range(model.head_cfg.n_classes)]
    config = dict(architectures=[task_model.cls], classifier_dropout=model.head_cfg.dropout,
                  **kind.export_config(labels))
    return tensors, config


def output_layer(tensors: dict[str, torch.Tensor], name: str, kind: Exported, info: dict[str, Any],
                 inverse: bool = False) -> dict[str, torch.Tensor]:
    """The tensors of output layer `name` as transformers' model of the type reads them (Exported.export_output),
    or with `inverse` as ours does."""
    layer = {leaf: tensors[f"{name}.{leaf}"] for leaf in ("weight", "bias") if f"{name}.{leaf}" in tensors}
    return {f"{name}.{leaf}": tensor for leaf, tensor in kind.export_output(layer, info, inverse).items()}


def set_task_encoding(folder: Path, cfg: TransformerConfig, special_ids: dict[str, int], max_len: int | None) -> None:
    """The tokenizer files in `folder` set up so that transformers encodes as lib.data.encoding.encode does (texts
    within max_len): [bos] a [eos] (b [eos], segment 1) as the template, token type ids only for a model with
    segment embeddings (GPT-2 would add them as tokens), max_len as model_max_length."""
    try:  # a published model's own template (RoBERTa's <s> a </s></s> b </s>) is not the one training used
        tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
    except Exception:  # tokenizers raises bare Exceptions; a folder without a usable tokenizer is left as it is
        return
    bos, eos = (tokenizer.id_to_token(special_ids[role]) for role in ("bos", "eos"))
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} $B:1 {eos}:1",
        special_tokens=[(bos, special_ids["bos"]), (eos, special_ids["eos"])])
    tokenizer.save(str(folder / TOKENIZER_FILE))
    path = folder / HF_CONFIG_FILE
    if path.is_file():
        config = json.loads(path.read_text(encoding="utf-8"))
        segments = ["token_type_ids"] if cfg.segment_vocab else []
        config["model_input_names"] = ["input_ids", *segments, "attention_mask"]
        if max_len:
            config["model_max_length"] = max_len
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def card_facts(kind) -> dict[str, Any]:
    """What the model card (lib.serving.model_card) says of a task model of type `kind`, beside its
    classifier.json: whether lib/serving predicts raw text with it, and the transformers task model and
    hub pipeline_tag of an exported type, so the card needs no knowledge of task types."""
    exported = isinstance(kind, Exported)
    return {"served": isinstance(kind, Served), "task_model": kind.task_model if exported else None,
            "pipeline_tag": kind.pipeline_tag if exported else None}


def save_task_model(model: TaskModel, out_dir: Path, tokenizer_dir: Path, meta: dict[str, Any]) -> str:
    """out_dir/ as the task's type writes its model (TaskType.write_model: by default write_task_model), with
    the tokenizer files of `tokenizer_dir`, written whole or not at all (lib.models.folder.model_folder);
    the type's line saying in which layout."""
    from lib.tasks import saved_type  # here, as in write_task_model
    with model_folder(out_dir, tokenizer_dir) as folder:
        return saved_type(meta).write_model(model, folder, meta)


def write_task_model(model: TaskModel, folder: Path, meta: dict[str, Any]) -> str:
    """Into `folder` (a model folder being written, its tokenizer files in it): backbone, head and
    classifier.json (head config + `meta`: label names, encoding), the tokenizer set up to encode as
    training did. Where transformers has the same backbone and head (task_model_family), the folder is
    its task model of the type's shape: the head's tensors sit in model.safetensors under transformers'
    names, and its Auto class and pipeline load it; else the head is head.safetensors. Returns one line
    saying which (also classifier.json's "transformers")."""
    from lib.tasks import saved_type  # here: the registry imports the types, which build their models with this module
    special = saved_special_ids(folder)
    kind = saved_type(meta)
    family, why = (task_model_family(model, special, kind) if isinstance(kind, Exported)
                   else (None, f"transformers has no task model for a {kind.name} task"))
    line = f"{EXPORTED}{family.task_models[kind.task_model].cls}" if family else f"lib layout only: {why}"
    if family is None:
        write_model(model.backbone, folder, special)
        write_safetensors(folder / HEAD_FILE, model.head.state_dict())
        if model.mix is not None:
            write_safetensors(folder / MIX_FILE, model.mix.state_dict())
    else:
        write_model(model.backbone, folder, special, head_export(model, family, meta, kind), model.language)
    info = {"head": dataclasses.asdict(model.head_cfg), **meta, "transformers": line}
    (folder / META_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    set_task_encoding(folder, model.backbone.cfg, special, meta.get("encoding", {}).get("max_len"))
    return line


def load_task_model(model_dir: Path, device: str | torch.device = "cpu") -> tuple[nn.Module, dict[str, Any]]:
    """(the model in eval mode, the contents of classifier.json) from a folder save_task_model wrote, read by
    the type it was saved as (TaskType.read_model)."""
    from lib.tasks import saved_type  # here, as in write_task_model
    model_dir = Path(model_dir)
    try:
        info = json.loads((model_dir / META_FILE).read_text(encoding="utf-8"))
        kind = saved_type(info)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise not_a_description(model_dir, err) from None
    return kind.read_model(model_dir, info).to(device).eval(), info


def read_task_model(model_dir: Path, info: dict[str, Any], exported: Exported | None) -> TaskModel:
    """A TaskModel from a folder save_task_model wrote (`info`: its classifier.json), in lib's layout or, where
    the saved type is `exported`, in transformers' (TaskType.read_model's default)."""
    try:
        head = HeadConfig(**info["head"])
    except (ValueError, KeyError, TypeError) as err:
        raise not_a_description(model_dir, err) from None
    if (model_dir / HEAD_FILE).is_file() or exported is None \
            or not str(info.get("transformers", "")).startswith(EXPORTED):
        model = TaskModel(load_model(model_dir), head)
        load_weights(model.head, model_dir / HEAD_FILE, model_dir / META_FILE)
        if model.mix is not None:
            load_weights(model.mix, model_dir / MIX_FILE, model_dir / META_FILE)
    else:  # the head's tensors are in model.safetensors, under transformers' names: read the file once
        theirs = read_weights(model_dir)
        cfg = read_config(model_dir)
        model = TaskModel(load_exported(model_dir, cfg, theirs), head)
        names = head_tensor_names(model, export_family(cfg)[0], exported)
        missing = [t for t in names.values() if t not in theirs]
        if missing:
            raise UserError(f"{model_dir / MODEL_FILE}: no {missing[0]} (the model's head); "
                            "write the folder again with the finetune stage")
        tensors = {ours: theirs[t] for ours, t in names.items()}
        tensors.update(output_layer(tensors, str(len(model.head) - 1), exported, info.get("info", {}), inverse=True))
        model.head.load_state_dict(tensors)
    model.read_as(info.get("language"))
    return model


def not_a_description(model_dir: Path, err: Exception) -> UserError:
    """The error of a classifier.json that does not describe a saved model."""
    return UserError(f"{model_dir / META_FILE}: not a classifier description ({err!r}); "
                     "point at a folder written by the finetune stage")

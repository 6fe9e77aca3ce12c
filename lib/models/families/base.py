"""What a model family is to the pipeline: how its config.json maps onto TransformerConfig and back,
its tensor names, its transformers classes per task model, its head details, and which models of ours
it computes exactly (so that they are written in its layout). One subclass per family in this package;
lib/models/hf.py reads and writes published models from these descriptions alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lib.models.config import TransformerConfig

# transformers' hidden_act names -> ours, and back
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
EXPORTED_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new"}

# The task models a family may have, by the shape of their head, named as transformers' AutoModel classes
# end (a task type names the one it exports as)
SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION, QUESTION_ANSWERING, MULTIPLE_CHOICE = (
    "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering", "ForMultipleChoice")

# The masked-LM head's four spellings in transformers (outside the base model's prefix): dense, LayerNorm, decoder
CLS_PREDICTIONS = {"head.dense": "cls.predictions.transform.dense", "head.norm": "cls.predictions.transform.LayerNorm",
                   "head.decoder": "cls.predictions.decoder", "head.decoder.bias": "cls.predictions.bias"}
LM_HEAD = {"head.dense": "lm_head.dense", "head.norm": "lm_head.layer_norm", "head.decoder": "lm_head.decoder",
           "head.decoder.bias": "lm_head.bias"}
GENERATOR_PREDICTIONS = {"head.dense": "generator_predictions.dense", "head.norm": "generator_predictions.LayerNorm",
                         "head.decoder": "generator_lm_head", "head.decoder.bias": "generator_lm_head.bias"}
VOCAB_PROJECTOR = {"head.dense": "vocab_transform", "head.norm": "vocab_layer_norm", "head.decoder": "vocab_projector",
                   "head.decoder.bias": "vocab_projector.bias"}
MLM_HEADS = [CLS_PREDICTIONS, LM_HEAD, GENERATOR_PREDICTIONS, VOCAB_PROJECTOR]


def preferring(head: dict[str, str]) -> list[dict[str, str]]:
    """The masked-LM head spellings with `head` first: the one an export of the family writes, the others
    read too."""
    return [head, *(h for h in MLM_HEADS if h is not head)]


def activation(name: str) -> str:
    """Ours for transformers' activation `name`."""
    if name not in ACTIVATIONS:
        raise ValueError(f"activation {name} (supported: {', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name]


def head_is_table(theirs: dict[str, torch.Tensor], tables: list[str], head: str) -> bool:
    """Whether a published model's LM head `head` is its token table (one of `tables`, the first found): it
    stores no head of its own, or one of the same values."""
    table = next((theirs[name] for name in tables if name in theirs), None)
    return head not in theirs or (table is not None and torch.equal(theirs[head], table))


@dataclass(frozen=True)
class TaskClass:
    """A transformers task model of a family: its class, and where our plain head's layers sit in it."""
    cls: str
    dense: str | None  # the head's dense layer (None: it has none)
    out: str  # its output layer


@dataclass(frozen=True)
class Stack:
    """One stack of blocks of ours in a family's layout (Family.stacks): our tensor names' prefix, the blocks'
    prefix in theirs, the names of a block and of the stack's other tensors (as Family's layers, layer, top),
    its depth."""
    ours: str
    layers: str
    layer: dict[str, Any]
    top: dict[str, str]
    depth: int


class Family:
    """A model family (config.json's model_type). Tensor names: ours <- theirs, `{i}` a layer; a
    tuple of theirs is concatenated along dim 0 (q, k, v)."""

    name: str  # transformers' model_type
    title: str  # how prose names it
    base: str  # the base model's prefix in task models (BertForMaskedLM's "bert."); absent in a bare model
    layers: str = ""  # the blocks' prefix, before the layer index ("": the names place the index, `{i}`)
    layer: dict[str, Any] = {}
    top: dict[str, str] = {}  # embeddings, projection, pooler and final norm, relative to the base prefix
    heads: list[dict[str, str]]  # the LM head's spellings, outside the base prefix: the first found is read
    encoder_decoder = False  # its models are encoder-decoders (Seq2SeqConfig), and no other family's are
    # one tensor under several of its names (an encoder-decoder's token table), relative to the base prefix:
    # the first -> the others; read as one, checked equal
    aliases: dict[str, tuple[str, ...]] = {}
    conv1d = False  # Conv1D stores weights (in, out): transposed
    decoder_bias = True  # the LM decoder has a bias of its own (zeros where ours has none)
    positions_after_padding = False  # real tokens' positions are numbered from padding_idx + 1
    projects_embeddings = False  # its embeddings may be narrower than the layers, projected up (embedding_size)
    detector_head = ""  # the prefix of a replaced-token detection head in its published models ("": none)
    # transformers classes with the LM head: (bidirectional, causal); None: none
    lm_classes: tuple[str | None, str | None] = (None, None)
    task_models: dict[str, TaskClass] = {}  # by shape (SEQUENCE_CLASSIFICATION, ...)
    causal_task_models = False  # its task models are made for causal attention (read the last token)
    head_activation: str | None = "tanh"  # the sequence-classification head's dense activation; None: no dense

    def config(self, hf: dict) -> TransformerConfig:
        """The Transformer's config from the family's config.json (ValueError/KeyError where it does not map)."""
        raise NotImplementedError

    def stacks(self, cfg: TransformerConfig) -> list[Stack]:
        """Our stacks of blocks in its layout: the model itself (layers, layer, top), or an encoder-decoder's two."""
        return [Stack("", self.layers, self.layer, self.top, cfg.n_layers)]

    def weights_config(self, cfg: TransformerConfig, theirs: dict[str, torch.Tensor]) -> TransformerConfig:
        """`cfg` as a published model's tensors complete it, where its config.json does not tell."""
        return cfg

    def zero_tensors(self, cfg: TransformerConfig) -> dict[str, torch.Tensor]:
        """Tensors of its layout, outside the base prefix, that add nothing when zero and that ours lack
        (BART's final_logits_bias): exported as these zeros, imported only where they are all zeros."""
        return {}

    def covers(self, cfg: TransformerConfig) -> bool:
        """Whether models shaped like `cfg` are this family's to export (at most one family covers a config;
        mismatch then says whether it computes exactly what the model does)."""
        return False

    def mismatch(self, cfg: TransformerConfig) -> str:
        """Why this family does not compute exactly what a model of `cfg` (one it covers) does; "" when it does."""
        return ""

    def export_config(self, cfg: TransformerConfig, special_ids: dict[str, int], shift: int) -> dict:
        """The family's own config.json keys for `cfg` (`shift`: rows added before the position table)."""
        raise NotImplementedError

    def fold_for_export(self, ours: dict[str, torch.Tensor], language: int | None) -> None:
        """Rewrite our tensors (in place) into the sums the family computes, where they differ."""

    def sequence_head_mismatch(self, pooler: str | None, bias: bool, special_ids: dict[str, int], cls: str) -> str:
        """Why the plain sequence head (`pooler` activation, output `bias`) is not this family's sequence
        classifier `cls`; "" when it is."""
        if pooler != self.head_activation or not bias:
            shape = f"dense + {self.head_activation} + linear" if self.head_activation else "one linear layer"
            return f"{cls}'s head is {shape} with bias; this head is not"
        return ""

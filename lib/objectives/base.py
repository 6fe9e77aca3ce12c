"""The objective interface (see lib/objectives/__init__.py) and the registry objectives join by name."""
from __future__ import annotations

from typing import ClassVar

from torch import Tensor, nn

from lib.config.params import Params
from lib.core.errors import UserError
from lib.models.hf import ImportedModel
from lib.models.transformer import Transformer, TransformerConfig


class Objective(nn.Module):
    """Base class: a module that maps (tokens, word_starts) to (loss, metrics)."""

    name: ClassVar[str]
    causal: ClassVar[bool]
    sentence_task: ClassVar[bool] = False  # whether it learns mlm.sentence (SOP, NSP) beside its own loss
    # the knowledge units (lib/data/knowledge.py) whose start flags its batches carry as word_starts: a
    # token starts a word only where it starts a unit of each; () = the tokenizer's word starts
    units: tuple[str, ...] = ()
    # whether its batches carry each token's language (model.languages, XLM) after the word starts
    reads_languages: ClassVar[bool] = False
    # whether translation pairs (lib/data/pairs.py) follow in its batches; such an objective's cost
    # depends on them, so read_pairs() comes before flops_per_token()
    reads_pairs: ClassVar[bool] = False

    def __init__(self, params: Params, vocab_size: int, special_ids: dict[str, int],
                 arch: TransformerConfig | None = None):
        super().__init__()
        self.vocab_size = vocab_size
        self.special_ids = dict(special_ids)
        # the backbone's shape: params.yaml's model section, or a checkpoint's (init)
        self.arch = arch or TransformerConfig.from_params(params.model, vocab_size, causal=self.causal)
        if self.arch.causal != self.causal:
            raise UserError(f"objective: {self.name} needs a {'causal' if self.causal else 'bidirectional'} model; "
                            f"use {fitting_objective(self.name, self.arch)}")

    def forward(self, tokens: Tensor, word_starts: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """tokens (B, T+1) long, word_starts (B, T+1) bool -> (scalar loss, detached scalar metrics)."""
        raise NotImplementedError

    def backbone(self) -> Transformer:
        """The Transformer that later stages fine-tune."""
        raise NotImplementedError

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token of all this objective computes (what `pretrain.budget_flops`
        spends and MFU counts): by default the backbone with its LM head at every position."""
        return self.backbone().flops_per_token(seq_len)

    def start_from(self, imported: ImportedModel) -> None:
        """Take a published checkpoint's weights: its model as the backbone (an objective with parts of
        its own that a checkpoint may carry loads those too)."""
        self.backbone().load_state_dict(imported.model.state_dict())


OBJECTIVES: dict[str, type[Objective]] = {}


def register(cls: type[Objective]) -> type[Objective]:
    """Class decorator: make `cls` buildable by its `name`."""
    if cls.name in OBJECTIVES and OBJECTIVES[cls.name] is not cls:
        raise ValueError(f"objective '{cls.name}' is registered twice")
    OBJECTIVES[cls.name] = cls
    return cls


def fitting_objective(name: str, arch: TransformerConfig) -> str:
    """`name` if it trains a model shaped like `arch` (a checkpoint's), else the one that does: clm for
    a causal model, mlm for a bidirectional one (electra too keeps a bidirectional checkpoint)."""
    if OBJECTIVES[name].causal == arch.causal:
        return name
    return "clm" if arch.causal else "mlm"

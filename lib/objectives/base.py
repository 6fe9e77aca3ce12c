"""The objective interface (see lib/objectives/__init__.py) and the registry objectives join by name."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from torch import Tensor, nn

from lib.config.errors import UserError
from lib.config.params import Params
from lib.data.packed import PackedTokens
from lib.data.windows import Batch, BatchStream, Windows, WindowBatches, fixed_windows
from lib.models.architectures import Seq2SeqConfig, Transformer
from lib.models.config import TransformerConfig
from lib.models.hf import ImportedModel


@dataclass(frozen=True)
class BatchPlan:
    """What the trainer asks an objective's batches to be built from and how big they are."""

    tokens: Path  # the packed token stream: <tokens>/train and <tokens>/valid (lib/data/packed.py)
    parallel: Path  # packed translation pairs: <parallel>/train and <parallel>/valid (lib/data/pairs.py)
    seq_len: int  # positions trained per window; windows hold seq_len + 1 tokens (a causal one predicts t+1)
    batch_size: int  # windows of a training micro-batch and of a validation batch
    eval_batches: int  # the fixed validation set's batches
    seed: int  # of the training batches' draws
    batch_key: str  # the setting batch_size comes from ("<stage>.batch_size"), for share's error
    # this process's rows of every batch of n rows (its rank's share under torchrun), the setting of n named
    share: Callable[[int, str], slice]
    tokenizer: Path  # the folder of the tokenizer that encoded the tokens: what an objective reads of its vocabulary


@dataclass
class Batches:
    """An objective's batches, as it reads them."""

    train: BatchStream
    valid: list[Batch]  # the fixed validation set
    splits: list[PackedTokens]  # every packed split read, the token stream's train and valid first


def window_batches(plan: BatchPlan, units: Sequence[str] = (), languages: Sequence[str] | None = None) -> Batches:
    """Windows of seq_len + 1 tokens of the token stream with their word starts, or, with `units`
    (lib/data/knowledge.py), with the starts of those units in their place. With `languages`
    (model.languages) TaggedWindows, each token's language read from the stream (none if it is untagged)."""
    train, valid = PackedTokens(plan.tokens / "train"), PackedTokens(plan.tokens / "valid")
    window = plan.seq_len + 1
    if languages is not None and not train.languages:
        languages = []  # untagged text (no corpora.parallel): every token reads the model's first language
    rows = plan.share(plan.batch_size, plan.batch_key)
    return Batches(WindowBatches(train, window, plan.batch_size, plan.seed, name=str(plan.tokens / "train"),
                                 rows=rows, units=units, languages=languages),
                   fixed_windows(valid, window, plan.batch_size, plan.eval_batches, units=units, languages=languages),
                   [train, valid])


class Objective(nn.Module):
    """Base class: a module that maps a batch (of its type `reads`) to (loss, metrics)."""

    name: ClassVar[str]
    causal: ClassVar[bool]
    encoder_decoder: ClassVar[bool] = False  # it trains an encoder-decoder (lib/objectives/seq2seq.py)
    sentence_task: ClassVar[bool] = False  # whether it learns mlm.sentence (SOP, NSP) beside its own loss
    reads: ClassVar[type[Batch]] = Windows  # the batch forward reads, its fields named; batches() builds it

    def __init__(self, params: Params, vocab_size: int, special_ids: dict[str, int],
                 arch: TransformerConfig | None = None):
        super().__init__()
        self.vocab_size = vocab_size
        self.special_ids = dict(special_ids)
        # the backbone's shape: params.yaml's model section, or a published model's (init)
        self.arch = arch or self.model_config(params, vocab_size, self.special_ids)
        if fitting_objective(self.name, self.arch) != self.name:
            kind = ("an encoder-decoder" if self.encoder_decoder else
                    f"a {'causal' if self.causal else 'bidirectional'} model")
            raise UserError(f"objective: {self.name} needs {kind}; use {fitting_objective(self.name, self.arch)}")

    @classmethod
    def model_config(cls, params: Params, vocab_size: int, special_ids: dict[str, int]) -> TransformerConfig:
        """The shape of the model it trains from scratch: params.yaml's model section."""
        return TransformerConfig.from_params(params.model, vocab_size, causal=cls.causal)

    def batches(self, plan: BatchPlan) -> Batches:
        """Its training and validation batches, built from the packed token files: by default Windows
        (window_batches). Called before flops_per_token, which may depend on them."""
        return window_batches(plan)

    def forward(self, batch: Batch) -> tuple[Tensor, dict[str, Tensor]]:
        """A batch of its type `reads` -> (scalar loss, detached scalar metrics)."""
        raise NotImplementedError

    def backbone(self) -> Transformer:
        """The Transformer that later stages fine-tune."""
        raise NotImplementedError

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token of all this objective computes (what `pretrain.budget_flops`
        spends and MFU counts): by default the backbone with its LM head at every position."""
        return self.backbone().flops_per_token(seq_len)

    def start_from(self, imported: ImportedModel) -> None:
        """Take a published model's weights: its model as the backbone (an objective with parts of
        its own that a published model may carry loads those too)."""
        self.backbone().load_state_dict(imported.model.state_dict())


OBJECTIVES: dict[str, type[Objective]] = {}


def register(cls: type[Objective]) -> type[Objective]:
    """Class decorator: make `cls` buildable by its `name`."""
    if cls.name in OBJECTIVES and OBJECTIVES[cls.name] is not cls:
        raise ValueError(f"objective '{cls.name}' is registered twice")
    OBJECTIVES[cls.name] = cls
    return cls


def fitting_objective(name: str, arch: TransformerConfig) -> str:
    """`name` if it trains a model shaped like `arch` (a published model's), else the one that does: clm for
    a causal model, mlm for a bidirectional one (electra too keeps a bidirectional model), for an
    encoder-decoder t5 where it has T5's position bias, else bart."""
    seq2seq = isinstance(arch, Seq2SeqConfig)
    if OBJECTIVES[name].encoder_decoder == seq2seq and (seq2seq or OBJECTIVES[name].causal == arch.causal):
        return name
    if seq2seq:
        return "t5" if arch.position == "t5" else "bart"
    return "clm" if arch.causal else "mlm"

"""For the task-type tests: tokenizers (tiny ones of each algorithm lib.data.tokenizer trains, and MiniLM's
WordPiece tokenizer.json as lib.models.hf imports it, specials as role -> id), a one-thread fixture, and a
tiny backbone trained with a task type's head on one batch."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from lib.config.params import FinetuneConfig, SpecialTokens, TokenizerConfig
from lib.data.tokenizer import special_ids, train_tokenizer
from lib.models.architectures import build_model
from lib.models.config import TransformerConfig
from lib.models.hf import import_tokenizer
from lib.tasks import TYPES
from lib.tasks.base import TaskData
from lib.training.variants import VARIANTS
from tests.helpers import ROOT

MINILM = ROOT.parent / "shared" / "models" / "all-MiniLM-L6-v2"
KINDS = ["bpe", "wordpiece", "unigram", "minilm"]
WORDS = ("the a of in to was said on Monday city river king war army church people year north south Paris "
         "Normandy Rollo duchy founded settled ruled 911 1066 Viking Frankish German British lamb call "
         "boycott rejects government").split()
VOCAB_SIZES = {"bpe": 320, "wordpiece": 200, "unigram": 300}  # unigram: 256 bytes + characters + pieces


def trained(algorithm: str, folder: Path):
    """(a tokenizer of `algorithm` trained on 2,000 random sentences of WORDS, its special ids)."""
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(2000)]
    cfg = TokenizerConfig(algorithm=algorithm, vocab_size=VOCAB_SIZES[algorithm], min_frequency=1)
    tokenizer = train_tokenizer(iter(texts), cfg, folder)
    return tokenizer, special_ids(tokenizer, SpecialTokens())


def minilm():
    """(MiniLM's tokenizer without its padding and truncation, its special ids)."""
    if not MINILM.is_dir():
        pytest.skip("needs ../shared/models/all-MiniLM-L6-v2")
    tokenizer, roles, _ = import_tokenizer(MINILM, 30522)
    return tokenizer, {role: tokenizer.token_to_id(token) for role, token in roles.items()}


def tokenizer_of(kind: str, folder: Path):
    return minilm() if kind == "minilm" else trained(kind, folder)


@pytest.fixture(scope="module", params=KINDS)
def tokenizer(request, tmp_path_factory):
    """(tokenizer, special ids) of each kind in KINDS."""
    return tokenizer_of(request.param, tmp_path_factory.mktemp("tokenizer") / request.param)


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return trained("bpe", tmp_path_factory.mktemp("tokenizer") / "bpe")


def bpe_on(words: list[str], folder: Path):
    """A 400-token BPE tokenizer trained on 200 random 3-10 word sentences of `words`."""
    rng = random.Random(0)
    texts = (" ".join(rng.choice(words) for _ in range(rng.randint(3, 10))) for _ in range(200))
    return train_tokenizer(texts, TokenizerConfig(algorithm="bpe", vocab_size=400, min_frequency=1), folder)


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from threads, and two threads on a busy 2-core machine run 100x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def toy_task(task_type: str, examples: list, label_names: list[str] = (), **info) -> TaskData:
    """A TaskData of `task_type` training on `examples` (no dev or evaluation split)."""
    return TaskData(name="toy", label_names=list(label_names), train=examples, dev=[], eval=None, eval_split="",
                    skipped={}, truncated={}, type=task_type, info=info)


def fit_on_one_batch(vocab_size: int, task: TaskData, batch: dict[str, torch.Tensor], steps: int,
                     max_positions: int = 64) -> torch.Tensor:
    """A 1-layer, 32-wide encoder backbone (lib/models/architectures/) (seed 0) with the plain head of the task's type
    (the plain variant's setup, no dropout), trained by Adam for `steps` steps on the type's loss on one
    batch, through the type's forward; the last outputs."""
    torch.manual_seed(0)
    backbone = build_model(TransformerConfig(vocab_size=vocab_size, d_model=32, n_layers=1, n_heads=2, d_ff=64,
                                             dropout=0.0, max_positions=max_positions))
    kind = TYPES[task.type]
    model = VARIANTS["plain"].setup(backbone, kind.n_outputs(task), FinetuneConfig(tasks=[], head_dropout=0.0),
                                    kind).model
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        outputs, _ = kind.forward(model, batch)
        optimizer.zero_grad()
        kind.loss(outputs, batch, task).backward()
        optimizer.step()
    return outputs.detach()

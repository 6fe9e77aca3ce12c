"""Small helpers shared by the tests."""
import contextlib
import errno
import gzip
import json
import os
import tempfile
from pathlib import Path
from typing import Iterator

import torch
import yaml

from lib.data.windows import TaggedWindows

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
# the toy vocabulary of counting_rows: the special tokens, then ids 5..59 that the rows count over
TOY_SPECIAL = {"pad": 0, "unk": 1, "bos": 2, "eos": 3, "mask": 4}
TOY_VOCAB = 60


def counting_rows(rows: int = 8, length: int = 33, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, word_starts) of learnable windows: each row counts up from a random start by a step of
    1-3 over ids 5..59, with an eos at position 13; word starts on every other token. Used by the
    objectives' tests and (as counting_batch) bench/electra_context.py."""
    first = len(TOY_SPECIAL)
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, TOY_VOCAB - first, (rows, 1), generator=g)
    step = torch.randint(1, 4, (rows, 1), generator=g)
    tokens = first + (start + step * torch.arange(length)) % (TOY_VOCAB - first)
    tokens[:, 13] = TOY_SPECIAL["eos"]
    word_starts = (torch.arange(length) % 2 == 0).expand(rows, length).clone()
    word_starts |= tokens == TOY_SPECIAL["eos"]
    return tokens, word_starts


def counting_batch(rows: int = 8, length: int = 33, seed: int = 0) -> TaggedWindows:
    """counting_rows as a batch that every objective reads (TaggedWindows are Windows; no languages)."""
    return TaggedWindows(*counting_rows(rows, length, seed))


def two_sided_rows(rows: int, length: int, generator: torch.Generator, n: int = 7) -> torch.Tensor:
    """Token i is the pair (a_i, a_(i-1)) of fresh draws from n values: its left neighbour tells a_(i-1),
    its right neighbour a_i, and only both tell the token."""
    fresh = torch.randint(0, n, (rows, length + 1), generator=generator)
    return len(TOY_SPECIAL) + fresh[:, 1:] * n + fresh[:, :-1]


def write_jsonl_gz(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def write_params(path: Path, params: dict) -> Path:
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


@contextlib.contextmanager
def read_only_folder(locked: Path, monkeypatch) -> Iterator[Path]:
    """Folder `locked`, mode 0o555 while in the block. Root ignores permission bits (the suite may run
    as root, e.g. in a container): there, creating a file in it is made to fail as it would for others."""
    locked.mkdir()
    locked.chmod(0o555)
    if os.geteuid() == 0:
        create = tempfile.NamedTemporaryFile

        def denied_in_locked(*args, dir=None, **kwargs):
            if dir is not None and Path(dir) == locked:
                raise PermissionError(errno.EACCES, "Permission denied", str(locked / "tmpfile"))
            return create(*args, dir=dir, **kwargs)

        monkeypatch.setattr(tempfile, "NamedTemporaryFile", denied_in_locked)
    try:
        yield locked
    finally:
        locked.chmod(0o755)


def stub_tokenizer_dir(folder: Path) -> Path:
    """A tokenizer folder as far as saving a classifier reads it: tokenizer.json (copied along, never
    parsed) and the special token ids (ids 0..4, as the pipeline's tokenizers have them)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text("{}")
    specials = {role: {"token": f"[{role}]", "id": i} for i, role in enumerate(["pad", "unk", "bos", "eos", "mask"])}
    (folder / "tokenizer_meta.json").write_text(json.dumps({"special_tokens": specials}))
    return folder


# A tiny classifier folder on a real (tiny) tokenizer, for the tests of what reads classifier folders
# (lib.serving.predict, ONNX, transformers).
TINY_LABELS = ["negative", "neutral", "positive"]
TINY_MAX_LEN = 16
TINY_CORPUS = ["the film was good and the actors were great", "a dull plot with bad acting and a long ending",
               "I loved it", "boring, far too long", "what a wonderful story about two old friends"]
TINY_TEXTS = ["A wonderful film.", "Dull and far too long.", "", "the actors were great " * 6, "I loved it",
              "bad acting", "a long ending with good friends", "the plot"]  # one longer than TINY_MAX_LEN, one empty


def tiny_tokenizer(out_dir: Path) -> Path:
    """A 120-token WordPiece tokenizer trained on TINY_CORPUS."""
    from lib.config.params import TokenizerConfig
    from lib.data.tokenizer import train_tokenizer

    train_tokenizer(TINY_CORPUS * 4, TokenizerConfig(algorithm="wordpiece", vocab_size=120, min_frequency=1), out_dir)
    return out_dir


def save_tiny_classifier(out_dir: Path, tokenizer_dir: Path, pairs: bool = False, head=None, language: str | None = None,
                         **model) -> Path:
    """A 2-layer, 32-wide classifier over TINY_LABELS (`model`: TransformerConfig fields; `head`: a
    HeadConfig, or a function of the backbone's config that makes one; default the ULMFiT block; `language`:
    the task's, for a model with languages), its weights drawn wide enough that texts get different labels,
    saved by save_task_model."""
    import torch

    from lib.tasks.model import TaskModel, HeadConfig, save_task_model
    from lib.models.architectures import build_model
    from lib.models.config import TransformerConfig
    from lib.data.tokenizer import load_tokenizer

    torch.manual_seed(0)
    cfg = TransformerConfig(**{"vocab_size": load_tokenizer(tokenizer_dir).get_vocab_size(), "d_model": 32,
                               "n_layers": 2, "n_heads": 2, "d_ff": 64, "dropout": 0.0,
                               "max_positions": TINY_MAX_LEN, **model})
    head = head(cfg) if callable(head) else head or HeadConfig(len(TINY_LABELS), hidden=16, dropout=0.0)
    classifier = TaskModel(build_model(cfg), head)
    for weight in (p for p in classifier.parameters() if p.dim() > 1):
        torch.nn.init.normal_(weight, std=0.3)
    classifier.read_as(language)
    encoding = {"max_len": TINY_MAX_LEN, "truncation": "head_tail", "text_field": "premise" if pairs else "text",
                "text_pair_field": "hypothesis" if pairs else None}
    save_task_model(classifier, out_dir, tokenizer_dir, {"label_names": TINY_LABELS, "encoding": encoding,
                                                         "language": language})
    return out_dir


def skip_unless_cpu_bf16() -> None:
    """Skip the calling test where bf16 autocast crashes this CPU: the probe finds out in a child process
    (cached), so a crash there is not the test process's."""
    import pytest

    from lib.core import runtime

    probe = runtime.cpu_bf16_probe()
    if probe.outcome == "crash":
        pytest.skip(f"bf16 autocast crashes on this CPU (the bf16 probe's matmul died with {probe.failure})")

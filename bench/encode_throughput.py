"""Encode throughput: tokens per second of `encode_to_packed` with a byte-level BPE tokenizer.

    python bench/encode_throughput.py [--tokenizer DIR] [--docs 1000] [--repeat 3]

Without --tokenizer it first trains the default tokenizer config (byte-level BPE, vocab 16384) on the
first --train-chars characters of the Wikipedia training split. Reading and training are not timed;
the figure is encode + pack only, the best of --repeat runs (other work on the machine only slows it).
"""
from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

from lib.config.params import TokenizerConfig  # noqa: E402
from lib.core.errors import run_main  # noqa: E402
from lib.data.packed import EncodeStats, encode_to_packed  # noqa: E402
from lib.data.tokenizer import load_tokenizer, special_ids, train_tokenizer  # noqa: E402

DATA = ROOT.parent / "shared/data/wikipedia_en/train.jsonl.gz"  # ../shared/data, as in params.yaml


def read_texts(path: Path) -> Iterator[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, help="a trained tokenizer folder (default: train one)")
    parser.add_argument("--data", type=Path, default=DATA, help="JSONL(.gz) with a 'text' field")
    parser.add_argument("--docs", type=int, default=1000, help="documents to encode")
    parser.add_argument("--train-chars", type=int, default=5_000_000, help="characters to train on")
    parser.add_argument("--batch-docs", type=int, default=TokenizerConfig.batch_docs)
    parser.add_argument("--repeat", type=int, default=3, help="encode this many times, report the best")
    args = parser.parse_args()

    cfg = TokenizerConfig(train_chars=args.train_chars, batch_docs=args.batch_docs)
    with tempfile.TemporaryDirectory() as tmp:
        if args.tokenizer:
            tokenizer = load_tokenizer(args.tokenizer)
        else:
            tokenizer = train_tokenizer(read_texts(args.data), cfg, Path(tmp) / "tokenizer")
        eos_id = special_ids(tokenizer, cfg.special_tokens)["eos"]
        texts = list(itertools.islice(read_texts(args.data), args.docs))  # read once, outside the timing
        runs: list[tuple[EncodeStats, float]] = []
        for _ in range(args.repeat):
            cpu = cpu_seconds()
            stats = encode_to_packed(tokenizer, texts, Path(tmp) / "bench", tokenizer.get_vocab_size(),
                                     eos_id, cfg.batch_docs)
            runs.append((stats, cpu_seconds() - cpu))
            print(f"run {len(runs)}: {stats.tokens_per_second:,.0f} tokens/s", file=sys.stderr)
    best, cpu = min(runs, key=lambda run: run[0].seconds)
    print(f"docs {best.docs}  chars {sum(map(len, texts)):,}  tokens {best.tokens:,}  seconds {best.seconds:.3f}  "
          f"tokens/s {best.tokens_per_second:,.0f}  tokens/word {best.tokens_per_word:.3f}  unk {best.unk}  "
          f"cpu-seconds {cpu:.2f} ({cpu / best.seconds:.2f} cores busy)")


def cpu_seconds() -> float:
    """User + system CPU time of this process, all threads: with the wall time it shows how busy the
    cores were (on a shared machine other work takes them)."""
    times = os.times()
    return times.user + times.system


if __name__ == "__main__":
    run_main(main)

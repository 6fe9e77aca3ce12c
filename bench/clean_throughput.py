"""Cleaning throughput: run DocumentCleaner (default CleanConfig: near-dup and decontamination on)
over the first N documents of a corpus and print MB/s of input text.

    python bench/clean_throughput.py [N] [--source PATH] [--workers W]

Documents are read into memory first, so the timing covers the cleaner alone (pool start included).
The CPU seconds of this process and its workers are printed too: on a shared machine they tell
how much of the wall time was spent waiting for a core.
"""
from __future__ import annotations

import argparse
import gzip
import itertools
import json
import resource
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

from lib.config.params import CleanConfig  # noqa: E402
from lib.data.clean import CleanStats, DocumentCleaner, build_contamination_index  # noqa: E402

DATA = ROOT.parent / "shared/data"  # ../shared/data, as in params.yaml


def read_texts(path: Path, field: str = "text") -> Iterator[str]:
    """The `field` of every line of a gzipped JSON Lines file."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)[field]


def cpu_seconds() -> float:
    """User + system CPU time of this process and of its finished children (the pool workers)."""
    return sum(usage.ru_utime + usage.ru_stime for usage in
               (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("n", nargs="?", type=int, default=2000, help="documents to clean")
    parser.add_argument("--source", type=Path, default=DATA / "wikipedia_en/train.jsonl.gz")
    parser.add_argument("--workers", type=int, default=0, help="0 = one process per CPU core")
    args = parser.parse_args()

    cfg = replace(CleanConfig(), workers=args.workers)
    eval_texts = itertools.chain(*(read_texts(DATA / f"sst2/{split}.jsonl.gz") for split in ("validation", "test")))
    contamination = build_contamination_index(eval_texts, cfg)
    docs = list(itertools.islice(read_texts(args.source), args.n))
    chars = sum(map(len, docs))

    stats = CleanStats()
    cpu_start, start = cpu_seconds(), time.perf_counter()
    kept = sum(1 for _ in DocumentCleaner(cfg, contamination, seed=1337).run(docs, stats))
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu_start

    print(f"docs {len(docs)}  MB in {chars / 1e6:.1f}  seconds {seconds:.2f}  "
          f"MB/s {chars / 1e6 / seconds:.1f}  docs kept {kept}  cpu seconds {cpu:.2f}")
    print(json.dumps(stats.as_dict()))


if __name__ == "__main__":
    main()

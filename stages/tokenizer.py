"""Stage `tokenizer`: train a tokenizer on cleaned pretraining text, encode the corpora to packed tokens.

With `init` set, the published model's own tokenizer (its vocabulary, lowercasing and special tokens) is
taken instead of training one (lib/models/hf.py), and the corpora are encoded with it.

Before encoding, phrases and named entities are mined from the pretraining train text the tokenizer
learns from (lib/data/knowledge.py) for ERNIE's knowledge masking (mlm.knowledge).

With `corpora.parallel` (XLM), the tokenizer also learns from both sides of every parallel train split
(beyond tokenizer.train_chars: one vocabulary for every language), every token file is tagged with its
documents' languages (P.lang), the pretraining files end with the parallel corpora's distinct sentences
as documents of their language, and `parallel/<split>` holds the pairs: documents 2i and 2i + 1 are pair
i's two sides, the corpora one after another in params order. Without it `parallel/<split>` holds no
pairs: it is always there, so a stage can depend on it whatever params say.

Writes one folder, --out (data/tokens): `tokenizer/` (tokenizer.json, + spm.model for unigram),
`knowledge.json` (the mined phrases and entities with their counts) and, for each corpus and split,
`<corpus>/<split>.{bin,idx,wstart,phrase,entity,lang,json}`, replaced together, so token files
never meet another vocabulary (each records the SHA-256 of the tokenizer.json that encoded it, and
the training stages check it); a metrics JSON and a document-length plot CSV.
"""
import time
from pathlib import Path
from typing import Iterable

import numpy as np

from lib.core.errors import run_main
from lib.core.io import atomic_dir, write_csv, write_json
from lib.core.progress import Progress
from lib.core.stage import open_stage
from lib.data import knowledge
from lib.data.corpus import CORPORA, TRAIN, VALID, read_clean
from lib.data.packed import PackedTokens, encode_to_packed
from lib.data.parallel import PARALLEL, documents, pair_documents, pair_tokens
from lib.data.tokenizer import TrainingText, read_meta, saved_special_ids, tokenizer_sha256, train_tokenizer
from lib.models.hf import init_folder, save_tokenizer

TOKENIZER = "tokenizer"  # the tokenizer's folder inside --out
KNOWLEDGE = "knowledge.json"  # the mined phrases and entities inside --out


def main() -> None:
    stage = open_stage("tokenizer", __doc__, inputs={"clean": "data/clean"},
                       outputs={"out": "data/tokens", "metrics": "metrics/tokenizer.json",
                                "plots": "plots/tokenizer"})
    args, params = stage.args, stage.params
    cfg = params.tokenizer

    with stage.run() as run:
        with atomic_dir(args.out) as out:
            corpora, languages = params.corpora, params.corpora.languages()
            if params.init:
                tokenizer = save_tokenizer(init_folder(params), params.init, out / TOKENIZER)
            else:
                sides = (text for _, text in pair_documents(args.clean, corpora, TRAIN))
                tokenizer = train_tokenizer(read_clean(args.clean, "pretrain", TRAIN), cfg, out / TOKENIZER, sides)
            vocab_size, signature = tokenizer.get_vocab_size(), tokenizer_sha256(out / TOKENIZER)
            eos_id = saved_special_ids(out / TOKENIZER)["eos"]
            metrics: dict = {"vocab_size": vocab_size, "algorithm": read_meta(out / TOKENIZER)["algorithm"],
                             "init": params.init}
            units, metrics["knowledge"] = mine_knowledge(args.clean, cfg.train_chars, out / KNOWLEDGE)

            def encode(name: str, split: str, docs: Iterable, count: int) -> None:
                prefix = out / name / split
                prefix.parent.mkdir(parents=True, exist_ok=True)
                stats = encode_to_packed(tokenizer, docs, prefix, vocab_size, eos_id, cfg.batch_docs,
                                         tokenizer_sha256=signature, knowledge=units, languages=languages,
                                         progress=Progress(f"tokenizer: {name}/{split}", count, "docs"))
                metrics[f"{name}_{split}"] = summarize(stats)
                print(f"tokenizer: {name}/{split}: {stats.tokens} tokens from {stats.docs} docs "
                      f"({metrics[f'{name}_{split}']['tokens_per_s']:.0f} tokens/s)", flush=True)

            for name in (*CORPORA, PARALLEL):
                for split in (TRAIN, VALID):
                    encode(name, split, *documents(args.clean, corpora, name, split))
            if corpora.parallel:
                metrics[PARALLEL] = {split: pair_tokens(args.clean, corpora, split,
                                                        PackedTokens(out / PARALLEL / split).doc_offsets)
                                     for split in (TRAIN, VALID)}
            lengths = {c: np.diff(PackedTokens(out / c / TRAIN).doc_offsets) for c in CORPORA}
        write_json(args.metrics, metrics)
        write_length_plot(args.plots / "doc_lengths.csv", lengths)
        run.log_summary(metrics)
        run.log_artifact(args.metrics)
        run.log_artifact(args.plots, "plots")
        run.log_artifact(args.out / TOKENIZER, "tokenizer")
        run.log_artifact(args.out / KNOWLEDGE)


def mine_knowledge(clean: Path, train_chars: int | None, path: Path) -> tuple[knowledge.Knowledge, dict]:
    """ERNIE's phrases and entities, mined from the pretraining train text the tokenizer learns from
    (its first train_chars characters) and saved to `path`; with their metrics."""
    start = time.perf_counter()
    units = knowledge.mine(TrainingText(read_clean(clean, "pretrain", TRAIN), train_chars))
    units.save(path)
    metrics = {"phrases": len(units.phrases), "entities": len(units.entities),
               "mining_s": round(time.perf_counter() - start, 1)}
    print(f"tokenizer: mined {metrics['phrases']} phrases and {metrics['entities']} entities "
          f"in {metrics['mining_s']} s", flush=True)
    return units, metrics


def summarize(stats) -> dict:
    return {"docs": stats.docs, "tokens": stats.tokens, "tokens_per_word": round(stats.tokens_per_word, 4),
            "unk_rate": round(stats.unk / max(stats.tokens, 1), 6), "tokens_per_s": round(stats.tokens_per_second, 1)}


def write_length_plot(path: Path, lengths: dict[str, np.ndarray]) -> None:
    """Documents per power-of-two length bin, per corpus: what a seq_len choice cuts or pads."""
    rows = []
    for corpus, doc_lengths in lengths.items():
        bins = np.ceil(np.log2(np.maximum(doc_lengths, 1))).astype(int)
        rows += [[f"{corpus}: <= {2 ** b} tokens", int(count)] for b, count in zip(*np.unique(bins, return_counts=True))]
    write_csv(path, ["tokens_bin", "docs"], rows)


if __name__ == "__main__":
    run_main(main)

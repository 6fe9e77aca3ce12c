"""Stage `clean`: normalise, filter, deduplicate and decontaminate the LM corpora.

Reads the `pretrain` and `domain` corpora named in params.yaml (their copies in --raw, which the
`data` stage wrote) and drops documents that hold an evaluation text of a task (the splits and fields
--raw/eval_texts.json names, not params.yaml's `tasks`, so that only a change there reruns it); writes
`<out>/<corpus>/{train,valid}.jsonl.gz`, per-rule counts to the metrics JSON and a plot CSV. The pairs of
each `corpora.parallel` corpus are cleaned side by side into `<out>/parallel/<name>/{train,valid}.jsonl.gz`
(lib/data/parallel.py), decontaminated alike.
"""
import json
from pathlib import Path

from lib.core.errors import run_main
from lib.core.io import atomic_dir, write_csv, write_json
from lib.core.progress import Progress
from lib.core.stage import open_stage
from lib.data.clean import DocumentCleaner, build_contamination_index
from lib.data.corpus import CORPORA, clean_corpus, eval_texts, planned_docs
from lib.data.parallel import PARALLEL, PairCleaner, clean_parallel
from lib.data.raw import IDENTITY_FILE, localize, read_eval_text_spec


def main() -> None:
    stage = open_stage("clean", __doc__, inputs={"raw": "data/raw"},
                       outputs={"out": "data/clean", "metrics": "metrics/clean.json", "plots": "plots/clean"})
    args, params = stage.args, stage.params
    cfg = params.clean
    local = localize(params, args.raw)

    with stage.run() as run:
        contamination = None
        if cfg.decontaminate.enabled:
            # cleaned by the same rules, so an evaluation text matches its cleaned copy in a document
            contamination = build_contamination_index(eval_texts(read_eval_text_spec(args.raw), args.raw), cfg)
        metrics: dict = {}
        with atomic_dir(args.out) as out:
            for name in CORPORA:
                cleaner = DocumentCleaner(cfg, contamination, params.seed)
                corpus = getattr(local.corpora, name)
                rows = source_rows(Path(corpus.source))
                progress = Progress(f"clean: {name}", None if rows is None else planned_docs(corpus, rows), "docs")
                metrics[name] = clean_corpus(corpus, f"corpora.{name}", cleaner, out / name, progress)
                print(f"clean: {name}: {metrics[name]['docs_in']} docs in, {metrics[name]['docs_out']} kept "
                      f"({metrics[name]['mb_per_s']} MB/s)", flush=True)
            for name, corpus in local.corpora.parallel.items():
                done = clean_parallel(corpus, f"corpora.parallel.{name}", PairCleaner(cfg, contamination),
                                      out / PARALLEL / name)
                metrics.setdefault(PARALLEL, {})[name] = done
                print(f"clean: parallel {name}: {done['pairs_in']} pairs in, {done['pairs_out']} kept; dropped "
                      f"{', '.join(f'{n} {reason}' for reason, n in done['dropped'].items())}", flush=True)
        if contamination is not None:
            metrics["decontamination"] = contamination.summary()
        write_json(args.metrics, metrics)
        write_rule_plot(args.plots / "rules.csv", metrics)
        run.log_summary(metrics)
        run.log_artifact(args.metrics)
        run.log_artifact(args.plots, "plots")


def source_rows(folder: Path) -> dict[str, int] | None:
    """Rows per split of a source as the data stage wrote them into `folder` (its .source.json); None
    for a folder the data stage did not write, whose documents are then counted without a total."""
    path = folder / IDENTITY_FILE
    return json.loads(path.read_text(encoding="utf-8"))["rows"] if path.is_file() else None


def write_rule_plot(path: Path, metrics: dict) -> None:
    """One row per (corpus, rule): how many documents (of a parallel corpus: pairs) the rule rewrote or dropped."""
    corpora = {**{corpus: metrics[corpus] for corpus in CORPORA},
               **{f"{PARALLEL} {name}": done for name, done in metrics.get(PARALLEL, {}).items()}}
    write_csv(path, ["rule", "docs"], [[f"{corpus}: {kind} {rule}", count] for corpus, done in corpora.items()
                                       for kind in ("rewritten", "dropped")
                                       for rule, count in sorted(done[kind].items())])


if __name__ == "__main__":
    run_main(main)

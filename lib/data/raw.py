"""Stage `data`: every source the chain reads, read once into data/raw/<name>/, so that the stages
after it depend on content DVC tracks, not on a path outside the repository or on a hub download.

A source in params (`corpora.{pretrain,domain}.source`, `corpora.parallel.*.source`, `tasks.*.source`) is a hub id,
`hf:<org>/<name>[/<config>][@<revision>]`, or a local file or folder. Each becomes data/raw/<name>/,
one `<split>.jsonl.gz` per split (a local source: its data files, copied as they are) and
`.source.json`, the identity it was read with (hidden, so that no reader takes it for a split). The rows
come from, in this order:
- a local source: its files (a relative path is read from the project root);
- a hub id with a copy in the mirror (`data.mirror`, `<mirror>/<name>/`): that copy;
- otherwise the hub, through `datasets`, streaming, at the pinned revision.
A hub dataset whose names or values differ from ours (IMDb's split `unsupervised`, GLUE's `sentence`
fields, Wikipedia's single split, CoNLL-2003's tag ids, SQuAD's dev set that our copies split by article,
Multi30k's field per language)
is mapped in LAYOUTS, the one place for it, onto the names and values of its mirror copy, so params read
the same whichever way the rows came. A source already read with the same
identity (source, row cap, FORMAT; a local source's file contents) is not read again.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import zlib
from dataclasses import dataclass, field, replace
from operator import itemgetter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from lib.config.errors import UserError
from lib.config.params import HUB_PREFIX, Params
from lib.core.errors import describe
from lib.core.io import JsonlGzWriter, atomic_dir, atomic_file, file_sha256, project_root
from lib.data.sources import data_suffix, list_splits, local_files, parse_hub, read_records

# Bump when the rows written for an unchanged source change (a new mapping, another row format):
# data/raw/<name>/.source.json carries it, and a name read with another FORMAT is read again.
FORMAT = 1
IDENTITY_FILE = ".source.json"
EVAL_TEXTS_FILE = "eval_texts.json"  # what `clean` removes from the LM corpora (eval_text_spec)
LABEL_WITHHELD = -1  # the hub's label of a row that has none (GLUE test splits, IMDb unsupervised)
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def wikipedia_split(row: dict[str, Any]) -> str:
    """The mirror copy's rule (wikipedia_en/PROVENANCE.md): CRC32 of the decimal page id, mod 100:
    0 is test, 1 validation, the rest train. The hub publishes one split."""
    bucket = zlib.crc32(str(row["id"]).encode("utf-8")) % 100
    return {0: "test", 1: "validation"}.get(bucket, "train")


def article_split(row: dict[str, Any]) -> str:
    """The squad and squad_v2 copies' rule (their PROVENANCE.md): the official dev set split by article,
    CRC32 of the title's UTF-8 mod 5: 0 is validation, the rest train."""
    return "validation" if zlib.crc32(row["title"].encode("utf-8")) % 5 == 0 else "train"


def squad_row(row: dict[str, Any]) -> dict[str, Any]:
    """A hub SQuAD row as the copies have it: each answer starting at the first occurrence of its text in
    the context (the explorer pages they were rebuilt from carry no offsets; the official ones differ for
    about 3% of questions, scores do not: the metric compares answer text), and `is_impossible`."""
    answers = row.get("answers") or {"text": [], "answer_start": []}
    starts = [found if (found := row["context"].find(text)) >= 0 else start
              for text, start in zip(answers["text"], answers["answer_start"])]
    return {**row, "answers": {"text": list(answers["text"]), "answer_start": starts},
            "is_impossible": not answers["text"]}


# CoNLL-2003's tags on the hub are ClassLabel ids, in the orders of the `datasets` loading script
# (huggingface/datasets datasets/conll2003/conll2003.py, whose features the hub's parquet export keeps).
CONLL_POS = ('"', "''", "#", "$", "(", ")", ",", ".", ":", "``", "CC", "CD", "DT", "EX", "FW", "IN", "JJ", "JJR",
             "JJS", "LS", "MD", "NN", "NNP", "NNPS", "NNS", "NN|SYM", "PDT", "POS", "PRP", "PRP$", "RB", "RBR", "RBS",
             "RP", "SYM", "TO", "UH", "VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "WDT", "WP", "WP$", "WRB")
CONLL_CHUNK = ("O", "B-ADJP", "I-ADJP", "B-ADVP", "I-ADVP", "B-CONJP", "I-CONJP", "B-INTJ", "I-INTJ", "B-LST", "I-LST",
               "B-NP", "I-NP", "B-PP", "I-PP", "B-PRT", "I-PRT", "B-SBAR", "I-SBAR", "B-UCP", "I-UCP", "B-VP", "I-VP")
CONLL_NER = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")


def iob1(tags: list[str]) -> list[str]:
    """IOB2 tags in IOB1: B- only where the tag before is of the same type (the original files' scheme)."""
    out: list[str] = []
    for tag in tags:
        if tag.startswith("B-") and (out[-1][2:] if out else "") != tag[2:]:
            tag = "I-" + tag[2:]
        out.append(tag)
    return out


def conll_row(row: dict[str, Any]) -> dict[str, Any]:
    """A hub CoNLL-2003 row as the copy has it: tag names, not ids; NER tags IOB2 (as the hub's), chunk
    tags IOB1 (as the original files', which the copy leaves as given; the hub converted them to IOB2)."""
    return {**row, "pos_tags": [CONLL_POS[i] for i in row["pos_tags"]],
            "chunk_tags": iob1([CONLL_CHUNK[i] for i in row["chunk_tags"]]),
            "ner_tags": [CONLL_NER[i] for i in row["ner_tags"]]}


def translation_row(*languages: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A hub row holding one field per language ({"en": ..., "de": ...}) in the translation layout of the
    mirror copies ({"translation": {"en": ..., "de": ...}})."""
    return lambda row: {"translation": {code: row[code] for code in languages}}


CODAH_CATEGORIES = "irpnqo"  # the TSV's letters of the hub's ClassLabel Idioms, Reference, Polysemy, ..., Others


def codah_row(row: dict[str, Any]) -> dict[str, Any]:
    """A hub CODAH row as the copy has it: the category as the TSV's letter ('' where it has none, -1 on the hub)."""
    category = row.get("categories")
    return {**row, "categories": "" if category is None or category < 0 else CODAH_CATEGORIES[category]}


@dataclass(frozen=True)
class Layout:
    """A hub dataset in our names, those of its mirror copy (its PROVENANCE.md tells the source)."""

    name: str  # its folder in data/raw and in the mirror
    columns: tuple[str, ...]  # the fields kept, in this order; a field a row lacks is written as null
    fields: dict[str, str] = field(default_factory=dict)  # hub field -> ours
    splits: dict[str, str] = field(default_factory=dict)  # hub split -> ours
    deal: Callable[[dict[str, Any]], str] | None = None  # our split of a hub row (one hub split, several of ours)
    read: tuple[str, ...] | None = None  # the hub splits read (None: every one), where the mirror copy has not all
    convert: Callable[[dict[str, Any]], dict[str, Any]] | None = None  # a hub row's values as the copy has them
    numbered: str | None = None  # a column the hub lacks: the row's place in its split, from 0
    order: Callable[[dict[str, Any]], Any] | None = None  # sort key of the rows of each dealt split (stable)
    # hub config -> our split, for a dataset the hub publishes as a config per part (XQuAD: per language) and
    # the copy as a split per part; its source names no config, and each config's rows (every split) are read
    configs: dict[str, str] = field(default_factory=dict)

    def hub_row(self, row: dict[str, Any]) -> dict[str, Any]:
        renamed = {self.fields.get(k, k): v for k, v in row.items()}
        return self.row(self.convert(renamed) if self.convert else renamed)

    def row(self, row: dict[str, Any]) -> dict[str, Any]:
        """The columns, with a withheld label written as null (as the mirror copies leave it out)."""
        out = {column: row.get(column) for column in self.columns}
        if "label" in out and out["label"] == LABEL_WITHHELD:
            out["label"] = None
        return out

    def numbered_rows(self, rows: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """`rows` with the `numbered` column filled in, where the layout has one."""
        for n, row in enumerate(rows):
            yield {**row, self.numbered: n} if self.numbered else row


GLUE_PAIR = {"sentence1": "text_a", "sentence2": "text_b"}
SQUAD = ("id", "title", "context", "question", "answers", "is_impossible")
LAYOUTS = {  # (repo, config) -> layout; the revision is the source's own
    ("stanfordnlp/imdb", None): Layout("imdb", ("text", "label"), splits={"unsupervised": "unsup"}),
    ("nyu-mll/glue", "sst2"): Layout("sst2", ("text", "label"), fields={"sentence": "text"}),
    ("nyu-mll/glue", "cola"): Layout("cola", ("text", "label"), fields={"sentence": "text"},
                                     splits={"test": "test_unlabeled"}),
    ("nyu-mll/glue", "mrpc"): Layout("mrpc", ("text_a", "text_b", "label"), fields=GLUE_PAIR),
    ("nyu-mll/glue", "rte"): Layout("rte", ("text_a", "text_b", "label"), fields=GLUE_PAIR,
                                    splits={"test": "test_unlabeled"}),
    ("wikimedia/wikipedia", "20231101.en"): Layout("wikipedia_en", ("id", "title", "text"), deal=wikipedia_split),
    # Each task dataset's id as params name it. Its revision was not checked against the hub (no network
    # here); it is the one other public projects pin, and how sure that is says each comment.
    # hf:eriktks/conll2003@ce85b39f9dd99f552d0739d456814e95fb6a39b0: main holds a loading script, which
    # `datasets` no longer runs; this is a commit of the hub's parquet export (refs/convert/parquet), one
    # config with the three splits (pinned so by two projects, one checking the ClassLabel order as here)
    ("eriktks/conll2003", None): Layout("conll2003", ("id", "tokens", "pos_tags", "chunk_tags", "ner_tags"),
                                        convert=conll_row),
    # hf:rajpurkar/squad@7b6d24c440a36b6815f21b70d25016731768db1f (pinned so by several projects) and
    # hf:rajpurkar/squad_v2@3ffb306f725f7d2ce8394bc1873b24868140c412 (by one; another names 3ffb306f): the
    # copies are the official dev sets only, split by article, so the hub's train split is not read and its
    # validation split is dealt as the copies were, each of our splits in the copies' order (by title)
    ("rajpurkar/squad", None): Layout("squad", SQUAD, read=("validation",), deal=article_split, convert=squad_row,
                                      order=itemgetter("title")),
    ("rajpurkar/squad_v2", None): Layout("squad_v2", SQUAD, read=("validation",), deal=article_split,
                                         convert=squad_row, order=itemgetter("title")),
    # hf:mteb/stsbenchmark-sts@b0fddb56ed78048fa8b90373c8a3cfc37b684831 (mteb's own pin): the STS Benchmark
    # files with their 0-5 scores, test labels included (GLUE's stsb withholds those, sentence-transformers/stsb
    # scales scores to 0-1); the copy numbers each split's rows, the hub does not
    ("mteb/stsbenchmark-sts", None): Layout("stsb", ("idx", "genre", "filename", "year", "sentence1", "sentence2",
                                                     "label"), fields={"dataset": "filename", "score": "label"},
                                            numbered="idx"),
    # hf:PhilipMay/stsb_multi_mt/<de|fr|ru>@93d57ef91790589e3ce9c365164337a8a78b7632 (mteb's pin; it may predate
    # the hub's conversion to parquet, which `datasets` needs): the copies' DeepL translations of the STS
    # Benchmark, one config per language, the score 0-5 as `similarity_score`, the copies' validation as `dev`
    **{("PhilipMay/stsb_multi_mt", language): Layout(f"stsb_multi_{language}", ("sentence1", "sentence2", "label"),
                                                     fields={"similarity_score": "label"}, splits={"dev": "validation"})
       for language in ("de", "fr", "ru")},
    # hf:google/xquad@51adfef1c1287aab1d2d91b5bead9bcfb9c68583 ("Convert dataset to Parquet", the commit mteb
    # pins): a config per language with one split, validation; the copy's English, German and Russian
    # are read, each config as the split of its language, without the copy's `title` (the hub has none)
    ("google/xquad", None): Layout("xquad", ("id", "context", "question", "answers"),
                                   configs={f"xquad.{language}": language for language in ("en", "de", "ru")}),
    # hf:jaredfern/codah/fold_0@4b0e0e7f33b3ae8cd8e69bcdfa09af9611d8f3bd (main after its conversion to parquet;
    # pinned so by one project): the authors' cross-validation fold 0 (data/cv_split/fold_0), as the copy
    ("jaredfern/codah", "fold_0"): Layout("codah", ("idx", "categories", "startphrase", "endings", "label"),
                                          fields={"id": "idx", "question_category": "categories",
                                                  "question_propmt": "startphrase", "candidate_answers": "endings",
                                                  "correct_answer_idx": "label"}, convert=codah_row),
    # hf:bentrevett/multi30k@37e118600232bb5298ca011a8a7e7a44e863c36a (its last commit to the data files,
    # "fix empty examples"; later ones change the README only): Multi30k task 1 English-German, train 29,000 /
    # validation 1,014 / test 1,000 pairs as the copy (its files train/val/test.jsonl; `datasets` names val
    # validation), one field per language where the copy has the translation layout. The revision is the hub's
    # commit history's; its rows were not compared with the copy's (no network here)
    ("bentrevett/multi30k", None): Layout("multi30k_en_de", ("translation",), convert=translation_row("en", "de")),
    # hf:knkarthick/samsum@2a6b79b3e3c939aebb149d9109d7cdb78a9c2d3b (its head; the data files are unchanged
    # since f804067, 2022-06-29): the CSV re-upload of SAMSum that the copy was made from (its PROVENANCE.md)
    ("knkarthick/samsum", None): Layout("samsum", ("dialogue", "summary", "id")),
    # No hub dataset holds Multi30k's English-French text alone: romrawinjp/multi30k has it beside the images
    # (10.5 GB to stream for 4 MB of text), HWU-F21NL-multi30k has no test split and token ids of its own. So
    # multi30k_en_fr is read as the local folder it is (../shared/data/multi30k_en_fr), as any local source.
}


@dataclass
class Use:
    """One source and the params keys that name it."""

    source: str
    keys: list[str]
    max_rows: int | None  # at most this many rows of each of its splits are needed (None: all)


def uses(params: Params) -> dict[str, Use]:
    """data/raw name -> the source stored there and who reads it. Two sources may not share a name."""
    named: dict[str, Use] = {}
    found = [(f"corpora.{name}", getattr(params.corpora, name).source, getattr(params.corpora, name).max_docs)
             for name in ("pretrain", "domain")]
    found += [(f"corpora.parallel.{name}", corpus.source, corpus.max_pairs)
              for name, corpus in params.corpora.parallel.items()]
    found += [(f"tasks.{name}", task.source, None) for name, task in params.tasks.items()]
    for key, source, max_rows in found:
        name = raw_name(source, f"{key}.source")
        use = named.setdefault(name, Use(source, [], max_rows))
        if use.source != source:
            raise UserError(f"{key}.source: '{source}' and {use.keys[0]}.source '{use.source}' are both stored as "
                            f"data/raw/{name}; name the same source the same way (same revision) in both")
        use.keys.append(key)
        use.max_rows = None if use.max_rows is None or max_rows is None else max(use.max_rows, max_rows)
    return named


def layout_of(source: str, key: str) -> Layout | None:
    if not source.startswith(HUB_PREFIX):
        return None
    hub = parse_hub(source, key)
    return LAYOUTS.get((hub.repo, hub.config))


def raw_name(source: str, key: str) -> str:
    """The folder of `source` in data/raw and in the mirror: a known hub dataset's mirror name; another
    hub dataset's repo and config; a local source's file name and a digest of its path as written."""
    layout = layout_of(source, key)
    if layout is not None:
        return layout.name
    hub = parse_hub(source, key) if source.startswith(HUB_PREFIX) else None
    if hub is not None and not Path(hub.repo).is_dir():
        return _slug("--".join(filter(None, (hub.repo.replace("/", "--"), hub.config))))
    digest = hashlib.sha256(source.encode("utf-8")).hexdigest()[:8]
    return f"{_slug(Path(source.removeprefix(HUB_PREFIX).partition('@')[0]).name.split('.')[0])}-{digest}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.") or "source"


def localize(params: Params, raw_dir: Path) -> Params:
    """`params` with every source replaced by its folder under raw_dir, which the data stage wrote:
    what the stages after it read."""
    def local(section: Any, key: str) -> Any:
        return replace(section, source=str(raw_dir / raw_name(section.source, f"{key}.source")))

    corpora = replace(params.corpora, **{n: local(getattr(params.corpora, n), f"corpora.{n}")
                                         for n in ("pretrain", "domain")},
                      parallel={name: local(corpus, f"corpora.parallel.{name}")
                                for name, corpus in params.corpora.parallel.items()})
    tasks = {name: local(task, f"tasks.{name}") for name, task in params.tasks.items()}
    return replace(params, corpora=corpora, tasks=tasks)


def read_all(params: Params, out: Path) -> dict[str, dict[str, Any]]:
    """Read every source of `params` into out/<name>/ (skipping those already there with the same
    identity) and remove the names no source uses any more; returns per name what was done. Every
    source, and every split params name of it (check_splits), is checked before any is read, so one that
    cannot be read leaves `out` as it was (a hub download's splits are known, and checked, once read)."""
    out.mkdir(parents=True, exist_ok=True)
    mirror = None if params.data.mirror is None else _from_root(params.data.mirror)
    named = uses(params)
    identities = {name: identity_of(use) for name, use in named.items()}
    kept = {name: _kept_rows(out / name, identity) for name, identity in identities.items()}
    # only what is to be read is asked for (the hub may be offline for one already read)
    plans = {name: origin_of(use, name, mirror) for name, use in named.items() if kept[name] is None}
    check_splits(params, {name: kept[name] if kept[name] is not None else planned_splits(use, plans[name])
                          for name, use in named.items()})
    report = {}
    for name, use in named.items():
        started = time.perf_counter()
        identity, origin = identities[name], plans.get(name)
        if origin is None:
            origin, splits = "kept: read earlier with the same identity", kept[name]
        else:
            with atomic_dir(out / name) as tmp:
                splits = fetch(use, origin, tmp)
                (tmp / IDENTITY_FILE).write_text(json.dumps({"identity": identity, "rows": splits}, indent=2,
                                                            sort_keys=True) + "\n", encoding="utf-8")
        report[name] = {"source": use.source, "used_by": use.keys, "origin": _shown(origin), "rows": splits,
                        "seconds": round(time.perf_counter() - started, 2)}
        print(f"data: {name}: {sum(splits.values()):,} rows ({', '.join(f'{s} {n:,}' for s, n in splits.items())}) "
              f"<- {_shown(origin)}", flush=True)
    for stale in sorted(p for p in out.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in named):
        shutil.rmtree(stale)
        print(f"data: {stale.name}: no source uses it any more, removed", flush=True)
    check_splits(params, {name: done["rows"] for name, done in report.items()})  # a hub source's, now known
    return report


def planned_splits(use: Use, origin: str) -> list[str] | None:
    """The splits `use.source` will have in data/raw when read from `origin` (origin_of's), where known
    before reading: a local source's or a mirror copy's files; None for the hub (a layout renames or deals its
    splits as it reads them)."""
    kind, _, where = origin.partition(" ")
    key = f"{use.keys[0]}.source"
    if kind == "local":
        return list(local_files(str(_from_root(use.source)), key))
    return list(local_files(where, key)) if kind == "mirror" else None


def check_splits(params: Params, splits: dict[str, Iterable[str] | None]) -> None:
    """Raise UserError naming the params key and the source as params write it for a split params name
    that the source does not have (`splits`: data/raw name -> the source's splits, None where not known yet).
    The stages after `data` read data/raw's copy, whose name would tell the user nothing."""
    wanted = []
    corpora = {f"corpora.{name}": getattr(params.corpora, name) for name in ("pretrain", "domain")}
    corpora.update({f"corpora.parallel.{name}": corpus for name, corpus in params.corpora.parallel.items()})
    for key, corpus in corpora.items():
        wanted += [(f"{key}.splits", corpus.source, split) for split in corpus.splits]
        if corpus.valid_split is not None:
            wanted.append((f"{key}.valid_split", corpus.source, corpus.valid_split))
    for name, task in params.tasks.items():
        if task.transfer_from is None:  # a transfer task reads no train split of its own
            wanted.append((f"tasks.{name}.train_split", task.source, task.train_split))
        wanted += [(f"tasks.{name}.eval_splits", task.source, split) for split in task.eval_splits]
    for key, source, split in wanted:
        have = splits.get(raw_name(source, key))
        if have is not None and split not in have:
            file, fix = _from_root(source), "name one of its splits"
            if file.is_file():
                suffix = data_suffix(file)
                fix = (f"a single file is split train alone: give a folder with a file per split (train{suffix}, "
                       f"validation{suffix}, ...)")
            raise UserError(f"{key}: split '{split}' not in '{source}' (it has: {', '.join(sorted(have))}); {fix}")


def eval_text_spec(params: Params, field_kinds: dict[str, dict[str, str]]) -> dict[str, dict[str, Any]]:
    """Per task, the folder in data/raw, evaluation splits and text fields whose texts `clean` removes
    from the LM corpora, and `kinds`, what a field holds where it is not one text (`field_kinds`, per task
    its type's (lib.tasks.field_kinds); absent when every field is one text). The data stage
    writes it into data/raw (write_eval_text_spec), so clean depends on it through data/raw's content rather
    than on the whole `tasks` section: a change of a task's max_len or metrics, or of which tasks finetune
    selects, does not rerun clean."""
    spec = {}
    for name, task in sorted(params.tasks.items()):
        # the texts; and a field of another role where the type says what it holds (a seq2seq target)
        fields = {key: getattr(task, key) for key in ("text_field", "text_pair_field", *field_kinds[name])
                  if getattr(task, key) is not None}
        spec[name] = {"folder": raw_name(task.source, f"tasks.{name}.source"), "splits": list(task.eval_splits),
                      "fields": fields}
        kinds = {key: kind for key, kind in field_kinds[name].items() if key in fields}
        if kinds:
            spec[name]["kinds"] = kinds
    return spec


def write_eval_text_spec(params: Params, field_kinds: dict[str, dict[str, str]], out: Path) -> None:
    """out/EVAL_TEXTS_FILE for `params`, rewritten only when it changes."""
    path = out / EVAL_TEXTS_FILE
    text = json.dumps(eval_text_spec(params, field_kinds), indent=2, sort_keys=True) + "\n"
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        out.mkdir(parents=True, exist_ok=True)
        with atomic_file(path, "w") as f:
            f.write(text)


def read_eval_text_spec(raw_dir: Path) -> dict[str, dict[str, Any]]:
    path = raw_dir / EVAL_TEXTS_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"{path}: cannot read it ({describe(err)}); run the data stage first (dvc repro data)"
                        ) from None


def up_to_date(params: Params, out: Path) -> bool:
    """Every source of `params` is in `out` with its identity, and nothing else is. Raises UserError
    (check_splits) when so but params name a split that one of them lacks."""
    named = uses(params)
    kept = {p.name for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")} if out.is_dir() else set()
    if kept != set(named):
        return False
    rows = {name: _kept_rows(out / name, identity_of(use)) for name, use in named.items()}
    if any(r is None for r in rows.values()):
        return False
    check_splits(params, rows)
    return True


def identity_of(use: Use) -> dict[str, Any]:
    """What the rows of data/raw/<name> are a function of. A local source: its files' contents."""
    identity: dict[str, Any] = {"source": use.source, "max_rows": use.max_rows, "format": FORMAT}
    if not use.source.startswith(HUB_PREFIX):
        files = local_files(str(_from_root(use.source)), f"{use.keys[0]}.source")
        identity["files"] = {Path(path).name: file_sha256(path) for paths in files.values() for path in paths}
    return identity


def _kept_rows(folder: Path, identity: dict[str, Any]) -> dict[str, int] | None:
    """Rows per split of what `folder` holds when it was read with `identity`, else None."""
    try:
        kept = json.loads((folder / IDENTITY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return kept["rows"] if isinstance(kept, dict) and kept.get("identity") == identity else None


def origin_of(use: Use, name: str, mirror: Path | None) -> str:
    """Where the rows of `use.source` are to come from: "local <path>", "mirror <folder>" or "hub <id>".
    A hub id with no copy in the mirror while the hub is offline is a UserError naming the dataset,
    the mirror folder and how to fill it."""
    if not use.source.startswith(HUB_PREFIX):
        return f"local {use.source}"
    copy = None if mirror is None else mirror / name
    if copy is not None and copy.is_dir():
        return f"mirror {copy}"
    offline = any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on") for v in OFFLINE_VARIABLES)
    if offline and not Path(parse_hub(use.source, f"{use.keys[0]}.source").repo).is_dir():
        raise UserError(f"{use.keys[0]}.source: '{use.source}' has no copy in the mirror and the hub is offline "
                        f"({'/'.join(OFFLINE_VARIABLES)} is set); {_fill(copy)}, or connect and run again")
    layout = layout_of(use.source, f"{use.keys[0]}.source")
    for source in config_sources(use, layout) or [use.source]:  # the hub answers for it, before anything is read
        hub_splits(use, copy, source)
    return f"hub {use.source}"


def config_sources(use: Use, layout: Layout | None) -> dict[str, str]:
    """Our split -> the hub id of the config it is read from, where the layout reads a config per split."""
    if layout is None or not layout.configs:
        return {}
    hub = parse_hub(use.source, f"{use.keys[0]}.source")
    return {ours: str(replace(hub, config=config)) for config, ours in layout.configs.items()}


def hub_splits(use: Use, copy: Path | None = None, source: str | None = None) -> list[str]:
    """The splits the hub publishes for `use.source` (or `source`, one of its configs); one UserError line
    if it cannot say (no network, an unknown id or revision, a gated dataset), naming the mirror folder
    that would do instead."""
    from huggingface_hub.utils import logging as hub_logging

    # its warning per retry (five when there is no network) would bury the one line that says what to do
    hub_logging.set_verbosity_error()
    try:
        return list_splits(source or use.source, f"{use.keys[0]}.source")
    except UserError as err:
        raise UserError(f"{err}; check the id and revision, or {_fill(copy)}") from None


def _shown(origin: str) -> str:
    """An origin with its folder relative to the project root (`mirror ../shared/data/imdb`), as params
    name it: the metrics file then reads the same on every machine."""
    kind, _, where = origin.partition(" ")
    if kind == "mirror":
        return f"{kind} {os.path.relpath(where, project_root())}"
    return origin


def _fill(copy: Path | None) -> str:
    """How to give the data stage a hub dataset without the hub."""
    if copy is None:
        return "set data.mirror to a folder with a copy"
    missing = "" if copy.parent.is_dir() else f"data.mirror {copy.parent} does not exist: "
    return f"{missing}put a copy in {copy} (one <split>.jsonl.gz per split)"


def fetch(use: Use, origin: str, out: Path) -> dict[str, int]:
    """Write the rows of `use.source` into `out` from `origin` (origin_of's); returns rows per split."""
    key = f"{use.keys[0]}.source"
    kind, _, where = origin.partition(" ")
    if kind == "local":
        return copy_local(use, out)
    layout = layout_of(use.source, key)
    if kind == "mirror":
        rows = {split: (layout.row(r) if layout else r for r in read_records(where, split, key, use.max_rows))
                for split in sorted(local_files(where, key))}
        return write_splits(rows, out)
    return write_splits(hub_rows(use, layout, key), out)


def copy_local(use: Use, out: Path) -> dict[str, int]:
    """A local source's data files, as they are (a single file becomes split train); returns rows per
    split, counted in the user's files so that an error names one of them, not the copy."""
    key = f"{use.keys[0]}.source"
    source = _from_root(use.source)
    files = local_files(str(source), key)
    rows = {split: sum(1 for _ in read_records(str(source), split, key)) for split in files}
    for paths in files.values():
        for path in map(Path, paths):
            shutil.copyfile(path, out / (path.name if source.is_dir() else "train" + data_suffix(path)))
    return rows


def hub_rows(use: Use, layout: Layout | None, key: str) -> dict[str, Iterator[dict]]:
    """Our split -> the hub's rows for it, read lazily (streaming, at most use.max_rows per hub split)."""
    configs = config_sources(use, layout)
    if configs:
        return {ours: map(layout.hub_row, _every_split(use, source, key)) for ours, source in configs.items()}
    splits = [s for s in hub_splits(use) if layout is None or layout.read is None or s in layout.read]
    parts = {split: read_records(use.source, split, key, use.max_rows) for split in splits}
    if layout is None:
        return parts
    if layout.deal is not None:
        ours = _dealt(layout, parts.values())
    else:
        ours = {layout.splits.get(split, split): map(layout.hub_row, records) for split, records in parts.items()}
    return {split: layout.numbered_rows(rows) for split, rows in ours.items()}


def _every_split(use: Use, source: str, key: str) -> Iterator[dict]:
    """The rows of every split of hub id `source`, split by split."""
    for split in hub_splits(use, source=source):
        yield from read_records(source, split, key, use.max_rows)


def _dealt(layout: Layout, parts: Iterable[Iterator[dict]]) -> dict[str, Iterator[dict]]:
    """Rows of every hub split read, dealt into our splits by layout.deal (one pass over the hub's rows),
    each split sorted by layout.order where it has one."""
    dealt: dict[str, list[dict]] = {}
    for part in parts:
        for row in map(layout.hub_row, part):
            dealt.setdefault(layout.deal(row), []).append(row)
    return {split: iter(sorted(rows, key=layout.order) if layout.order else rows) for split, rows in dealt.items()}


def write_splits(rows: dict[str, Iterator[dict]], out: Path) -> dict[str, int]:
    counts = {}
    for split in sorted(rows):
        with JsonlGzWriter(out / f"{split}.jsonl.gz") as writer:
            for row in rows[split]:
                writer.write(row)
        counts[split] = writer.rows
    return counts


def _from_root(path: str) -> Path:
    """A path from params, relative to the project root: the same folder for a queued experiment,
    which DVC runs in a temporary copy of the project."""
    return (project_root() / path).resolve()

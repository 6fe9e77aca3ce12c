"""Bad input across the stages, one table: each case runs a stage as a user would (a subprocess) on a
tiny project with one thing broken, and must end in one `error: ...` line that names the cause with
exit code 2 and no output left behind, or, where skipping is right, finish and count what it skipped."""
import csv
import gzip
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from tests.helpers import write_jsonl_gz
from tests.test_pipeline import copy_reproduced



def env() -> dict[str, str]:
    """The environment of the stage processes, read when they start (the test session sets caches)."""
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def stage(repo: Path, name: str, params: Path, out: Path, raw: Path) -> subprocess.CompletedProcess:
    """Run stage `name` with its inputs from the project (the sources' copies from `raw`) and every
    output under `out`."""
    inputs = {"clean": ["--raw", str(raw)],
              "tokenizer": ["--clean", "data/clean"],
              "pretrain": ["--tokenizer", "data/tokens/tokenizer", "--tokens", "data/tokens/pretrain"],
              "adapt": ["--model", "models/pretrain", "--tokens", "data/tokens/domain"],
              "finetune": ["--raw", str(raw), "--model", "models/adapt"],
              "evaluate": ["--raw", str(raw), "--lm", "models/adapt",
                           "--finetune-metrics", str(out / "missing.json")]}.get(name, [])
    outputs = {"data": ["--out", "raw", "--metrics", "m.json"],
               "clean": ["--out", "clean", "--metrics", "m.json", "--plots", "plots"],
               "tokenizer": ["--out", "tokens", "--metrics", "m.json", "--plots", "plots"],
               "evaluate": ["--metrics", "m.json", "--plots", "plots", "--report", "report"]}.get(
        name, ["--out", "model", "--metrics", "m.json", "--plots", "plots", "--checkpoints", "ckpt"])
    outputs = [arg if arg.startswith("--") else str(out / arg) for arg in outputs]
    return subprocess.run([sys.executable, "-m", f"stages.{name}", "--params", str(params), *inputs, *outputs],
                          cwd=repo, env=env(), capture_output=True, text=True, timeout=600)


def outputs_under(out: Path) -> list[str]:
    """The output options of a training stage, every output under `out`."""
    return ["--out", str(out / "model"), "--metrics", str(out / "m.json"), "--plots", str(out / "plots"),
            "--checkpoints", str(out / "ckpt")]


@pytest.fixture(scope="module")
def project(reproduced, tmp_path_factory):
    """A tiny project with data, clean, tokenizer, pretrain and adapt done (a copy of the session's
    reproduced one, whose outputs these are), its params then tracking off and finetune cut down."""
    repo = copy_reproduced(reproduced, tmp_path_factory.mktemp("bad_input"))
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["tracking"]["enabled"] = False
    params["finetune"].update(tasks=["sst2"], variants=["plain"], epochs=1, max_train_examples=None)
    params["distill"].update(tasks=["sst2"], unlabeled={})
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return repo


def rows(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


# data edits: (case folder with a copy of the tiny data) -> None
def empty_file(data: Path) -> None:
    (data / "wikipedia_en" / "train.jsonl.gz").write_bytes(b"")


def invalid_utf8(data: Path) -> None:
    path = data / "wikipedia_en" / "train.jsonl.gz"
    raw = gzip.decompress(path.read_bytes())
    bad = b'{"text": "' + b"Broken bytes \xff\xfe in an otherwise fine article. " * 20 + b'"}\n'
    path.write_bytes(gzip.compress(raw + bad))


def ten_mb_line(data: Path) -> None:
    path = data / "wikipedia_en" / "train.jsonl.gz"
    write_jsonl_gz(path, rows(path) + [{"text": "word " * 2_000_000}])


def relabel(label_of: Callable[[int, Any], Any]) -> Callable[[Path], None]:
    def edit(data: Path) -> None:
        path = data / "sst2" / "train.jsonl.gz"
        write_jsonl_gz(path, [{**r, "label": label_of(i, r["label"])} for i, r in enumerate(rows(path))])
    return edit


def empty_texts(data: Path) -> None:
    path = data / "sst2" / "train.jsonl.gz"
    write_jsonl_gz(path, [{**r, "text": "" if i % 10 == 0 else r["text"]} for i, r in enumerate(rows(path))])


def edit_first_row(name: str, change: Callable[[dict], dict]) -> Callable[[Path], None]:
    """A data edit: the first train row of dataset `name` changed by `change`."""
    def edit(data: Path) -> None:
        path = data / name / "train.jsonl.gz"
        train = rows(path)
        write_jsonl_gz(path, [change(train[0]), *train[1:]])
    return edit


def moved_answer(row: dict) -> dict:
    answers = row["answers"]
    starts = answers["answer_start"]
    return {**row, "answers": {**answers, "answer_start": [starts[0] + 1, *starts[1:]]}}


def own_task(folder: str, writers: dict[str, Callable[[Path, str, list[dict]], None]]) -> Callable[[Path], None]:
    """A data edit: a user's own task in `folder` beside the mirror's datasets, each split written from the sst2
    split of its name by its writer (task folder, split, rows)."""
    def edit(data: Path) -> None:
        for split, write in writers.items():
            (data / folder).mkdir(exist_ok=True)
            write(data / folder, split, rows(data / "sst2" / f"{split}.jsonl.gz"))
    return edit


def as_jsonl(folder: Path, split: str, split_rows: list[dict]) -> None:
    write_jsonl_gz(folder / f"{split}.jsonl.gz", split_rows)


def label_renamed(folder: Path, split: str, split_rows: list[dict]) -> None:
    write_jsonl_gz(folder / f"{split}.jsonl.gz", [{"text": r["text"], "Label": r["label"]} for r in split_rows])


def csv_writer(delimiter: str = ",", encoding: str = "utf-8",
               text: Callable[[str], str] = str) -> Callable[[Path, str, list[dict]], None]:
    """A writer of a split as a spreadsheet saves it: a header, string labels, a text with the delimiter or a
    quote quoted; in `encoding`, each text as `text` makes it. (In Latin-1, the bytes of a text with an accent
    are not UTF-8: 2 of sst2's train texts, 'clichés', and 1 of its validation texts, 'amélie'.)"""
    def write(folder: Path, split: str, split_rows: list[dict]) -> None:
        with open(folder / f"{split}.csv", "w", newline="", encoding=encoding) as f:
            writer = csv.writer(f, delimiter=delimiter)
            writer.writerow(["review", "sentiment"])
            writer.writerows([text(r["text"]), ("negative", "positive")[r["label"]]] for r in split_rows)
    return write


def own(task: str, **settings: Any) -> dict[str, Any]:
    """Params that add task `task` from the folder own_task writes in the mirror and finetune it alone."""
    return {f"tasks.{task}": lambda mirror: {"source": str(mirror / task), **settings},
            "finetune.tasks": [task], "distill.tasks": [task]}


def typed(task: str, **settings: Any) -> dict[str, Any]:
    """Params that finetune `task` alone (lengths the tiny model takes)."""
    return {"finetune.tasks": [task], "distill.tasks": [task], **{f"tasks.{task}.{k}": v for k, v in settings.items()}}


def truncate_model(repo: Path, case: Path) -> None:
    model = case / "model_in"
    shutil.copytree(repo / "models" / "adapt", model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])


@dataclass
class Case:
    name: str
    stage: str
    error: str | None  # a fragment of the one-line error; None: the stage must finish
    params: dict[str, Any] = field(default_factory=dict)  # dotted key -> value, or a function of the mirror's folder
    data: Callable[[Path], None] | None = None  # edits a copy of the tiny data
    check: Callable[[dict], None] | None = None  # on the metrics of a stage that finished


CASES = [
    Case("empty corpus file", "data", "train.jsonl.gz' is empty; remove it or fill it", data=empty_file),
    Case("every document filtered out", "clean", "corpora.pretrain: no train documents left after cleaning",
         params={"clean.min_chars": 900_000}),
    Case("non-UTF-8 bytes: counted and dropped", "clean", None, data=invalid_utf8,
         check=lambda m: m["pretrain"]["dropped"]["undecodable"] == 1),
    Case("a 10 MB single line: counted and dropped", "clean", None, data=ten_mb_line,
         check=lambda m: m["pretrain"]["dropped"]["too_long"] == 1),
    Case("missing text field", "clean", "corpora.pretrain.text_field: field 'body' not in",
         params={"corpora.pretrain.text_field": "body"}),
    Case("missing source", "data", "corpora.domain.source: '/no/such/folder' does not exist",
         params={"corpora.domain.source": "/no/such/folder"}),
    Case("a dataset offline with no copy in the mirror", "data",
         "corpora.pretrain.source: 'hf:wikimedia/wikipedia/20231101.en@b04c8d1ceb2f5cd4588862100d08de323dccfbaa' has "
         "no copy in the mirror and the hub is offline (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set); data.mirror "
         "/no/such/mirror does not exist: put a copy in /no/such/mirror/wikipedia_en", params={"data.mirror": "/no/such/mirror"}),
    Case("unknown params key", "pretrain", "pretrain.budget_token: unknown key; did you mean 'pretrain.budget_tokens'?",
         params={"pretrain.budget_token": 10}),
    Case("wrong params type", "pretrain", "pretrain.batch_size: expected an integer, got str 'big'",
         params={"pretrain.batch_size": "big"}),
    Case("vocabulary smaller than the special tokens", "tokenizer", "tokenizer.vocab_size: 3 is too small",
         params={"tokenizer.vocab_size": 3}),
    Case("init folder that does not exist", "tokenizer", "init: '/no/such/checkpoint' is not a folder",
         params={"init": "/no/such/checkpoint"}),
    Case("init hub id offline", "tokenizer", "init: cannot download someone/not-cached from the Hugging Face hub",
         params={"init": "hf:someone/not-cached"}),
    Case("init that names nothing", "pretrain", "init: 'hf:' names no published model", params={"init": "hf:"}),
    Case("seq_len above max positions", "pretrain", "pretrain.seq_len: 128 is above model.max_positions (64)",
         params={"pretrain.seq_len": 128}),
    Case("NaN loss", "pretrain", "training: loss is nan at step", params={"pretrain.lr": 1e30}),
    Case("a model of another architecture", "adapt", "its model config differs from params.yaml's model",
         params={"model.d_model": 48}),
    Case("label outside the declared classes", "finetune", "tasks.sst2.label_names: train label 7 has no name",
         params={"tasks.sst2.label_names": ["negative", "positive"]}, data=relabel(lambda i, y: 7 if i == 3 else y)),
    Case("labels of mixed types", "finetune", "has mixed types",
         data=relabel(lambda i, y: "positive" if i == 3 else y)),
    Case("a task with one class", "finetune", "has one class", data=relabel(lambda i, y: 0)),
    Case("empty texts: counted and skipped", "finetune", None, data=empty_texts,
         check=lambda m: m["sst2"]["skipped"]["train.empty_text"] == 15),
    Case("pair task without its second field", "finetune", "tasks.mrpc.text_pair_field: field 'sentence3' not in",
         params={"finetune.tasks": ["mrpc"], "distill.tasks": ["mrpc"], "tasks.mrpc.max_len": 64, "tasks.mrpc.text_pair_field": "sentence3"}),
    Case("task not in params", "finetune", "finetune.tasks[1]: 'nope' is not a task in `tasks`",
         params={"finetune.tasks": ["sst2", "nope"]}),
    Case("tagging words and tags of different lengths: counted and skipped", "finetune", None,
         params=typed("conll2003", max_len=64),
         data=edit_first_row("conll2003", lambda r: {**r, "ner_tags": r["ner_tags"][:-1]}),
         check=lambda m: m["conll2003"]["skipped"]["train.length_mismatch"] == 1),
    Case("an answer not at its answer_start: moved to its text and counted", "finetune", None,
         params=typed("squad_v2", max_len=64, stride=16, max_question_len=16),
         data=edit_first_row("squad_v2", moved_answer),
         check=lambda m: m["squad_v2"]["skipped"]["train.answer_repaired"] == 1),
    Case("a regression label that is not a number: counted and skipped", "finetune", None,
         params=typed("stsb", max_len=64), data=edit_first_row("stsb", lambda r: {**r, "label": "n/a"}),
         check=lambda m: m["stsb"]["skipped"]["train.label_not_a_number"] == 1),
    Case("a multiple-choice row with another number of endings: counted and skipped", "finetune", None,
         params=typed("codah"), data=edit_first_row("codah", lambda r: {**r, "endings": r["endings"][:3]}),
         check=lambda m: m["codah"]["skipped"]["train.n_choices"] == 1),
    Case("a task type the registry does not have", "finetune",
         "tasks.stsb.type: 'ranking' is not one of classification, regression",
         params={**typed("stsb", max_len=64), "tasks.stsb.type": "ranking"}),
    Case("truncated model weights", "finetune", "model.safetensors: not a readable safetensors file"),
    Case("token files of another tokenizer", "pretrain", "train.json: encoded with another tokenizer than "
         "data/tokens/tokenizer/tokenizer.json; encode the corpora again (dvc repro tokenizer)"),
    Case("the metrics of an earlier stage missing", "evaluate", "missing.json: cannot read it"),
    Case("a split the source lacks, named as params write the source", "data",
         "noeval' (it has: train); name one of its splits", params=own("noeval", max_len=32),
         data=own_task("noeval", {"train": as_jsonl})),
    Case("an evaluation split with its label field renamed", "finetune",
         "tasks.renamed.label_field: split 'validation' has no field 'label' but has 'Label'",
         params=own("renamed", max_len=32), data=own_task("renamed", {"train": as_jsonl, "validation": label_renamed})),
    Case("a labeled CSV task added as a user adds one: trained and evaluated", "finetune", None,
         params=own("reviews", text_field="review", label_field="sentiment", max_len=32),
         data=own_task("reviews", {"train": csv_writer(), "validation": csv_writer()}),
         check=lambda m: m["reviews"]["eval_examples"] == 60 and "eval" in m["reviews"]["variants"]["plain"]
         and m["reviews"]["train_examples"] + m["reviews"]["dev_examples"] == 150),
    Case("a task CSV in Latin-1: its rows with accents counted and skipped in each split", "finetune", None,
         params=own("latin1", text_field="review", label_field="sentiment", max_len=32),
         data=own_task("latin1", {split: csv_writer(encoding="latin-1") for split in ("train", "validation")}),
         check=lambda m: m["latin1"]["skipped"] == {"train.undecodable": 2, "train.empty_text": 0,
                                                    "eval.undecodable": 1, "eval.empty_text": 0}
         and m["latin1"]["eval_examples"] == 59 and m["latin1"]["train_examples"] + m["latin1"]["dev_examples"] == 148),
    Case("a task file wholly in Latin-1", "finetune",
         "train.csv' is not UTF-8: 150 of 150 rows of split 'train' hold bytes that do not decode; re-save the "
         "source's train.csv as UTF-8 (from Latin-1: iconv -f latin1 -t utf-8 train.csv > utf8.csv",
         params=own("quoted", text_field="review", label_field="sentiment", max_len=32),
         data=own_task("quoted", {split: csv_writer(encoding="latin-1", text=lambda t: f"« {t} »")
                                  for split in ("train", "validation")})),
    Case("a semicolon-separated task CSV: read so, trained and evaluated", "finetune", None,
         params=own("semicolons", text_field="review", label_field="sentiment", max_len=32),
         data=own_task("semicolons", {"train": csv_writer(";"), "validation": csv_writer(";")}),
         check=lambda m: m["semicolons"]["eval_examples"] == 60
         and m["semicolons"]["train_examples"] + m["semicolons"]["dev_examples"] == 150),
]


def run_case(repo: Path, case: Case, tmp_path: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """Case `case` run in `tmp_path`: the stage's process, and the folder its outputs went to."""
    params = yaml.safe_load((repo / "params.yaml").read_text())
    raw, mirror = repo / "data" / "raw", tmp_path / "mirror"
    if case.data:  # an edited copy of the mirror, read by the data stage, unless the case is the data stage's
        shutil.copytree(repo.parent / "shared" / "data", mirror)
        case.data(mirror)
        params["data"]["mirror"] = str(mirror)
    for key, value in case.params.items():
        *parents, last = key.split(".")
        section = params
        for part in parents:
            section = section[part]
        section[last] = value(mirror) if callable(value) else value
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    out = tmp_path / "out"
    out.mkdir()
    if case.data and case.stage != "data":
        raw = tmp_path / "raw"
        done = subprocess.run([sys.executable, "-m", "stages.data", "--params", str(params_file), "--out", str(raw),
                               "--metrics", str(tmp_path / "data.json")], cwd=repo, env=env(), capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    if case.name == "token files of another tokenizer":  # e.g. a tokenizer stage killed between the two (before
        # they became one output): the new vocabulary's tokenizer beside the old token files
        tokens = tmp_path / "tokens"
        shutil.copytree(repo / "data" / "tokens" / "pretrain", tokens)
        meta = json.loads((tokens / "train.json").read_text())
        (tokens / "train.json").write_text(json.dumps({**meta, "tokenizer": "0" * 64}))
        done = subprocess.run([sys.executable, "-m", "stages.pretrain", "--params", str(params_file), "--tokenizer",
                               "data/tokens/tokenizer", "--tokens", str(tokens), *outputs_under(out)],
                              cwd=repo, env=env(), capture_output=True, text=True, timeout=600)
    elif case.name == "truncated model weights":
        truncate_model(repo, tmp_path)
        done = subprocess.run([sys.executable, "-m", "stages.finetune", "--params", str(params_file), "--model",
                               str(tmp_path / "model_in"), *outputs_under(out)],
                              cwd=repo, env=env(), capture_output=True, text=True, timeout=600)
    else:
        done = stage(repo, case.stage, params_file, out, raw)
    return done, out


@pytest.fixture(scope="module")
def ran(project, request, tmp_path_factory):
    """The cases this session runs, started on their first use two at a time (each stage process runs on one
    thread, and much of it is the import of its libraries, on one core): case name -> future of its
    run_case. Every case runs in a folder and processes of its own, and its test checks its result."""
    selected = [item.callspec.params["case"] for item in request.session.items
                if item.module is request.module and item.originalname == "test_bad_input"]
    pool = ThreadPoolExecutor(max_workers=2)
    try:
        yield {case.name: pool.submit(run_case, project, case, tmp_path_factory.mktemp("case"))
               for case in selected}
    finally:
        pool.shutdown(cancel_futures=True)  # a session stopped early starts no more cases


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(ran, case):
    done, out = ran[case.name].result()
    if case.error is None:
        assert done.returncode == 0, done.stderr[-2000:]
        metrics = json.loads((out / "m.json").read_text())
        assert case.check(metrics), metrics
        return
    assert done.returncode == 2, f"exit {done.returncode}: {done.stderr[-2000:]}"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-2000:]
    assert case.error in lines[0]
    left = [p.relative_to(out) for p in out.rglob("*") if p.is_file() and "ckpt" not in p.parts]
    assert left == [], f"left behind: {left}"

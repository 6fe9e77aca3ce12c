"""The data stage (lib/data/raw.py): hub ids read without the network, the mirror and the hub giving the same
data/raw, local sources copied and re-read when their content changes, one-line errors offline."""
import gzip
import hashlib
import json
import re
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from lib.config.errors import UserError
from lib.config.params import load_params
from lib.data.corpus import eval_texts
from lib.data.raw import (EVAL_TEXTS_FILE, localize, raw_name, read_all, read_eval_text_spec, up_to_date,
                          write_eval_text_spec)
from lib.data.sources import HubId, local_files, parse_hub, read_records
from lib.tasks import check_tasks, field_kinds
from tests.helpers import ROOT, SHARED_DATA, write_jsonl_gz

IMDB = "hf:stanfordnlp/imdb@e6281661ce1c48d982bc483cf8a173c1bbeb5d31"
SST2 = "hf:nyu-mll/glue/sst2@bcdcba79d07bc864c1c254ccfcedcce55bcc9a8c"
WIKI = "hf:wikimedia/wikipedia/20231101.en@b04c8d1ceb2f5cd4588862100d08de323dccfbaa"


@pytest.mark.parametrize("source, expected", [
    ("hf:stanfordnlp/imdb", HubId("stanfordnlp/imdb", None, None)),
    ("hf:nyu-mll/glue/sst2@bcdcba7", HubId("nyu-mll/glue", "sst2", "bcdcba7")),
    ("hf:wikimedia/wikipedia/20231101.en@main", HubId("wikimedia/wikipedia", "20231101.en", "main")),
    ("hf:imdb", HubId("imdb", None, None)),
])
def test_hub_ids_are_read_by_position_without_the_network(source, expected):
    """Offline, `hf:stanfordnlp/imdb` was once read as dataset `stanfordnlp` with config `imdb`."""
    assert parse_hub(source, "k") == expected
    assert str(expected) == source


@pytest.mark.parametrize("source", ["hf:org//name", "hf:org/name@", "hf:@main"])
def test_a_malformed_hub_id_is_one_line(source):
    with pytest.raises(UserError, match=r"^tasks.x.source: .* is not a hub id; write hf:<org>/<name>"):
        parse_hub(source, "tasks.x.source")


def head(path: Path, n: int) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line, _ in zip(f, range(n))]


def tiny_mirror(mirror: Path) -> dict[str, dict[str, list[dict]]]:
    """A few rows of each split of imdb, sst2 and wikipedia_en, as the mirror holds them."""
    rows = {"imdb": {s: head(SHARED_DATA / "imdb" / f"{s}.jsonl.gz", 12) for s in ("train", "test", "unsup")},
            "sst2": {s: head(SHARED_DATA / "sst2" / f"{s}.jsonl.gz", 12) for s in ("train", "validation", "test")},
            "wikipedia_en": {s: sorted(({**r, "text": r["text"][:500]} for r in
                                        head(SHARED_DATA / "wikipedia_en" / f"{s}.jsonl.gz", n)), key=lambda r: r["id"])
                             for s, n in (("train", 20), ("validation", 3), ("test", 3))}}
    for name, splits in rows.items():
        for split, split_rows in splits.items():
            write_jsonl_gz(mirror / name / f"{split}.jsonl.gz", split_rows)
    return rows


def hub_repo(folder: Path, config: str | None, splits: dict[str, list[dict]]) -> Path:
    """A dataset repo laid out as on the hub: parquet shards per config and split, listed in the README."""
    prefix = config or "plain_text"
    entries = []
    for split, rows in splits.items():
        path = f"{prefix}/{split}-00000-of-00001.parquet"
        (folder / prefix).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), folder / path)
        entries.append({"split": split, "path": path})
    (folder / "README.md").write_text("---\n" + yaml.safe_dump({"configs": [
        {"config_name": prefix, "data_files": entries, "default": True}]}) + "---\n")
    return folder


def fake_hub(tmp_path: Path, rows: dict, monkeypatch) -> None:
    """The hub's versions of the mirror rows (its names: IMDb's `unsupervised` split with label -1,
    GLUE's `sentence` and `idx`, Wikipedia's one split with a `url`), served from local folders: only
    where `datasets` looks a repo id up is redirected, so every line of ours runs as it would."""
    imdb = hub_repo(tmp_path / "hub" / "imdb", None, {
        "train": rows["imdb"]["train"], "test": rows["imdb"]["test"],
        "unsupervised": [{"text": r["text"], "label": -1} for r in rows["imdb"]["unsup"]]})
    sst2 = hub_repo(tmp_path / "hub" / "glue", "sst2", {
        split: [{"sentence": r["text"], "label": r["label"], "idx": i} for i, r in enumerate(split_rows)]
        for split, split_rows in rows["sst2"].items()})
    wiki = hub_repo(tmp_path / "hub" / "wikipedia", "20231101.en", {"train": sorted(
        ({**r, "url": f"https://en.wikipedia.org/wiki?curid={r['id']}"} for split in rows["wikipedia_en"].values()
         for r in split), key=lambda r: r["id"])})
    repos = {("stanfordnlp/imdb", None): (imdb, None), ("nyu-mll/glue", "sst2"): (sst2, "sst2"),
             ("wikimedia/wikipedia", "20231101.en"): (wiki, "20231101.en")}
    load, split_names = datasets.load_dataset, datasets.get_dataset_split_names

    def local(repo, config):
        assert (repo, config) in repos, f"the test's hub has no {repo} {config}"
        return str(repos[repo, config][0]), repos[repo, config][1]

    monkeypatch.setattr(datasets, "load_dataset", lambda repo, config=None, revision=None, **kw:
                        load(*local(repo, config), **kw))
    monkeypatch.setattr(datasets, "get_dataset_split_names", lambda repo, config=None, revision=None:
                        split_names(*local(repo, config)))
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)


def params_for(tmp_path: Path, mirror: Path | None, **sources: str):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["data"]["mirror"] = None if mirror is None else str(mirror)
    raw["corpora"]["pretrain"]["source"] = sources.get("pretrain", WIKI)
    raw["corpora"]["domain"]["source"] = sources.get("domain", IMDB)
    raw["tasks"] = {"imdb": {**raw["tasks"]["imdb"], "source": sources.get("imdb", IMDB)},
                    "sst2": {**raw["tasks"]["sst2"], "source": sources.get("sst2", SST2)}}
    if "sst2" in sources:  # the local tasks here have train and test
        raw["tasks"]["sst2"]["eval_splits"] = ["test"]
    if "domain" in sources:  # and the local corpora train alone
        raw["corpora"]["domain"]["splits"] = ["train"]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_params(path, [check_tasks])


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_mirror_and_the_hub_give_the_same_raw_data(tmp_path, monkeypatch):
    rows = tiny_mirror(tmp_path / "mirror")
    from_mirror = read_all(params_for(tmp_path, tmp_path / "mirror"), tmp_path / "raw-mirror")
    fake_hub(tmp_path, rows, monkeypatch)
    from_hub = read_all(params_for(tmp_path, None), tmp_path / "raw-hub")
    assert {n: r["origin"].split()[0] for n, r in from_mirror.items()} == dict.fromkeys(from_mirror, "mirror")
    assert {n: r["origin"].split()[0] for n, r in from_hub.items()} == dict.fromkeys(from_hub, "hub")
    assert files(tmp_path / "raw-hub") == files(tmp_path / "raw-mirror")
    assert sorted(files(tmp_path / "raw-hub")) == [
        "imdb/.source.json", "imdb/test.jsonl.gz", "imdb/train.jsonl.gz", "imdb/unsup.jsonl.gz",
        "sst2/.source.json", "sst2/test.jsonl.gz", "sst2/train.jsonl.gz", "sst2/validation.jsonl.gz",
        "wikipedia_en/.source.json", "wikipedia_en/test.jsonl.gz", "wikipedia_en/train.jsonl.gz",
        "wikipedia_en/validation.jsonl.gz"]
    unsup = [json.loads(line) for line in gzip.open(tmp_path / "raw-hub" / "imdb" / "unsup.jsonl.gz", "rt")]
    assert {r["label"] for r in unsup} == {None}  # the hub's -1, the mirror's missing label: both null
    assert from_hub["imdb"]["used_by"] == ["corpora.domain", "tasks.imdb"]


def test_a_hub_row_cap_reads_no_more_than_it(tmp_path, monkeypatch):
    rows = tiny_mirror(tmp_path / "mirror")
    fake_hub(tmp_path, rows, monkeypatch)
    params = params_for(tmp_path, None)
    params.corpora.pretrain.max_docs = 10
    params.corpora.pretrain.valid_split = None  # the first 10 articles are all dealt into train
    report = read_all(params, tmp_path / "raw")
    assert sum(report["wikipedia_en"]["rows"].values()) == 10
    assert json.loads((tmp_path / "raw" / "wikipedia_en" / ".source.json").read_text())["identity"]["max_rows"] == 10


def test_offline_without_a_copy_is_one_line_naming_the_dataset_and_the_mirror(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tiny_mirror(tmp_path / "mirror")
    (tmp_path / "mirror" / "sst2" / "train.jsonl.gz").unlink()
    (tmp_path / "mirror" / "sst2" / "validation.jsonl.gz").unlink()
    (tmp_path / "mirror" / "sst2" / "test.jsonl.gz").unlink()
    (tmp_path / "mirror" / "sst2").rmdir()
    with pytest.raises(UserError) as info:
        read_all(params_for(tmp_path, tmp_path / "mirror"), tmp_path / "raw")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"tasks.sst2.source: '{SST2}' has no copy in the mirror and the hub is offline")
    assert f"put a copy in {tmp_path / 'mirror' / 'sst2'} (one <split>.jsonl.gz per split)" in message


def test_a_local_source_is_copied_and_read_again_when_its_content_changes(tmp_path, monkeypatch):
    rows = tiny_mirror(tmp_path / "mirror")
    local = tmp_path / "reviews"
    write_jsonl_gz(local / "train.jsonl.gz", [{"text": "good", "label": 1}, {"text": "bad", "label": 0}])
    write_jsonl_gz(local / "test.jsonl.gz", [{"text": "fine", "label": 1}])
    (local / "README.md").write_text("not data")
    params = params_for(tmp_path, tmp_path / "mirror", sst2=str(local))
    name = raw_name(str(local), "k")
    first = read_all(params, tmp_path / "raw")
    assert first[name]["origin"] == f"local {local}" and first[name]["rows"] == {"test": 1, "train": 2}
    assert (tmp_path / "raw" / name / "train.jsonl.gz").read_bytes() == (local / "train.jsonl.gz").read_bytes()
    assert not (tmp_path / "raw" / name / "README.md").exists()
    assert read_all(params, tmp_path / "raw")[name]["origin"].startswith("kept")
    write_jsonl_gz(local / "test.jsonl.gz", [{"text": "fine", "label": 1}, {"text": "meh", "label": 0}])
    again = read_all(params, tmp_path / "raw")
    assert again[name]["origin"].startswith("local") and again[name]["rows"]["test"] == 2
    assert localize(params, tmp_path / "raw").tasks["sst2"].source == str(tmp_path / "raw" / name)
    assert rows  # the mirror served the other sources


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".txt", ".parquet"])
def test_a_local_source_of_each_format_reads_back_from_data_raw_as_its_splits(tmp_path, suffix):
    """The stages after `data` read data/raw/<name>/ as a local folder: its identity file is not a split."""
    tiny_mirror(tmp_path / "mirror")
    local = tmp_path / "reviews"
    local.mkdir()
    texts = {"test": ["fine"], "train": ["good", "bad"]}
    for split, lines in texts.items():
        path = local / f"{split}{suffix}"
        if suffix == ".txt":
            path.write_text("".join(f"{line}\n" for line in lines))
        elif suffix == ".parquet":
            pq.write_table(pa.Table.from_pylist([{"text": line} for line in lines]), path)
        else:
            write_jsonl_gz(path, [{"text": line} for line in lines])
    params = params_for(tmp_path, tmp_path / "mirror", sst2=str(local))
    read_all(params, tmp_path / "raw")
    source = localize(params, tmp_path / "raw").tasks["sst2"].source
    assert {split: [r["text"] for r in read_records(source, split, "k")] for split in local_files(source, "k")} == texts


def test_a_single_local_file_becomes_split_train(tmp_path):
    tiny_mirror(tmp_path / "mirror")
    corpus = write_jsonl_gz(tmp_path / "my.corpus.jsonl.gz", [{"text": "one"}, {"text": "two"}])
    report = read_all(params_for(tmp_path, tmp_path / "mirror", domain=str(corpus)), tmp_path / "raw")
    assert report[raw_name(str(corpus), "k")]["rows"] == {"train": 2}


def test_names_no_source_uses_are_removed_and_a_name_clash_is_one_line(tmp_path):
    tiny_mirror(tmp_path / "mirror")
    (tmp_path / "raw" / "old").mkdir(parents=True)
    read_all(params_for(tmp_path, tmp_path / "mirror"), tmp_path / "raw")
    assert sorted(p.name for p in (tmp_path / "raw").iterdir()) == ["imdb", "sst2", "wikipedia_en"]
    clash = params_for(tmp_path, tmp_path / "mirror", imdb=IMDB.replace("e6281661", "00000000"))
    with pytest.raises(UserError, match=r"^tasks.imdb.source: .* are both stored as data/raw/imdb; name the same"):
        read_all(clash, tmp_path / "raw")


def test_a_missing_local_source_is_one_line_naming_its_key(tmp_path):
    tiny_mirror(tmp_path / "mirror")
    with pytest.raises(UserError, match=r"^tasks.sst2.source: '/no/such/folder' does not exist$"):
        read_all(params_for(tmp_path, tmp_path / "mirror", sst2="/no/such/folder"), tmp_path / "raw")


def test_a_split_the_source_lacks_is_one_line_naming_the_source_as_params_write_it(tmp_path):
    """Before anything is read, and again when nothing is to be read: the stages after `data` would name
    data/raw's copy (data/raw/reviews-6e346321), which the user never wrote."""
    tiny_mirror(tmp_path / "mirror")
    local = tmp_path / "reviews"
    write_jsonl_gz(local / "train.jsonl.gz", [{"text": "good", "label": 1}])
    write_jsonl_gz(local / "test.jsonl.gz", [{"text": "fine", "label": 1}])
    params = params_for(tmp_path, tmp_path / "mirror", sst2=str(local))
    params.tasks["sst2"].eval_splits = ["validation"]
    message = rf"^tasks.sst2.eval_splits: split 'validation' not in '{re.escape(str(local))}' \(it has: test, train\); "
    with pytest.raises(UserError, match=message):
        read_all(params, tmp_path / "raw")
    assert not any((tmp_path / "raw").iterdir())
    params.tasks["sst2"].eval_splits = ["test"]
    read_all(params, tmp_path / "raw")
    assert up_to_date(params, tmp_path / "raw")
    params.tasks["sst2"].eval_splits = ["validation"]
    with pytest.raises(UserError, match=message):
        up_to_date(params, tmp_path / "raw")
    (tmp_path / "my.csv").write_text("text,label\ngood,1\n")
    with pytest.raises(UserError, match=r"^tasks.sst2.eval_splits: split 'test' not in .*my.csv' \(it has: train\); "
                                        r"a single file is split train alone: give a folder with a file per split"):
        read_all(params_for(tmp_path, tmp_path / "mirror", sst2=str(tmp_path / "my.csv")), tmp_path / "raw")


def test_a_local_file_that_cannot_be_read_is_named_not_its_copy(tmp_path):
    tiny_mirror(tmp_path / "mirror")
    local = tmp_path / "reviews"
    write_jsonl_gz(local / "test.jsonl.gz", [{"text": "fine", "label": 1}])
    whole = gzip.compress(b"".join(b'{"text": "row %d", "label": 1}\n' % i for i in range(5000)))
    (local / "train.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    file = re.escape(str(local / "train.jsonl.gz"))
    with pytest.raises(UserError, match=rf"^tasks.sst2.source: cannot read '{file}' \(EOFError: Compressed file"):
        read_all(params_for(tmp_path, tmp_path / "mirror", sst2=str(local)), tmp_path / "raw")


def test_a_semicolon_separated_local_csv_is_read_so_and_said_naming_the_users_file(tmp_path, capsys):
    """The data stage reads the user's file (to count its rows) before its copy: the delimiter is said of it."""
    tiny_mirror(tmp_path / "mirror")
    local = tmp_path / "reviews"
    local.mkdir()
    for split in ("train", "test"):
        (local / f"{split}.csv").write_text("text;label\ngood, really good;1\nbad;0\n")
    params = params_for(tmp_path, tmp_path / "mirror", sst2=str(local))
    assert read_all(params, tmp_path / "raw")[raw_name(str(local), "k")]["rows"] == {"test": 2, "train": 2}
    assert (f"tasks.sst2.source: '{local / 'train.csv'}' is semicolon-separated, not comma-separated "
            "(its first line is 'text;label'); read so") in capsys.readouterr().out
    source = localize(params, tmp_path / "raw").tasks["sst2"].source
    assert list(read_records(source, "train", "k")) == [{"text": "good, really good", "label": 1},
                                                        {"text": "bad", "label": 0}]


def test_no_network_and_no_copy_is_one_line_before_anything_is_read(tmp_path, monkeypatch):
    """Offline without HF_HUB_OFFLINE set: the hub's first answer fails, and no source is read yet."""
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)

    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "get_dataset_split_names", unreachable)
    tiny_mirror(tmp_path / "mirror")
    for split in ("train", "validation", "test"):
        (tmp_path / "mirror" / "sst2" / f"{split}.jsonl.gz").unlink()
    (tmp_path / "mirror" / "sst2").rmdir()
    with pytest.raises(UserError) as info:
        read_all(params_for(tmp_path, tmp_path / "mirror"), tmp_path / "raw")
    assert str(info.value) == (f"tasks.sst2.source: cannot load '{SST2}' (ConnectionError: Couldn't reach "
                               f"'nyu-mll/glue' on the Hub (LocalEntryNotFoundError)); check the id and revision, or "
                               f"put a copy in {tmp_path / 'mirror' / 'sst2'} (one <split>.jsonl.gz per split)")
    assert not (tmp_path / "raw").exists() or not any((tmp_path / "raw").iterdir())


def test_a_source_read_earlier_needs_neither_mirror_nor_hub(tmp_path, monkeypatch):
    """Offline, with the mirror gone: a local task that changed is read, the hub datasets already in
    data/raw are kept, and nothing asks the hub for them."""
    tiny_mirror(tmp_path / "mirror")
    local = tmp_path / "reviews"
    write_jsonl_gz(local / "train.jsonl.gz", [{"text": "good", "label": 1}])
    write_jsonl_gz(local / "test.jsonl.gz", [{"text": "fine", "label": 1}])
    read_all(params_for(tmp_path, tmp_path / "mirror", sst2=str(local)), tmp_path / "raw")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write_jsonl_gz(local / "train.jsonl.gz", [{"text": "good", "label": 1}, {"text": "bad", "label": 0}])
    report = read_all(params_for(tmp_path, tmp_path / "gone", sst2=str(local)), tmp_path / "raw")
    assert report["imdb"]["origin"].startswith("kept") and report["wikipedia_en"]["origin"].startswith("kept")
    assert report[raw_name(str(local), "k")]["rows"] == {"test": 1, "train": 2}


def test_clean_reads_the_evaluation_texts_the_data_stage_names(tmp_path):
    """data/raw carries what decontamination reads, so clean depends on it through data/raw (and not on
    the whole `tasks` section): another max_len leaves the file as it was, another split changes it."""
    tiny_mirror(tmp_path / "mirror")
    params = params_for(tmp_path, tmp_path / "mirror")
    read_all(params, tmp_path / "raw")
    write_eval_text_spec(params, field_kinds(params.tasks), tmp_path / "raw")
    spec_file = tmp_path / "raw" / EVAL_TEXTS_FILE
    written = spec_file.read_bytes()
    sst2 = params.tasks["sst2"]
    assert read_eval_text_spec(tmp_path / "raw")["sst2"] == {
        "folder": "sst2", "splits": sst2.eval_splits, "fields": {"text_field": sst2.text_field}}
    texts = list(eval_texts(read_eval_text_spec(tmp_path / "raw"), tmp_path / "raw"))
    expected = [row[params.tasks[name].text_field] for name in ("imdb", "sst2")
                for split in params.tasks[name].eval_splits
                for row in read_records(str(tmp_path / "raw" / name), split, "x")]
    assert texts == expected and texts
    params.tasks["sst2"].max_len = 32
    write_eval_text_spec(params, field_kinds(params.tasks), tmp_path / "raw")
    assert spec_file.read_bytes() == written
    params.tasks["sst2"].eval_splits = ["test"]
    write_eval_text_spec(params, field_kinds(params.tasks), tmp_path / "raw")
    assert read_eval_text_spec(tmp_path / "raw")["sst2"]["splits"] == ["test"]
    spec_file.unlink()
    with pytest.raises(UserError, match=r"eval_texts.json: cannot read it .*; run the data stage first"):
        read_eval_text_spec(tmp_path / "raw")


# The hub ids of the task datasets, as params name them (lib/data/raw.py LAYOUTS says where each revision comes from)
HUB_IDS = {"conll2003": "hf:eriktks/conll2003@ce85b39f9dd99f552d0739d456814e95fb6a39b0",
           "squad": "hf:rajpurkar/squad@7b6d24c440a36b6815f21b70d25016731768db1f",
           "squad_v2": "hf:rajpurkar/squad_v2@3ffb306f725f7d2ce8394bc1873b24868140c412",
           "stsb": "hf:mteb/stsbenchmark-sts@b0fddb56ed78048fa8b90373c8a3cfc37b684831",
           "codah": "hf:jaredfern/codah/fold_0@4b0e0e7f33b3ae8cd8e69bcdfa09af9611d8f3bd",
           **{f"stsb_multi_{language}": f"hf:PhilipMay/stsb_multi_mt/{language}@93d57ef91790589e3ce9c365164337a8a78b7632"
              for language in ("de", "fr", "ru")}}


def iob2(tags: list[str]) -> list[str]:
    """IOB1 tags in IOB2 (every chunk starts with B-), as the hub's CoNLL-2003 has its chunk tags."""
    return [f"B-{t[2:]}" if t.startswith("I-") and (i == 0 or tags[i - 1][2:] != t[2:]) else t
            for i, t in enumerate(tags)]


def by_article(rows: list[dict], articles: int, per_article: int) -> list[dict]:
    """The first rows of the first articles of a SQuAD copy's split, in the copy's order."""
    kept: dict[str, list[dict]] = {}
    for row in rows:
        if row["title"] in kept or len(kept) < articles:
            kept.setdefault(row["title"], [])
            if len(kept[row["title"]]) < per_article:
                kept[row["title"]].append(row)
    return [row for article in kept.values() for row in article]


def squad_hub(copy: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """The hub's version of SQuAD copy rows: all of them in its validation split, articles in another order
    (the official one is not by title), without is_impossible, an answer that occurs twice in its context at
    its second occurrence (the official offsets are not always the first), and a train split to ignore."""
    rows = [{k: v for k, v in r.items() if k != "is_impossible"} for split in copy.values() for r in split]
    titles = list(dict.fromkeys(r["title"] for r in rows))[::-1]
    rows = sorted(rows, key=lambda r: titles.index(r["title"]))
    for i, row in enumerate(rows):
        text = next(iter(row["answers"]["text"]), "")
        second = row["context"].find(text, row["context"].find(text) + 1) if text else -1
        if second > 0:
            rows[i] = {**row, "answers": {"text": [text], "answer_start": [second]}}
            rows[i]["answers"]["text"] += row["answers"]["text"][1:]
            rows[i]["answers"]["answer_start"] += row["answers"]["answer_start"][1:]
            break
    else:
        raise AssertionError("no answer occurs twice in these rows")
    train = [{**rows[0], "id": "not-in-the-copy", "title": "Not_read"}]
    return {"train": train, "validation": rows}


def hub_versions(name: str, copy: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Rows of the mirror copy `name` as the hub has them (its field names, splits and values), written
    independently of lib/data/raw.py from each dataset card: this is what LAYOUTS has to undo."""
    from lib.data.raw import CONLL_CHUNK, CONLL_NER, CONLL_POS
    if name == "conll2003":
        return {s: [{"id": r["id"], "tokens": r["tokens"], "pos_tags": [CONLL_POS.index(t) for t in r["pos_tags"]],
                     "chunk_tags": [CONLL_CHUNK.index(t) for t in iob2(r["chunk_tags"])],
                     "ner_tags": [CONLL_NER.index(t) for t in r["ner_tags"]]} for r in rows]
                for s, rows in copy.items()}
    if name in ("squad", "squad_v2"):
        return squad_hub(copy)
    if name == "stsb":
        return {s: [{"split": s, "genre": r["genre"], "dataset": r["filename"], "year": r["year"], "sid": f"{i:04d}",
                     "score": r["label"], "sentence1": r["sentence1"], "sentence2": r["sentence2"]}
                    for i, r in enumerate(rows)] for s, rows in copy.items()}
    if name.startswith("stsb_multi_"):  # validation is the hub's dev
        return {"dev" if s == "validation" else s: [{"sentence1": r["sentence1"], "sentence2": r["sentence2"],
                                                     "similarity_score": r["label"]} for r in rows]
                for s, rows in copy.items()}
    categories = ["Idioms", "Reference", "Polysemy", "Negation", "Quantitative", "Others"]  # the hub's ClassLabel
    letters = {"i": 0, "r": 1, "p": 2, "n": 3, "q": 4, "o": 5, "": -1}  # the TSV's letters, as the script maps them
    assert [c[0].lower() for c in categories] == list("irpnqo")
    return {s: [{"id": r["idx"], "question_category": letters[r["categories"]], "question_propmt": r["startphrase"],
                 "candidate_answers": r["endings"], "correct_answer_idx": r["label"]} for r in rows]
            for s, rows in copy.items()}


def copy_rows(name: str) -> dict[str, list[dict]]:
    """A few real rows of each split of the mirror copy `name` (both kinds of SQuAD v2 question; a CODAH
    question without a category)."""
    splits = {s: SHARED_DATA / name / f"{s}.jsonl.gz" for s in ("train", "validation", "test")}
    splits = {s: path for s, path in splits.items() if path.exists()}
    if name in ("squad", "squad_v2"):
        return {s: by_article(head(path, 400), 3, 6 if name == "squad" else 12) for s, path in splits.items()}
    rows = {s: head(path, 8) for s, path in splits.items()}
    if name == "codah":
        rows["train"] += [r for r in head(splits["train"], 1665) if r["categories"] == ""][:1]
    return rows


@pytest.mark.parametrize("name", sorted(HUB_IDS))
def test_a_task_dataset_read_from_the_hub_gives_its_mirror_rows(name, tmp_path, monkeypatch):
    """The hub's rows (its names, ClassLabel ids, splits, order and offsets) become the mirror copy's rows."""
    from lib.data.raw import Use, fetch
    copy = copy_rows(name)
    if name == "squad_v2":
        assert {r["is_impossible"] for rows in copy.values() for r in rows} == {True, False}
    for split, rows in copy.items():
        write_jsonl_gz(tmp_path / "mirror" / name / f"{split}.jsonl.gz", rows)
    use = Use(HUB_IDS[name], [f"tasks.{name}"], None)
    assert raw_name(use.source, "k") == name
    hub = parse_hub(use.source, "k")
    if name == "conll2003":  # the parquet export: <config>/<split>/0000.parquet, no card, one config
        folder = tmp_path / "hub" / name
        for split, rows in hub_versions(name, copy).items():
            (folder / "conll2003" / split).mkdir(parents=True)
            pq.write_table(pa.Table.from_pylist(rows), folder / "conll2003" / split / "0000.parquet")
        served = (str(folder), None)
    else:
        served = (str(hub_repo(tmp_path / "hub" / name, hub.config, hub_versions(name, copy))), hub.config)
    load, split_names = datasets.load_dataset, datasets.get_dataset_split_names

    def local(repo, config, revision):  # the hub's repo, else `datasets`' own builders (the mirror's json)
        if repo != hub.repo:
            return repo, config
        assert (config, revision) == (hub.config, hub.revision)
        return served

    monkeypatch.setattr(datasets, "load_dataset", lambda repo, config=None, revision=None, **kw:
                        load(*local(repo, config, revision), **kw))
    monkeypatch.setattr(datasets, "get_dataset_split_names", lambda repo, config=None, revision=None:
                        split_names(*local(repo, config, revision)))
    for origin, out in ((f"hub {use.source}", "from-hub"), (f"mirror {tmp_path / 'mirror' / name}", "from-mirror")):
        (tmp_path / out).mkdir()
        assert fetch(use, origin, tmp_path / out) == {s: len(rows) for s, rows in copy.items()}
    assert files(tmp_path / "from-hub") == files(tmp_path / "from-mirror")
    assert {s: head(tmp_path / "from-hub" / f"{s}.jsonl.gz", 10**6) for s in copy} == copy


def test_xquad_is_read_from_the_hub_a_config_per_language(tmp_path, monkeypatch):
    """XQuAD on the hub is a config per language with one split, validation, and no titles; the data stage
    reads each config as the split of its language, and the rows are the mirror copy's without its titles."""
    from lib.data.raw import Use, fetch
    source = "hf:google/xquad@51adfef1c1287aab1d2d91b5bead9bcfb9c68583"
    copy = {language: head(SHARED_DATA / "xquad" / f"{language}.jsonl.gz", 5) for language in ("en", "de", "ru")}
    folder, configs = tmp_path / "hub" / "xquad", []
    for language, rows in copy.items():
        write_jsonl_gz(tmp_path / "mirror" / "xquad" / f"{language}.jsonl.gz", rows)
        path = f"xquad.{language}/validation-00000-of-00001.parquet"
        (folder / f"xquad.{language}").mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist([{k: v for k, v in r.items() if k != "title"} for r in rows]), folder / path)
        configs.append({"config_name": f"xquad.{language}", "data_files": [{"split": "validation", "path": path}]})
    (folder / "README.md").write_text("---\n" + yaml.safe_dump({"configs": configs}) + "---\n")
    load, split_names = datasets.load_dataset, datasets.get_dataset_split_names

    def local(repo, config, revision):  # the hub's repo, else `datasets`' own builders (the mirror's json)
        if repo != "google/xquad":
            return repo, config
        assert config in {f"xquad.{language}" for language in copy} and revision == source.partition("@")[2]
        return str(folder), config

    monkeypatch.setattr(datasets, "load_dataset", lambda repo, config=None, revision=None, **kw:
                        load(*local(repo, config, revision), **kw))
    monkeypatch.setattr(datasets, "get_dataset_split_names", lambda repo, config=None, revision=None:
                        split_names(*local(repo, config, revision)))
    use = Use(source, ["tasks.xquad_de"], None)
    assert raw_name(source, "k") == "xquad"
    for origin, out in ((f"hub {source}", "from-hub"), (f"mirror {tmp_path / 'mirror' / 'xquad'}", "from-mirror")):
        (tmp_path / out).mkdir()
        assert fetch(use, origin, tmp_path / out) == {language: 5 for language in copy}
    assert files(tmp_path / "from-hub") == files(tmp_path / "from-mirror")
    assert head(tmp_path / "from-hub" / "de.jsonl.gz", 5) == [{k: v for k, v in r.items() if k != "title"}
                                                              for r in copy["de"]]


def test_conll_tag_ids_are_read_in_the_order_the_dataset_card_shows():
    """The hub's own example (eriktks/conll2003's card, a training sentence) becomes the copy's row."""
    from lib.data.raw import conll_row
    card = {"chunk_tags": [11, 12, 12, 21, 13, 11, 11, 21, 13, 11, 12, 13, 11, 21, 22, 11, 12, 17, 11, 21, 17, 11, 12,
                           12, 21, 22, 22, 13, 11, 0],
            "ner_tags": [0, 3, 4, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            "pos_tags": [12, 22, 22, 38, 15, 22, 28, 38, 15, 16, 21, 35, 24, 35, 37, 16, 21, 15, 24, 41, 15, 16, 21, 21,
                         20, 37, 40, 35, 21, 7]}
    ours = head(SHARED_DATA / "conll2003" / "train.jsonl.gz", 4)[3]
    assert ours["tokens"][:5] == ["The", "European", "Commission", "said", "on"]
    assert conll_row({"id": ours["id"], "tokens": ours["tokens"], **card}) == ours


def test_the_copies_follow_the_rules_their_layouts_apply():
    """On every row of the copies: SQuAD's article deal, first-occurrence offsets and is_impossible (so the
    conversion leaves a copy's row as it is); CoNLL's chunk tags survive IOB2 and back, NER tags are IOB2."""
    from lib.data.raw import article_split, iob1, squad_row
    for name in ("squad", "squad_v2"):
        for split in ("train", "validation"):
            for row in head(SHARED_DATA / name / f"{split}.jsonl.gz", 10**6):
                assert article_split(row) == split and squad_row(row) == row
    for split in ("train", "validation", "test"):
        for row in head(SHARED_DATA / "conll2003" / f"{split}.jsonl.gz", 10**6):
            assert iob1(iob2(row["chunk_tags"])) == row["chunk_tags"] and iob2(row["ner_tags"]) == row["ner_tags"]


def test_the_evaluation_text_spec_of_classification_tasks_reads_as_before_task_types(tmp_path):
    """The default params' classification tasks' eval_texts.json, byte for byte as the data stage wrote it
    before tasks had a type (its SHA-256 then), so their entries do not change for existing projects."""
    params = load_params(ROOT / "params.yaml", [check_tasks])
    params.tasks = {name: task for name, task in params.tasks.items() if task.type is None}  # classification
    write_eval_text_spec(params, field_kinds(params.tasks), tmp_path)
    written = (tmp_path / EVAL_TEXTS_FILE).read_bytes()
    assert hashlib.sha256(written).hexdigest() == "b48a23a29072196ff2d49933e602c40685a1d064a021a46b90733b97f25dc61c"
    assert b"kinds" not in written


def test_evaluation_texts_of_each_task_type(tmp_path):
    """Tagging's words joined by spaces, span_qa's question and context (not its answers), multiple_choice's
    context alone and followed by each ending, regression's two sentences: read from real mirror rows."""
    tiny_mirror(tmp_path / "mirror")
    copies = {name: copy_rows(name) for name in ("conll2003", "squad", "stsb", "codah")}
    for name, splits in copies.items():
        for split, rows in splits.items():
            write_jsonl_gz(tmp_path / "mirror" / name / f"{split}.jsonl.gz", rows)
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["data"]["mirror"] = str(tmp_path / "mirror")
    raw["corpora"]["pretrain"]["source"], raw["corpora"]["domain"]["source"] = WIKI, IMDB
    raw["tasks"] = {  # imdb and sst2 stay: other sections name them
        "imdb": {**raw["tasks"]["imdb"], "source": IMDB}, "sst2": {**raw["tasks"]["sst2"], "source": SST2},
        "ner": {"source": HUB_IDS["conll2003"], "type": "tagging", "text_field": "tokens", "label_field": "ner_tags"},
        "qa": {"source": HUB_IDS["squad"], "type": "span_qa", "text_field": "question", "text_pair_field": "context",
               "label_field": "answers"},
        "sts": {"source": HUB_IDS["stsb"], "type": "regression", "text_field": "sentence1",
                "text_pair_field": "sentence2", "eval_splits": ["validation", "test"]},
        "choice": {"source": HUB_IDS["codah"], "type": "multiple_choice", "text_field": "startphrase",
                   "text_pair_field": "endings", "eval_splits": ["test"]}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    params = load_params(tmp_path / "params.yaml", [check_tasks])
    read_all(params, tmp_path / "raw")
    write_eval_text_spec(params, field_kinds(params.tasks), tmp_path / "raw")
    spec = {name: task for name, task in read_eval_text_spec(tmp_path / "raw").items()
            if name not in ("imdb", "sst2")}
    assert {name: task.get("kinds") for name, task in spec.items()} == {
        "choice": {"text_pair_field": "endings"}, "ner": {"text_field": "words"}, "qa": None, "sts": None}
    assert spec["ner"] == {"folder": "conll2003", "splits": ["validation"], "fields": {"text_field": "tokens"},
                           "kinds": {"text_field": "words"}}
    expected = {
        "choice": [t for r in copies["codah"]["test"] for t in [r["startphrase"]] +
                   [f"{r['startphrase']} {ending}" for ending in r["endings"]]],
        "ner": [" ".join(r["tokens"]) for r in copies["conll2003"]["validation"]],
        "qa": [t for r in copies["squad"]["validation"] for t in (r["question"], r["context"])],
        "sts": [t for s in ("validation", "test") for r in copies["stsb"][s] for t in (r["sentence1"], r["sentence2"])]}
    assert list(eval_texts(spec, tmp_path / "raw")) == [t for name in sorted(expected) for t in expected[name]]
    assert "The chicken cannot fly. It crosses the road." in list(eval_texts(
        {"choice": {**spec["choice"], "splits": ["train"]}}, tmp_path / "raw"))


@pytest.mark.parametrize("kinds, value, message", [
    ({}, ["EU", "rejects"], "holds list values, not text; name a text field"),
    ({"text_field": "words"}, "EU rejects", "holds str values, not a list of words; name the field of its list of"),
    ({"text_field": "words"}, ["EU", 3], "holds lists of int values, not a list of words"),
])
def test_an_evaluation_field_of_another_type_is_one_line_naming_its_key(tmp_path, kinds, value, message):
    write_jsonl_gz(tmp_path / "raw" / "ner" / "validation.jsonl.gz", [{"tokens": value, "ner_tags": ["O", "O"]}])
    spec = {"ner": {"folder": "ner", "splits": ["validation"], "fields": {"text_field": "tokens"}, "kinds": kinds}}
    with pytest.raises(UserError) as info:
        list(eval_texts(spec, tmp_path / "raw"))
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(f"tasks.ner.text_field: field 'tokens' of '{tmp_path / 'raw' / 'ner'}' split "
                                      f"'validation' {message}")


def test_endings_of_another_type_are_one_line_naming_their_key(tmp_path):
    write_jsonl_gz(tmp_path / "raw" / "mc" / "test.jsonl.gz", [{"startphrase": "He", "endings": "ran.", "label": 0}])
    spec = {"mc": {"folder": "mc", "splits": ["test"], "fields": {"text_field": "startphrase",
                                                                  "text_pair_field": "endings"},
                   "kinds": {"text_pair_field": "endings"}}}
    with pytest.raises(UserError, match=r"^tasks.mc.text_pair_field: field 'endings' of .* split 'test' holds str "
                                        r"values, not a list of endings"):
        list(eval_texts(spec, tmp_path / "raw"))

"""Loading local and hub sources through `datasets`, with one-line errors for bad input."""
import gzip
import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lib.core.errors import UserError
from lib.data.sources import list_splits, read_rows, read_texts
from tests.helpers import SHARED_DATA, write_jsonl_gz


def test_folder_splits_from_file_names(tmp_path):
    write_jsonl_gz(tmp_path / "train.jsonl.gz", [{"text": "a"}])
    write_jsonl_gz(tmp_path / "test_unlabeled.jsonl.gz", [{"text": "b"}])
    assert list_splits(str(tmp_path), "k") == ["test_unlabeled", "train"]


def test_sharded_files_join_one_split(tmp_path):
    write_jsonl_gz(tmp_path / "train-00000.jsonl.gz", [{"text": "a"}])
    write_jsonl_gz(tmp_path / "train-00001.jsonl.gz", [{"text": "b"}])
    assert sorted(read_texts(str(tmp_path), "train", "text", "k")) == ["a", "b"]


def test_parquet_shards_join_one_split(tmp_path):
    for i, text in enumerate("ab"):
        pq.write_table(pa.table({"text": [text]}), tmp_path / f"train-0000{i}-of-00002.parquet")
    assert sorted(read_texts(str(tmp_path), "train", "text", "k")) == ["a", "b"]


@pytest.mark.parametrize("names", [("train.jsonl", "train.jsonl.gz"), ("train.jsonl.gz", "train-00000.jsonl.gz"),
                                   ("train-00000.jsonl", "train-00000.jsonl.gz")])
def test_two_files_of_one_split_that_are_not_shards_are_one_line(tmp_path, names):
    """They were read as one split, every row twice where they held the same rows."""
    for name in names:
        (tmp_path / name).write_bytes(gzip.compress(b'{"text": "a"}\n') if name.endswith(".gz") else b'{"text": "a"}\n')
    with pytest.raises(UserError, match=rf"^tasks.x.source: '{re.escape(str(tmp_path))}' has 2 files for split 'train' "
                                        rf"\({', '.join(sorted(names))}\); keep one, or name its parts as shards"):
        list_splits(str(tmp_path), "tasks.x.source")


def test_single_file_is_train_split(tmp_path):
    path = write_jsonl_gz(tmp_path / "corpus.jsonl.gz", [{"body": "x"}, {"body": "y"}])
    assert list(read_texts(str(path), "train", "body", "k")) == ["x", "y"]


def test_field_mapping_of_pairs():
    row = next(read_rows(str(SHARED_DATA / "mrpc"), "validation", {"a": "text_a", "b": "text_b", "y": "label"}, "k"))
    assert set(row) == {"a", "b", "y"} and isinstance(row["a"], str) and row["y"] in (0, 1)


def test_txt_and_parquet(tmp_path):
    (tmp_path / "txt").mkdir()
    (tmp_path / "txt" / "train.txt").write_text("line one\nline two\n")
    assert list(read_texts(str(tmp_path / "txt"), "train", "text", "k")) == ["line one", "line two"]
    (tmp_path / "pq").mkdir()
    pq.write_table(pa.table({"text": ["p", "q"], "label": [0, 1]}), tmp_path / "pq" / "validation.parquet")
    assert list(read_texts(str(tmp_path / "pq"), "validation", "text", "k")) == ["p", "q"]


def test_csv_tsv_and_a_json_array(tmp_path):
    """Spreadsheet CSV (quoted delimiters and line breaks, gzipped too), TSV and a JSON array of objects."""
    rows = [{"text": "good, really good", "label": 1}, {"text": 'a "quoted"\nline', "label": 0}]
    csv = 'text,label\n"good, really good",1\n"a ""quoted""\nline",0\n'
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "train.csv").write_text(csv)
    with gzip.open(tmp_path / "csv" / "test.csv.gz", "wt") as f:
        f.write(csv)
    (tmp_path / "train.tsv").write_text("text\tlabel\ngood, really good\t1\n")
    (tmp_path / "array.json").write_text(json.dumps(rows))
    for source, split, expected in [(tmp_path / "csv", "train", rows), (tmp_path / "csv", "test", rows),
                                    (tmp_path / "train.tsv", "train", rows[:1]),
                                    (tmp_path / "array.json", "train", rows)]:
        assert list(read_rows(str(source), split, {"text": "text", "label": "label"}, "k")) == expected


def test_max_rows(tmp_path):
    write_jsonl_gz(tmp_path / "train.jsonl.gz", [{"text": str(i)} for i in range(50)])
    assert len(list(read_texts(str(tmp_path), "train", "text", "k", max_rows=7))) == 7


def test_missing_field_names_key_and_fields(tmp_path):
    write_jsonl_gz(tmp_path / "train.jsonl.gz", [{"review": "a"}])
    with pytest.raises(UserError, match=r"corpora.domain.text_field: field 'text' not in .* \(fields: review\)"):
        list(read_texts(str(tmp_path), "train", "text", "corpora.domain.text_field"))


def test_missing_split_lists_available(tmp_path):
    write_jsonl_gz(tmp_path / "train.jsonl.gz", [{"text": "a"}])
    with pytest.raises(UserError, match=r"split 'validation' not in .* \(it has: train\)"):
        list(read_texts(str(tmp_path), "validation", "text", "k"))


def test_empty_file(tmp_path):
    (tmp_path / "train.jsonl").write_text("")
    with pytest.raises(UserError, match="is empty"):
        list(read_texts(str(tmp_path), "train", "text", "k"))


def test_no_rows(tmp_path):
    with gzip.open(tmp_path / "train.jsonl.gz", "wt") as f:
        f.write("")
    with pytest.raises(UserError, match="has no rows"):
        list(read_texts(str(tmp_path), "train", "text", "k"))


def test_non_utf8_bytes_become_replacement_chars(tmp_path):
    (tmp_path / "train.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "bad \xff\xfe"}\n{"text": "fine"}\n')
    texts = list(read_texts(str(tmp_path), "train", "text", "k"))
    assert texts[0] == "ok" and "\ufffd" in texts[1] and texts[2] == "fine"


def test_broken_json_is_one_line(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(UserError) as info:
        list(read_texts(str(tmp_path), "train", "text", "corpora.pretrain"))
    assert str(info.value).startswith("corpora.pretrain: cannot read") and "\n" not in str(info.value)


def test_an_unreadable_file_is_named(tmp_path):
    whole = gzip.compress(b"".join(b'{"text": "row %d"}\n' % i for i in range(5000)))
    (tmp_path / "train.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(UserError, match=rf"^k: cannot read '{re.escape(str(tmp_path / 'train.jsonl.gz'))}' \(EOFError"):
        list(read_texts(str(tmp_path), "train", "text", "k"))


def test_non_text_field(tmp_path):
    write_jsonl_gz(tmp_path / "train.jsonl.gz", [{"text": 3}])
    with pytest.raises(UserError, match="holds int values, not text"):
        list(read_texts(str(tmp_path), "train", "text", "k"))


def test_mixed_formats_rejected(tmp_path):
    write_jsonl_gz(tmp_path / "train.jsonl.gz", [{"text": "a"}])
    (tmp_path / "test.txt").write_text("b\n")
    with pytest.raises(UserError, match=r"mixes file formats \(json, text\)"):
        list_splits(str(tmp_path), "k")
    (tmp_path / "test.txt").unlink()
    (tmp_path / "train.jsonl.gz").unlink()
    (tmp_path / "train.csv").write_text("text\na\n")
    (tmp_path / "test.tsv").write_text("text\nb\n")
    with pytest.raises(UserError, match=r"mixes file formats \(csv, tsv\)"):
        list_splits(str(tmp_path), "k")


def test_hub_path_with_locally_built_dataset(tmp_path):
    """The hf: path goes through datasets.load_dataset by name; a local repo folder needs no network."""
    repo = tmp_path / "my_dataset"
    write_jsonl_gz(repo / "train.jsonl.gz", [{"sentence": "great film", "label": 1}])
    write_jsonl_gz(repo / "test.jsonl.gz", [{"sentence": "dull", "label": 0}])
    source = f"hf:{repo}"
    assert sorted(list_splits(source, "k")) == ["test", "train"]
    assert list(read_rows(source, "test", {"text": "sentence", "label": "label"}, "k")) == [{"text": "dull", "label": 0}]


def test_unreachable_hub_dataset_is_one_line():
    with pytest.raises(UserError, match=r"tasks.x.source: cannot load 'hf:no_such_dataset_here'"):
        list_splits("hf:no_such_dataset_here", "tasks.x.source")

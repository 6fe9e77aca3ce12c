"""Loading local and hub sources through `datasets`, with one-line errors for bad input."""
import gzip
import json
import re
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lib.config.errors import UserError
from lib.data.sources import drop_undecodable, list_splits, read_rows, read_texts
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


def test_a_semicolon_separated_csv_is_read_so_and_said_once(tmp_path, capsys):
    """As a spreadsheet saves it where the decimal mark is a comma; its texts hold commas."""
    (tmp_path / "train.csv").write_text('review;sentiment\ngood, really good;positive\n"bad; awful";negative\n')
    for _ in range(2):  # every stage reads a split more than once: the delimiter is said once
        assert list(read_rows(str(tmp_path), "train", {"text": "review", "label": "sentiment"}, "tasks.x.source")) == [
            {"text": "good, really good", "label": "positive"}, {"text": "bad; awful", "label": "negative"}]
    assert capsys.readouterr().out == (f"tasks.x.source: '{tmp_path / 'train.csv'}' is semicolon-separated, not "
                                       "comma-separated (its first line is 'review;sentiment'); read so\n")


@pytest.mark.parametrize("name, text", [("train.tsv", "text|label\na|1\nb, c|0\n"),
                                        ("train.csv.gz", "text\tlabel\na\t1\nb; c\t0\n")])
def test_a_tsv_or_gzipped_csv_of_another_delimiter_is_read_so(tmp_path, capsys, name, text):
    path = tmp_path / name
    path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    assert list(read_rows(str(tmp_path), "train", {"text": "text", "label": "label"}, "k")) == [
        {"text": "a", "label": 1}, {"text": text.split("\n")[2][:4], "label": 0}]
    assert "-separated, not" in capsys.readouterr().out


def test_a_comma_csv_whose_texts_hold_other_delimiters_stays_comma_separated(tmp_path, capsys):
    (tmp_path / "train.csv").write_text("text,label\na; b; c|d,1\n\"e, f; g\",0\nh\tj;,1\n")
    assert [r["text"] for r in read_rows(str(tmp_path), "train", {"text": "text"}, "k")] == ["a; b; c|d", "e, f; g",
                                                                                            "h\tj;"]
    (tmp_path / "train.csv").write_text("text\nsolo; one\nsolo; two\n")  # one column: nothing splits its header
    assert [r["text"] for r in read_rows(str(tmp_path), "train", {"text": "text"}, "k")] == ["solo; one", "solo; two"]
    assert capsys.readouterr().out == ""


def test_a_csv_that_parses_by_no_delimiter_is_one_line_showing_its_first_line(tmp_path, capfd):
    """The sniffer finds no delimiter that splits the first line: comma-separated it is, and the row with an
    unquoted comma stops the read in one line, not in pandas' alone ("Expected 1 fields in line 3, saw 2")."""
    (tmp_path / "train.csv").write_text("text\nfine\nhello, world\n")
    with pytest.raises(UserError) as info:
        list(read_texts(str(tmp_path), "train", "text", "tasks.x.source"))
    assert str(info.value).startswith(f"tasks.x.source: '{tmp_path / 'train.csv'}' does not parse as comma-separated "
                                      "(ParserError: ") and "its first line is 'text': " in str(info.value)
    assert "\n" not in str(info.value) and capfd.readouterr().err == ""  # nor `datasets`' own log line


def test_undecodable_rows_are_dropped_and_counted(tmp_path):
    """A Latin-1 file: its rows with accents are what decoding mangled; the others are kept as they are."""
    (tmp_path / "train.csv").write_bytes("text,label\ncafé,1\nplain,0\nfine,1\nalso fine,0\n".encode("latin-1"))
    skipped = Counter()
    rows = list(drop_undecodable(read_rows(str(tmp_path), "train", {"text": "text"}, "k"), str(tmp_path), "train",
                                 "k", skipped))
    assert [r["text"] for r in rows] == ["plain", "fine", "also fine"] and skipped == {"undecodable": 1}


def test_a_replacement_character_in_a_utf8_file_is_the_texts_own_and_kept(tmp_path):
    write_jsonl_gz(tmp_path / "train.jsonl.gz", [{"text": "copied from a mangled page \ufffd"}, {"text": "plain"}])
    skipped = Counter()
    rows = list(drop_undecodable(read_rows(str(tmp_path), "train", {"text": "text"}, "k"), str(tmp_path), "train",
                                 "k", skipped))
    assert len(rows) == 2 and not skipped


def test_a_file_mostly_undecodable_is_one_line_naming_it_and_the_fix(tmp_path):
    lines = [{"text": "« %d »" % i, "words": ["ok", "é"]} for i in range(3)] + [{"text": "ascii", "words": ["ok"]}]
    (tmp_path / "train.jsonl").write_bytes("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines)
                                           .encode("latin-1"))
    with pytest.raises(UserError, match=rf"^tasks.x.source: '{re.escape(str(tmp_path / 'train.jsonl'))}' is not UTF-8: "
                                        r"3 of 4 rows of split 'train' hold bytes that do not decode; re-save the "
                                        r"source's train.jsonl as UTF-8 \(from Latin-1: iconv -f latin1 -t utf-8 "
                                        r"train.jsonl > utf8.jsonl, then replace train.jsonl with utf8.jsonl\)"):
        list(drop_undecodable(read_rows(str(tmp_path), "train", {"words": "words"}, "k"), str(tmp_path), "train",
                              "tasks.x.source", Counter()))

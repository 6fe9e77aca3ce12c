"""The cleaned-corpus files: identical documents give identical bytes, so DVC sees no change."""
import gzip
import json
import time

from lib.corpus import JsonlWriter


def write(path, texts):
    writer = JsonlWriter(path)
    for text in texts:
        writer.write(text)
    writer.close()
    return path.read_bytes()


def test_same_documents_same_bytes(tmp_path):
    texts = ["first document", "zweites Dokument ü"]
    first = write(tmp_path / "a.jsonl.gz", texts)
    time.sleep(1.1)  # a gzip header with the mtime would now differ
    assert write(tmp_path / "b.jsonl.gz", texts) == first
    with gzip.open(tmp_path / "a.jsonl.gz", "rt", encoding="utf-8") as f:
        assert [json.loads(line)["text"] for line in f] == texts

"""Atomic outputs: all or nothing, with ordinary permissions; deterministic JSON-lines files."""
import gzip
import json
import os
import stat
import time

import pytest

from lib.io import JsonlGzWriter, atomic_dir, atomic_file, write_json


def test_atomic_dir_replaces_whole_or_not_at_all(tmp_path):
    out = tmp_path / "out"
    with atomic_dir(out) as tmp:
        (tmp / "a").write_text("1")
    with pytest.raises(RuntimeError):
        with atomic_dir(out) as tmp:
            (tmp / "b").write_text("2")
            raise RuntimeError("killed half way")
    assert sorted(p.name for p in out.iterdir()) == ["a"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary left behind


def test_atomic_file_keeps_old_content_on_failure(tmp_path):
    path = tmp_path / "m.json"
    write_json(path, {"x": 1})
    with pytest.raises(ValueError):
        with atomic_file(path) as f:
            f.write("partial")
            raise ValueError
    assert path.read_text() == '{\n  "x": 1\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]


def test_outputs_get_umask_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        write_json(tmp_path / "m.json", {})
        with atomic_dir(tmp_path / "d") as tmp:
            (tmp / "w.safetensors").touch(mode=0o600)  # as safetensors writes its files
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "m.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "d" / "w.safetensors").stat().st_mode) == 0o644


def test_jsonl_gz_writer_gives_the_same_bytes_for_the_same_rows(tmp_path):
    """No name or mtime in the gzip header: identical rows make identical files, so DVC sees no change."""
    rows = [{"text": "first document"}, {"text": "zweites Dokument ü", "label": None}]

    def write(path):
        with JsonlGzWriter(path) as writer:
            for row in rows:
                writer.write(row)
        return path.read_bytes()

    first = write(tmp_path / "a.jsonl.gz")
    time.sleep(1.1)  # a gzip header with the mtime would now differ
    assert write(tmp_path / "b.jsonl.gz") == first
    with gzip.open(tmp_path / "a.jsonl.gz", "rt", encoding="utf-8") as f:
        assert [json.loads(line) for line in f] == rows


def test_jsonl_gz_writer_leaves_nothing_on_failure(tmp_path):
    with pytest.raises(RuntimeError):
        with JsonlGzWriter(tmp_path / "a.jsonl.gz") as writer:
            writer.write({"text": "x"})
            raise RuntimeError("stop")
    assert list(tmp_path.iterdir()) == []

"""Atomic outputs: all or nothing, with ordinary permissions, no leftovers; outputs checked writable first;
deterministic JSON-lines files; weight files that store a tied tensor once."""
import gzip
import json
import os
import stat
import subprocess
import sys
import time

import pytest
import torch
from safetensors import safe_open

from lib.config.errors import UserError
from lib.core.io import (JsonlGzWriter, atomic_dir, atomic_file, check_writable, read_safetensors, write_json,
                         write_safetensors)
from tests.helpers import read_only_folder


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
        write_safetensors(tmp_path / "w.safetensors", {"x": torch.zeros(1)})
        with atomic_dir(tmp_path / "d") as tmp:
            (tmp / "w.safetensors").touch(mode=0o600)  # as safetensors writes its files
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "m.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "w.safetensors").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "d" / "w.safetensors").stat().st_mode) == 0o644


def test_a_tied_tensor_is_stored_once_and_read_back_under_each_name(tmp_path):
    embeddings = torch.randn(4, 3)
    tensors = {"head.weight": embeddings, "embeddings.weight": embeddings, "bias": torch.arange(3.0),
               "empty.a": torch.zeros(0), "empty.b": torch.zeros(0)}
    write_safetensors(tmp_path / "w.safetensors", tensors, {"format": "pt"})
    with safe_open(tmp_path / "w.safetensors", "pt") as f:  # as safetensors.torch.save_model stores it
        assert sorted(f.keys()) == ["bias", "embeddings.weight", "empty.a", "empty.b"]
        assert f.metadata() == {"format": "pt", "head.weight": "embeddings.weight"}
    back = read_safetensors(tmp_path / "w.safetensors")
    assert back.keys() == tensors.keys() and all(torch.equal(back[k], v) for k, v in tensors.items())
    assert back["head.weight"] is back["embeddings.weight"]


def test_a_missing_or_truncated_weight_file_is_one_line_naming_it(tmp_path):
    path = tmp_path / "w.safetensors"
    with pytest.raises(UserError, match=f"^{path}: not found"):
        read_safetensors(path)
    write_safetensors(path, {"x": torch.zeros(8)})
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(UserError, match=f"^{path}: not a readable safetensors file \\(SafetensorError") as info:
        read_safetensors(path)
    assert "\n" not in str(info.value)


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


def dead_pid() -> int:
    """The id of a process that has ended (and been reaped): no process has it now, barring reuse."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def write_dir(path):
    with atomic_dir(path) as tmp:
        (tmp / "a").write_text("1")


@pytest.mark.parametrize("write", [write_dir, lambda path: write_json(path, {})], ids=["atomic_dir", "atomic_file"])
def test_leftovers_of_a_killed_writer_are_removed_and_a_live_ones_kept(tmp_path, write):
    """A stage killed while writing leaves its temporary (and the output it was replacing) beside the
    output; the next write removes them, but never those of a process that is still writing."""
    dead, live = dead_pid(), os.getpid()
    for name in (f".out.tmp-{dead}-x1y2z3", f".out.old-{dead}", f".out.tmp-{live}-a1b2c3", f".out.old-{live}",
                 ".out.tmp-abc", f".other.tmp-{dead}-q"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "weights.bin").write_bytes(b"x" * 100)
    (tmp_path / f".out.tmp-{dead}-file").write_text("a killed atomic_file's temporary")
    write(tmp_path / "out")
    assert {p.name for p in tmp_path.iterdir()} == {
        "out", f".out.tmp-{live}-a1b2c3", f".out.old-{live}",  # a live writer's
        ".out.tmp-abc", f".other.tmp-{dead}-q"}  # no process id; another output's
    assert (tmp_path / f".out.tmp-{live}-a1b2c3" / "weights.bin").exists()


def test_check_writable_names_the_output_and_the_folder_that_refuses_it(tmp_path, monkeypatch):
    with read_only_folder(tmp_path / "locked", monkeypatch) as locked:
        check_writable(tmp_path / "m.json", tmp_path / "new" / "deeper" / "model")  # folders still to create
        for output in (locked / "models" / "pretrain", locked / "m.json"):
            with pytest.raises(UserError) as err:
                check_writable(tmp_path / "m.json", output)
            assert str(err.value) == (f"cannot write {output}: permission denied on {locked}; fix its permissions "
                                      "or point the stage elsewhere")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(UserError, match=r"a-file is a file, not a folder; point the stage elsewhere"):
        check_writable(tmp_path / "a-file" / "m.json")
    assert {p.name for p in tmp_path.rglob("*")} == {"locked", "a-file"}  # the checks leave nothing behind

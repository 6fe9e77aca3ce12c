"""Small helpers shared by the tests."""
import contextlib
import errno
import gzip
import json
import os
import tempfile
from pathlib import Path
from typing import Iterator

import yaml

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


def write_jsonl_gz(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def write_params(path: Path, params: dict) -> Path:
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


@contextlib.contextmanager
def read_only_folder(locked: Path, monkeypatch) -> Iterator[Path]:
    """Folder `locked`, mode 0o555 while in the block. Root ignores permission bits (the suite may run
    as root, e.g. in a container): there, creating a file in it is made to fail as it would for others."""
    locked.mkdir()
    locked.chmod(0o555)
    if os.geteuid() == 0:
        create = tempfile.NamedTemporaryFile

        def denied_in_locked(*args, dir=None, **kwargs):
            if dir is not None and Path(dir) == locked:
                raise PermissionError(errno.EACCES, "Permission denied", str(locked / "tmpfile"))
            return create(*args, dir=dir, **kwargs)

        monkeypatch.setattr(tempfile, "NamedTemporaryFile", denied_in_locked)
    try:
        yield locked
    finally:
        locked.chmod(0o755)


def stub_tokenizer_dir(folder: Path) -> Path:
    """A tokenizer folder as far as saving a classifier reads it: tokenizer.json (copied along, never
    parsed) and the special token ids (ids 0..4, as the pipeline's tokenizers have them)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text("{}")
    specials = {role: {"token": f"[{role}]", "id": i} for i, role in enumerate(["pad", "unk", "bos", "eos", "mask"])}
    (folder / "tokenizer_meta.json").write_text(json.dumps({"special_tokens": specials}))
    return folder

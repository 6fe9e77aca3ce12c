"""Outputs and streams. Outputs are atomic: everything is written to a temporary sibling and renamed
into place, so a killed or failed stage never leaves a half-written file or folder behind."""
from __future__ import annotations

import contextlib
import csv
import gzip
import io
import itertools
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence, TypeVar

T = TypeVar("T")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary folder beside `path`; on success it replaces `path` whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    tmp.chmod(0o777 & ~_umask())  # mkdtemp makes it owner-only; outputs get the usual permissions
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for file in tmp.rglob("*"):  # some writers (safetensors) create owner-only files
        if file.is_file():
            file.chmod(0o666 & ~_umask())
    if path.exists():
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w", **kwargs: Any) -> Iterator[Any]:
    """Open a temporary sibling of `path` for writing; on success rename it to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it owner-only; outputs get the usual permissions
    try:
        with open(tmp, mode, **kwargs) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: str | Path, obj: Any) -> None:
    with atomic_file(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def write_csv(path: str | Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """A CSV file (DVC plots, MLflow artifacts) with `header` as its first row, written atomically."""
    with atomic_file(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def batched(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Lists of `size` items (the last may be shorter), read lazily; itertools.batched needs Python 3.12."""
    iterator = iter(items)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


class JsonlGzWriter:
    """Streams rows (dicts) as JSON lines into a gzip file, written atomically; a context manager.
    Deterministic bytes: no file name and a zero mtime in the gzip header, so the same rows give the
    same file and a rerun of the stage that writes it does not make DVC rerun the stages after it.
    Level 1: these are working files, speed matters more than size."""

    def __init__(self, path: str | Path):
        self.rows = 0
        self._target = atomic_file(path, "wb")
        self._raw = self._target.__enter__()
        self._file = io.TextIOWrapper(gzip.GzipFile(filename="", mode="wb", compresslevel=1, fileobj=self._raw,
                                                    mtime=0), encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        self._file.write(json.dumps(row, ensure_ascii=False))
        self._file.write("\n")
        self.rows += 1

    def __enter__(self) -> JsonlGzWriter:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._file.close()  # flushes gzip's trailer into the temporary file, which stays open
        self._target.__exit__(*exc_info)


def project_root() -> Path:
    """DVC_ROOT under DVC (the original project, also for a queued experiment that DVC runs in a
    temporary copy), else the nearest folder holding dvc.yaml, else the working directory."""
    if os.environ.get("DVC_ROOT"):
        return Path(os.environ["DVC_ROOT"]).resolve()
    here = Path.cwd().resolve()
    return next((p for p in (here, *here.parents) if (p / "dvc.yaml").exists()), here)

"""Outputs and streams. Outputs are atomic: everything is written to a temporary sibling and renamed
into place, so a killed or failed stage never leaves a half-written file or folder behind. A killed
stage does leave its temporary sibling: the temporary's name carries the writing process's id, and
the next write of the same output removes those whose process is gone."""
from __future__ import annotations

import contextlib
import csv
import gzip
import hashlib
import io
import itertools
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence, TypeVar

import safetensors
import safetensors.torch
import torch

from lib.config.errors import UserError
from lib.core.errors import DENIED, describe, stop_if_interrupted

T = TypeVar("T")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists on this machine (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user's process
        pass
    return True


def _temporary_prefix(path: Path) -> str:
    """The start of the names of `path`'s temporary siblings written by this process."""
    return f".{path.name}.tmp-{os.getpid()}-"


def _writer_pid(name: str, path: Path) -> int | None:
    """The process id in `name` when it names a temporary (`.<name>.tmp-<pid>-*`) or a replaced
    (`.<name>.old-<pid>`) sibling of `path`, else None."""
    for start in (f".{path.name}.tmp-", f".{path.name}.old-"):
        if name.startswith(start):
            pid = name[len(start):].split("-")[0]
            return int(pid) if pid.isdigit() else None
    return None


def remove_dead_leftovers(path: Path) -> None:
    """Remove the temporary and replaced siblings of `path` that a killed process left. One whose
    process still runs is kept: it may be writing `path` now."""
    for sibling in path.parent.iterdir():
        pid = _writer_pid(sibling.name, path)
        if pid is None or process_alive(pid):
            continue
        if sibling.is_dir():
            shutil.rmtree(sibling, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                sibling.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary folder beside `path`; on success it replaces `path` whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_leftovers(path)
    tmp = Path(tempfile.mkdtemp(prefix=_temporary_prefix(path), dir=path.parent))
    tmp.chmod(0o777 & ~_umask())  # mkdtemp makes it owner-only; outputs get the usual permissions
    try:
        yield tmp
        stop_if_interrupted()  # after Ctrl-C no output is put in place, even where a library swallowed it
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
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield the name of an empty temporary sibling of `path`, for a writer that takes a file name; on
    success it is renamed to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_leftovers(path)
    fd, tmp = tempfile.mkstemp(prefix=_temporary_prefix(path), dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        stop_if_interrupted()
        # mkstemp makes it owner-only, and so do some writers (safetensors); outputs get the usual permissions
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w", **kwargs: Any) -> Iterator[Any]:
    """Open a temporary sibling of `path` for writing; on success rename it to `path`."""
    with atomic_path(path) as tmp, open(tmp, mode, **kwargs) as f:
        yield f


def check_writable(*paths: str | Path) -> None:
    """Stop a stage before any work when one of its outputs cannot be written, rather than with a
    traceback after it. An output is written as a temporary sibling renamed into place, or into the
    output folder where it exists: the folder that holds it (its nearest existing ancestor) and an
    existing output folder must take a new file. Tried by creating and removing one, so permission
    bits, ACLs and read-only mounts all count."""
    for path in map(Path, paths):
        holder = next(p for p in path.parents if p.exists())
        if not holder.is_dir():
            raise UserError(f"cannot write {path}: {holder} is a file, not a folder; point the stage elsewhere")
        for folder in ([path] if path.is_dir() else []) + [holder]:
            try:
                with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
                    pass
            except OSError as err:
                if err.errno not in DENIED:
                    raise
                raise UserError(f"cannot write {path}: {err.strerror.lower()} on {folder}; fix its permissions or "
                                "point the stage elsewhere") from None


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, read in blocks (weights and datasets can be large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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


def write_safetensors(path: str | Path, tensors: Mapping[str, torch.Tensor],
                      metadata: dict[str, str] | None = None) -> None:
    """`tensors` (on any device) as the safetensors file `path`, written atomically: the one writer of
    weight files. Names of one tensor (tied weights) store it once, under the first of them in sorted
    order, and the metadata maps each other name to it: what safetensors.torch.save_model wrote, byte
    for byte. read_safetensors gives every name back."""
    stored, metadata = {}, dict(metadata or {})
    first: dict[tuple, str] = {}  # where a tensor's values lie -> the name it is stored under
    for name in sorted(tensors):
        tensor = tensors[name]
        place = (tensor.device, tensor.data_ptr(), tensor.dtype, tensor.shape, tensor.stride())
        if tensor.numel() and place in first:  # (an empty tensor has no memory to share)
            metadata.setdefault(name, first[place])
        else:
            first[place] = name
            stored[name] = tensor.contiguous().cpu()
    with atomic_path(path) as tmp:
        safetensors.torch.save_file(stored, str(tmp), metadata or None)


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file `path`, in CPU memory, under every name write_safetensors was
    given (a tied tensor under each of its names); a missing, truncated or corrupt file ends in one
    line naming it."""
    try:
        with safetensors.safe_open(str(path), "pt") as f:
            tensors = {name: f.get_tensor(name) for name in f.keys()}
            metadata = f.metadata() or {}
    except FileNotFoundError:
        raise UserError(f"{path}: not found; point at a folder the pipeline wrote whole") from None
    except (safetensors.SafetensorError, OSError) as err:
        raise UserError(f"{path}: not a readable safetensors file ({describe(err)}); "
                        "write or download it again") from None
    tied = {name: tensors[kept] for name, kept in metadata.items() if kept in tensors and name not in tensors}
    return {**tensors, **tied}


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

"""Read rows from a data source through `datasets`, streaming.

A source is a local file or folder of .jsonl/.json/.txt/.csv/.tsv (optionally .gz) or .parquet files, or a
hub dataset written `hf:<org>/<name>[/<config>][@<revision>]` (e.g. `hf:nyu-mll/glue/sst2@bcdcba7`).
In a folder, a file's split is its name up to the first dot (`train.jsonl.gz` -> train; shards
`train-00001.parquet` join split train, and only shards: two other files of one split are an error;
hidden files are skipped); a single file is split `train`.
A .json file holds JSON Lines or one array of objects; a CSV or TSV file's first line names its fields,
and a field with the delimiter, a quote or a line break in it is quoted ("a, b"), as spreadsheets write
it. Rows are streamed, never loaded whole, and fields are mapped by name. The stages read local folders
only: the `data` stage (lib/data/raw.py) reads hub sources into data/raw first.

Undecodable bytes in a text file become U+FFFD instead of stopping the read; the clean stage then
drops those documents and counts them as `undecodable`.
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from lib.config.params import HUB_PREFIX, LOCAL_SUFFIXES
from lib.core.errors import UserError, describe

# a data file's format by its suffix (less .gz), which names the `datasets` builder that reads it (TSV: csv)
FORMATS = {".jsonl": "json", ".json": "json", ".txt": "text", ".csv": "csv", ".tsv": "tsv", ".parquet": "parquet"}
SHARD_SUFFIX = re.compile(r"-\d+(-of-\d+)?$")
READ_BATCH = 1000


def data_suffix(path: Path) -> str | None:
    name = path.name.lower()
    return next((s for s in LOCAL_SUFFIXES if name.endswith(s)), None)


def _format(suffix: str) -> str:
    return FORMATS[suffix.removesuffix(".gz")]


def local_files(source: str, key: str) -> dict[str, list[str]]:
    """Split name -> data files of a local source. Raises UserError naming `key` on a bad source."""
    path = Path(source)
    if path.is_file():
        candidates = [path]
    elif path.is_dir():
        # hidden files are never data: the data stage's .source.json, macOS's ._train.jsonl
        candidates = sorted(p for p in path.iterdir() if p.is_file() and data_suffix(p) and not p.name.startswith("."))
    else:
        raise UserError(f"{key}: '{source}' does not exist")
    if not candidates or not data_suffix(candidates[0]):
        raise UserError(f"{key}: no {'/'.join(LOCAL_SUFFIXES)} files in '{source}'")
    formats = {_format(data_suffix(p)) for p in candidates}
    if len(formats) > 1:
        raise UserError(f"{key}: '{source}' mixes file formats ({', '.join(sorted(formats))}); keep one per source")
    splits: dict[str, list[Path]] = defaultdict(list)
    for p in candidates:
        if p.stat().st_size == 0:
            raise UserError(f"{key}: '{p}' is empty; remove it or fill it")
        splits["train" if path.is_file() else SHARD_SUFFIX.sub("", _stem(p))].append(p)
    for split, paths in splits.items():
        stems = [_stem(p) for p in paths]
        # only shards join a split: train.jsonl beside train.jsonl.gz is most likely one split saved twice
        if len(paths) > 1 and (len(set(stems)) < len(stems) or not all(SHARD_SUFFIX.search(s) for s in stems)):
            raise UserError(f"{key}: '{source}' has {len(paths)} files for split '{split}' "
                            f"({', '.join(p.name for p in paths)}); keep one, or name its parts as shards "
                            f"({split}-00000, {split}-00001, ...)")
    return {split: [str(p) for p in paths] for split, paths in splits.items()}


def _stem(path: Path) -> str:
    """A data file's name without its data suffix: train-00001.jsonl.gz -> train-00001."""
    return path.name[: -len(data_suffix(path))]


def list_splits(source: str, key: str) -> list[str]:
    if source.startswith(HUB_PREFIX):
        import datasets

        hub = parse_hub(source, key)
        try:
            return list(datasets.get_dataset_split_names(hub.repo, hub.config, revision=hub.revision))
        except Exception as err:  # network, unknown dataset, gated: all surface as one line
            raise UserError(f"{key}: cannot load '{source}' ({describe(err)})") from None
    return sorted(local_files(source, key))


@dataclass(frozen=True)
class HubId:
    repo: str  # org/name, or a legacy name without an org
    config: str | None
    revision: str | None  # a commit, branch or tag; None = the default branch

    def __str__(self) -> str:
        return HUB_PREFIX + "/".join(filter(None, (self.repo, self.config))) + (f"@{self.revision}" if self.revision else "")


def parse_hub(source: str, key: str) -> HubId:
    """hf:org/name[/config][@revision] -> HubId, by position alone: no request to the hub, so an id
    reads the same offline (`hf:stanfordnlp/imdb` is repo stanfordnlp/imdb, never dataset stanfordnlp
    with config imdb). A single name (`hf:imdb`) is a legacy id without an org. A local folder laid
    out as a hub dataset repo (`hf:/path/to/repo`) is taken whole."""
    spec, _, revision = source[len(HUB_PREFIX):].partition("@")
    if spec.strip("/") and Path(spec).is_dir():
        return HubId(spec, None, revision or None)
    parts = spec.strip("/").split("/")
    if not all(parts) or (source.count("@") and not revision):
        raise UserError(f"{key}: '{source}' is not a hub id; write hf:<org>/<name>[/<config>][@<revision>]")
    return HubId("/".join(parts[:2]), "/".join(parts[2:]) or None, revision or None)


def _open(source: str, split: str, key: str):
    import datasets

    if source.startswith(HUB_PREFIX):
        hub = parse_hub(source, key)
        return datasets.load_dataset(hub.repo, hub.config, revision=hub.revision, split=split, streaming=True)
    files = local_files(source, key)
    if split not in files:
        raise UserError(f"{key}: split '{split}' not in '{source}' (it has: {', '.join(sorted(files))})")
    builder = _format(data_suffix(Path(files[split][0])))
    options = {}
    if builder == "tsv":
        builder, options = "csv", {"sep": "\t"}
    if builder != "parquet":
        # `json` decodes with errors='replace' only for an encoding other than the literal "utf-8",
        # so "utf8" (the same codec) is how undecodable bytes become U+FFFD instead of an exception.
        options = {**options, "encoding": "utf8", "encoding_errors": "replace"}
    return datasets.load_dataset(builder, data_files={split: files[split]}, split=split, streaming=True, **options)


def _batches(source: str, split: str, key: str) -> Iterator[dict[str, list]]:
    """Column batches of `split`, with any error of `datasets`/pyarrow deep inside turned into one
    UserError line that names `key` and the source."""
    try:
        yield from _open(source, split, key).iter(batch_size=READ_BATCH)
    except UserError:
        raise
    except StopIteration:  # how datasets' json reader reports a file without a single row
        return
    except Exception as err:
        raise UserError(f"{key}: cannot read {_shown_split(source, split, key)} ({describe(err)})") from None


def _shown_split(source: str, split: str, key: str) -> str:
    """How an error names a split: its file where it is one local file, else the source and the split."""
    if not source.startswith(HUB_PREFIX):
        files = local_files(source, key).get(split, [])
        if len(files) == 1:
            return f"'{files[0]}'"
    return f"'{source}' split '{split}'"


def read_rows(source: str, split: str, fields: dict[str, str], key: str, max_rows: int | None = None,
              field_keys: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
    """Yield {name: row[field]} for each row of `split`. `fields` maps output names to source fields,
    e.g. {"text": "review"}; `key` is the params key named in errors, `field_keys` the one that sets
    each field (by output name; default `key`). Raises UserError on a missing split or field, an
    empty split, or a source `datasets` cannot read."""
    for n, record in enumerate(read_records(source, split, key, max_rows)):
        if n == 0:
            missing = [name for name, f in fields.items() if f not in record]
            if missing:
                raise UserError(f"{(field_keys or {}).get(missing[0], key)}: field '{fields[missing[0]]}' not in "
                                f"'{source}' split '{split}' (fields: {', '.join(record)}); "
                                "set the field name in params.yaml")
        yield {name: record[f] for name, f in fields.items()}


def read_records(source: str, split: str, key: str, max_rows: int | None = None) -> Iterator[dict[str, Any]]:
    """Every field of each row of `split`, as read (at most max_rows rows). Raises UserError on a
    missing or empty split, or a source `datasets` cannot read, naming `key`."""
    n = 0
    for batch in _batches(source, split, key):
        for values in zip(*batch.values()):
            yield dict(zip(batch, values))
            n += 1
            if max_rows is not None and n >= max_rows:
                return
    if n == 0:
        raise UserError(f"{key}: '{source}' split '{split}' has no rows")


def split_columns(source: str, split: str, key: str) -> list[str]:
    """The field names of `split`, from its first rows (UserError for a missing split or an unreadable source)."""
    return list(next(_batches(source, split, key), {}))


def read_texts(source: str, split: str, field: str, key: str, max_rows: int | None = None,
               field_key: str | None = None) -> Iterator[str]:
    """The `field` of each row as a string (null -> ''); a non-text value is a UserError. `key` and
    `field_key` are the params keys named in errors about the split and the field."""
    for row in read_rows(source, split, {"text": field}, key, max_rows, {"text": field_key or key}):
        text = row["text"]
        if text is None:
            text = ""
        elif not isinstance(text, str):
            raise UserError(f"{field_key or key}: field '{field}' of '{source}' split '{split}' holds "
                            f"{type(text).__name__} values, not text; name a text field")
        yield text

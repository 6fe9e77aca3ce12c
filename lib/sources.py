"""Read rows from a data source through `datasets`, streaming.

A source is a local file or folder of .jsonl/.json/.txt (optionally .gz) or .parquet files, or a
hub dataset written `hf:<dataset>[/<config>]`. In a folder, a file's split is its name up to the
first dot (`train.jsonl.gz` -> train; shards `train-00001.parquet` join split train); a single file
is split `train`. Rows are streamed, never loaded whole, and fields are mapped by name.

Undecodable bytes in a text file become U+FFFD instead of stopping the read; the clean stage then
drops those documents and counts them as `undecodable`.
"""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

from lib.config import HUB_PREFIX, LOCAL_SUFFIXES
from lib.errors import UserError, describe

BUILDERS = {".jsonl": "json", ".json": "json", ".txt": "text", ".parquet": "parquet"}
SHARD_SUFFIX = re.compile(r"-\d+(-of-\d+)?$")
READ_BATCH = 1000


def _suffix(path: Path) -> str | None:
    name = path.name.lower()
    return next((s for s in LOCAL_SUFFIXES if name.endswith(s)), None)


def _builder(suffix: str) -> str:
    return BUILDERS[suffix.removesuffix(".gz")]


def local_files(source: str, key: str) -> dict[str, list[str]]:
    """Split name -> data files of a local source. Raises UserError naming `key` on a bad source."""
    path = Path(source)
    if path.is_file():
        candidates = [path]
    elif path.is_dir():
        candidates = sorted(p for p in path.iterdir() if p.is_file() and _suffix(p))
    else:
        raise UserError(f"{key}: '{source}' does not exist")
    if not candidates or not _suffix(candidates[0]):
        raise UserError(f"{key}: no {'/'.join(LOCAL_SUFFIXES)} files in '{source}'")
    builders = {_builder(_suffix(p)) for p in candidates}
    if len(builders) > 1:
        raise UserError(f"{key}: '{source}' mixes file formats ({', '.join(sorted(builders))}); keep one per source")
    splits: dict[str, list[str]] = defaultdict(list)
    for p in candidates:
        if p.stat().st_size == 0:
            raise UserError(f"{key}: '{p}' is empty; remove it or fill it")
        split = "train" if path.is_file() else SHARD_SUFFIX.sub("", p.name[: -len(_suffix(p))])
        splits[split].append(str(p))
    return dict(splits)


def list_splits(source: str, key: str) -> list[str]:
    if source.startswith(HUB_PREFIX):
        import datasets

        name, config = _hub_name(source)
        try:
            return list(datasets.get_dataset_split_names(name, config))
        except Exception as err:  # network, unknown dataset, gated: all surface as one line
            raise UserError(f"{key}: cannot load '{source}' ({describe(err)})") from None
    return sorted(local_files(source, key))


def _hub_name(source: str) -> tuple[str, str | None]:
    """hf:imdb -> ('imdb', None); hf:glue/sst2 -> ('glue', 'sst2'); hf:org/name/config -> ('org/name', 'config').
    A local folder laid out as a hub dataset repo (hf:/path/to/repo) is taken whole."""
    name = source[len(HUB_PREFIX):]
    if Path(name).is_dir():
        return name, None
    parts = name.strip("/").split("/")
    if len(parts) == 1:
        return parts[0], None
    if len(parts) == 2:
        # `org/name` (a repo id) and `name/config` look alike; datasets resolves the former, so try it first
        return ("/".join(parts), None) if _is_repo_id(parts) else (parts[0], parts[1])
    return "/".join(parts[:2]), "/".join(parts[2:])


def _is_repo_id(parts: list[str]) -> bool:
    import datasets

    try:
        datasets.get_dataset_config_names("/".join(parts))
        return True
    except Exception:
        return False


def _open(source: str, split: str, key: str):
    import datasets

    if source.startswith(HUB_PREFIX):
        name, config = _hub_name(source)
        return datasets.load_dataset(name, config, split=split, streaming=True)
    files = local_files(source, key)
    if split not in files:
        raise UserError(f"{key}: split '{split}' not in '{source}' (it has: {', '.join(sorted(files))})")
    builder = _builder(_suffix(Path(files[split][0])))
    # `json` decodes with errors='replace' only for an encoding other than the literal "utf-8",
    # so "utf8" (the same codec) is how undecodable bytes become U+FFFD instead of an exception.
    options = {"encoding": "utf8", "encoding_errors": "replace"} if builder in ("json", "text") else {}
    return datasets.load_dataset(builder, data_files={split: files[split]}, split=split, streaming=True, **options)


def read_rows(source: str, split: str, fields: dict[str, str], key: str, max_rows: int | None = None,
              field_keys: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
    """Yield {name: row[field]} for each row of `split`. `fields` maps output names to source fields,
    e.g. {"text": "review"}; `key` is the params key named in errors, `field_keys` the one that sets
    each field (by output name; default `key`). Raises UserError on a missing split or field, an
    empty split, or a source `datasets` cannot read."""
    n = 0
    try:
        dataset = _open(source, split, key)
        batches = dataset.iter(batch_size=READ_BATCH)
        for batch in batches:
            if n == 0:
                missing = [name for name, f in fields.items() if f not in batch]
                if missing:
                    raise UserError(f"{(field_keys or {}).get(missing[0], key)}: field '{fields[missing[0]]}' not in "
                                    f"'{source}' split '{split}' (fields: {', '.join(batch)}); "
                                    "set the field name in params.yaml")
            columns = [batch[f] for f in fields.values()]
            for values in zip(*columns):
                yield dict(zip(fields, values))
                n += 1
                if max_rows is not None and n >= max_rows:
                    return
    except UserError:
        raise
    except StopIteration:  # how datasets' json reader reports a file without a single row
        pass
    except Exception as err:  # datasets/pyarrow errors deep inside: report which source failed
        raise UserError(f"{key}: cannot read '{source}' split '{split}' ({describe(err)})") from None
    if n == 0:
        raise UserError(f"{key}: '{source}' split '{split}' has no rows")


def split_columns(source: str, split: str, key: str) -> list[str]:
    """The field names of `split`, from its first rows (UserError for a missing split or an unreadable source)."""
    try:
        return list(next(iter(_open(source, split, key).iter(batch_size=1))))
    except UserError:
        raise
    except StopIteration:
        return []
    except Exception as err:
        raise UserError(f"{key}: cannot read '{source}' split '{split}' ({describe(err)})") from None


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

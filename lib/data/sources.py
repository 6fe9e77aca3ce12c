"""Read rows from a data source through `datasets`, streaming.

A source is a local file or folder of .jsonl/.json/.txt/.csv/.tsv (optionally .gz) or .parquet files, or a
hub dataset written `hf:<org>/<name>[/<config>][@<revision>]` (e.g. `hf:nyu-mll/glue/sst2@bcdcba7`).
In a folder, a file's split is its name up to the first dot (`train.jsonl.gz` -> train; shards
`train-00001.parquet` join split train, and only shards: two other files of one split are an error;
hidden files are skipped); a single file is split `train`.
A .json file holds JSON Lines or one array of objects; a CSV or TSV file's first line names its fields,
and a field with the delimiter, a quote or a line break in it is quoted ("a, b"), as spreadsheets write
it. A CSV or TSV file whose first line is one field by its suffix's delimiter is read with the delimiter
that spreadsheets would guess (`delimiter`), which is said in one line. Rows are streamed, never loaded
whole, and fields are mapped by name. The stages read local folders only: the `data` stage
(lib/data/raw.py) reads hub sources into data/raw first.

Undecodable bytes in a text file become U+FFFD instead of stopping the read; the clean stage then
drops those documents and counts them as `undecodable`, and a task's rows holding them are dropped and
counted by `drop_undecodable`.
"""
from __future__ import annotations

import codecs
import csv
import functools
import gzip
import logging
import re
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator

from lib.config.errors import UserError
from lib.config.params import HUB_PREFIX, LOCAL_SUFFIXES
from lib.core.errors import describe

# a data file's format by its suffix (less .gz), which names the `datasets` builder that reads it (TSV: csv)
FORMATS = {".jsonl": "json", ".json": "json", ".txt": "text", ".csv": "csv", ".tsv": "tsv", ".parquet": "parquet"}
SHARD_SUFFIX = re.compile(r"-\d+(-of-\d+)?$")
READ_BATCH = 1000
# a CSV or TSV file's delimiter by its suffix, and those it may turn out to use, as spreadsheets guess them
DELIMITERS = {".csv": ",", ".tsv": "\t"}
DELIMITER_NAMES = {",": "comma", ";": "semicolon", "\t": "tab", "|": "pipe"}
SNIFF_LINES, SNIFF_BYTES = 20, 64 * 1024  # how much of a file's start decides its delimiter
REPLACEMENT = "\ufffd"  # what decoding puts in place of bytes that are not UTF-8


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
    # `datasets`' readers log an error before raising it; _batches raises it as the one line instead
    logging.getLogger("datasets.packaged_modules").setLevel(logging.CRITICAL)
    builder = _format(data_suffix(Path(files[split][0])))
    options = {}
    if builder in ("csv", "tsv"):
        builder, options = "csv", {"sep": delimiter(files[split][0], key)}
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
        from pandas.errors import ParserError  # what `datasets`' CSV reader raises on a row of other fields

        shown = _shown_split(source, split, key)
        if isinstance(err, ParserError):
            first = local_files(source, key)[split][0]
            name = DELIMITER_NAMES[delimiter(first, key)]
            raise UserError(f"{key}: {shown} does not parse as {name}-separated ({describe(err)}); its first line is "
                            f"{_first_lines(first)[0][:120]!r}: separate the fields by one of , ; tab |, and quote a "
                            "field that holds it (\"a, b\")") from None
        raise UserError(f"{key}: cannot read {shown} ({describe(err)})") from None


def delimiter(path: str, key: str) -> str:
    """The field delimiter of CSV or TSV file `path`: its suffix's, unless that leaves its first line one
    field and csv.Sniffer, restricted to DELIMITER_NAMES, finds on its first lines another that splits it,
    as spreadsheets guess; the first use of another is said in one printed line naming `key` and the file."""
    return _delimiter(path, key, _version(path))


@functools.lru_cache(maxsize=None)
def _delimiter(path: str, key: str, version: tuple[int, int]) -> str:
    """delimiter's, once per version of the file: it is asked at every read of a split."""
    expected = DELIMITERS[data_suffix(Path(path)).removesuffix(".gz")]
    lines = _first_lines(path)
    if _field_count(lines[0], expected) > 1:
        return expected
    try:
        found = csv.Sniffer().sniff("\n".join(lines), delimiters="".join(DELIMITER_NAMES)).delimiter
    except csv.Error:  # one column, or no delimiter it could tell: the suffix's, and a parse error names the file
        return expected
    if found == expected or _field_count(lines[0], found) < 2:
        return expected
    print(f"{key}: '{path}' is {DELIMITER_NAMES[found]}-separated, not {DELIMITER_NAMES[expected]}-separated "
          f"(its first line is {lines[0][:120]!r}); read so", flush=True)
    return found


def _version(path: str) -> tuple[int, int]:
    """(size, modification time) of a file: what the answers cached about it are kept for."""
    stat = Path(path).stat()
    return stat.st_size, stat.st_mtime_ns


def _bytes_of(path: str) -> BinaryIO:
    """File `path` opened for its bytes, gunzipped where its name ends in .gz."""
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _first_lines(path: str) -> list[str]:
    """The first SNIFF_LINES whole lines of a (gzipped) text file, within its first SNIFF_BYTES (at least one)."""
    with _bytes_of(path) as f:
        head = f.read(SNIFF_BYTES)
    lines = head.decode("utf-8", errors="replace").splitlines()
    if len(head) == SNIFF_BYTES and len(lines) > 1:
        lines.pop()  # cut short by the byte limit
    return lines[:SNIFF_LINES] or [""]


def _field_count(line: str, separator: str) -> int:
    return len(next(csv.reader([line], delimiter=separator), []))


def drop_undecodable(rows: Iterable[dict[str, Any]], source: str, split: str, key: str,
                     skipped: Counter) -> Iterator[dict[str, Any]]:
    """`rows`, read from `split` of `source`, less those in which decoding put U+FFFD for bytes that are
    not UTF-8, counted in skipped["undecodable"] once all are read (only where some are). A U+FFFD in a
    split whose files are UTF-8 throughout is the text's own, and kept. Raises UserError naming `key`
    and the file when more than half of the rows are dropped: the file is in another encoding, and what
    is left is not the data it holds."""
    total = dropped = 0
    mangled: list[str] | None = None  # the split's files that are not UTF-8, looked for at the first U+FFFD
    for row in rows:
        total += 1
        if _holds_replacement(row):
            mangled = not_utf8(source, split, key) if mangled is None else mangled
            if mangled:
                dropped += 1
                continue
        yield row
    if dropped:
        skipped["undecodable"] += dropped
    if dropped * 2 > total:
        name = Path(mangled[0]).name
        converted = "utf8" + data_suffix(Path(name))
        fix = (f"zcat {name} | iconv -f latin1 -t utf-8 | gzip > {converted}" if name.endswith(".gz")
               else f"iconv -f latin1 -t utf-8 {name} > {converted}")
        raise UserError(f"{key}: '{mangled[0]}' is not UTF-8: {dropped} of {total} rows of split '{split}' hold bytes "
                        f"that do not decode; re-save the source's {name} as UTF-8 (from Latin-1: {fix}, then "
                        f"replace {name} with {converted}) and run again")


def _holds_replacement(value: Any) -> bool:
    """Whether a text in `value` (a row, or a field's text, list or mapping of them) holds U+FFFD."""
    if isinstance(value, str):
        return REPLACEMENT in value
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, list):
        return False
    return any(_holds_replacement(v) for v in value)


def not_utf8(source: str, split: str, key: str) -> list[str]:
    """The files of `split` of local `source` whose bytes are not all UTF-8 (those of a hub source, and
    Parquet files, which are not decoded, are not looked at)."""
    if source.startswith(HUB_PREFIX):
        return []
    files = [path for path in local_files(source, key)[split] if _format(data_suffix(Path(path))) != "parquet"]
    return [path for path in files if not _is_utf8(path, _version(path))]


@functools.lru_cache(maxsize=None)
def _is_utf8(path: str, version: tuple[int, int]) -> bool:
    """Whether (gzipped) file `path` (at `version`) decodes as UTF-8 throughout; a file that can not be read to
    its end is not (reading its rows says why)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        with _bytes_of(path) as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                decoder.decode(chunk)
        decoder.decode(b"", final=True)
    except (UnicodeDecodeError, OSError, EOFError, zlib.error):
        return False
    return True


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

"""Sample lengths and token ids of real data, cached as .npy files.

Planning needs each sample's token count; training on the data's own ids (dataset.tokens=data,
data/ids.py) needs the ids. Tokenizing a long-context corpus takes minutes, so both are
computed in one pass and cached: `<source>.lengths-<key>.npy` (the count of every sample, in
the source's order) and `<source>.ids-<key>.npy` (every sample's ids end to end, int32; empty
when the source gives counts, not ids). A cache is used only when both files are there, so a
lengths cache written before ids were kept is read again rather than taken for a source
without ids. The names carry a hash of the source's and the
tokenizer's sizes and modification times and of the loader options: editing the data,
swapping the tokenizer or changing the field gives a new name, and older caches of the same
source are deleted when the new ones are written (atomically: a temporary file renamed).

Two sources:
- `jsonl`: one sample per line, as a token count, a list of token ids, or an object
  holding either under `field`;
- `hf_disk`: a Hugging Face dataset on disk: a folder written by `save_to_disk`, or data files
  that `datasets` reads as it goes (Parquet, as on the Hub; Arrow, JSON, CSV): one file, or a folder
  of them laid out as on the Hub (its splits named by file or folder); a text column is tokenized
  with a local tokenizer (a directory with tokenizer.json, or the file; its ids are kept), a chat column
  (a list of messages with `content`) by joining the contents with newlines, which leaves
  out the chat template's few tokens; without a tokenizer the column must hold token ids or
  counts.

Samples shorter than 2 tokens have nothing to learn (no next-token label) and are dropped.

A source gives ids only when every sample is a list of ids (or tokenized text); a file
mixing counts and lists gives counts. UTF-8 files may start with a byte-order mark, and a
`jsonl` file may be gzip, bzip2 or xz-compressed (known by its first bytes, read as it goes).

The cache is written only once the run is accepted (`write_pending_caches`, called by the
job after its last check): a refused input leaves nothing beside the user's data. Until then
the lengths and ids are held in this process, so checking a run and running it read the source once.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import importlib.util
import itertools
import json
import logging
import lzma
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from odc_bench.config.hub import hub_hint
from odc_bench.errors import NO_ROOM, DataError
from odc_bench.files import atomic_path, name_too_long, room_left, text_encoding

LOADERS = ("jsonl", "hf_disk")
# Bumped when the readers refuse what they once read, so that no cache of such a read is served:
# 2, a dataset.field on a file of bare counts or ids, and counts of COUNT_LIMIT or more.
CACHE_VERSION = 2
# Ids are kept as int32 (4 bytes a token beside the data); no vocabulary comes near its limit.
ID_LIMIT = 2**31
# No model takes a sequence of 2^31 tokens, so a count that large is some other number (a byte
# count, a timestamp) under the field's name; below it a count's square (attention's cost) fits int64.
COUNT_LIMIT = 2**31


_FORMAT = "one JSON value per line: a token count, a list of token ids, or an object holding either (dataset.field)"


# datasets reads a CSV file through pandas, which takes more than an empty cell for missing.
_CSV_MISSING = ("; in a CSV file, an empty cell or one reading NA, None, null, N/A or nan, which pandas takes for "
                "missing")


def _csv_missing(where: str) -> str:
    """_CSV_MISSING where `where` (the message's place: a file and column, or a line) is a CSV file's."""
    return _CSV_MISSING if ".csv" in where.lower() else ""


def _json_name(value: object) -> str:
    """How the file spells the value (null, true, an object), not Python's type name."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, dict):
        return f"an object (keys: {', '.join(map(str, value)) or 'none'})"
    return type(value).__name__


def _sample(value: object, where: str) -> tuple[int, list[int] | None]:
    """The sample's token count and its ids (None for a bare count)."""
    if isinstance(value, float) and value.is_integer():
        # JSON has one number type: exporters that keep counts in a float column (pandas, once a
        # value is missing) write 512.0 for 512.
        value = int(value)
    if isinstance(value, float):
        raise DataError(f"{where}: a token count is a whole number, got {value!r}")
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise DataError(f"{where}: negative token count {value}")
        if value >= COUNT_LIMIT:
            raise DataError(f"{where}: a token count of {value} is beyond any sequence a model takes (counts are "
                            f"below {COUNT_LIMIT}); check that the value is a sample's token count")
        return value, None
    if isinstance(value, list):
        bad = next((i for i, v in enumerate(value) if type(v) is not int or v < 0), None)
        if bad is not None:
            raise DataError(f"{where}: token ids must be integers >= 0, got {value[bad]!r} at position {bad}; "
                            f"give the tokenizer's ids, or the token count")
        huge = next((i for i, v in enumerate(value) if v >= ID_LIMIT), None)
        if huge is not None:
            raise DataError(f"{where}: token id {value[huge]} at position {huge} is beyond any vocabulary (ids are "
                            f"below {ID_LIMIT}); give the tokenizer's ids, or the token count")
        return len(value), value
    if isinstance(value, str):
        raise DataError(f"{where}: expected a token count or a list of token ids, got text; tokenize it first, or "
                        f"use dataset=hf_disk with dataset.tokenizer, which tokenizes a column of text (a JSONL "
                        f"file's objects too, dataset.text_field naming the key)")
    missing = f" ({_csv_missing(where).removeprefix('; ')})" if value is None and _csv_missing(where) else ""
    raise DataError(f"{where}: expected a token count or a list of token ids, got {_json_name(value)}{missing}")


def _collect(samples: Iterable[tuple[int, list[int] | None]]) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, ids end to end); the ids are empty unless every sample gave its ids."""
    lengths: list[int] = []
    chunks: list[np.ndarray] = []
    all_ids = True
    for n, ids in samples:
        lengths.append(n)
        all_ids = all_ids and ids is not None
        if all_ids and ids:
            chunks.append(np.asarray(ids, dtype=np.int32))
    flat = np.concatenate(chunks) if all_ids and chunks else np.zeros(0, dtype=np.int32)
    return np.asarray(lengths, dtype=np.int64), flat


# Compressed JSON lines, known by their first bytes whatever the file's name: corpora ship as
# .jsonl.gz, .bz2 or .xz, which the standard library reads as it goes, so nothing is unpacked
# beside the user's data. zstd needs a package of its own before Python 3.14: said, not read.
_COMPRESSIONS: dict[bytes, tuple[str, Callable[..., IO[Any]]]] = {
    b"\x1f\x8b": ("gzip", gzip.open), b"BZh": ("bzip2", bz2.open), b"\xfd7zXZ\x00": ("xz", lzma.open)}
_ZSTD = b"\x28\xb5\x2f\xfd"


# Column files researchers have (a Hub dataset's Parquet shards, datasets' Arrow files), known by
# their first bytes: the jsonl loader names the loader that reads them rather than failing on bytes.
_COLUMNAR = {b"PAR1": "Parquet", b"ARROW1": "Arrow"}


def data_file_kind(path: Path) -> str | None:
    """What a file holds that the jsonl loader does not read and hf_disk does: 'Parquet', 'Arrow',
    'a JSON array' (one array of samples, not one sample per line), 'CSV' (with a header), or None."""
    with open(path, "rb") as f:
        head = f.read(4096)
    for magic, kind in _COLUMNAR.items():
        if head.startswith(magic):
            return kind
    if path.suffix == ".arrow":  # datasets' own Arrow files are streams, which carry no magic bytes
        return "Arrow"
    encoding = text_encoding(path)
    for magic, (_, opener) in _COMPRESSIONS.items():
        if head.startswith(magic):
            with contextlib.suppress(EOFError, OSError, lzma.LZMAError), opener(path, "rb") as f:
                head, encoding = f.read(4096), "utf-8-sig"
    start = head.decode(encoding, "replace").lstrip("\ufeff \t\r\n")
    # An array of objects or of arrays cannot be one sample (a sample's ids are numbers), so the
    # file is an exported table (pandas' to_json, json.dump of a list), on one line or on many.
    if start.startswith("[") and start[1:].lstrip(" \t\r\n")[:1] in ("{", "[", ""):
        return "a JSON array"
    # A .csv file whose first line is no JSON value has a header (pandas' to_csv): a table. One
    # of bare counts, a count per line, is JSON lines and stays the jsonl loader's.
    if ".csv" in path.suffixes and start:
        with contextlib.suppress(ValueError):
            json.loads(start.splitlines()[0])
            return None
        return "CSV"
    return None


def _open_text(path: Path) -> tuple[IO[str], str]:
    """The file as text, decompressed when it is compressed; and what it was ("" when plain)."""
    if (kind := data_file_kind(path)) is not None:
        holds = {"a JSON array": "holds one JSON array of samples", "CSV": "is a CSV file with a header"}.get(
            kind, f"is a {kind} file")
        raise DataError(f"{path} {holds}, not one JSON value per line; dataset=hf_disk reads it "
                        f"(dataset.text_field: the field to measure), or write one sample per line")
    with open(path, "rb") as f:
        head = f.read(6)
    if head.startswith(_ZSTD):
        raise DataError(f"{path} is zstd-compressed, which this Python does not read; decompress it (zstd -d "
                        f"{path}) and give the file it writes")
    for magic, (kind, opener) in _COMPRESSIONS.items():
        if head.startswith(magic):
            return opener(path, "rt", encoding="utf-8-sig"), kind
    return open(path, encoding=text_encoding(path)), ""


def _jsonl_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of every line that is not blank, of a plain or compressed file;
    DataError when the file is not text, or is compressed and damaged."""
    n, kind = 0, ""
    try:
        text, kind = _open_text(path)
        with text as f:
            for n, line in enumerate(f, 1):
                if "\x00" in line:
                    # Every other character NUL: UTF-16 text whose byte-order mark, which text_encoding reads
                    # it by, is missing.
                    utf16 = len(line) > 2 and (line[1::2].strip("\x00\n") == "" or line[::2].strip("\x00\n") == "")
                    hint = " (UTF-16 text without its byte-order mark: save it as UTF-8)" if utf16 else ""
                    raise DataError(f"{path} is not text: line {n} holds NUL bytes{hint}; dataset=jsonl reads a text "
                                    f"file with {_FORMAT}")
                if line.strip():
                    yield n, line
    except UnicodeDecodeError:
        raise DataError(f"{path} is not text: it holds bytes that are not UTF-8 (reading from line {n + 1}); "
                        f"dataset=jsonl reads a text file with {_FORMAT}") from None
    except (EOFError, OSError, lzma.LZMAError) as e:
        if not kind:
            raise
        # gzip.BadGzipFile is an OSError; a stream cut short is an EOFError in all three.
        raise DataError(f"{path} is {kind}-compressed but damaged or cut short after line {n} ({e}); compress it "
                        f"again, or give it uncompressed") from None


def jsonl_samples(path: Path, field: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Every sample's token count, and their ids end to end (empty unless every line gives ids)."""
    return _collect(_line_sample(path, n, line, field, first=k == 0)
                    for k, (n, line) in enumerate(_jsonl_lines(path)))


def jsonl_line(path: Path, sample: int) -> int:
    """The line number of the file's `sample`-th sample (counting from 0; blank lines hold none)."""
    return next(n for k, (n, _) in enumerate(_jsonl_lines(path)) if k == sample)


class UnusedFieldError(DataError):
    """A field was given for a JSONL file whose lines are not objects: it names no key there."""


def _line_sample(path: Path, n: int, line: str, field: str | None, first: bool) -> tuple[int, list[int] | None]:
    where = f"{path} line {n}"
    try:
        value = json.loads(line)
    except json.JSONDecodeError as e:
        if first:  # nothing of the file has read as JSON lines: the whole file is something else
            raise DataError(f"{path} is not JSON lines: line {n} is not a JSON value ({e.msg}); dataset=jsonl "
                            f"reads {_FORMAT}") from None
        raise DataError(f"{where} is not valid JSON ({e.msg}); fix or remove the line") from None
    if isinstance(value, dict):
        if field is None:
            raise DataError(f"{where} is an object; set dataset.field to its key holding the token "
                            f"count or ids (keys: {', '.join(sorted(value))})")
        if field not in value:
            raise DataError(f"{where} has no key {field!r}; set dataset.field to one of "
                            f"{', '.join(sorted(value))}")
        value = value[field]
    elif field is not None:
        # A key that names nothing in the file would be a setting silently ignored.
        kind = {int: "a token count", list: "a list of token ids"}.get(type(value), f"a JSON {type(value).__name__}")
        raise UnusedFieldError(f"{where} is {kind}, not an object holding the key dataset.field ({field!r}); "
                               f"unset dataset.field for a file of bare counts or ids")
    return _sample(value, where)


def _text(value: object, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value):
        return "\n".join(str(m["content"]) for m in value)
    if isinstance(value, list) and all(isinstance(m, str) for m in value):
        return "\n".join(value)
    if value is None:
        raise DataError(f"{where}: a sample has no text (null{_csv_missing(where)}); fill it in or drop that sample")
    raise DataError(f"{where}: expected text or chat messages to tokenize, got {type(value).__name__}")


def tokenizer_file(tokenizer: Path) -> Path:
    path = tokenizer / "tokenizer.json" if tokenizer.is_dir() else tokenizer
    if not path.is_file():
        raise DataError(f"dataset.tokenizer {tokenizer} has no tokenizer.json; point it at a local Hugging Face "
                        f"tokenizer directory or its tokenizer.json")
    return path


# Data files by suffix (a compressed one by the suffix before its compression's), for datasets'
# packaged builders.
_BUILDERS = {".parquet": "parquet", ".arrow": "arrow", ".json": "json", ".jsonl": "json", ".csv": "csv"}
# A file named otherwise, by what data_file_kind finds in it.
_KIND_BUILDERS = {"Parquet": "parquet", "Arrow": "arrow", "a JSON array": "json", "CSV": "csv"}
_COMPRESSED = (".gz", ".bz2", ".xz", ".zst")


def _saved_to_disk(path: Path) -> bool:
    """A folder save_to_disk wrote: a Dataset's holds state.json, a DatasetDict's dataset_dict.json."""
    return path.is_dir() and any((path / marker).is_file() for marker in ("state.json", "dataset_dict.json"))


def _hf_dataset(path: Path, scratch: str) -> Any:
    """The dataset at `path`: a save_to_disk folder loaded, or data files streamed (read as they go,
    so a corpus is not converted into datasets' cache nor copied beside the user's data). The
    stream's lock files go to `scratch`, not datasets' cache: an unwritable one (HF_HOME on a
    read-only home) failed the read of a local file."""
    import datasets

    suffixes = [x for x in path.suffixes if x not in _COMPRESSED][-1:]
    builder = _BUILDERS.get(suffixes[0]) if suffixes else None
    if path.is_file() and builder is None:
        builder = _KIND_BUILDERS.get(data_file_kind(path) or "")
    what = ("a folder written by save_to_disk, a data file (.parquet, .arrow, .json, .jsonl, .csv) or a folder of "
            "them")
    if path.is_file() and builder is None:
        raise DataError(f"dataset=hf_disk reads {what}; {path} is none of these")
    try:
        if _saved_to_disk(path):
            return datasets.load_from_disk(str(path))
        if path.is_file():
            return datasets.load_dataset(builder, data_files=str(path), streaming=True, cache_dir=scratch)
        return datasets.load_dataset(str(path), streaming=True, cache_dir=scratch)
    except Exception as e:  # the library raises many kinds for unreadable data
        raise DataError(f"cannot load {path} with datasets ({_first_line(e)}); point dataset.path at {what}") from None


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


class _Said(logging.Handler):
    """What datasets logs while it reads (it names a damaged file there, not in what it raises), kept
    from stderr so that a refusal stays one line."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.last = record.getMessage()


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[_Said]:
    logger, said = logging.getLogger("datasets"), _Said()  # the library's loggers all end here
    handlers, propagate = logger.handlers, logger.propagate
    logger.handlers, logger.propagate = [said], False
    try:
        yield said
    finally:
        logger.handlers, logger.propagate = handlers, propagate


def _read(batches: Iterator[Any], path: Path, rows: int) -> Iterator[Any]:
    """The batches, `rows` rows each; a streamed file found damaged on the way (a Parquet shard cut
    short, a JSON line broken) said in one line, with the file datasets named."""
    for k in itertools.count():
        with _quiet_datasets() as said:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except Exception as e:  # pyarrow and datasets raise many kinds for damaged data
                after = f" after {k * rows} rows" if k else ""
                raise DataError(f"{path} could not be read to the end{after}: "
                                f"{_first_line(e) if said.last is None else said.last.splitlines()[0]}; fix or "
                                f"remove the damaged file") from None
        yield batch


def hf_disk_samples(path: Path, text_field: str, tokenizer: Path | None,
                    split: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Every row's token count, and their ids end to end (empty when the column holds counts)."""
    if importlib.util.find_spec("datasets") is None or importlib.util.find_spec("tokenizers") is None:
        raise DataError("dataset=hf_disk needs the datasets and tokenizers packages: pip install 'odc-bench[data]'")
    with tempfile.TemporaryDirectory(prefix="odc-datasets-") as scratch:
        return _collect(_hf_rows(_hf_dataset(path, scratch), path, text_field, tokenizer, split))


def _hf_rows(ds: Any, path: Path, text_field: str, tokenizer: Path | None,
             split: str | None) -> Iterator[tuple[int, list[int] | None]]:
    import datasets
    from tokenizers import Tokenizer

    if isinstance(ds, datasets.DatasetDict | datasets.IterableDatasetDict):
        if split not in ds:
            raise DataError(f"{path} has no split {split!r}; set dataset.split to one of {', '.join(ds)}")
        ds = ds[split]
    columns = ds.column_names  # None for streamed JSON, whose columns are known once a row is read
    if columns is None:
        columns = list(next(_read(iter(ds), path, 1), {}))
    if text_field not in columns:
        raise DataError(f"{path} has no column {text_field!r}; set dataset.text_field to one of "
                        f"{', '.join(columns) or '(none: it has no rows)'}")
    tok = Tokenizer.from_file(str(tokenizer_file(tokenizer))) if tokenizer is not None else None

    def rows() -> Iterator[tuple[int, list[int] | None]]:
        for start, batch in enumerate(_read(ds.iter(batch_size=256), path, 256)):
            values, where = batch[text_field], f"{path} column {text_field!r} (batch {start})"
            if tok is None:
                yield from (_sample(v, where) for v in values)
            else:
                yield from ((len(e.ids), e.ids) for e in tok.encode_batch([_text(v, where) for v in values]))

    return rows()


def _fingerprint(path: Path) -> list[tuple[str, int, int]]:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return [(str(p.relative_to(path) if path.is_dir() else p.name), p.stat().st_size, p.stat().st_mtime_ns)
            for p in files]


def cache_key(source: Path, options: dict, extra: Path | None = None) -> str:
    blob = json.dumps(dict(version=CACHE_VERSION, options=options, source=_fingerprint(source),
                           extra=_fingerprint(extra) if extra is not None else None), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


class _Writes:
    """A file numpy writes through its write(), in chunks: to a real file numpy writes with
    tofile(), whose short write on a full disk raises an OSError without its errno ("8000
    requested and 496 written"), which then read as no reason at all."""

    def __init__(self, f: IO[bytes]) -> None:
        self.write = f.write


def _atomic_save(path: Path, array: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(_Writes(f), array)


# (lengths, ids) this process read whose cache files are not written yet, by their paths.
_pending: dict[tuple[Path, Path], tuple[np.ndarray, np.ndarray]] = {}
KINDS = ("lengths", "ids")


def _writable(folder: Path) -> bool:
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)


def cached(source: Path, key: str, compute: Callable[[], tuple[np.ndarray, np.ndarray]],
           cache_dir: Path | None) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, ids) from `<source name>.{lengths,ids}-<key>.npy`, read from the source when either
    is missing; the files themselves are written by write_pending_caches, once the run is accepted."""
    folder = cache_dir if cache_dir is not None else source.parent
    lengths_path, ids_path = paths = (folder / f"{source.name}.lengths-{key}.npy",
                                      folder / f"{source.name}.ids-{key}.npy")
    if paths in _pending:
        return _pending[paths]
    if lengths_path.is_file() and ids_path.is_file():
        with contextlib.suppress(OSError, ValueError):
            # mapped, not read: a rank touches only the ids of the samples it trains on
            return np.load(lengths_path), np.load(ids_path, mmap_mode="r")
    if not _writable(folder):
        raise DataError(f"cannot write the lengths cache into {folder}; set dataset.cache_dir to a writable "
                        f"directory")
    _pending[paths] = compute()
    return _pending[paths]


def write_pending_caches() -> None:
    """Write the caches of the lengths and ids this process read (older caches of the same source
    are deleted): call it once the run that read them has passed every check."""
    for paths, arrays in list(_pending.items()):
        for path, array, kind in zip(paths, arrays, KINDS, strict=True):
            try:
                _atomic_save(path, array)
                for stale in path.parent.glob(f"{path.name.rsplit(f'.{kind}-', 1)[0]}.{kind}-*.npy"):
                    if stale != path:
                        stale.unlink(missing_ok=True)
            except OSError as e:
                why = (f"no space left on device{room_left(path)}; free some space, or set dataset.cache_dir to "
                       f"another folder" if e.errno in NO_ROOM
                       else f"{e.strerror or e}; set dataset.cache_dir to a writable directory")
                raise DataError(f"cannot write the {kind} cache {path}: {why}") from None
        del _pending[paths]


@dataclass(frozen=True)
class Pool:
    """A real source's usable samples (at least 2 tokens), in its order, and their ids when it gives them."""

    source: Path
    loader: str
    raw_lengths: np.ndarray  # every sample's count, unusable ones too
    ids: np.ndarray  # every sample's ids end to end; empty when the source gives counts
    usable: np.ndarray  # indices into raw_lengths of the usable samples

    @property
    def lengths(self) -> np.ndarray:
        return self.raw_lengths[self.usable]

    @property
    def has_ids(self) -> bool:
        return self.ids.size > 0

    @property
    def starts(self) -> np.ndarray:
        """Where each usable sample's ids begin in `ids`."""
        return (np.cumsum(self.raw_lengths) - self.raw_lengths)[self.usable]

    def where(self, sample: int) -> str:
        """The usable sample's place in the source, as a user finds it: a line, or a row."""
        raw = int(self.usable[sample])
        if self.loader == "jsonl":
            return f"{self.source} line {jsonl_line(self.source, raw)}"
        return f"{self.source} row {raw}"


def load_pool(loader: str, path: str | None, *, field: str | None = None, text_field: str = "text",
              tokenizer: str | None = None, split: str | None = "train", cache_dir: str | None = None) -> Pool:
    """Every usable sample of a real source (at least 2 tokens), in the source's order."""
    if loader not in LOADERS:
        raise DataError(f"unknown dataset loader {loader!r}; choose one of {', '.join(LOADERS)}")
    if not path:
        what = ("the .jsonl file" if loader == "jsonl" else
                "the folder written by save_to_disk, or the data file or folder of them")
        raise DataError(f"dataset={loader} needs dataset.path: set dataset.path to {what}")
    source = Path(path).expanduser()
    if (too_long := name_too_long(source)) is not None:
        raise DataError(f"dataset.path {source} {too_long}: no file can have it; point it at your data")
    if not source.exists():
        hint = hub_hint(path, "dataset", "dataset=hf_disk dataset.path={}")
        raise DataError(f"dataset.path {source} does not exist; point it at your data{hint}")
    cache = Path(cache_dir).expanduser() if cache_dir else None
    if loader == "jsonl":
        if source.is_fifo():
            # The source is read more than once (its key, its samples) and its cache goes beside it.
            raise DataError(f"dataset.path {source} is a pipe (as the shell's <(command) gives), which the harness "
                            f"cannot read twice or cache beside; write it to a file (command > lengths.jsonl) and "
                            f"give that")
        if not source.is_file():
            raise DataError(f"dataset.path {source} is not a file; dataset=jsonl reads one .jsonl file")
        key = cache_key(source, dict(loader=loader, field=field))
        lengths, ids = cached(source, key, lambda: jsonl_samples(source, field), cache)
    else:
        tok = Path(tokenizer).expanduser() if tokenizer else None
        tok_file = tokenizer_file(tok) if tok is not None else None
        key = cache_key(source, dict(loader=loader, text_field=text_field, split=split), tok_file)
        lengths, ids = cached(source, key, lambda: hf_disk_samples(source, text_field, tok, split), cache)
    usable = np.flatnonzero(lengths >= 2)
    if usable.size == 0:
        raise DataError(f"{source} has no sample of at least 2 tokens")
    return Pool(source, loader, lengths, ids, usable)


def load_lengths(loader: str, path: str | None, *, field: str | None = None, text_field: str = "text",
                 tokenizer: str | None = None, split: str | None = "train",
                 cache_dir: str | None = None) -> np.ndarray:
    """Token counts of every usable sample (at least 2 tokens), in the source's order."""
    return load_pool(loader, path, field=field, text_field=text_field, tokenizer=tokenizer, split=split,
                     cache_dir=cache_dir).lengths


CACHE_SUFFIX = ".lengths-"


def loader_for(path: Path) -> str:
    """The loader that reads a lengths source: `hf_disk` for a folder, a Parquet or Arrow file, a JSON
    array or a CSV file with a header, else `jsonl` (a text file of one token count per line is JSON
    lines too)."""
    return "hf_disk" if path.is_dir() or data_file_kind(path) is not None else "jsonl"


def source_name(path: Path) -> str:
    """The data's own name: a lengths cache's source (`mine.jsonl.lengths-<key>.npy` is `mine`), a file's
    stem, a folder's name."""
    name = path.name.split(CACHE_SUFFIX, 1)[0] if CACHE_SUFFIX in path.name else path.name
    return Path(name).stem if not path.is_dir() else name


def read_lengths(path: Path, *, field: str | None = None, text_field: str | None = None,
                 tokenizer: str | None = None) -> np.ndarray:
    """Token counts of every usable sample (at least 2 tokens) of a lengths source, in its order: what the
    what-if and dataset=jsonl / hf_disk read (a text file of one count per line, JSONL, a dataset
    hf_disk reads), or a lengths cache (.npy) this module wrote. Reading writes no cache."""
    if path.suffix == ".npy" and path.is_file():
        try:
            counts = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise DataError(f"{path} is not a lengths array ({str(e).splitlines()[0]}); give a .npy file of token "
                            f"counts, or a text file of one count per line") from None
        if counts.ndim != 1 or counts.dtype.kind not in "iu":
            raise DataError(f"{path} holds a {counts.ndim}-D {counts.dtype} array, not token counts; give a 1-D "
                            f"integer array")
        if counts.size and (counts.min() < 0 or counts.max() >= COUNT_LIMIT):
            bad = counts.min() if counts.min() < 0 else counts.max()
            raise DataError(f"{path} holds a token count of {bad}; counts are 0 to {COUNT_LIMIT - 1}: give an array of "
                            f"samples' token counts")
        lengths = counts.astype(np.int64)
        if not (lengths >= 2).any():
            raise DataError(f"{path} has no sample of at least 2 tokens")
        return lengths[lengths >= 2]
    return load_lengths(loader_for(path), str(path), field=field, text_field=text_field or field or "text",
                        tokenizer=tokenizer)

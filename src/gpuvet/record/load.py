"""The one reader of gpuvet's record files: it tells a run record, an export (a list of run
records), a watch log (JSON lines) and a cluster record apart, checks their types, and raises
RecordError, one line naming the file and the field, for anything else.

`gpuvet report`, `inspect`, `import`, `compare` and `show` all read through here, so a file that
one of them refuses, every one refuses, and a record `import` stores is one `show` can render.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any

from .cluster import CLUSTER_SCHEMA, check_cluster
from .errors import RecordError
from .run import SCHEMA, RunRecord
from .validate import json_kind
from .watch import WATCH_SCHEMA, is_watch_header

RUN, EXPORT, WATCH, CLUSTER = "run", "export", "watch", "cluster"
KINDS = (RUN, EXPORT, WATCH, CLUSTER)
# An export of a few hundred runs with their time series stays well below; /dev/zero does not.
MAX_BYTES = 512 * 1024 * 1024

_WHAT = {RUN: "a gpuvet run record", EXPORT: "a gpuvet export (several run records)",
         WATCH: "a gpuvet watch log", CLUSTER: "a gpuvet cluster record"}


@dataclass
class Loaded:
    """A record file, told apart: `data` is the run record's dict (run), the list of them
    (export), the cluster record's dict (cluster), or the file's text (watch: its lines are read
    by watch.read_log)."""

    kind: str
    data: Any
    where: str

    def runs(self) -> list[RunRecord]:
        """The run records of a run record or an export, each checked."""
        if self.kind == RUN:
            return [_run(self.data, self.where)]
        if self.kind == EXPORT:
            return [_run(item, f"{self.where}: item {n} of {len(self.data)}") for n, item in enumerate(self.data, 1)]
        raise RecordError(f"{self.where}: {_WHAT[self.kind]}, not a run record")


def parse_json(text: str | bytes, where: str) -> Any:
    """JSON text as gpuvet reads a record: NaN and Infinity literals are a reading not known (None)."""
    try:
        return json.loads(text, parse_constant=lambda _constant: None)
    except RecursionError:
        raise RecordError(f"{where}: nested too deeply to be a gpuvet record") from None
    except ValueError as err:  # also a number with thousands of digits, and text that is not UTF-8
        raise RecordError(f"{where}: not JSON ({str(err)[:120]})") from None


def read_text(path: str) -> str:
    """A record file's text ("-": standard input), bounded in size; RecordError when unreadable."""
    where = "stdin" if path == "-" else path
    try:
        if path == "-":
            binary = getattr(sys.stdin, "buffer", None)  # a text stream without one: read as text
            raw = binary.read(MAX_BYTES + 1) if binary is not None else sys.stdin.read(MAX_BYTES + 1).encode("utf-8", "surrogatepass")
        else:
            if os.path.exists(path) and not os.path.isfile(path):  # a FIFO or a device could block or never end
                raise RecordError(f"{path}: not a regular file")
            with open(path, "rb") as f:
                raw = f.read(MAX_BYTES + 1)
    except OSError as err:
        raise RecordError(f"{where}: cannot read it ({err.strerror or err})") from None
    if len(raw) > MAX_BYTES:
        raise RecordError(f"{where}: larger than {MAX_BYTES // 2**20} MB, not a gpuvet record")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RecordError(f"{where}: not UTF-8 text (byte {err.start})") from None


def classify(data: Any, where: str) -> Loaded:
    """Parsed JSON told apart by its schema (a list: an export)."""
    if isinstance(data, list):
        if not data:
            raise RecordError(f"{where}: an empty gpuvet export (no run in it)")
        for n, item in enumerate(data, 1):
            if not isinstance(item, dict) or item.get("schema") != SCHEMA:
                raise RecordError(f"{where}: item {n} of {len(data)} is not a gpuvet run record "
                                  f"({_schema_words(item)}); an export is a list of run records")
        return Loaded(EXPORT, data, where)
    if isinstance(data, dict):
        schema = data.get("schema")
        if schema == SCHEMA:
            return Loaded(RUN, data, where)
        if schema == CLUSTER_SCHEMA:
            return Loaded(CLUSTER, _prefixed(check_cluster, data, where), where)
        if schema == WATCH_SCHEMA:
            raise RecordError(f"{where}: one line of a gpuvet watch log, not the whole log")
    raise RecordError(f"{where}: not a gpuvet record ({_schema_words(data)})")


def load(path: str, kinds: tuple[str, ...] = KINDS) -> Loaded:
    """The record file at `path` ("-": stdin), told apart and checked; RecordError when it is not
    one of `kinds`, naming what it is."""
    where = "stdin" if path == "-" else path
    text = read_text(path)
    first = text.lstrip().split("\n", 1)[0]
    if WATCH_SCHEMA in first and is_watch_header(_quiet_parse(first)):
        loaded = Loaded(WATCH, text, where)
    else:
        loaded = classify(parse_json(text, where), where)
    if loaded.kind not in kinds:
        wanted = " or ".join(_WHAT[k] for k in kinds)
        raise RecordError(f"{where}: {_WHAT[loaded.kind]}; {wanted} is needed here")
    return loaded


def load_runs(path: str) -> list[RunRecord]:
    """The run records of a run record file or an export."""
    return load(path, (RUN, EXPORT)).runs()


def _run(data: Any, where: str) -> RunRecord:
    return _prefixed(RunRecord.from_dict, data, where)


def _prefixed(read: Any, data: Any, where: str) -> Any:
    try:
        return read(data)
    except RecordError as err:
        raise RecordError(f"{where}: {err}") from None


def _quiet_parse(line: str) -> Any:
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None


def _schema_words(data: Any) -> str:
    if isinstance(data, dict):
        schema = data.get("schema")
        return f"schema {str(schema)[:40]!r}" if schema is not None else "an object without a schema"
    return json_kind(data)

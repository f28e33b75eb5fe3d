"""The local history of runs (D1): one SQLite file, safe under concurrent and killed writers.

Each run is stored whole, as its run record's JSON: that is the single source of truth. The
other columns (when, label, price, GPUs, verdict, key figures, machine key) are derived from it
for listing, and a migration can always rebuild them from the JSON.

Robustness:
* WAL journal and a busy timeout: several gpuvet processes can write at once, readers never
  block writers; every write is one `BEGIN IMMEDIATE` transaction, so a process killed in the
  middle leaves the last committed state (SQLite rolls the rest back on the next open).
  WAL needs shared memory between the processes: a store on a network file system is not safe
  for concurrent writers (keep it on local disk, the default).
* The layout version is SQLite's `user_version` pragma; older layouts are migrated at open, in
  one transaction, under the write lock (two processes opening an old store migrate it once).
* A file that is not a readable gpuvet store raises `StoreError` naming the path, before
  anything is written to it: gpuvet never overwrites or "repairs" a file it cannot read.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import random
import re
import sqlite3
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

from .compare import gpu_summary, key_figures
from .facts import Machine
from .record import SCHEMA, RunRecord, check_run, parse_timestamp, timestamp
from .untrusted_text import clean_strings

SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 30.0  # a writer waits this long for another one to finish before giving up

# Version 1. Everything but `id` and `record` is derived from `record`.
_CREATE_V1 = """
CREATE TABLE runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_hash TEXT NOT NULL UNIQUE,        -- identity of the run (see run_hash()): imports stay idempotent
    started_at TEXT NOT NULL,             -- ISO 8601, UTC
    saved_at TEXT NOT NULL,
    label TEXT,
    price_per_hour REAL,                  -- USD
    machine_key TEXT NOT NULL,
    machine_basis TEXT NOT NULL,          -- what the key was made of
    gpus TEXT NOT NULL,                   -- "8 x NVIDIA H100 80GB HBM3"
    hostname TEXT,
    verdict TEXT NOT NULL,
    tool_version TEXT,
    figures TEXT NOT NULL,                -- JSON {measurement name: median over GPUs}
    record TEXT NOT NULL                  -- the run record, whole (JSON)
);
CREATE INDEX runs_by_time ON runs (started_at);
CREATE INDEX runs_by_machine ON runs (machine_key, started_at);
-- Rows an old layout held whose record could not be read: kept, never dropped.
CREATE TABLE unreadable_runs (id INTEGER PRIMARY KEY, record TEXT, reason TEXT);
"""


class StoreError(Exception):
    """The store cannot be used; the message says which file and why (one line, no traceback)."""

    def __init__(self, path: str | os.PathLike[str], reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"run store {self.path}: {reason}")


class UnknownRun(StoreError):
    """No run with that id in this store."""


class DamagedRun(StoreError):
    """One stored run cannot be read (its row was damaged); the other runs can."""


class NoStoreYet(StoreError):
    """Reading was asked of a store that was never created: an empty history, not a fault."""


@dataclass
class Imported:
    """What importing one run did: `already` when this store held it before; `kept` says which
    of its stored label/price differ from the file's and were kept (one sentence each)."""

    id: int
    already: bool
    kept: list[str]


# -- where, and which machine -----------------------------------------------------------------

def default_path() -> Path:
    """$GPUVET_DB, else $XDG_DATA_HOME/gpuvet/runs.sqlite3, else ~/.local/share/gpuvet/runs.sqlite3."""
    if os.environ.get("GPUVET_DB"):
        return Path(os.environ["GPUVET_DB"]).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME", "")
    base = Path(data_home) if os.path.isabs(data_home) else Path.home() / ".local" / "share"  # XDG: relative = unset
    return base / "gpuvet" / "runs.sqlite3"


@dataclass(frozen=True)
class MachineIdentity:
    key: str  # 12 hex digits
    basis: str  # what it was made of, for a person


_MASKED_UUID = re.compile(r"^(GPU-|MIG-)?[0-]+$", re.IGNORECASE)


def machine_identity(machine: Machine) -> MachineIdentity:
    """A stable key for "the same machine": the sorted GPU UUIDs when every GPU has a real one.
    Captures masked by their collector (GPU-00000000-...) and sources without UUIDs fall back to
    hostname + GPU models + bus ids, which machines of the same shape and name can share; a
    machine without GPUs is its hostname and CPU."""
    uuids = [g.uuid.strip() for g in machine.gpus if g.uuid and not _MASKED_UUID.match(g.uuid.strip())]
    if machine.gpus and len(uuids) == len(machine.gpus):
        return MachineIdentity(_digest("uuids", *sorted(uuids)), "the GPU UUID" if len(uuids) == 1 else f"the {len(uuids)} GPU UUIDs")
    hostname = machine.host.hostname if machine.host else None
    if machine.gpus:
        parts = sorted(f"{g.pcie.bus_id or g.index}={g.name}" for g in machine.gpus)
        why = "UUIDs masked or missing"
        basis = f"hostname {hostname} + GPU bus ids; {why}" if hostname else f"GPU models + bus ids only; {why}, no hostname"
        return MachineIdentity(_digest("bus", hostname or "", *parts), basis)
    return gpuless_identity(hostname)


def gpuless_identity(hostname: str | None) -> MachineIdentity:
    """A machine without GPUs is its hostname: `gpuvet health` reads no CPU model, and keying on it
    gave one machine two keys, one from `run` and one from `health`."""
    return MachineIdentity(_digest("host", hostname or "", ""), f"hostname {hostname or 'unknown'}; no GPU")


_CPU_KEYED = "% + CPU model; no GPU"  # how earlier versions keyed a GPU-less machine


def _digest(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def run_hash(data: dict[str, Any]) -> str:
    """The identity of a run: its record without what can change after the run (the label and
    price the user gives, and the findings, which newer rules may judge differently)."""
    options = {k: v for k, v in (data.get("options") or {}).items() if k not in ("label", "price")}
    core = {k: v for k, v in data.items() if k not in ("findings", "verdict", "options")}
    text = json.dumps({"options": options, **core}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


# -- listing ----------------------------------------------------------------------------------

@dataclass
class RunSummary:
    id: int
    started_at: str
    label: str | None
    price_per_hour: float | None
    gpus: str
    verdict: str
    figures: dict[str, float]  # key figures by measurement name (compare.KEY_FIGURES), when measured
    machine_key: str
    machine_basis: str
    hostname: str | None
    kind: str = "default"  # the record's profile: quick, default, soak, bench, health, ...
    summary: str | None = None  # a health run's summary line (options.summary)


# The kind is read from the stored record itself (its options.profile), so no layout change. A
# record damaged outside gpuvet is not JSON: json_extract would fail the whole listing on it.
_KIND = "coalesce(CASE WHEN json_valid(record) THEN json_extract(record, '$.options.profile') END, 'default')"
_LISTED = ("id, started_at, label, price_per_hour, gpus, verdict, figures, machine_key, machine_basis, hostname, "
           f"{_KIND} AS kind, CASE WHEN json_valid(record) THEN json_extract(record, '$.options.summary') END AS summary")


def _summary(row: sqlite3.Row) -> RunSummary:
    r = clean_strings(dict(row))  # the store file may have been edited elsewhere: no escapes shown
    return RunSummary(r["id"], r["started_at"], r["label"], r["price_per_hour"], r["gpus"], r["verdict"],
                      json.loads(r["figures"]), r["machine_key"], r["machine_basis"], r["hostname"], str(r["kind"]),
                      r["summary"] if isinstance(r["summary"], str) else None)


@dataclass
class _Row:
    """A run as the `runs` table holds it: the record JSON and the columns derived from it."""

    data: dict[str, Any]
    record: str
    run_hash: str
    started_at: str
    label: str | None
    price_per_hour: float | None
    machine_key: str
    machine_basis: str
    gpus: str
    hostname: str | None
    verdict: str
    tool_version: str | None
    figures: str

    @classmethod
    def of(cls, data: dict[str, Any], record: RunRecord) -> _Row:
        identity = machine_identity(record.machine)
        options = data.get("options") or {}
        return cls(
            data=data, record=_to_json(data), run_hash=run_hash(data), started_at=record.started_at,
            label=options.get("label"), price_per_hour=options.get("price"),
            machine_key=identity.key, machine_basis=identity.basis, gpus=gpu_summary(record.machine),
            hostname=record.machine.host.hostname if record.machine.host else None, verdict=record.verdict,
            tool_version=record.tool.get("version"), figures=json.dumps(key_figures(record)),
        )


# -- the store --------------------------------------------------------------------------------

T = TypeVar("T")


def _guarded(method: Callable[..., T]) -> Callable[..., T]:
    """SQLite errors (a file damaged after open, a full disk) become one StoreError."""

    @functools.wraps(method)
    def wrapper(self: Store, *args: Any, **kwargs: Any) -> T:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as err:
            raise StoreError(self.path, _reason(err)) from None

    return wrapper


def _reason(err: sqlite3.Error) -> str:
    text = str(err)
    if "not a database" in text or "malformed" in text:
        return f"not a readable gpuvet store ({text}); it is left as it is: move it aside or use --db"
    if "locked" in text or "busy" in text:
        return f"another gpuvet process held it for more than {BUSY_TIMEOUT_S:.0f} s ({text})"
    return text


class Store:
    """Runs saved on this machine. Open it, use it, close it (or use `with Store(path) as s:`)."""

    def __init__(self, path: str | os.PathLike[str] | None = None, create: bool = True, read_only: bool = False):
        """`read_only`: for commands that only read (history, show, export, compare); such a store
        may sit on a read-only file system or belong to another user."""
        self.path = Path(path) if path is not None else default_path()
        self.read_only = read_only and not create
        self.damaged: dict[int, str] = {}  # run id -> why it could not be read, as reads meet them
        self._db = self._connect(create)
        try:
            self._prepare()
        except sqlite3.Error as err:
            self._db.close()
            raise StoreError(self.path, _reason(err)) from None
        except StoreError:
            self._db.close()
            raise

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- opening --------------------------------------------------------------------------

    def _connect(self, create: bool) -> sqlite3.Connection:
        if self.path.is_dir():
            raise StoreError(self.path, "is a folder; give a file name")
        if not self.path.exists():
            if not create:
                raise NoStoreYet(self.path, "no store here yet (`gpuvet run` saves every run to it)")
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # 0600 before SQLite opens it (its -wal and -shm files copy the mode): the runs
                # hold hostnames, serials and IP addresses.
                os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            except FileExistsError:
                pass  # another gpuvet created it meanwhile
            except OSError as err:
                raise StoreError(self.path, f"cannot create it ({err.strerror or err})") from None
        try:
            # isolation_level=None: transactions are begun and ended here, explicitly.
            db = sqlite3.connect(self._uri(), timeout=BUSY_TIMEOUT_S, isolation_level=None, uri=True)
            if self.read_only:
                db.execute("PRAGMA user_version").fetchone()  # fails here if a WAL store cannot be read so
        except sqlite3.DatabaseError as err:
            if not self.read_only or "not a database" in str(err):
                raise StoreError(self.path, _reason(err) if "not a database" in str(err) else f"cannot open it ({err})") from None
            # A WAL store on a read-only file system, without its -shm file: nobody can write
            # there, so SQLite may read it as immutable.
            try:
                db = sqlite3.connect(self._uri(immutable=True), isolation_level=None, uri=True)
                db.execute("PRAGMA user_version").fetchone()
            except sqlite3.Error as again:
                raise StoreError(self.path, f"cannot open it ({_reason(again)})") from None
        db.row_factory = sqlite3.Row
        return db

    def _uri(self, immutable: bool = False) -> str:
        mode = "?mode=ro" + ("&immutable=1" if immutable else "") if self.read_only else ""
        return "file:" + urllib.parse.quote(str(self.path.absolute())) + mode

    def _prepare(self) -> None:
        """Check what the file holds (reads only), then create or migrate it under the write lock,
        then switch to WAL. Nothing is written to a file that is not a gpuvet store."""
        version, tables = self._layout()
        self._refuse_unknown(version, tables)
        if self.read_only:
            if version < SCHEMA_VERSION:
                raise StoreError(self.path, "written by an older gpuvet; a command that saves (gpuvet import, "
                                            "gpuvet label) upgrades it first")
            return
        if version < SCHEMA_VERSION:
            with self._transaction():
                version, tables = self._layout()  # another process may have done it meanwhile
                self._refuse_unknown(version, tables)
                if version < SCHEMA_VERSION:
                    self._upgrade(version, tables)
        self._rekey_gpuless_machines()
        self._use_wal()
        self._db.execute("PRAGMA synchronous = FULL")

    def _layout(self) -> tuple[int, set[str]]:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        tables = {row[0] for row in self._db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")}
        return version, tables

    def _refuse_unknown(self, version: int, tables: set[str]) -> None:
        if version > SCHEMA_VERSION:
            raise StoreError(self.path, f"written by a newer gpuvet (store layout {version}; this gpuvet reads up to "
                                        f"{SCHEMA_VERSION}); upgrade gpuvet to use it. The file is left as it is.")
        if version == 0 and tables and not self._is_v0(tables):
            raise StoreError(self.path, f"an SQLite database, but not a gpuvet store (tables: {', '.join(sorted(tables))}); "
                                        f"it is left as it is: choose another --db")

    def _is_v0(self, tables: set[str]) -> bool:
        if "runs" not in tables:
            return False
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(runs)")}
        return {"id", "record"} <= columns

    def _use_wal(self) -> None:
        """Switching to WAL takes the file's exclusive lock. Where another process holds its read
        lock and waits for ours, SQLite answers "locked" at once instead of waiting (its deadlock
        rule; the busy timeout does not apply), so the switch is retried here up to that timeout.
        Once one process has switched, the others' switch is a no-op."""
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        pause = 0.005
        while True:
            try:
                self._db.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as err:
                if "readonly" in str(err):  # a read-only store is still readable without WAL
                    return
                if "locked" not in str(err) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause * (0.5 + random.random()))  # jittered, so two retriers do not meet again
            pause = min(pause * 2, 0.2)

    # -- migrations -----------------------------------------------------------------------

    def _rekey_gpuless_machines(self) -> None:
        """Runs of a GPU-less machine that earlier versions keyed on hostname + CPU model get the
        hostname key, so they join the machine's `health` runs (at the first writable open)."""
        if not self._db.execute("SELECT 1 FROM runs WHERE machine_basis LIKE ? LIMIT 1", (_CPU_KEYED,)).fetchone():
            return
        with self._transaction():
            for (hostname,) in self._db.execute("SELECT DISTINCT hostname FROM runs WHERE machine_basis LIKE ?",
                                                (_CPU_KEYED,)).fetchall():
                identity = gpuless_identity(hostname)
                self._db.execute("UPDATE runs SET machine_key = ?, machine_basis = ? WHERE machine_basis LIKE ? AND hostname IS ?",
                                 (identity.key, identity.basis, _CPU_KEYED, hostname))

    def _upgrade(self, version: int, tables: set[str]) -> None:
        steps = {0: self._migrate_0_to_1}
        while version < SCHEMA_VERSION:
            steps[version](tables)
            version += 1
            self._db.execute(f"PRAGMA user_version = {version}")

    def _migrate_0_to_1(self, tables: set[str]) -> None:
        """Layout 0: a `runs` table with at least `id` and `record` (the run record JSON), as early
        versions wrote it, or nothing at all (a new file). Its rows are rebuilt from their JSON
        with their ids kept; a row whose JSON cannot be read moves to `unreadable_runs`."""
        if "runs" in tables:
            self._db.execute("ALTER TABLE runs RENAME TO runs_v0")
        for statement in _CREATE_V1.split(";"):
            if statement.strip():
                self._db.execute(statement)
        if "runs" not in tables:
            return
        for row in self._db.execute("SELECT id, record FROM runs_v0 ORDER BY id").fetchall():
            try:
                data, record = _parse_record(row["record"])
            except ValueError as err:
                self._db.execute("INSERT INTO unreadable_runs (id, record, reason) VALUES (?, ?, ?)",
                                 (row["id"], row["record"], str(err)))
                continue
            self._insert(_Row.of(data, record), run_id=row["id"])
        self._reserve_ids_up_to("runs_v0")
        self._db.execute("DROP TABLE runs_v0")

    def _reserve_ids_up_to(self, old_table: str) -> None:
        """New runs get ids above every old one, unreadable ones too (an id names one run forever)."""
        highest = self._db.execute(f"SELECT COALESCE(MAX(id), 0) FROM {old_table}").fetchone()[0]
        self._db.execute("DELETE FROM sqlite_sequence WHERE name = 'runs'")
        self._db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('runs', ?)", (highest,))

    # -- writing --------------------------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """One write transaction; the write lock is taken at the start, so two writers queue
        instead of failing half-way."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:  # also after a failed COMMIT (disk full): never leave one open
                self._db.execute("ROLLBACK")
            raise

    @_guarded
    def save(self, record: RunRecord, label: str | None = None, price_per_hour: float | None = None) -> int:
        """Store a run (label and price default to the record's options "label"/"price"); returns
        its id. Saving the same run again returns the id it already has."""
        data = record.to_dict()
        _set_label_and_price(data, label, price_per_hour)
        row = _Row.of(data, record)  # computed before the write lock: other writers wait less
        with self._transaction():
            return self._insert(row)

    def _insert(self, row: _Row, run_id: int | None = None) -> int:
        """Insert a run unless it is already stored (then fill a missing label or price); returns
        its id. Runs inside a transaction."""
        existing = self._db.execute("SELECT id, record FROM runs WHERE run_hash = ?", (row.run_hash,)).fetchone()
        if existing:
            self._fill_blanks(existing["id"], json.loads(existing["record"]), row.data)
            return existing["id"]
        cursor = self._db.execute(
            "INSERT INTO runs (id, run_hash, started_at, saved_at, label, price_per_hour, machine_key, machine_basis,"
            " gpus, hostname, verdict, tool_version, figures, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, row.run_hash, row.started_at, timestamp(), row.label, row.price_per_hour, row.machine_key,
             row.machine_basis, row.gpus, row.hostname, row.verdict, row.tool_version, row.figures, row.record),
        )
        assert cursor.lastrowid is not None  # set by every INSERT that succeeds
        return cursor.lastrowid

    def _fill_blanks(self, run_id: int, stored: dict[str, Any], incoming: dict[str, Any]) -> list[str]:
        """The same run arriving again may carry a label or price the stored copy lacks: those are
        filled in. A stored label or price is never overwritten by an incoming one; what was kept
        instead is returned, one sentence each, so the caller can say so."""
        have, new = stored.get("options") or {}, incoming.get("options") or {}
        kept = []
        for key, what in (("label", "label"), ("price", "price per hour")):
            if have.get(key) is not None and new.get(key) is not None and have[key] != new[key]:
                kept.append(f"kept its {what} {have[key]!r} (the import has {new[key]!r})")
        label = have.get("label") if have.get("label") is not None else new.get("label")
        price = have.get("price") if have.get("price") is not None else new.get("price")
        if (label, price) != (have.get("label"), have.get("price")):
            _set_label_and_price(stored, label, price)
            self._db.execute("UPDATE runs SET label = ?, price_per_hour = ?, record = ? WHERE id = ?",
                             (label, price, _to_json(stored), run_id))
        return kept

    @_guarded
    def import_records(self, items: list[dict[str, Any]]) -> list[int]:
        """Store exported run records (all or none); a run already here is kept once. Returns the
        ids, in the order given."""
        return [imported.id for imported in self.import_runs(items)]

    @_guarded
    def import_runs(self, items: list[dict[str, Any]] | dict[str, Any]) -> list[Imported]:
        """Store exported run records (all or none), saying for each whether it was new or
        already here, and which stored label/price were kept over the file's."""
        if not isinstance(items, list):
            items = [items]  # one run record on its own, as `gpuvet run --out` writes it
        rows = []
        for n, item in enumerate(items, 1):
            try:
                data, record = _parse_record(item, importing=True)
                rows.append(_Row.of(data, record))
            except ValueError as err:
                raise ValueError(f"item {n} of {len(items)}: {err}") from None
        results = []
        with self._transaction():
            for row in rows:
                existing = self._db.execute("SELECT id, record FROM runs WHERE run_hash = ?", (row.run_hash,)).fetchone()
                if existing:
                    kept = self._fill_blanks(existing["id"], json.loads(existing["record"]), row.data)
                    results.append(Imported(existing["id"], True, kept))
                else:
                    results.append(Imported(self._insert(row), False, []))
        return results

    @_guarded
    def set_label(self, run_id: int, label: str | None = None, price_per_hour: float | None = None) -> dict[str, Any]:
        """Give a stored run a label and/or a price afterwards (None leaves that one as it is, a
        label "" removes it); returns the run's options as stored now."""
        with self._transaction():
            data = self._record_dict(run_id)
            _set_label_and_price(data, label, price_per_hour)
            options = data["options"]
            self._db.execute("UPDATE runs SET label = ?, price_per_hour = ?, record = ? WHERE id = ?",
                             (options.get("label"), options.get("price"), _to_json(data), run_id))
            return options

    # -- reading --------------------------------------------------------------------------

    def _record_dict(self, run_id: int) -> dict[str, Any]:
        row = self._db.execute("SELECT record FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise UnknownRun(self.path, f"no run {run_id} (gpuvet history lists them)")
        try:
            data = json.loads(row["record"])
        except (TypeError, ValueError) as err:
            raise self._damaged(run_id, f"its record is not JSON: {err}") from None
        if not isinstance(data, dict):
            raise self._damaged(run_id, f"its record is a JSON {type(data).__name__}, not a run")
        return data

    def _damaged(self, run_id: int, why: str) -> DamagedRun:
        """Noted for the listing's warning (`damaged`), and raised where that one run was asked for."""
        self.damaged[run_id] = why
        return DamagedRun(self.path, f"run {run_id} is damaged ({why}); the other runs are readable (gpuvet history)")

    def _record(self, run_id: int) -> RunRecord:
        try:
            return RunRecord.from_dict(self._record_dict(run_id))
        except (TypeError, ValueError, KeyError, AttributeError) as err:
            if isinstance(err, StoreError):
                raise
            raise self._damaged(run_id, f"not a readable run record: {err}") from None

    @_guarded
    def get(self, run_id: int) -> RunRecord:
        """A stored run, as it was saved (its options carry "label"/"price" when it has them)."""
        return self._record(run_id)

    @_guarded
    def latest(self) -> RunRecord | None:
        row = self._db.execute("SELECT id FROM runs ORDER BY started_at DESC, id DESC LIMIT 1").fetchone()
        return self.get(row["id"]) if row else None

    @_guarded
    def runs(self, machine_key: str | None = None, limit: int | None = None, kind: str | None = None) -> list[RunSummary]:
        """Stored runs, newest first; `machine_key` may be a prefix of the key (as in `git log`);
        `kind`: only runs of that profile ("health": the fleet checks)."""
        conditions: list[str] = []
        args: list[object] = []
        if machine_key:
            conditions.append("machine_key LIKE ? ESCAPE '\\'")
            args.append(_like_prefix(machine_key))
        if kind:
            conditions.append(f"{_KIND} = ?")
            args.append(kind)
        where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
        query = f"SELECT {_LISTED} FROM runs {where} ORDER BY started_at DESC, id DESC"
        if limit is not None:
            query += " LIMIT ?"
            args.append(int(limit))
        summaries = []
        for row in self._db.execute(query, args):
            try:
                summaries.append(_summary(row))
            except (TypeError, ValueError) as err:  # a row edited or damaged outside gpuvet: list the rest
                self.damaged[row["id"]] = f"its listing columns are unreadable: {err}"
        return summaries

    @_guarded
    def records(self, machine_key: str) -> list[RunRecord]:
        """Every run of one machine (key or prefix), oldest first: what `compare.history_trend` takes."""
        rows = self._db.execute("SELECT id FROM runs WHERE machine_key LIKE ? ESCAPE '\\' ORDER BY started_at, id",
                                (_like_prefix(machine_key),)).fetchall()
        return self._readable(row["id"] for row in rows)

    def _readable(self, ids: Iterable[int]) -> list[RunRecord]:
        """The runs of `ids` that can be read; a damaged one is skipped and noted in `damaged`."""
        records = []
        for run_id in ids:
            with contextlib.suppress(DamagedRun):
                records.append(self._record(run_id))
        return records

    @_guarded
    def export(self, ids: list[int]) -> list[dict[str, Any]]:
        """Whole run records (label and price in their options), in the order asked; each one a
        valid gpuvet.run/1 record on its own. A damaged run is left out and noted in `damaged`;
        if every one asked for is damaged, DamagedRun names the first."""
        runs, first_damage = [], None
        for run_id in ids:
            try:
                runs.append(self._record_dict(int(run_id)))
            except DamagedRun as err:
                first_damage = first_damage or err
        if first_damage and not runs:
            raise first_damage
        return runs

    @_guarded
    def machines(self) -> list[tuple[str, str, int]]:
        """(machine key, description, number of runs), the most recently seen machine first."""
        rows = self._db.execute(
            "SELECT machine_key, machine_basis, gpus, hostname, COUNT(*) AS n, MAX(started_at) AS last"
            " FROM runs GROUP BY machine_key ORDER BY last DESC")
        return [(row["machine_key"], _describe(row), row["n"]) for row in rows]

    @_guarded
    def integrity(self) -> str:
        """SQLite's own check of the file: "ok", or what is damaged."""
        return "; ".join(row[0] for row in self._db.execute("PRAGMA integrity_check"))


# -- helpers ----------------------------------------------------------------------------------

def _set_label_and_price(data: dict[str, Any], label: str | None, price: float | None) -> None:
    """Set the label ("" removes it) and the price; a price must be a positive finite number
    (JSON has no Infinity or NaN, and a zero price makes every cost meaningless)."""
    options = dict(data.get("options") or {})
    if label == "":
        options.pop("label", None)
    elif label is not None:
        options["label"] = label
    if price is not None:
        options["price"] = check_price(price)
    data["options"] = options


def check_price(price: Any) -> float:
    """A price per hour as a float, or ValueError saying why it is not one."""
    try:
        value = float(price)
    except (TypeError, ValueError):
        raise ValueError(f"a price per hour must be a number of USD, not {price!r}") from None
    if isinstance(price, bool) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"a price per hour must be a positive finite number of USD, not {price!r}")
    return value


# What a stored run needs to be listed and compared; `gpuvet run` writes all of them.
_REQUIRED = {"started_at": str, "machine": dict, "tool": dict}


def _check_importable(data: dict[str, Any]) -> None:
    """A record from elsewhere must carry what a run listing needs, and a valid label and price."""
    missing = [key for key, kind in _REQUIRED.items() if not isinstance(data.get(key), kind) or not data.get(key)]
    if missing:
        raise ValueError(f"a gpuvet run record without {', '.join(missing)} (not written by gpuvet run/inspect?)")
    try:
        parse_timestamp(data["started_at"])
    except ValueError:
        raise ValueError(f"started_at {data['started_at']!r} is not an ISO 8601 time") from None
    options = data.get("options") or {}
    if not isinstance(options, dict):
        raise ValueError("its options are not an object")
    if options.get("price") is not None:
        check_price(options["price"])
    if options.get("label") is not None and not isinstance(options["label"], str):
        raise ValueError(f"its label {options['label']!r} is not text")


def _parse_record(item: Any, importing: bool = False) -> tuple[dict[str, Any], RunRecord]:
    """A run record dict from JSON text or a dict, checked to be one this gpuvet can read; the
    dict is what gets stored (fields a newer gpuvet added are kept)."""
    if isinstance(item, str):
        try:
            item = json.loads(item)
        except json.JSONDecodeError as err:
            raise ValueError(f"not JSON ({err})") from None
    if not isinstance(item, dict):
        raise ValueError(f"not a gpuvet run record (a {type(item).__name__})")
    if item.get("schema") != SCHEMA:
        raise ValueError(f"not a gpuvet run record (schema {item.get('schema')!r}, expected {SCHEMA!r})")
    if importing:
        _check_importable(item)  # before the type check turns an infinite price into no price
    try:
        checked = check_run(item)  # what is stored: NaN and infinities as null, as gpuvet writes them
        return checked, RunRecord.from_dict(checked)
    except (TypeError, ValueError, KeyError, AttributeError) as err:
        raise ValueError(f"a damaged gpuvet run record ({err})") from None


def _describe(row: sqlite3.Row) -> str:
    host = f" on {row['hostname']}" if row["hostname"] else ""
    return f"{row['gpus']}{host} · key from {row['machine_basis']}"


def _like_prefix(text: str) -> str:
    return re.sub(r"([%_\\])", r"\\\1", text) + "%"


def _to_json(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"))



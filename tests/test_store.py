"""The run store: round trips, listing, export/import, several writers, a killed writer,
migration from an older layout, and files it must refuse without touching them.

Records come from real captures (tests/fixtures) judged by `gpuvet inspect`; where a test needs
benchmark figures it adds them to a copy of a real record and says so (synthetic).
"""

from __future__ import annotations

import copy
import hashlib
import json
import multiprocessing
import os
import signal
import sqlite3
from pathlib import Path

import pytest

from gpuvet import runner
from gpuvet.record import Measurement, RunRecord
from gpuvet.store import SCHEMA_VERSION, NoStoreYet, Store, StoreError, UnknownRun, default_path, machine_identity

FIXTURES = Path(__file__).parent / "fixtures"
H100_8X = "smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt"  # real UUIDs, 8 GPUs
RTX4090_8X = "smi_text/q-8x-rtx4090-all-idle-535.154.05.txt"  # real UUIDs, 8 GPUs
H100_MASKED = "bundles/h100-80gb-hbm3-vm-590.48.01.txt"  # collector masked the UUID (GPU-00000000-...)
L40S_MASKED = "bundles/l40s-vm-595.80.txt"


def captured(fixture: str, started_at: str = "2025-03-01T10:00:00Z") -> RunRecord:
    """A real capture judged as `gpuvet inspect` judges it, with a fixed start time."""
    record = runner.inspect([str(FIXTURES / fixture)])
    record.started_at = started_at
    return record


def with_synthetic_figures(record: RunRecord, figures: dict[str, list[float]], units: dict[str, str]) -> RunRecord:
    """A copy of a real record with SYNTHETIC per-GPU measurements added (gpu0, gpu1, ...)."""
    record = copy.deepcopy(record)
    for name, values in figures.items():
        record.measurements += [Measurement(name, v, units[name], f"gpu{i}") for i, v in enumerate(values)]
    return record


@pytest.fixture(scope="module")
def h100() -> RunRecord:
    return captured(H100_8X)


@pytest.fixture(scope="module")
def rtx4090() -> RunRecord:
    return captured(RTX4090_8X, "2025-03-02T22:00:00Z")


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "runs.sqlite3") as s:
        yield s


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- round trips and listing ------------------------------------------------------------------

def test_a_saved_run_comes_back_as_the_same_record(store, h100, rtx4090):
    first, second = store.save(h100), store.save(rtx4090)
    assert (first, second) == (1, 2)
    assert store.get(first).to_dict() == h100.to_dict()
    assert store.get(second).to_dict() == rtx4090.to_dict()
    assert store.latest().to_dict() == rtx4090.to_dict()  # the later start time
    with pytest.raises(UnknownRun, match="no run 99"):
        store.get(99)


def test_label_and_price_travel_in_the_record_options_and_saving_twice_stores_once(store, h100):
    run_id = store.save(h100, label="provider A, region x", price_per_hour=2.49)
    assert store.save(h100) == run_id  # the same run again: no second row
    assert len(store.runs()) == 1
    options = store.get(run_id).options
    assert options["label"] == "provider A, region x" and options["price"] == 2.49
    assert "label" not in h100.options  # the caller's record is not changed
    summary = store.runs()[0]
    assert (summary.label, summary.price_per_hour) == ("provider A, region x", 2.49)
    with pytest.raises(ValueError, match="positive"):
        store.save(h100, price_per_hour=0)


def test_listing_shows_gpus_verdict_and_key_figures_as_medians_over_gpus(store, h100, rtx4090):
    gemm = [700.0, 710.0, 690.0, 705.0, 720.0, 300.0, 698.0, 702.0]  # synthetic; one slow GPU
    measured = with_synthetic_figures(h100, {"gemm.bf16": gemm, "membw.copy": [3000.0] * 8},
                                      {"gemm.bf16": "TFLOPS", "membw.copy": "GB/s"})
    store.save(measured, label="A")
    store.save(rtx4090, label="B")
    newest, older = store.runs()
    assert (newest.label, older.label) == ("B", "A")  # newest first
    assert older.gpus == "8 x NVIDIA H100 80GB HBM3" and newest.gpus == "8 x NVIDIA GeForce RTX 4090"
    assert older.verdict == h100.verdict == "fail"  # this capture is power-capped under load
    assert older.figures == {"gemm.bf16": 701.0, "membw.copy": 3000.0}  # median of the 8 GPUs
    assert newest.figures == {}
    assert [s.label for s in store.runs(limit=1)] == ["B"]


def test_runs_of_one_machine_are_grouped_by_their_gpu_uuids(store, h100, rtx4090):
    later = copy.deepcopy(h100)
    later.started_at = "2025-03-05T03:00:00Z"
    later.machine.gpus.reverse()  # the same GPUs enumerated in another order: the same machine
    ids = [store.save(h100), store.save(later), store.save(rtx4090)]
    assert len(set(ids)) == 3
    key = machine_identity(h100.machine)
    assert key == machine_identity(later.machine) != machine_identity(rtx4090.machine)
    assert key.basis == "the 8 GPU UUIDs"
    assert [s.id for s in store.runs(machine_key=key.key)] == [ids[1], ids[0]]
    assert [s.id for s in store.runs(machine_key=key.key[:5])] == [ids[1], ids[0]]  # a prefix, as in git
    assert [r.started_at for r in store.records(key.key)] == [h100.started_at, later.started_at]  # oldest first
    machines = dict((k, (description, n)) for k, description, n in store.machines())
    assert machines[key.key][1] == 2 and "8 x NVIDIA H100 80GB HBM3" in machines[key.key][0]
    assert machines[machine_identity(rtx4090.machine).key][1] == 1


def test_masked_uuids_fall_back_to_bus_ids_and_say_so():
    h100, l40s = captured(H100_MASKED), captured(L40S_MASKED)
    assert h100.machine.gpus[0].uuid.startswith("GPU-00000000")
    identity = machine_identity(h100.machine)
    assert "bus ids" in identity.basis and "masked" in identity.basis
    assert identity != machine_identity(l40s.machine)


# -- export / import --------------------------------------------------------------------------

def test_export_and_import_move_runs_between_stores_once(tmp_path, h100, rtx4090):
    with Store(tmp_path / "a.sqlite3") as a, Store(tmp_path / "b.sqlite3") as b:
        ids = [a.save(h100, label="A", price_per_hour=12.0), a.save(rtx4090, label="B", price_per_hour=3.2)]
        exported = json.loads(json.dumps(a.export(ids)))  # as `gpuvet export > runs.json` writes it
        assert [item["options"]["label"] for item in exported] == ["A", "B"]
        assert all(item["schema"] == "gpuvet.run/1" for item in exported)
        b_ids = b.import_records(exported)
        assert b.export(b_ids) == exported
        assert b.import_records(exported) == b_ids  # idempotent
        assert a.import_records(exported) == ids  # back home: still one copy each
        assert len(a.runs()) == len(b.runs()) == 2
        assert [s.label for s in b.runs()] == ["B", "A"]


def test_import_fills_a_missing_label_and_keeps_an_existing_one(store, h100):
    run_id = store.save(h100)
    labelled = copy.deepcopy(h100.to_dict())
    labelled["options"].update(label="from the other machine", price=4.0)
    assert store.import_records([labelled]) == [run_id]
    assert store.get(run_id).options["label"] == "from the other machine"
    relabelled = copy.deepcopy(labelled)
    relabelled["options"]["label"] = "another name"
    store.import_records([relabelled])
    assert store.runs()[0].label == "from the other machine"


def test_import_says_which_runs_were_already_here_and_what_was_kept(store, h100, rtx4090):
    run_id = store.save(h100, label="mine", price_per_hour=2.0)
    theirs = copy.deepcopy(h100.to_dict())
    theirs["options"].update(label="theirs", price=2.0)
    outcomes = store.import_runs([theirs, rtx4090.to_dict()])
    assert [(o.id, o.already) for o in outcomes] == [(run_id, True), (run_id + 1, False)]
    assert outcomes[0].kept == ["kept its label 'mine' (the import has 'theirs')"]  # same price: nothing to say
    assert store.runs()[-1].label == "mine"


def test_a_label_or_price_set_afterwards_and_bad_prices_refused(store, h100):
    run_id = store.save(h100, label="first name")
    named = lambda options: {k: v for k, v in options.items() if k in ("label", "price")}  # noqa: E731
    assert named(store.set_label(run_id, price_per_hour=3.5)) == {"label": "first name", "price": 3.5}
    assert named(store.set_label(run_id, label="")) == {"price": 3.5}  # "" removes the label
    assert (store.runs()[0].label, store.runs()[0].price_per_hour) == (None, 3.5)
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="positive finite"):
            store.set_label(run_id, price_per_hour=bad)
        with pytest.raises(ValueError, match="positive finite"):
            store.save(h100, price_per_hour=bad)
    infinite = copy.deepcopy(h100.to_dict())
    infinite["options"]["price"] = float("inf")  # what `json.loads('... Infinity ...')` gives
    with pytest.raises(ValueError, match="item 1 of 1: a price per hour must be a positive finite"):
        store.import_records([infinite])
    with pytest.raises(UnknownRun):
        store.set_label(run_id + 1, label="x")


def test_import_refuses_a_record_missing_what_a_run_needs(store, h100):
    with pytest.raises(ValueError, match="item 1 of 1: a gpuvet run record without started_at, machine, tool"):
        store.import_records([{"schema": "gpuvet.run/1"}])
    undated = copy.deepcopy(h100.to_dict())
    undated["started_at"] = "yesterday"
    with pytest.raises(ValueError, match="not an ISO 8601 time"):
        store.import_records([undated])
    assert store.runs() == []


def test_import_of_something_else_says_which_item_and_stores_nothing(store, h100):
    good = h100.to_dict()
    with pytest.raises(ValueError, match="item 2 of 3: not a gpuvet run record"):
        store.import_records([good, {"schema": "other/1"}, good])
    with pytest.raises(ValueError, match="item 1 of 1"):
        store.import_records(["not json at all"])
    assert store.runs() == []


# -- several processes ------------------------------------------------------------------------

WRITERS, RUNS_EACH = 6, 5


def _writer(path: str, base: dict, writer: int, start) -> None:
    start.wait()  # every process begins at once, the store not even created yet
    store = Store(path)
    for i in range(RUNS_EACH):
        data = copy.deepcopy(base)
        data["duration_s"] = writer * 100 + i  # a distinct run each time
        store.save(RunRecord.from_dict(data), label=f"writer {writer} run {i}")
    store.close()


def test_several_processes_saving_at_once_lose_nothing(tmp_path, h100):
    path = str(tmp_path / "shared.sqlite3")
    context = multiprocessing.get_context("fork")
    start = context.Barrier(WRITERS)
    writers = [context.Process(target=_writer, args=(path, h100.to_dict(), n, start)) for n in range(WRITERS)]
    for p in writers:
        p.start()
    for p in writers:
        p.join(timeout=120)
    assert [p.exitcode for p in writers] == [0] * WRITERS
    with Store(path) as store:
        labels = sorted(s.label for s in store.runs())
        assert labels == sorted(f"writer {w} run {i}" for w in range(WRITERS) for i in range(RUNS_EACH))
        assert store.integrity() == "ok"


class _LockedAtFirst:
    """A connection whose first WAL switches are answered "database is locked" at once, as SQLite
    answers a process that holds the read lock another waits on (seen in CI: 1 writer in 6)."""

    def __init__(self, db, refusals):
        self._db, self.refusals = db, refusals

    def execute(self, sql, *args):
        if "journal_mode" in sql and self.refusals:
            self.refusals -= 1
            raise sqlite3.OperationalError("database is locked")
        return self._db.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._db, name)


class _ContendedStore(Store):
    def _connect(self, create):
        self.connection = _LockedAtFirst(super()._connect(create), refusals=3)
        return self.connection


def test_a_store_opened_while_another_switches_it_to_wal_waits_instead_of_failing(tmp_path, h100):
    store = _ContendedStore(tmp_path / "runs.sqlite3")
    assert store.connection.refusals == 0  # every refusal was met and retried
    assert store.runs() == [] and store.save(h100) == 1
    store.close()


class _StallingStore(Store):
    """Stops inside the write transaction, after the row is written, until it is killed."""

    def __init__(self, path, inside, never):
        super().__init__(path)
        self._inside, self._never = inside, never

    def _insert(self, data, run_id=None):
        new_id = super()._insert(data, run_id)
        self._inside.set()
        self._never.wait()  # never set: the parent kills this process here
        return new_id


def _stalling_writer(path: str, data: dict, inside, never) -> None:
    _StallingStore(path, inside, never).save(RunRecord.from_dict(data), label="killed mid-write")


def test_a_writer_killed_mid_transaction_leaves_the_store_readable_and_writable(tmp_path, h100, rtx4090):
    path = tmp_path / "runs.sqlite3"
    with Store(path) as store:
        kept = store.save(h100, label="committed before")
    context = multiprocessing.get_context("fork")
    inside, never = context.Event(), context.Event()
    writer = context.Process(target=_stalling_writer, args=(str(path), rtx4090.to_dict(), inside, never))
    writer.start()
    assert inside.wait(timeout=60), "the writer never reached its transaction"
    os.kill(writer.pid, signal.SIGKILL)
    writer.join(timeout=30)
    assert writer.exitcode == -signal.SIGKILL
    with Store(path) as store:
        assert [s.label for s in store.runs()] == ["committed before"]  # the half-written run is gone
        assert store.get(kept).to_dict()["options"]["label"] == "committed before"
        assert store.integrity() == "ok"
        assert store.save(rtx4090, label="after the kill") != kept  # the write lock was released


# -- older layouts and files that are not stores ------------------------------------------------

def _version_0_store(path: Path, rows: list[tuple[int, str, str]]) -> None:
    """The layout before version 1: a bare `runs` table of id, started_at and the record JSON,
    and no user_version."""
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, started_at TEXT, record TEXT)")
    db.executemany("INSERT INTO runs VALUES (?, ?, ?)", rows)
    db.commit()
    db.close()


def test_a_version_0_store_is_migrated_at_open_and_keeps_every_run(tmp_path, h100, rtx4090):
    path = tmp_path / "old.sqlite3"
    old = [(5, h100.started_at, h100.to_json()), (9, rtx4090.started_at, rtx4090.to_json()),
           (11, "2025-01-01T00:00:00Z", "{broken json")]
    _version_0_store(path, old)
    with Store(path) as store:
        assert sorted(s.id for s in store.runs()) == [5, 9]
        assert store.get(5).to_dict() == h100.to_dict()
        assert store.runs(machine_key=machine_identity(rtx4090.machine).key)[0].id == 9
        assert store.save(captured(H100_MASKED)) == 12  # ids continue after the old ones
        assert store.integrity() == "ok"
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.execute("SELECT id, record FROM unreadable_runs").fetchall() == [(11, "{broken json")]  # kept, not dropped
    db.close()


def test_a_store_from_a_newer_gpuvet_is_refused_and_left_alone(tmp_path, h100):
    path = tmp_path / "new.sqlite3"
    with Store(path) as store:
        store.save(h100)
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    before = file_digest(path)
    with pytest.raises(StoreError, match="newer gpuvet"):
        Store(path)
    assert file_digest(path) == before


def test_a_file_that_is_not_a_database_gives_one_clear_error_and_stays_as_it_was(tmp_path):
    path = tmp_path / "runs.sqlite3"
    path.write_text("these are my notes, not a database\n" * 200)
    before = file_digest(path)
    with pytest.raises(StoreError) as error:
        Store(path)
    assert str(path) in str(error.value) and "not a readable gpuvet store" in str(error.value)
    assert error.value.path == str(path)
    assert file_digest(path) == before


def test_another_programs_sqlite_database_is_not_taken_over(tmp_path):
    path = tmp_path / "other.sqlite3"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE customers (name TEXT)")
    db.commit()
    db.close()
    before = file_digest(path)
    with pytest.raises(StoreError, match="not a gpuvet store"):
        Store(path)
    assert file_digest(path) == before


def test_a_damaged_store_gives_a_store_error_not_a_traceback_and_is_not_repaired(tmp_path, h100, rtx4090):
    path = tmp_path / "runs.sqlite3"
    with Store(path) as store:
        store.save(h100)
        store.save(rtx4090)
    db = sqlite3.connect(path)
    root, page_size = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'runs'").fetchone()[0], \
        db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    with open(path, "r+b") as f:  # overwrite the runs table's root page with junk
        f.seek((root - 1) * page_size)
        f.write(b"\xff" * page_size)
    before = file_digest(path)
    with pytest.raises(StoreError, match="not a readable gpuvet store"):
        with Store(path) as store:
            store.runs()
    assert file_digest(path) == before


def test_reading_a_store_that_does_not_exist_creates_nothing(tmp_path):
    path = tmp_path / "nowhere" / "runs.sqlite3"
    with pytest.raises(NoStoreYet, match="no store here yet"):
        Store(path, create=False)
    assert not path.parent.exists()


def test_default_path_follows_gpuvet_db_then_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("GPUVET_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_path() == tmp_path / "data" / "gpuvet" / "runs.sqlite3"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")  # the XDG spec: relative paths are invalid
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_path() == tmp_path / "home" / ".local" / "share" / "gpuvet" / "runs.sqlite3"
    monkeypatch.setenv("GPUVET_DB", str(tmp_path / "mine.db"))
    assert default_path() == tmp_path / "mine.db"

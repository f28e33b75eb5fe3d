"""The history store and written reports against damage, read-only places and prying eyes: one
damaged row hides nothing else, a read-only store is still read, new stores and reports are
private (0600), and a failed --out write leaves no temporary file."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpuvet.record import RunRecord
from gpuvet.store import machine_identity

from cli_runner import gpuvet

RECORDS = Path(__file__).parent / "fixtures/records"
NAMES = ("h100-8x-throttle", "cpu-quick", "gtx1070-6x-x1-riser")


@pytest.fixture
def db(tmp_path, monkeypatch, capsys) -> Path:
    path = tmp_path / "runs.sqlite3"
    monkeypatch.setenv("GPUVET_DB", str(path))
    for name in NAMES:
        assert gpuvet(capsys, "import", str(RECORDS / f"{name}.json"))[0] == 0
    return path


def damage(db: Path, sql: str) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute(sql)


def test_one_damaged_record_is_named_and_the_other_runs_are_shown_and_exported(capsys, db):
    damage(db, "UPDATE runs SET record = '{broken' WHERE id = 2")
    code, out, err = gpuvet(capsys, "show", "2")
    assert code == 2 and "run 2 is damaged (its record is not JSON" in err and "Traceback" not in err
    code, out, err = gpuvet(capsys, "export", "1", "2", "3")
    assert code == 0 and [r["started_at"] for r in json.loads(out)] and len(json.loads(out)) == 2
    assert "run 2 in" in err and "damaged and left out" in err
    cpu_quick = RunRecord.from_dict(json.loads((RECORDS / "cpu-quick.json").read_text()))
    code, out, err = gpuvet(capsys, "history", "--machine", machine_identity(cpu_quick.machine).key)  # its trend
    assert code == 0 and "run 2 in" in err and "Traceback" not in err


def test_a_damaged_listing_row_is_left_out_of_history_and_named(capsys, db):
    damage(db, "UPDATE runs SET figures = '{x' WHERE id = 3")
    code, out, err = gpuvet(capsys, "history")
    assert code == 0 and "H100" in out and "GTX 1070" not in out
    assert "run 3 in" in err and "damaged and left out" in err


def test_new_stores_and_reports_are_private(capsys, db, tmp_path):
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    out = tmp_path / "report.md"
    code, _, _ = gpuvet(capsys, "report", str(RECORDS / "cpu-quick.json"), "--format", "md", "--out", str(out))
    assert code in (0, 1) and stat.S_IMODE(out.stat().st_mode) == 0o600


def test_a_failed_out_write_leaves_no_temporary_file(capsys, tmp_path, monkeypatch):
    import gpuvet.private_file as private_file

    def full_disk(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(private_file.os, "replace", full_disk)
    out = tmp_path / "report.md"
    code, _, err = gpuvet(capsys, "report", str(RECORDS / "cpu-quick.json"), "--format", "md", "--out", str(out))
    assert code == 2 and "No space left on device" in err
    assert os.listdir(tmp_path) == []


def test_reads_open_the_store_read_only(db):
    from gpuvet.store import Store, StoreError

    with Store(db, create=False, read_only=True) as store:
        assert len(store.runs()) == 3
        with pytest.raises(StoreError, match="readonly"):  # the connection itself cannot write
            store.set_label(1, label="changed", price_per_hour=None)


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare(1) to mount a read-only view")
def test_a_store_on_a_read_only_file_system_is_still_listed(db, tmp_path):
    view = tmp_path / "ro"
    view.mkdir()
    script = (f"mount --bind {tmp_path} {view} && mount -o remount,ro,bind {view} && "
              f"GPUVET_DB={view / db.name} {sys.executable} -m gpuvet history")
    result = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    if "mount:" in result.stderr or "unshare:" in result.stderr:
        pytest.skip(f"no mount namespace here: {result.stderr.strip()[:80]}")
    assert result.returncode == 0 and "H100" in result.stdout, result.stderr

"""Stored runs on the command line: compare by label, --redact on export/compare/history, and the
run `gpuvet doctor` answers from."""

from __future__ import annotations

import copy
import json
import sqlite3
from pathlib import Path

import pytest

from gpuvet.cli import main
from gpuvet.record import RunRecord
from gpuvet.store import Store

RECORDS = Path(__file__).parent / "fixtures" / "records"
HOSTNAME = "gpu-node-17.example.internal"  # the real (set) hostname of cpu-quick.json


def record(name: str) -> RunRecord:
    return RunRecord.from_dict(json.loads((RECORDS / f"{name}.json").read_text()))


def gpuvet(capsys, *argv: str) -> tuple[int, str, str]:
    code = 0
    try:
        main(list(argv))
    except SystemExit as exit_:
        code = exit_.code or 0
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def db(tmp_path) -> str:
    """A store with the real cpu-quick run labelled "cpu box" and the synthetic H100 run "h100 node"."""
    path = str(tmp_path / "runs.sqlite3")
    with Store(path) as store:
        store.save(record("cpu-quick"), label="cpu box", price_per_hour=1.0)
        store.save(record("h100-8x-synthetic-sustained"), label="h100 node", price_per_hour=24.0)
    return path


def test_compare_takes_stored_runs_by_label(capsys, db):
    code, out, err = gpuvet(capsys, "compare", "cpu box", "H100 node", "--md", "--db", db)
    assert code == 0, err
    assert out.startswith("| | #1 cpu box | #2 h100 node |")
    assert "| gpu.throttle | not checked (skip) | FAIL |" in out


def test_compare_with_an_unknown_label_says_so_in_one_line_and_a_shared_one_is_one_machine(capsys, db):
    code, _, err = gpuvet(capsys, "compare", "nope", "1", "--db", db)
    assert code == 2
    assert err.strip() == ("gpuvet: nope: no such file, and no stored run has that label or platform (labels: 'cpu box', "
                           "'h100 node'; gpuvet history lists the runs)")
    with Store(db) as store:
        store.save(copy.deepcopy(record("cpu-sustained")), label="cpu box")  # the same machine, measured again
    code, out, err = gpuvet(capsys, "compare", "cpu box", "2", "--json", "--db", db)
    assert code == 0, err
    assert [run["name"] for run in json.loads(out)["runs"]] == ["#1+#3 cpu box", "#2 h100 node"]


def test_compare_redact_removes_the_hostname_even_from_a_file_name(capsys, tmp_path):
    named = tmp_path / f"{HOSTNAME}.json"
    named.write_text((RECORDS / "cpu-quick.json").read_text())
    code, out, err = gpuvet(capsys, "compare", str(named), str(RECORDS / "cpu-sustained.json"), "--json", "--redact")
    assert code == 0, err
    assert HOSTNAME not in out and "HOST-REDACTED-1.json" in out


def test_export_redact_removes_hostnames_with_one_token_per_host(capsys, db):
    code, out, _ = gpuvet(capsys, "export", "1", "2", "--redact", "--db", db)
    runs = json.loads(out)
    assert code == 0 and HOSTNAME not in out
    assert runs[0]["machine"]["host"]["hostname"] == "HOST-REDACTED-1" and runs[0]["options"]["redacted"] is True
    code, plain, _ = gpuvet(capsys, "export", "1", "--db", db)
    assert HOSTNAME in plain


def test_history_redact_hides_hostnames_in_the_machine_list_and_the_runs(capsys, db):
    code, out, _ = gpuvet(capsys, "history", "--machine", "--redact", "--db", db)
    assert code == 0 and HOSTNAME not in out and "HOST-REDACTED-1" in out
    code, out, _ = gpuvet(capsys, "history", "--json", "--redact", "--db", db)
    assert HOSTNAME not in out and {run["hostname"] for run in json.loads(out)} == {"HOST-REDACTED-1", None}


def test_doctor_answers_from_the_latest_full_run_not_a_later_partial_one(capsys, tmp_path):
    full = record("cpu-quick")  # synthetic: marked as a plain `gpuvet run`, then a later workload-only run
    full.options = {"profile": "default", "benchmarks": ["disk", "cpu", "workload"]}
    partial = record("cpu-quick")
    partial.started_at = "2026-11-29T17:00:00Z"
    partial.options = {"profile": "bench", "benchmarks": ["workload"], "device": "cpu"}
    path = str(tmp_path / "runs.sqlite3")
    with Store(path) as store:
        store.save(full)
        store.save(partial)
    code, out, _ = gpuvet(capsys, "doctor", "gpu-low-cpu-high", "--db", path)
    assert code == 0
    assert ("Answered from run #1 (started 2026-11-29T16:45:04Z, live, verdict warn): this machine's latest full "
            "`gpuvet run`; the later run #2 was partial (only workload).") in " ".join(out.split())


def test_doctor_says_when_only_a_partial_run_is_stored(capsys, db):
    code, out, _ = gpuvet(capsys, "doctor", "day-night", "--db", db)  # run #1 started last
    assert code == 0 and "Answered from run #1" in out
    assert ("a partial run (facts only: gpuvet run --quick); no full `gpuvet run` of this machine is stored"
            in " ".join(out.split()))


def test_doctor_reads_an_export_file_as_report_does(capsys, db, tmp_path):
    _, exported, _ = gpuvet(capsys, "export", "1", "2", "--db", db)
    runs = tmp_path / "runs.json"
    runs.write_text(exported)
    code, out, err = gpuvet(capsys, "doctor", "no-kernel-image", "--run", str(runs))
    assert code == 0, err
    assert f"Answered from {runs} (started 2026-11-29T16:45:04Z" in " ".join(out.split())
    assert "FOUND" not in out  # no GPU visible confirms no mixed fleet
    assert "holds 2 runs (a gpuvet export); this is the first" in err


def test_history_redact_hides_the_machine_keys_that_link_runs_to_a_machine(capsys, db, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # the table unwrapped: a key cannot hide by being folded
    with Store(db) as store:
        keys = [key for key, _, _ in store.machines()]
    for argv in (("history", "--redact"), ("history", "--machine", "--redact"), ("history", "--json", "--redact"),
                 ("history", "--machine", keys[0][:6], "--redact", "--json")):
        code, out, _ = gpuvet(capsys, *argv, "--db", db)
        assert code == 0 and "MACHINE-REDACTED-" in out, argv
        assert not any(key[:12] in out for key in keys), argv


# -- the first hour: a run's id, --json everywhere, one machine key (issue 29) ---------------------

def test_report_takes_the_run_id_saved_as_run_n_gave(capsys, tmp_path):
    """`gpuvet run --quick` on this (GPU-less) machine, then `gpuvet report 1` as its line says."""
    db = str(tmp_path / "runs.sqlite3")
    code, out, err = gpuvet(capsys, "run", "--quick", "--db", db)
    assert out.rstrip().splitlines()[-1].startswith("saved as run 1: gpuvet report 1")  # under the verdict
    code, report, err = gpuvet(capsys, "report", "1", "--db", db)
    assert code == 0, err
    assert report.strip().splitlines()[-1].split(":")[0] in ("PASS", "WARN", "FAIL", "SKIP")
    for argv in (("report", "#1", "--json"), ("show", "1", "--json")):
        code, out, err = gpuvet(capsys, *argv, "--db", db)
        assert json.loads(out)["schema"] == "gpuvet.run/1", (argv, err)
    code, out, err = gpuvet(capsys, "report", "7", "--db", db)
    assert code == 2 and "no run 7" in err


def test_a_file_named_like_a_run_id_is_still_read_as_the_file(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "3").write_text((RECORDS / "cpu-quick.json").read_text())
    code, out, err = gpuvet(capsys, "report", "3", "--json", "--db", str(tmp_path / "none.sqlite3"))
    assert code == 0, err
    assert json.loads(out)["machine"]["host"]["hostname"] == HOSTNAME


def test_run_and_health_of_one_machine_are_one_machine_in_the_history(capsys, tmp_path):
    """health reads no CPU model: a GPU-less machine was two machines, one per command."""
    db = str(tmp_path / "runs.sqlite3")
    gpuvet(capsys, "run", "--quick", "--db", db)
    gpuvet(capsys, "health", "--db", db)
    code, out, err = gpuvet(capsys, "history", "--machine", "--json", "--db", db)
    machines = json.loads(out)
    assert [m["runs"] for m in machines] == [2], machines


def test_runs_keyed_by_an_earlier_gpuvet_join_their_machine_at_the_next_save(tmp_path):
    """A GPU-less run as earlier versions keyed it (hostname + CPU model), rewritten here the way
    they stored it, is found under the machine's key once a command that saves opens the store."""
    db = tmp_path / "runs.sqlite3"
    with Store(db) as store:
        store.save(record("cpu-quick"))
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE runs SET machine_key = 'ff0a6cfecd59', machine_basis = ?",
                    (f"hostname {HOSTNAME} + CPU model; no GPU",))
    with Store(db) as store:
        store.save(_health_of(record("cpu-quick")))
        assert len(store.machines()) == 1
        assert store.machines()[0][1].endswith(f"key from hostname {HOSTNAME}; no GPU")


def _health_of(run: RunRecord) -> RunRecord:
    """The same machine seen by `gpuvet health` (no CPU model read), a later run."""
    health = copy.deepcopy(run)
    health.started_at = "2099-01-01T00:00:00Z"
    health.machine.host.cpu_model = None
    return health

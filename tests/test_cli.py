"""The command line as a user meets it: exit codes, JSON, files, and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_runner import gpuvet

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).parent.parent


def test_run_quick_on_a_machine_without_gpu_judges_the_host_and_skips_gpu_checks(capsys):
    code, out, err = gpuvet(capsys, "run", "--quick", "--json")
    record = json.loads(out)
    assert code == (1 if record["verdict"] == "fail" else 0)
    assert record["schema"] == "gpuvet.run/1" and record["source"] == "live"
    assert record["tool"]["name"] == "gpuvet" and record["measurements"] == []
    checks = {f["check"]: f for f in record["findings"]}
    for check in ("gpu.model", "gpu.power_limit", "gpu.pcie_link", "gpu.isolation", "gpu.ecc", "gpu.throttle",
                  "gpu.temperature", "gpu.nvlink", "gpu.uniform", "stack.driver_cuda", "stack.arch_support",
                  "host.cpu", "host.shm", "host.steal", "host.somaxconn", "storage.workdir"):
        assert check in checks, check
    if not record["machine"]["gpus"]:  # this machine and CI have no NVIDIA driver
        assert checks["gpu.power_limit"]["status"] == "skip"
        assert "NVIDIA" in checks["gpu.power_limit"]["summary"] or "NVML" in checks["gpu.power_limit"]["summary"]
    assert checks["host.cpu"]["status"] in ("pass", "warn", "fail")


def test_inspect_json_record_shape(capsys):
    code, out, _ = gpuvet(capsys, "inspect", str(FIXTURES / "smi_text/q-8x-rtx4090-all-idle-535.154.05.txt"), "--json")
    record = json.loads(out)
    assert code == 0 and record["source"] == "capture"
    gpus = record["machine"]["gpus"]
    assert len(gpus) == 8 and {g["reference"] for g in gpus} == {"RTX-4090"}
    assert all({"index", "name", "reference"} <= set(g) for g in gpus)
    f = record["findings"][0]
    assert set(f) == {"check", "subject", "status", "summary", "evidence", "remedy", "action"}
    assert set(f["evidence"]) == {"measured", "expected", "source"}
    assert record["verdict"] in ("pass", "warn")
    # Every finding names what a remediator does; the record names the worst (processes on the GPUs: ask)
    assert {g["action"] for g in record["findings"] if g["status"] == "pass"} == {"none"}
    assert record["action"] == "ask_provider"


def test_a_failed_check_exits_1_and_the_report_says_what_and_how(capsys):
    code, out, _ = gpuvet(capsys, "inspect", str(FIXTURES / "smi_xml/gtx-1070-x6-riser-pcie-x1-384.66-v9.xml"))
    assert code == 1
    assert "FAIL" in out and "gpu.pcie_link" in out and "x1 of x16" in out
    assert "fix/confirm:" in out and out.rstrip().splitlines()[-1].startswith("FAIL")


def test_expect_the_wrong_model_fails(capsys):
    code, out, _ = gpuvet(capsys, "inspect", str(FIXTURES / "smi_xml/a10g-aws-passthrough-515.105.01-v11.xml"),
                          "--expect", "A100 80GB")
    assert code == 1 and "is not the 'A100 80GB' you expected" in out


def test_several_captures_of_one_machine_merge(capsys):
    code, out, _ = gpuvet(capsys, "inspect", str(FIXTURES / "smi_text/nvlink-status-8x-a100-sxm4.txt"),
                          str(FIXTURES / "topo/dgx-a100-8gpu-nv12-12nics-topo-m.txt"), "--json")
    record = json.loads(out)
    gpus = record["machine"]["gpus"]
    assert len(gpus) == 8 and all(g["nvlinks"] for g in gpus)
    assert record["machine"]["topology"]["devices"][:8] == [f"GPU{i}" for i in range(8)]
    kinds = {c["kind"] for c in record["machine"]["captures"]}
    assert kinds == {"nvlink-status", "topo"}


@pytest.mark.parametrize(
    "name, words",
    [
        ("smi_text/error-nvml-driver-library-mismatch.txt", "error message"),
        ("smi_text/nvlink-status-a10-none.txt", "empty"),
        ("docs_embedded/gengwg-cheatsheets-gpu.md", "not a capture"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, name, words):
    code, out, err = gpuvet(capsys, "inspect", str(FIXTURES / name))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and words in err and name in err


def test_usage_errors_are_one_line_and_exit_2(capsys):
    for argv in (["inspect"], ["run", "--no-such-flag"], ["frobnicate"]):
        code, out, err = gpuvet(capsys, *argv)
        assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("gpuvet:")


def test_out_writes_the_record_and_refuses_to_clobber_a_foreign_file(capsys, tmp_path):
    target = tmp_path / "run.json"
    code, out, err = gpuvet(capsys, "inspect", str(FIXTURES / "smi_text/q-titan-v-560.35.03.txt"), "--out", str(target))
    assert json.loads(target.read_text())["schema"] == "gpuvet.run/1" and "run record written to" in err
    assert out.rstrip().splitlines()[-1].startswith("PASS")  # the verdict stays the last line
    # Writing over our own record is fine; over anything else is refused and the file kept.
    gpuvet(capsys, "inspect", str(FIXTURES / "smi_text/q-titan-v-560.35.03.txt"), "--out", str(target))
    precious = tmp_path / "train.py"
    precious.write_text("print('my model')\n")
    code, out, err = gpuvet(capsys, "inspect", str(FIXTURES / "smi_text/q-titan-v-560.35.03.txt"), "--out", str(precious))
    assert code == 2 and "not a gpuvet record or report" in err
    assert precious.read_text() == "print('my model')\n"
    code, _, err = gpuvet(capsys, "run", "--quick", "--out", str(tmp_path / "missing" / "run.json"))
    assert code == 2 and "does not exist" in err


def test_a_stored_record_is_judged_again(capsys, tmp_path):
    target = tmp_path / "run.json"
    gpuvet(capsys, "inspect", str(FIXTURES / "smi_xml/a10g-aws-passthrough-515.105.01-v11.xml"), "--out", str(target))
    code, out, _ = gpuvet(capsys, "inspect", str(target), "--expect", "A10G", "--json")
    record = json.loads(out)
    assert code == 0 and record["machine"]["gpus"][0]["name"] == "NVIDIA A10G"
    assert any(f["check"] == "gpu.model" and "expected" in f["summary"] for f in record["findings"])


def test_module_entry_point_runs_without_traceback():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, "-m", "gpuvet", "inspect", str(FIXTURES / "topo/windows-topo-m-error-591.86.txt")],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "error message" in proc.stderr


def test_runs_are_stored_listed_shown_exported_imported_and_compared(capsys, tmp_path):
    db, other = str(tmp_path / "runs.sqlite3"), str(tmp_path / "other.sqlite3")
    code, _, err = gpuvet(capsys, "run", "--quick", "--json", "--db", db, "--label", "box A", "--price", "2.5")
    assert "saved as run 1" in err
    code, out, _ = gpuvet(capsys, "inspect", str(FIXTURES / "smi_text/q-titan-v-560.35.03.txt"), "--out", str(tmp_path / "titan.json"))
    code, out, _ = gpuvet(capsys, "history", "--db", db, "--json")
    (run,) = json.loads(out)
    assert run["id"] == 1 and run["label"] == "box A" and run["price_per_hour"] == 2.5
    code, out, _ = gpuvet(capsys, "show", "1", "--db", db, "--format", "json")
    assert json.loads(out)["options"]["label"] == "box A"
    code, out, _ = gpuvet(capsys, "export", "1", "--db", db)
    (tmp_path / "export.json").write_text(out)
    code, out, _ = gpuvet(capsys, "import", str(tmp_path / "export.json"), "--db", other)
    assert "imported 1 run(s)" in out
    code, out, _ = gpuvet(capsys, "import", str(tmp_path / "export.json"), "--db", other)
    assert code == 0 and out.strip() == "already stored as run 1"
    code, out, _ = gpuvet(capsys, "compare", "1", str(tmp_path / "titan.json"), "--db", db, "--json")
    assert json.loads(out)["schema"] == "gpuvet.compare/1"
    code, _, err = gpuvet(capsys, "show", "99", "--db", db)
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_history_without_a_store_says_so(capsys, tmp_path):
    code, out, _ = gpuvet(capsys, "history", "--db", str(tmp_path / "none.sqlite3"))
    assert code == 0 and "no runs yet" in out


def test_history_of_a_store_it_cannot_read_gives_the_real_error(capsys, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes, not a database\n" * 100)
    for db, words in ((notes, "not a readable gpuvet store"), (tmp_path, "is a folder")):
        code, out, err = gpuvet(capsys, "history", "--db", str(db))
        assert code == 2 and out == "" and words in err and len(err.strip().splitlines()) == 1


def _store_of(capsys, tmp_path, *records: str) -> str:
    """A store holding the given fixture records (real captures judged by gpuvet), imported."""
    db = str(tmp_path / "runs.sqlite3")
    for name in records:
        code, _, err = gpuvet(capsys, "import", str(FIXTURES / "records" / f"{name}.json"), "--db", db)
        assert code == 0, err
    return db


@pytest.mark.parametrize("price", ["0", "-1", "inf", "nan", "lots"])
def test_a_bad_price_is_refused_at_parse_time(capsys, tmp_path, price):
    code, out, err = gpuvet(capsys, "bench", "p2p", "--device", "cpu", "--price", price, "--db", str(tmp_path / "x.sqlite3"))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--price" in err and ("positive finite number" in err or "a number of USD" in err)
    assert not (tmp_path / "x.sqlite3").exists()


def test_label_sets_a_price_afterwards_and_compare_prices_a_run_for_once(capsys, tmp_path):
    db = _store_of(capsys, tmp_path, "cpu-sustained", "h100-8x-throttle")
    code, out, _ = gpuvet(capsys, "label", "1", "--label", "spot box A", "--price", "0.5", "--db", db)
    assert code == 0 and out.strip() == "run 1: label 'spot box A' · price $0.50/h"
    code, out, _ = gpuvet(capsys, "history", "--db", db, "--json")
    assert [(r["label"], r["price_per_hour"]) for r in json.loads(out)] == [("spot box A", 0.5), (None, None)]
    code, out, _ = gpuvet(capsys, "compare", "1", "2", "--price", "2=30", "--price", "spot box A=0.25", "--db", db, "--json")
    assert [r["price_per_hour"] for r in json.loads(out)["runs"]] == [0.25, 30.0]
    code, out, _ = gpuvet(capsys, "history", "--db", db, "--json")  # a comparison's prices are not stored
    assert json.loads(out)[0]["price_per_hour"] == 0.5
    for argv, words in ((["label", "1"], "give --label"), (["label", "9", "--price", "1"], "no run 9"),
                        (["label", "1", "--price", "inf"], "positive finite"),
                        (["compare", "1", "2", "--price", "7=1"], "'7' names no single run"),
                        (["compare", "1", "--price", "1=nan"], "positive finite")):
        code, out, err = gpuvet(capsys, *argv, "--db", db)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, (argv, err)


def test_a_job_names_its_run_by_label_id_or_file_name(capsys, tmp_path):
    db = _store_of(capsys, tmp_path, "cpu-sustained")
    gpuvet(capsys, "label", "1", "--label", "8 h box", "--price", "0.5", "--db", db)
    record = str(FIXTURES / "records/cpu-sustained.json")
    for job in ("2 h on 8 h box", "2 h on #1", "2 h on 1", "2 h on cpu-sustained.json", "2 h on cpu-sustained"):
        code, out, err = gpuvet(capsys, "compare", "1", record, "--job", job, "--db", db, "--json", "--each-run")  # the same machine twice: kept apart
        assert code == 0, (job, err)
        expected = "#1 8 h box" if "cpu-sustained" not in job else record
        assert json.loads(out)["job"]["reference"] == expected, job


def test_import_says_what_it_kept_refuses_incomplete_records_and_reads_stdin(capsys, tmp_path, monkeypatch):
    import io

    db = _store_of(capsys, tmp_path, "cpu-quick")
    gpuvet(capsys, "label", "1", "--label", "mine", "--db", db)
    data = json.loads((FIXTURES / "records/cpu-quick.json").read_text())
    data["options"].update(label="theirs", price=2.0)
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps([data])))
    code, out, _ = gpuvet(capsys, "import", "-", "--db", db)
    assert code == 0 and out.splitlines() == [
        "already stored as run 1: kept its label 'mine' (the import has 'theirs')",
        "  to change them: gpuvet label 1 --label TEXT and/or --price USD_PER_HOUR"]
    code, out, _ = gpuvet(capsys, "history", "--db", db, "--json")
    assert json.loads(out)[0]["price_per_hour"] == 2.0  # a missing price is filled in
    monkeypatch.setattr("sys.stdin", io.StringIO('{"schema": "gpuvet.run/1"}'))
    code, out, err = gpuvet(capsys, "import", "-", "--db", db)
    assert code == 2 and err.strip() == ("gpuvet: stdin: item 1 of 1: a gpuvet run record without started_at, machine, "
                                         "tool (not written by gpuvet run/inspect?)")


def test_history_of_one_machine_resolves_its_key_and_shows_the_trend(capsys, tmp_path):
    db = _store_of(capsys, tmp_path, "cpu-sustained", "cpu-quick", "h100-8x-throttle")
    code, out, _ = gpuvet(capsys, "history", "--machine", "--json", "--db", db)
    machines = {m["runs"]: m["machine"] for m in json.loads(out)}
    cpu_key = machines[2]
    code, out, _ = gpuvet(capsys, "history", "--machine", cpu_key[:4], "--json", "--utc-offset", "8", "--db", db)
    data = json.loads(out)
    assert code == 0 and data["machine"] == cpu_key and len(data["runs"]) == 2
    assert data["trend"]["schema"] == "gpuvet.trend/1" and "UTC+8 h" in data["trend"]["clock"]
    # only the sustained run measured a benchmark; the quick run's host facts add the CPU steal
    figure, steal = data["trend"]["figures"]
    assert figure["name"] == "sustained.tflops" and len(figure["points"]) == 1
    assert steal["name"] == "host.steal_pct" and len(steal["points"]) >= 1
    code, out, _ = gpuvet(capsys, "history", "--machine", cpu_key, "--db", db)
    assert "values, oldest first" in out and "0.03207" in out and "this machine's time zone" in out
    code, out, err = gpuvet(capsys, "history", "--machine", "zz", "--db", db)
    assert code == 2 and "no such machine" in err and cpu_key in err
    code, out, err = gpuvet(capsys, "history", "--machine", "", "--db", db)  # "" is no key: the machine list
    assert code == 0


def test_show_renders_every_format_and_says_when_the_verdict_changed(capsys, tmp_path):
    db = _store_of(capsys, tmp_path, "h100-8x-throttle")
    code, out, _ = gpuvet(capsys, "show", "1", "--format", "md", "--db", db)
    assert code == 1 and out.startswith("# gpuvet") and "gpu.throttle" in out
    page = tmp_path / "run1.html"
    code, out, _ = gpuvet(capsys, "show", "1", "--format", "html", "--out", str(page), "--redact", "--db", db)
    assert "<title>gpuvet" in page.read_text() and "GPU-0" not in page.read_text().replace("GPU-REDACTED", "")
    # synthetic: the stored copy's findings edited to all pass, as an older gpuvet might have judged it
    import sqlite3

    con = sqlite3.connect(db)
    data = json.loads(con.execute("SELECT record FROM runs WHERE id = 1").fetchone()[0])
    for f in data["findings"]:
        f["status"] = "pass" if f["status"] in ("fail", "warn") else f["status"]
    con.execute("UPDATE runs SET record = ? WHERE id = 1", (json.dumps(data),))
    con.commit()
    con.close()
    code, out, err = gpuvet(capsys, "show", "1", "--db", db)
    assert code == 1 and "run 1 was saved with verdict PASS; this gpuvet's rules judge it FAIL" in err


def test_report_reads_an_export_file(capsys, tmp_path):
    db = _store_of(capsys, tmp_path, "h100-8x-throttle", "cpu-quick")
    for ids, note in ((["1"], False), (["1", "2"], True)):
        code, out, _ = gpuvet(capsys, "export", *ids, "--db", db)
        exported = tmp_path / "export.json"
        exported.write_text(out)
        code, out, err = gpuvet(capsys, "report", str(exported), "--format", "md")
        assert code == 0 and out.startswith("# gpuvet: FAIL")
        assert ("holds 2 runs" in err) == note
    exported.write_text("[]")
    code, out, err = gpuvet(capsys, "report", str(exported))
    assert code == 2 and "empty gpuvet export" in err
    code, out, _ = gpuvet(capsys, "export", "1", "--db", db)
    exported.write_text(out)
    code, out, _ = gpuvet(capsys, "inspect", str(exported), "--json")  # judged again, like a run record
    assert code == 1 and json.loads(out)["verdict"] == "fail"


def test_report_formats_from_a_stored_record(capsys, tmp_path):
    record = str(FIXTURES / "records/h100-8x-throttle.json")
    code, out, _ = gpuvet(capsys, "report", record, "--format", "md")
    assert code == 0 and out.startswith("# gpuvet") and "gpu.throttle" in out
    page = tmp_path / "report.html"
    code, out, _ = gpuvet(capsys, "report", record, "--format", "html", "--out", str(page), "--redact")
    html = page.read_text()
    assert "<title>gpuvet" in html and "GPU-0" not in html.replace("GPU-REDACTED", "")
    assert oct(page.stat().st_mode & 0o777) != oct(0o600)  # shareable, not private to the writer
    code, out, err = gpuvet(capsys, "report", str(tmp_path / "missing.json"))
    assert code == 2 and "cannot read" in err


def test_run_writes_an_html_report_directly(capsys, tmp_path):
    page = tmp_path / "box.html"
    code, out, err = gpuvet(capsys, "run", "--quick", "--no-save", "--report", "html", "--out", str(page), "--on-demand")
    assert "HTML report written" in err and "<title>gpuvet" in page.read_text()
    assert out.rstrip().splitlines()[-1].split(":")[0] in ("PASS", "WARN", "FAIL")


def test_a_report_format_without_out_is_refused_before_any_work(capsys):
    code, out, err = gpuvet(capsys, "inspect", str(FIXTURES / "smi_text/q-titan-v-560.35.03.txt"), "--report", "html")
    assert code == 2 and out == ""
    assert err.strip() == "gpuvet: --report html writes a file: add --out FILE (e.g. --out report.html)"


def test_doctor_lists_symptoms_and_answers_from_a_record(capsys):
    code, out, _ = gpuvet(capsys, "doctor")
    assert "slower-and-slower" in out and "no-kernel-image" in out
    code, out, _ = gpuvet(capsys, "doctor", "slower and slower", "--run", str(FIXTURES / "records/h100-8x-synthetic-sustained.json"))
    assert code == 0 and "FOUND" in out and "gpu2" in out
    code, _, err = gpuvet(capsys, "doctor", "frobnicate")
    assert code == 2 and "unknown symptom" in err


def test_a_watch_log_becomes_an_html_report(capsys, tmp_path):
    import signal
    import time

    log = tmp_path / "watch.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.Popen([sys.executable, "-m", "gpuvet", "watch", "--no-ui", "--interval", "0.2", "--log", str(log)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 3):
            time.sleep(0.1)  # waiting for the log to fill, not timing anything
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    page = tmp_path / "watch.html"
    code, out, _ = gpuvet(capsys, "report", str(log), "--format", "html", "--out", str(page))
    assert code == 0 and "<title>gpuvet" in page.read_text()
    code, out, _ = gpuvet(capsys, "report", str(log))  # the terminal: what the job went through, no checklist
    assert code in (0, 1) and "Acceptance checklist" not in out
    assert "SKIP: no GPU was watched" in out.splitlines()[-1]  # this machine has no GPU: nothing to pass

"""The command line as a user meets it: exit codes, JSON, files, and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuvet.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).parent.parent


def gpuvet(capsys, *argv: str) -> tuple[int, str, str]:
    code = 0
    try:
        main(list(argv))
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


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
    assert set(f) == {"check", "subject", "status", "summary", "evidence", "remedy"}
    assert set(f["evidence"]) == {"measured", "expected", "source"}
    assert record["verdict"] in ("pass", "warn")


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
    code, out, _ = gpuvet(capsys, "inspect", str(FIXTURES / "smi_text/q-titan-v-560.35.03.txt"), "--out", str(target))
    assert json.loads(target.read_text())["schema"] == "gpuvet.run/1" and "written to" in out
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
    code, out, _ = gpuvet(capsys, "compare", "1", str(tmp_path / "titan.json"), "--db", db, "--json")
    assert json.loads(out)["schema"] == "gpuvet.compare/1"
    code, _, err = gpuvet(capsys, "show", "99", "--db", db)
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_history_without_a_store_says_so(capsys, tmp_path):
    code, out, _ = gpuvet(capsys, "history", "--db", str(tmp_path / "none.sqlite3"))
    assert "no runs yet" in out


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
    code, out, _ = gpuvet(capsys, "run", "--quick", "--no-save", "--report", "html", "--out", str(page), "--on-demand")
    assert "HTML report written" in out and "<title>gpuvet" in page.read_text()


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

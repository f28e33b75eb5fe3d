"""What becomes of a `gpuvet watch --log` file (a log cut off mid-line, a host without GPUs, the
Markdown and HTML reports with the followed job's CPU and IO) and how the view prints where there
is little room (a narrow, short terminal) or a lot (a pipe).

Logs are written by the watch itself (tests/test_watch.py's write_log: test_telemetry's stand-in
NVML, a hand-moved clock); a log "cut off" is one of those with its end removed (SYNTHETIC: the cut).
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest
from rich.console import Console

from gpuvet import runner
from gpuvet import watch as w
from gpuvet.facts import Host
from gpuvet.probe.errors import CaptureError
from gpuvet.report.markdown import render_markdown
from cli_runner import gpuvet
from test_telemetry import _healthy_gpu_answers, _NvmlStandIn
from test_watch import _machine, _many_gpus, _screen, write_log


def _cut(path: Path, drop: int) -> int:
    """SYNTHETIC: the log as a watch killed mid-write leaves it, `drop` bytes short; the bytes left
    of its last line."""
    data = path.read_bytes()[:-drop]
    path.write_bytes(data)
    return len(data) - data.rindex(b"\n") - 1


# -- a log cut off mid-line ----------------------------------------------------------------------------

def test_a_log_cut_off_mid_line_is_reported_with_a_note(monkeypatch, tmp_path):
    path = write_log(monkeypatch, tmp_path / "watch.jsonl")
    left = _cut(path, 20)
    record = runner.load_watch_log(str(path))
    (note,) = [f for f in record.findings if f.check == "watch.log"]
    assert note.status == "skip"
    assert note.summary == f"the last line was cut off: {left} bytes skipped (a watch stopped mid-write, or one still writing)"
    assert {f.check for f in record.findings} >= {"watch.thermal", "watch.neighbour"}  # the rest still counts


def test_a_new_session_after_a_cut_off_one_starts_on_its_own_line(monkeypatch, tmp_path):
    path = write_log(monkeypatch, tmp_path / "watch.jsonl")
    left = _cut(path, 20)
    write_log(monkeypatch, path)  # the watch started again on the same log
    notes: list[str] = []
    series = w.read_log(str(path), notes)
    assert len([s for s in series if s["name"] == "watch.telemetry" and s["subject"] == "gpu0"]) == 2
    assert len(notes) == 1 and notes[0].startswith("line ") and f"(the end of a session) was cut off: {left} bytes" in notes[0]


def test_a_broken_line_in_the_middle_is_still_an_error(monkeypatch, tmp_path):
    path = write_log(monkeypatch, tmp_path / "watch.jsonl")
    lines = path.read_text().splitlines()
    lines[3] = lines[3][:-5]  # SYNTHETIC: damaged inside the log, not at its end
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CaptureError, match=r"a broken watch log \(line 4: "):
        runner.load_watch_log(str(path))


# -- a host without GPUs -------------------------------------------------------------------------------

def test_a_log_of_a_host_without_gpus_says_no_gpu_was_watched(tmp_path):
    path = tmp_path / "watch.jsonl"
    why = "no NVIDIA driver: the NVML library (libnvidia-ml.so.1) is not installed or not mounted into this container"
    log = w.WatchLog(str(path), 1.0, [], "cpu-node", gpu_error=why, host=Host(hostname="cpu-node"))
    log.close()
    record = runner.load_watch_log(str(path))
    (skip,) = record.findings
    assert (skip.check, skip.subject, skip.status) == ("watch.gpus", "host", "skip")
    assert skip.summary == f"no GPU was watched: {why}"
    md = render_markdown(record)
    assert f"- ➖ SKIP **host**: no GPU was watched: {why}" in md[md.index("## Watched job"):]
    assert "The log records no diagnosis." in md


# -- the followed job, and the Markdown report ---------------------------------------------------------

def test_the_followed_jobs_cpu_and_io_is_a_line_of_the_findings(monkeypatch, tmp_path):
    record = runner.load_watch_log(str(write_log(monkeypatch, tmp_path / "watch.jsonl", pid=os.getpid())))
    (job,) = [f for f in record.findings if f.check == "watch.job"]
    assert job.subject == f"job {os.getpid()}" and job.status == "measured"
    assert job.summary.startswith("CPU ") and "% of one core on average (peak " in job.summary
    assert job.summary.endswith("on GPU 0")  # the stand-in lists this test's process on gpu0


def test_markdown_of_a_watch_log_has_no_checklist_and_lists_diagnosis_changes(monkeypatch, tmp_path):
    record = runner.load_watch_log(str(write_log(monkeypatch, tmp_path / "watch.jsonl", pid=os.getpid())))
    md = render_markdown(record)
    assert "Acceptance checklist" not in md and "Hidden parameters" not in md
    assert "# gpuvet: FAIL: the platform failed the watched job" in md
    watched = md[md.index("## Watched job"):]
    assert f"_Recorded by `gpuvet watch --log {tmp_path / 'watch.jsonl'}`" in watched
    assert "- ❌ FAIL **gpu0**: thermal 100% of the watched time (" in watched
    assert f"- 📏 MEASURED (not judged) **job {os.getpid()}**: CPU " in watched
    changes = watched[watched.index("### Diagnosis changes"):]
    assert "| Time | Subject | From → to | What was seen |" in changes
    assert "| gpu0 | start → thermal | thermal: util 99%, SM clock at 100% of max, HW thermal slowdown active" in changes
    assert "| gpu1 | start → neighbour | neighbour: 99% utilization and 12.0 GiB in use" in changes


def test_html_of_a_watch_log_plots_the_followed_jobs_cpu_and_io(monkeypatch, tmp_path):
    from gpuvet.report import html as html_report

    record = runner.load_watch_log(str(write_log(monkeypatch, tmp_path / "watch.jsonl", pid=os.getpid())))
    plots = {p.key: p for p in html_report.render_plots(record)}
    assert {"job_cpu", "job_io"} <= set(plots)
    assert ">CPU<" in plots["job_cpu"].svg and "% of one core" in plots["job_cpu"].svg
    page = html_report.render_html(record)
    assert 'id="plot-job_cpu"' in page and "The followed job&#x27;s process tree" in page
    without_job = runner.load_watch_log(str(write_log(monkeypatch, tmp_path / "other.jsonl")))
    assert not {"job_cpu", "job_io"} & {p.key for p in html_report.render_plots(without_job)}


# -- `gpuvet report` of a watch log ---------------------------------------------------------------------

def test_report_reads_a_watch_log_from_stdin(monkeypatch, tmp_path, capsys):
    # It read the file a second time by its name: "-" was no file, and a traceback followed.
    data = write_log(monkeypatch, tmp_path / "watch.jsonl").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    code, out, err = gpuvet(capsys, "report", "-", "--format", "md")
    assert "Traceback" not in err
    assert code == 0 and "# gpuvet: FAIL: the platform failed the watched job" in out
    assert "- ❌ FAIL **gpu0**: thermal 100% of the watched time (" in out


def test_report_of_a_watch_log_with_a_blank_first_line(monkeypatch, tmp_path, capsys):
    # EDITED: a blank line before the header (a log copied with an editor, or concatenated). Told
    # a watch log by its first line that is not blank, then read from its very first line: a traceback.
    path = write_log(monkeypatch, tmp_path / "watch.jsonl")
    path.write_bytes(b"\n" + path.read_bytes())
    code, out, err = gpuvet(capsys, "report", str(path), "--format", "md")
    assert "Traceback" not in err
    assert code == 0 and "- ❌ FAIL **gpu0**: thermal 100% of the watched time (" in out


# -- the view with little room, and in a pipe ------------------------------------------------------------

def test_a_narrow_short_terminal_keeps_a_diagnosis_per_gpu(monkeypatch):
    rows = _screen(_many_gpus(monkeypatch, 8), 60, 15)
    assert len(rows) == 15
    gpu_rows = [r for r in rows if r.startswith("GPU ") and "diagnosis" not in r]
    assert [r.split()[1] for r in gpu_rows] == [str(i) for i in range(8)]
    assert all(r.startswith(f"GPU {i}  → thermal: util 99%") for i, r in enumerate(gpu_rows))
    assert "GPU   diagnosis (widen the window for the numbers)" in rows[2]


def test_once_into_a_pipe_is_not_cut_at_80_columns(monkeypatch):
    _NvmlStandIn(monkeypatch, _healthy_gpu_answers(nvmlDeviceGetCount=1))
    out = io.StringIO()
    machine = _machine(1)
    assert w.watch(once=True, console=Console(file=out, highlight=False), machine=machine) == w.EXIT_OK
    text = out.getvalue()
    assert "NVLink n/a (links not listed: not read at start)" in text
    assert "…" not in text

"""`gpuvet watch` and its log and exporter under faults (issue 30): a watch log whose diagnosis line
has "t": NaN, a full disk under `--log`, a replayed capture that must not pass for a live one, a GPU
name that would drive the terminal, and an exporter flooded with connections that send nothing.
"""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import re
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from rich.console import Console

from cli_runner import gpuvet
from gpuvet import watch as w
from gpuvet.watch import exporter as ex
from test_watch import monitor  # noqa: F401  (the fixture: a Monitor on a stand-in NVML, hand-moved clock)

FIXTURES = Path(__file__).parent / "fixtures"
WATCH_LOG = FIXTURES / "records/watch-replay-rtx-3080-595.58.03.jsonl"
RTX3080_XML = FIXTURES / "smi_xml/rtx-3080-595.58.03-v13.xml"
ROOT = Path(__file__).resolve().parents[1]
TERMINAL_DRIVERS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


@pytest.mark.parametrize("fmt", ["terminal", "md", "html", "json"])
def test_a_diagnosis_line_with_t_nan_is_skipped_not_a_traceback(capsys, tmp_path, fmt):
    """TypeError in every report format: the loader reads NaN as None (a reading not known), and
    a diagnosis without a time cannot be placed; it is skipped."""
    text = WATCH_LOG.read_text()
    edited = re.sub(r'"t":[0-9.]+,"diagnosis"', '"t":NaN,"diagnosis"', text, count=1)
    assert edited != text
    path = tmp_path / "watch-replay-edited-t-nan.jsonl"
    path.write_text(edited)
    code, out, err = gpuvet(capsys, "report", str(path), "--format", fmt)
    assert code in (0, 1) and "Traceback" not in err and out


def test_a_full_disk_is_one_line_and_watching_goes_on(tmp_path):
    """ENOSPC was a traceback and a 0-byte log (the header sat in a buffer). Each line is written
    through now: what fit is kept, the failure is one line, the watch goes on without the log."""
    path = tmp_path / "watch.jsonl"
    log = w.WatchLog(str(path), 1.0, [], "node")
    header = path.read_text()
    assert header.count("\n") == 1  # on disk at once, not in a buffer

    class FullDisk:
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            pass

    log._file = FullDisk()
    log._write({"subject": "host", "row": [1.0] + [None] * 10})  # no exception
    assert log.failed and "No space left on device" in log.failed and "1 line(s) of this session kept" in log.failed
    log._write({"subject": "host", "row": [2.0] + [None] * 10})  # nothing more is tried
    log.close()
    assert path.read_text() == header and [s["subject"] for s in w.read_log(str(path))] == ["host"]


def replayed(capture: Path, *argv: str) -> tuple[int, str, str]:
    """`gpuvet ARGV` as its own process under GPUVET_NVML_REPLAY (the variable is read at start)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "GPUVET_NVML_REPLAY": str(capture)}
    done = subprocess.run([sys.executable, "-m", "gpuvet", *argv], env=env, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout, done.stderr


def test_watch_once_with_a_log_on_a_full_device_says_so_in_one_line():
    code, out, err = replayed(RTX3080_XML, "watch", "--once", "--log", "/dev/full")
    assert code == 0 and "GPU 0" in out  # the snapshot is shown
    said = [line for line in err.splitlines() if line.strip()]
    assert len(said) == 1 and said[0].startswith("gpuvet watch: --log /dev/full: cannot write to it (No space left")


def test_a_log_written_under_replay_says_replay_in_its_header(tmp_path):
    """Issue 25 (c): a watch of a replayed capture is not this machine's live readings."""
    path = tmp_path / "watch.jsonl"
    code, _, _ = replayed(RTX3080_XML, "watch", "--once", "--log", str(path))
    header = json.loads(path.read_text().splitlines()[0])
    assert code == 0 and header["source"] == f"replay: {RTX3080_XML}"
    assert json.loads(WATCH_LOG.read_text().splitlines()[0])["source"].startswith("replay: ")


def test_a_gpu_name_with_c1_controls_and_bidi_reaches_no_terminal(capsys, tmp_path):
    """U+009B is a CSI on terminals that take 8-bit controls; U+202E reorders what follows. Both
    came through `watch --once` from a GPU name; as XML character references they pass any
    cleaning of the text before the parser, so the loader cleans what it parsed too."""
    edited = RTX3080_XML.read_text().replace("<product_name>NVIDIA GeForce RTX 3080<",
                                             "<product_name>NVIDIA &#x9b;31m&#x202e;GeForce RTX 3080<")
    path = tmp_path / "rtx-3080-edited-name-csi-bidi.xml"
    path.write_text(edited)
    code, out, _ = replayed(path, "watch", "--once")
    assert code == 0 and "GeForce RTX 3080" in out and not TERMINAL_DRIVERS.search(out), repr(out[:300])
    code, out, _ = gpuvet(capsys, "inspect", str(path))
    assert "GeForce RTX 3080" in out and not TERMINAL_DRIVERS.search(out)


def test_the_view_draws_no_control_character_whatever_the_names(monitor):  # noqa: F811
    m, clock, _ = monitor
    clock.now += 1.0
    m.tick()
    clock.now += 1.0
    snap = m.tick()
    hostile = "H100\x9b2J\u202eevil\x1b]0;title\x07"
    snap = dataclasses.replace(snap, hostname="node\u2066x", gpus=[dataclasses.replace(g, facts=dataclasses.replace(g.facts, name=hostile)) for g in snap.gpus])
    console = Console(file=io.StringIO(), width=200, color_system=None, force_terminal=False)
    console.print(w.render(snap, interactive=False))
    shown = console.file.getvalue()
    assert "H100" in shown and not TERMINAL_DRIVERS.search(shown.replace("\n", "")), repr(shown[:300])


def test_the_exporter_bounds_its_connections_and_times_out_idle_ones(monkeypatch):
    """1,000 connections that sent nothing held 1,004 threads (prometheus_client's server). Now at
    most MAX_CONNECTIONS are served, an idle one is closed after IDLE_SECONDS, and a scrape is
    answered once they are gone."""
    monkeypatch.setattr(ex, "MAX_CONNECTIONS", 8)
    monkeypatch.setattr(ex._QuietHandler, "timeout", 0.5)
    exporter = ex.Exporter()
    port = exporter.serve("127.0.0.1", 0)
    threads_before = threading.active_count()
    idle = []
    try:
        for _ in range(100):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and threading.active_count() - threads_before < 8:
            time.sleep(0.01)
        assert threading.active_count() - threads_before <= 8
        # Every idle connection ends: the 92 over the bound at once, the others after their timeout.
        for sock in idle:
            sock.settimeout(10)
            assert sock.recv(1024) == b""  # closed by the server
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and threading.active_count() > threads_before:
            time.sleep(0.05)
        assert threading.active_count() <= threads_before
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            assert answer.status == 200
    finally:
        for sock in idle:
            sock.close()
        exporter.close()

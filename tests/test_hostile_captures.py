"""Captures that would make gpuvet work without end: endless or huge files, FIFOs whose writer
never comes, GPU indices and counts no machine has, CSV fields over csv's limit. Each is refused
in one line with exit 2, quickly. The edited inputs are built here from real fixtures."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cli_runner import gpuvet
from gpuvet.probe import bounded_read

FIXTURES = Path(__file__).parent / "fixtures"
TOPO_2X = FIXTURES / "topo/puget-wrx90-2x-rtx6000ada-phb-spaces.txt"
NVLINK_1X = FIXTURES / "smi_text/nvlink-status-a100-one-gpu-healthy.txt"
RTX3090_XML = FIXTURES / "smi_xml/rtx-3090-swpowercap-590.44.01-v13.xml"
L40S_CSV = FIXTURES / "smi_csv/l40s-vm-595.80-idle.csv"


def refused(capsys, *argv: str, seconds: float = 10.0) -> str:
    start = time.monotonic()
    code, out, err = gpuvet(capsys, "inspect", *argv)
    assert time.monotonic() - start < seconds
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_an_endless_device_is_refused_by_its_size(capsys):
    assert "larger than 32 MB" in refused(capsys, "/dev/zero")


def test_an_endless_stdin_is_refused_by_its_size(capsys, monkeypatch):
    with open("/dev/zero", "rb") as zero:
        monkeypatch.setattr("sys.stdin", open(zero.fileno(), "r", closefd=False))
        assert refused(capsys, "-").startswith("gpuvet: stdin: larger than 32 MB")


def test_a_fifo_without_a_writer_does_not_wait_for_ever(capsys, monkeypatch, tmp_path):
    fifo = tmp_path / "capture.fifo"
    os.mkfifo(fifo)
    monkeypatch.setattr(bounded_read, "READ_SECONDS", 0.5)
    assert "nothing more arrived within 0 s of the command's start" in refused(capsys, str(fifo))


def test_the_read_window_is_the_commands_budget_counted_from_its_start(tmp_path, monkeypatch):
    """A FIFO without a writer was refused after 61.6 s of a command that promises 60 s: the
    1.6 s before the first read (the import) were not counted. The window is counted from the
    process's start now, so a command 59.5 s old waits 0.5 s more, not 60."""
    fifo = tmp_path / "capture.fifo"
    os.mkfifo(fifo)
    monkeypatch.setattr(bounded_read, "_command_started", None)
    bounded_read.start_command(age=bounded_read.READ_SECONDS - 0.5)
    start = time.monotonic()
    with pytest.raises(bounded_read.CaptureError, match="within 60 s of the command's start"):
        bounded_read.read_bounded(str(fifo))
    assert time.monotonic() - start < 5
    assert 0 <= bounded_read.process_age() < 24 * 3600  # read from /proc: this process is not a day old


def test_a_file_of_more_gpus_than_a_machine_holds_is_refused_before_parsing(capsys, tmp_path, monkeypatch):
    text = RTX3090_XML.read_text()
    start, end = text.index("<gpu id="), text.index("</gpu>") + len("</gpu>")
    many = tmp_path / "rtx-3090-edited-5-gpus.xml"
    many.write_text(text[:start] + text[start:end] * 5 + text[end:])
    monkeypatch.setattr(bounded_read, "MAX_GPUS", 4)
    assert "lists 5 GPUs, more than the 4 any one machine holds" in refused(capsys, str(many))


@pytest.mark.parametrize("index", ["20000000", "2000000000", "1" + "0" * 30])
def test_a_huge_gpu_index_in_topo_or_nvlink_is_refused_quickly(capsys, tmp_path, index):
    topo = tmp_path / "topo-edited-index.txt"
    topo.write_text(TOPO_2X.read_text().replace("GPU1", f"GPU{index}"))
    # A number longer than any reading (values.MAX_DIGITS) is not read at all.
    said = f"names GPU {index}" if len(index) < 20 else "names GPU with a number too long to read"
    assert said in refused(capsys, str(topo), seconds=5)
    nvlink = tmp_path / "nvlink-edited-index.txt"
    nvlink.write_text(NVLINK_1X.read_text().replace("GPU 7:", f"GPU {index}:"))
    assert said in refused(capsys, str(nvlink), seconds=5)


def test_a_csv_field_over_the_csv_limit_is_one_line(capsys, tmp_path):
    header = L40S_CSV.read_text().splitlines()[0]
    long = tmp_path / "l40s-edited-long-field.csv"
    long.write_text(header + "\n" + '"' + "A" * 140_000 + '"' + ", 1" * (header.count(",")) + "\n")
    assert "field larger than field limit" in refused(capsys, str(long))

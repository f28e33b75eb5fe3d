"""Every capture parser takes time linear in its input (or bounded per line): a line of 1 MB of
spaces, a 1 MB line without a newline, or a run of spaces inside a line must not make a regular
expression backtrack. Before: 1,500 spaces in a `-q` label took 4.8 s and 4,000 took 163 s; a run
of spaces in an `lspci` device line was quadratic (300 KB: 101 s); `nvlink -s`/`-e` lines with a
run of spaces took seconds per 20 KB. The inputs are real fixtures with the run spliced in.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpuvet.probe import capture
from gpuvet.probe.errors import CaptureError

FIXTURES = Path(__file__).parent / "fixtures"
# One real capture per parser (capture.detect_kind's kinds, and a bundle of several).
PARSERS = {
    "smi-xml": "smi_xml/rtx-3080-595.58.03-v13.xml",
    "smi-text": "smi_text/q-titan-v-560.35.03.txt",
    "smi-csv": "smi_csv/l40s-vm-595.80-idle.csv",
    "smi-table": "smi_text/default-table-h100-vm-590.48.01.txt",
    "smi-dmon": "smi_text/dmon-h100-vm-idle-590.48.01.txt",
    "topo": "topo/puget-wrx90-2x-rtx6000ada-phb-spaces.txt",
    "nvlink-status": "smi_text/nvlink-status-8x-a100-sxm4.txt",
    "nvlink-errors": "smi_text/nvlink-errors-gb300-one-link-srt-slurm-docs.txt",
    "lspci": "lspci/lspci-nn-a10-kvm.txt",
    "proc-version": "proc_sysfs/proc-driver-nvidia-version-470.63.01.txt",
    "kernel-log": "kernel_log/dmesg-ctime-xid13-xid109.txt",
    "bundle": "bundles/l40s-vm-595.80.txt",
}
MB = 1_000_000
# A linear pass over 1 MB takes well under a second; a quadratic one takes minutes. Generous for a
# loaded CI machine, far below what the backtracking took.
SECONDS = 5.0


def _spliced(text: str, how: str) -> str:
    lines = text.splitlines(keepends=True)
    middle = len(lines) // 2
    line = lines[middle].rstrip("\n")
    if how == "line of spaces":
        return "".join(lines[:middle] + [" " * MB + "\n"] + lines[middle:])
    if how == "spaces inside a line":
        cut = len(line) // 2
        return "".join(lines[:middle] + [line[:cut] + " " * MB + line[cut:] + "\n"] + lines[middle + 1:])
    if how == "spaces at a line's end, then a word":
        return "".join(lines[:middle] + [line + " " * MB + "x\n"] + lines[middle + 1:])
    assert how == "no newline"
    return text + " " * (MB // 2) + "x" * (MB // 2)


def _read_within(path: Path, seconds: float = SECONDS) -> None:
    start = time.monotonic()
    try:
        capture.read_captures(str(path))
    except CaptureError:
        pass  # one clear line is as good an answer as a record
    took = time.monotonic() - start
    assert took < seconds, f"{path.name}: {took:.1f} s"


@pytest.mark.parametrize("how", ["line of spaces", "spaces inside a line", "spaces at a line's end, then a word", "no newline"])
@pytest.mark.parametrize("kind", sorted(PARSERS))
def test_every_parser_reads_a_megabyte_line_in_linear_time(tmp_path, kind, how):
    source = FIXTURES / PARSERS[kind]
    path = tmp_path / f"{source.stem}-edited-{how.replace(' ', '-')}{source.suffix}"
    path.write_text(_spliced(source.read_text(), how))
    _read_within(path)


@pytest.mark.parametrize("name, text", [
    # The smallest inputs the fuzzer found, grown past the size that took seconds.
    ("q-label-spaces", "==============NVSMI LOG==============\n\nAttached GPUs : 1\nGPU 00000000:01:00.0\n"
                       "    Product" + " " * 200_000 + "Name\n"),
    ("lspci-device-spaces", "01:00.0 " + " " * 300_000 + "\n"),
    ("lspci-class-spaces", "01:00.0 VGA" + " " * 300_000 + "x [0300]\n"),
    ("nvlink-gpu-spaces", "GPU 0: A100 (UUID: GPU-1)\n\t Link 0: 25 GB/s\nGPU 1: A100" + " " * 200_000 + "x\n"),
    ("nvlink-link-spaces", "GPU 0: A100 (UUID: GPU-1)\n\t Link 0: 25" + " " * 200_000 + "x\n"),
    ("nvlink-counter-spaces", "GPU 0: GB300\n\t Link 0: Replay Errors: 0" + " " * 200_000 + "x\n"),
    ("table-name-spaces", (FIXTURES / PARSERS["smi-table"]).read_text().replace("NVIDIA H100", "NVIDIA" + " " * 200_000 + "H100", 1)),
    ("table-process-spaces", (FIXTURES / "smi_text/default-table-8x-h100-550.90.07.txt").read_text()
     + "|    0   N/A  N/A      1234      C   python" + " " * 200_000 + "x   |\n"),
    ("attached-blank-lines", "==============NVSMI LOG==============\n" + "\n" * 8000 + "Attached GPUs : 1\n"),
])
def test_the_backtracking_inputs_the_fuzzer_found_are_linear(tmp_path, name, text):
    path = tmp_path / f"{name}-edited.txt"
    path.write_text(text)
    _read_within(path)

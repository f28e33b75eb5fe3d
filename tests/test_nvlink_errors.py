"""`nvidia-smi nvlink -e` captures read by `gpuvet inspect` and judged in gpu.link_errors; the
remapped-row thresholds of gpu.recovery. On the one real `nvlink -e` output a permissively licensed
repository holds (a GB300's link 0, NVIDIA srt-slurm docs) and its named edit (see SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_runner import gpuvet
from gpuvet import judge
from gpuvet.probe import capture
from gpuvet.probe.errors import CaptureError
from gpuvet.probe.nvlink_errors import counter_key, is_error_counter, looks_like_nvlink_errors, parse_nvlink_errors

FIXTURES = Path(__file__).parent / "fixtures"
GB300 = FIXTURES / "smi_text/nvlink-errors-gb300-one-link-srt-slurm-docs.txt"
GB300_ERRORS = FIXTURES / "edited/nvlink-errors-gb300-srt-slurm-docs-edited-replay-12-crc-7.txt"
NVLINK_STATUS = FIXTURES / "smi_text/nvlink-status-8x-a100-sxm4.txt"
H100_IDLE = FIXTURES / "smi_text/q-h100-80gb-hbm3-vm-590.48.01-idle.txt"


def _findings(*paths: Path, check: str) -> list:
    machine = capture.merge([c for p in paths for c in capture.read_captures(str(p))])
    return [f for f in judge.judge(machine) if f.check == check]


def test_the_real_gb300_output_parses_per_link():
    text = GB300.read_text()
    assert looks_like_nvlink_errors(text)
    (gpu,) = parse_nvlink_errors(text)
    assert (gpu.index, gpu.name, gpu.uuid) == (0, "NVIDIA GB300", None)
    assert gpu.links == {0: {"Replay Errors": 0, "Recovery Errors": 0, "CRC Errors": 0}}


def test_nvlink_s_and_nvlink_e_are_told_apart_by_content(tmp_path):
    assert not looks_like_nvlink_errors(NVLINK_STATUS.read_text())
    copy = tmp_path / "nvlink-status.txt"  # the name says status: the content decides
    copy.write_text(GB300.read_text())
    assert [c.kind for c in capture.read_captures(str(copy))] == ["nvlink-errors"]
    assert [c.kind for c in capture.read_captures(str(NVLINK_STATUS))] == ["nvlink-status"]


def test_clean_counters_pass_and_say_which_were_read():
    (f,) = _findings(GB300, check="gpu.link_errors")
    assert f.subject == "gpu0" and f.status == "pass"
    assert "NVLink error counters 0 (crc, recovery, replay)" in f.summary


def test_a_link_that_counted_errors_warns_naming_the_link_and_dcgms_threshold(capsys):
    (f,) = _findings(GB300_ERRORS, check="gpu.link_errors")
    assert f.status == "warn" and "link 0: 7 crc, 12 replay" in f.summary
    assert "1 replay or recovery error" in f.evidence.expected and "PCIe" not in f.evidence.expected  # only NVLink read
    assert "DCGM_LIMIT_MAX_NVLINK_ERROR 1" in f.evidence.source and "nvidia-smi nvlink -e -i 0" in f.remedy
    code, out, _ = gpuvet(capsys, "inspect", str(GB300_ERRORS))
    assert "link 0: 7 crc, 12 replay" in out and "(nvlink-errors)" in out


def test_nvlink_e_beside_a_q_report_lands_on_the_same_gpu():
    machine = capture.merge(capture.read_captures(str(H100_IDLE)) + capture.read_captures(str(GB300_ERRORS)))
    assert len(machine.gpus) == 1
    assert machine.gpus[0].nvlink_errors == {"replay": 12, "recovery": 0, "crc": 7}
    assert machine.gpus[0].nvlink_error_links == {"0": {"replay": 12, "crc": 7}}


def test_a_stray_line_among_the_links_is_one_clear_error(tmp_path):
    damaged = tmp_path / "e.txt"
    damaged.write_text(GB300.read_text() + "\t something else entirely\n")
    with pytest.raises(CaptureError, match="unexpected line 'something else entirely' among the links of GPU 0"):
        capture.read_captures(str(damaged))


@pytest.mark.parametrize("name, counts", [
    # pre-Blackwell names (the real output above)
    ("Replay Errors", True), ("Recovery Errors", True), ("CRC Errors", True),
    # NVLink 5 counters DCGM's health watch fails on (MonitorNVLink5Fields): error and event counts
    ("Rx Errors", True), ("Malformed packet Errors", True), ("Local link integrity Errors", True),
    ("Link recovery failed events", True), ("Total link recovery events", True), ("Symbol Errors", True),
    # counts that are no fault, bins of corrected codewords, rates, and a part of the total above
    ("Tx packets", False), ("FEC Errors - 0", False), ("Effective BER", False), ("Raw Errors Lane 0", False),
    ("Link recovery successful events", False),
])
def test_which_counters_count_faults(name, counts):
    assert is_error_counter(name) is counts


def test_counter_keys_are_the_nvml_backends_names():
    assert [counter_key(n) for n in ("Replay Errors", "Recovery Errors", "CRC Errors")] == ["replay", "recovery", "crc"]


# -- gpu.recovery: remapped rows against DCGM's and Azure's figures --------------------------------

def test_remapped_rows_of_a_real_h100_pass_against_512():
    (f,) = _findings(H100_IDLE, check="gpu.recovery")
    assert f.status == "pass" and "0 of at most 512 rows remapped for uncorrectable errors" in f.summary
    assert "fewer than 512 rows remapped" in f.evidence.expected
    assert "DCGM_LIMIT_MAX_ROW_REMAP_UNCORRECTABLE 512" in f.evidence.source and "azure_gpu_ecc.nhc" in f.evidence.source


@pytest.mark.parametrize("field, value, words, remedy", [
    ("remapped_rows_uncorrectable", 512, "512 rows remapped for uncorrectable errors: at DCGM's limit", "another GPU"),
    ("remapped_rows_pending", True, "a row remap is pending until the GPU is reset", "nvidia-smi -r -i 0"),
    ("remapped_rows_failure", True, "a row remapping failed", "another GPU"),
])
def test_remap_limits_fail_recovery(field, value, words, remedy):
    machine = capture.merge(capture.read_captures(str(H100_IDLE)))
    setattr(machine.gpus[0].ecc, field, value)
    (f,) = [f for f in judge.judge(machine) if f.check == "gpu.recovery"]
    assert f.status == "fail" and words in f.summary and remedy in f.remedy


def test_511_uncorrectable_remaps_still_pass_recovery():
    machine = capture.merge(capture.read_captures(str(H100_IDLE)))
    machine.gpus[0].ecc.remapped_rows_uncorrectable = 511
    (f,) = [f for f in judge.judge(machine) if f.check == "gpu.recovery"]
    assert f.status == "pass" and "511 of at most 512" in f.summary

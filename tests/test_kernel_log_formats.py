"""Kernel logs in the forms the first reader meets them (dmesg -H, talosctl dmesg, a driver asking for
a reset without an Xid), NVIDIA's whole Xid catalogue with its actions, and the lines gpu.xid must
never pass: real logs in tests/fixtures/kernel_log (SOURCES.md)."""

from __future__ import annotations

import json
from pathlib import Path

from gpuvet import actions, judge
from gpuvet.facts import KernelEvent, KernelLog, Machine
from gpuvet.judge import gpu_xid
from gpuvet.probe import kernel_log
from tests.cli_runner import gpuvet

LOGS = Path(__file__).parent / "fixtures" / "kernel_log"
DMESG_H = LOGS / "dmesg-H-reltime-aer-fatal-nvidia.txt"
TALOS = LOGS / "talos-dmesg-gsp-timeout-xid154-reset-required.txt"
RESET_REQUIRED = LOGS / "dmesg-ctime-nv-err-reset-required-gsp.txt"
XID45 = LOGS / "journalctl-xid45-after-xid149-xid145-590.48.01.txt"


def _findings(machine: Machine) -> list:
    return [f for f in judge.judge(machine) if f.check == "gpu.xid"]


def _judged(path: Path) -> list:
    return _findings(Machine(source="capture", kernel_log=kernel_log.parse_kernel_log(path.read_text(), path.name)))


def test_dmesg_H_relative_stamps_are_read_and_a_fatal_pcie_error_fails(capsys):
    log = kernel_log.parse_kernel_log(DMESG_H.read_text(), "dmesg -H")
    assert log.lines == 12 and log.gpu_buses == ["0000:03:00.0"]
    assert [(e.bus_id, e.severity) for e in log.events if e.kind == "aer"] == [
        ("0000:00:03.0", "uncorrected_fatal"), ("0000:03:00.0", "uncorrected_fatal")]
    code, out, _ = gpuvet(capsys, "inspect", str(DMESG_H), "--json")
    findings = [f for f in json.loads(out)["findings"] if f["check"] == "gpu.xid"]
    assert code == 1 and [(f["subject"], f["status"]) for f in findings] == [("pci 0000:03:00.0", "fail")]
    assert "uncorrected PCIe errors" in findings[0]["summary"] and "line 9" in findings[0]["summary"]


def test_dmesg_H_minute_headers_date_the_lines_after_them():
    text = "[Dec13 10:01] nvidia 0000:03:00.0: probe\n[  +1.500000] NVRM: Xid (PCI:0000:03:00): 79, GPU has fallen off the bus.\n"
    (event,) = kernel_log.parse_kernel_log(text, "dmesg -H").events
    assert event.at == "2000-12-13T10:01:01"  # no year on the line: the year is not claimed either way


def test_talos_stamps_are_dates_and_a_gpu_marked_for_reset_fails():
    log = kernel_log.parse_kernel_log(TALOS.read_text(), "talosctl dmesg")
    assert log.first == "2026-04-22T21:30:51.52643656Z" and log.now == "2026-04-22T21:30:51+00:00"
    findings = _judged(TALOS)
    by_subject = {f.subject: f for f in findings}
    assert by_subject["machine"].status == "fail" and "reset" in by_subject["machine"].summary
    assert by_subject["machine"].action == actions.RESET_GPU
    assert "lines without times" not in " ".join(f.summary for f in findings)
    xid154 = by_subject["pci 0000:0b:00.0"]
    assert xid154.status == "fail" and "2026-04-22T21:30:51" in xid154.summary


def test_nv_err_reset_required_without_an_xid_fails_the_node(capsys):
    (f,) = _judged(RESET_REQUIRED)
    assert (f.subject, f.status, f.action) == ("machine", "fail", "reset_gpu")
    assert "NV_ERR_RESET_REQUIRED" in f.summary and "Sun Jan 11 09:52:01 2026" in f.summary
    code, _, _ = gpuvet(capsys, "inspect", str(RESET_REQUIRED), "--json")
    assert code == 1


def test_xid45_names_the_xid_its_line_says_caused_it_and_cites_undated_lines_by_number():
    findings = _judged(XID45)
    dc = next(f for f in findings if f.subject == "pci 0000:dc:00.0")
    assert "caused by previous Xid 149" in dc.summary and "usually the application" not in dc.summary
    assert "line 0" not in dc.summary and "line 1" in dc.summary


def test_every_code_the_issue_found_missing_is_in_the_table_with_nvidias_action():
    table = gpu_xid.xid_table()
    for code in (54, 81, 125, 126, 136, 151, 155, 156, 157, 158, 159, 162, 163, 164, 165, 168):
        assert ("xid", code) in table, code
    assert all(("xid", code) in table for code in range(1, 173))  # the catalogue, 1 to 172
    for entry in table.values():
        assert entry.remediation in actions.NAMES
        mapped = actions.FROM_XID_RESOLUTION.get(entry.resolution)
        assert mapped is None or entry.remediation == mapped, entry.code
    assert table[("xid", 79)].remediation == actions.REBOOT_NODE and table[("xid", 54)].remediation == actions.ASK_PROVIDER


def test_an_xid_not_in_the_catalogue_fails_so_a_scheduler_drains_the_node():
    log = KernelLog(source="t", read=True, lines=1,
                    events=[KernelEvent("xid", "0000:03:00.0", 999, None, None, "[5.0]", 5.0, "NVRM: Xid (PCI:0000:03:00): 999, x")])
    (f,) = _findings(Machine(source="capture", kernel_log=log))
    assert f.status == "fail" and f.action == actions.DRAIN_AND_REPAIR and "not in NVIDIA's Xid catalogue" in f.summary


def test_a_code_of_thousands_of_digits_is_read_without_raising():
    huge = "9" * 5000
    text = (f"[ 1.0] nvidia-nvswitch0: SXid (PCI:0000:84:00.0): {huge}, Non-fatal, Link 1\n"
            f"[ 2.0] NVRM: Xid (PCI:0000:84:00): {huge}, pid=1\n"
            f"6,1,{huge},-;NVRM: Xid (PCI:0000:84:00): 79, GPU has fallen off the bus.\n")
    log = kernel_log.parse_kernel_log(text, "hostile")
    assert [e.code for e in log.events] == [None, None, 79]
    assert {f.status for f in _findings(Machine(source="capture", kernel_log=log))} == {"fail"}


def test_gpu_xid_skips_on_a_machine_without_an_nvidia_gpu():
    log = kernel_log.parse_kernel_log((LOGS / "kmsg-nvswitch-no-nvidia-fault.log").read_text(), "/dev/kmsg")
    log.gpu_buses = []
    (f,) = _findings(Machine(source="live", gpu_error="no NVIDIA GPU found", kernel_log=log))
    assert f.status == "skip" and "no NVIDIA GPU" in f.summary

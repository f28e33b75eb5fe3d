"""gpu.xid's time window (`--xid-window`): the kernel log keeps an Xid until reboot, so after a GPU
reset a since-boot rule would fail (and drain) the node for ever. Events older than the window are
shown as history, not judged. Real kernel logs (and the named edit of one), live through a stand-in
dmesg with fixed clocks, and as captures, whose window ends at their last dated line."""

from __future__ import annotations

import json
import stat
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpuvet import judge
from gpuvet.facts import Machine
from gpuvet.fleet import health
from gpuvet.judge.health import HEALTHY, PROBLEM
from gpuvet.probe import capture, kernel_log
from gpuvet.report.health import detail_lines
from tests.cli_runner import gpuvet

FIXTURES = Path(__file__).parent / "fixtures"
LOGS = FIXTURES / "kernel_log"
XID79_ON_GPU3 = FIXTURES / "edited/dmesg-tesla-k40m-xid79-390.30-edited-bus-86-as-h100-gpu3.txt"
XID79_UPTIME_S = 74889.644138  # its "[74889.644138] NVRM: Xid (PCI:0000:86:00): 79, GPU has fallen off the bus."
H100_Q = FIXTURES / "smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt"  # gpu3 is bus 0000:86:00.0
BOOT = datetime(2026, 12, 1, 0, 0, tzinfo=timezone.utc)


def _stand_in(tmp_path: Path, monkeypatch, tool_name: str, prints: Path) -> None:
    """The only tool on PATH is `tool_name`, printing the real log `prints` (no /dev/kmsg either)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / tool_name
    tool.write_text(f"#!/bin/sh\nexec /bin/cat {prints}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(bin_dir))


@pytest.fixture
def live_dmesg(tmp_path, monkeypatch):
    """This machine's `dmesg` prints the edited Xid 79 log (no /dev/kmsg, no journalctl)."""
    _stand_in(tmp_path, monkeypatch, "dmesg", XID79_ON_GPU3)

    def read(hours_after_the_xid: float):
        now = BOOT + timedelta(seconds=XID79_UPTIME_S, hours=hours_after_the_xid)
        return kernel_log.read_kernel_log(5, kmsg_path=str(tmp_path / "no-kmsg"), now_and_boot=(now, BOOT))
    return read


def _h100_with(log) -> Machine:
    machine = capture.merge(capture.read_captures(str(H100_Q)))
    machine.kernel_log = log
    return machine


def _xid(record) -> list:
    return [f for f in record.findings if f.check == "gpu.xid" and f.subject == "gpu3"]


def test_live_seconds_since_boot_are_dated_with_the_boot_time(live_dmesg):
    log = live_dmesg(5)
    (xid79,) = [e for e in log.events if e.code == 79]
    assert xid79.when == "[74889.644138]" and xid79.at == "2026-12-01T20:48:09+00:00"
    assert log.now_is == "read" and log.now == "2026-12-02T01:48:09+00:00"


def test_health_shows_an_xid_before_the_2h_window_as_history_and_does_not_fail_the_node(live_dmesg):
    """The operator reset gpu3 (`nvidia-smi -r`) after its Xid 79 five hours ago: no drain."""
    record = health.check(machine=_h100_with(live_dmesg(5)), skip=["gpu.throttle"])  # gpu2's power brake aside
    assert record.options["xid_window_s"] == 7200
    assert health.outcome(record) == HEALTHY
    old = [f for f in _xid(record) if f.status == "measured"]
    assert [f.summary for f in old] == [
        "uncorrected PCIe errors on this GPU's bus at 2026-12-01T20:48:09Z, 5.0 h ago, before the 2 h window (1 time): "
        "history, not judged",
        "Xid 79 (GPU has fallen off the bus) at 2026-12-01T20:48:09Z, 5.0 h ago, before the 2 h window (1 time): "
        "history, not judged"]
    assert all("--xid-window boot" in f.remedy for f in old)
    shown = detail_lines(record)  # what `gpuvet health` prints under its summary line, without -v
    assert any(line.split()[:3] == ["MEASURED", "gpu.xid", "gpu3"] and "Xid 79" in line for line in shown)
    (clean,) = [f for f in record.findings if f.check == "gpu.xid" and f.status == "pass"]
    assert clean.subject == "machine" and clean.summary.startswith("no NVIDIA driver error in the last 2 h of the kernel log")


def test_health_fails_the_same_xid_inside_the_window(live_dmesg):
    record = health.check(machine=_h100_with(live_dmesg(0.25)), skip=["gpu.throttle"])
    assert health.outcome(record) == PROBLEM
    (failed,) = [f for f in _xid(record) if f.status == "fail" and "Xid 79" in f.summary]
    assert failed.summary.endswith("(within the 2 h window)")
    assert failed.evidence.expected.endswith("for the GPUs in the last 2 h")


def test_since_boot_judges_the_old_xid_as_before(live_dmesg):
    record = health.check(machine=_h100_with(live_dmesg(5)), skip=["gpu.throttle"], xid_window_s=None)
    assert health.outcome(record) == PROBLEM
    assert any(f.status == "fail" and "Xid 79" in f.summary and "window" not in f.summary for f in _xid(record))


def test_a_capture_with_only_seconds_since_boot_says_the_window_could_not_be_applied(capsys, tmp_path):
    out_file = tmp_path / "health.json"  # the whole record (--json prints the verdict object)
    code, _, _ = gpuvet(capsys, "health", "--no-save", "--from", str(H100_Q), "--from", str(XID79_ON_GPU3),
                        "--skip", "gpu.throttle", "--out", str(out_file))
    record = json.loads(out_file.read_text())
    assert code == 1 and record["options"]["xid_window_s"] == 7200
    (xid79,) = [f for f in record["findings"] if f["check"] == "gpu.xid" and "Xid 79" in f["summary"]]
    assert xid79["status"] == "fail" and xid79["subject"] == "gpu3"
    assert "the 2 h window could not be applied: the log's lines carry seconds since boot, not dates" in xid79["summary"]


def test_inspect_window_ends_at_the_captures_last_dated_line(capsys):
    """syslog (no year): RmInitAdapter failed at 11:49:53, 11:50:34, 11:52:03, 11:54:40; the last
    line is 11:54:56. A 2 min window judges the lines from 11:54:40 on and counts the rest."""
    code, out, _ = gpuvet(capsys, "inspect", "--xid-window", "2m", "--json", str(LOGS / "syslog-rminitadapter-failed-gpu-operator.txt"))
    record = json.loads(out)
    assert record["options"]["xid_window_s"] == 120
    (failed,) = [f for f in record["findings"] if f["check"] == "gpu.xid"]
    assert failed["status"] == "fail" and "first Dec  2 11:54:40, last Dec  2 11:54:56" in failed["summary"]
    assert failed["summary"].endswith("; 3 more line(s) before the 2 min window")


def test_inspect_lists_a_group_wholly_before_the_window_as_history():
    """dmesg -T: Xid 13 at 11:43:09, Xid 109 at 11:43:14 (the last line): a 3 s window."""
    log = kernel_log.parse_kernel_log((LOGS / "dmesg-ctime-xid13-xid109.txt").read_text(), "dmesg -T")
    assert log.now == "2024-08-30T11:43:14" and log.now_is == "last line"
    findings = [f for f in judge.judge(Machine(source="capture", kernel_log=log), options={"xid_window_s": 3.0})
                if f.check == "gpu.xid"]
    by_code = {("13" if "Xid 13" in f.summary else "109"): f for f in findings}
    assert by_code["109"].status == "warn" and by_code["13"].status == "measured"
    assert by_code["13"].summary.startswith("Xid 13 (Graphics engine exception) at Fri Aug 30 11:43:09 2024, 5 s ago, "
                                            "before the 3 s window")


def test_iso_and_journal_times_keep_their_zone():
    log = kernel_log.parse_kernel_log((LOGS / "dmesg-iso-sxid-12028-nvswitch.txt").read_text(), "iso")
    assert {e.at for e in log.events} == {"2025-01-25T10:34:54+00:00"}


def test_run_and_inspect_judge_since_boot_unless_asked(capsys):
    code, out, _ = gpuvet(capsys, "inspect", "--json", str(XID79_ON_GPU3))
    record = json.loads(out)
    assert record["options"]["xid_window_s"] is None
    assert not any("window" in f["summary"] for f in record["findings"] if f["check"] == "gpu.xid")


@pytest.mark.parametrize("bad", ["2x", "-1h", "h", "0.0.1"])
def test_a_bad_window_is_one_line_and_exit_2(capsys, bad):
    code, out, err = gpuvet(capsys, "health", "--no-save", "--from", str(H100_Q), f"--xid-window={bad}")
    assert code == 2 and "is not a window: give e.g. 2h, 90m, 1d or boot" in err


def test_live_journal_lines_without_a_zone_are_dated_by_their_seconds_since_boot(tmp_path, monkeypatch):
    """A journalctl that prints syslog's zone-less "Dec  2 11:49:53 ... [  885.242168]": the boot
    time dates it, comparable with the time it was read."""
    _stand_in(tmp_path, monkeypatch, "journalctl", LOGS / "syslog-rminitadapter-failed-gpu-operator.txt")
    log = kernel_log.read_kernel_log(5, kmsg_path=str(tmp_path / "no-kmsg"), now_and_boot=(BOOT + timedelta(hours=1), BOOT))
    assert log.source == "journalctl -k" and log.events[0].at == "2026-12-01T00:14:45+00:00"  # 885.24 s after boot


def test_damaged_times_leave_an_event_undated_instead_of_failing():
    huge = "6,1,99999999999999999999999,-;NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.\n"
    (event,) = kernel_log.parse_kernel_log(huge, "kmsg", boot_at=BOOT).events
    assert event.code == 79 and event.at is None
    leap = "Feb 29 10:00:00 h kernel: NVRM: Xid (PCI:0000:01:00): 79, x\nJan  1 00:00:01 h kernel: later\n"
    (event,) = kernel_log.parse_kernel_log(leap, "syslog").events
    assert event.at == "1999-02-28T10:00:00"  # the year before the log's last line, Feb 29 made Feb 28

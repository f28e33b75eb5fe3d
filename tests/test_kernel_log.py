"""gpu.xid: the kernel log's NVIDIA lines, read from real logs (captures) and live through
stand-ins for /dev/kmsg, journalctl and dmesg, judged against the Xid table."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from gpuvet import judge
from gpuvet.facts import KernelLog, Machine
from gpuvet.judge import gpu_xid
from gpuvet.probe import capture, kernel_log
from tests.cli_runner import gpuvet

FIXTURES = Path(__file__).parent / "fixtures"
LOGS = FIXTURES / "kernel_log"
XID79_ON_GPU3 = FIXTURES / "edited/dmesg-tesla-k40m-xid79-390.30-edited-bus-86-as-h100-gpu3.txt"
H100_Q = FIXTURES / "smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt"


def _log(name: str) -> KernelLog:
    return kernel_log.parse_kernel_log((LOGS / name).read_text(), name)


def _xid_findings(machine: Machine) -> list:
    return [f for f in judge.judge(machine) if f.check == "gpu.xid"]


def _judged(name: str) -> list:
    return _xid_findings(Machine(source="capture", kernel_log=_log(name)))


@pytest.mark.parametrize("name", sorted(p.name for p in LOGS.iterdir()))
def test_every_real_kernel_log_is_recognised_from_its_content(tmp_path, name):
    renamed = tmp_path / "capture.dat"
    renamed.write_bytes((LOGS / name).read_bytes())
    (c,) = capture.read_captures(str(renamed))
    assert c.kind == "kernel-log" and c.kernel_log is not None


def test_dmesg_uptimes_xid79_and_aer_below_the_root_port():
    log = _log("dmesg-tesla-k40m-aer-surprise-down-xid79-390.30.txt")
    xid = [e for e in log.events if e.kind == "xid"]
    assert [(e.bus_id, e.code, e.uptime_s) for e in xid] == [("0000:02:00.0", 79, 74889.644138)]
    # The root port logged the AER errors; the kernel's broadcast names the GPU below it.
    on_gpu = [e for e in log.events if e.kind == "aer" and e.bus_id == "0000:02:00.0"]
    assert [e.severity for e in on_gpu] == ["uncorrected_fatal"]
    assert log.gpu_buses == ["0000:02:00.0"] and log.first == "[74785.660366]" and log.since_boot is False


def test_inspect_dmesg_and_q_fails_the_gpu_of_the_xid79_and_only_it(capsys):
    code, out, _ = gpuvet(capsys, "inspect", str(XID79_ON_GPU3), str(H100_Q), "--json")
    assert code == 1
    findings = [f for f in json.loads(out)["findings"] if f["check"] == "gpu.xid"]
    failed = {f["subject"] for f in findings if f["status"] == "fail"}
    assert failed == {"gpu3"}
    xid79 = next(f for f in findings if "Xid 79" in f["summary"])
    assert "fallen off the bus" in xid79["summary"] and "[74889.644138]" in xid79["summary"]
    assert "reboot" in xid79["remedy"] and "provider" in xid79["remedy"]
    assert {f["subject"] for f in findings if f["status"] == "pass"} == {f"gpu{i}" for i in range(8) if i != 3}


def test_the_same_log_without_a_report_names_the_bus():
    findings = _judged("dmesg-tesla-k40m-aer-surprise-down-xid79-390.30.txt")
    assert {(f.subject, f.status) for f in findings} == {("pci 0000:02:00.0", "fail")}


def test_application_xids_warn_and_name_the_process_and_count_instants():
    findings = _judged("dmesg-ctime-xid13-xid109.txt")
    by_code = {f.summary.split(" (")[0]: f for f in findings}
    assert {f.status for f in findings} == {"warn"}
    # Three Xid 13 lines in one second are one event, at the time dmesg -T printed.
    assert "1 time (Fri Aug 30 11:43:09 2024)" in by_code["Xid 13"].summary
    assert "application" in by_code["Xid 13"].summary
    assert "pt_main_thread" in by_code["Xid 109"].summary


def test_xid45_on_four_gpus_warns_each_without_times():
    findings = _judged("journalctl-xid45-after-xid149-xid145-590.48.01.txt")
    assert sorted(f.subject for f in findings) == ["pci 0000:97:00.0", "pci 0000:ba:00.0", "pci 0000:dc:00.0",
                                                    "pci 0000:ed:00.0"]
    assert all(f.status == "warn" and "python3" in f.summary for f in findings)
    assert "2 times" in next(f for f in findings if f.subject == "pci 0000:dc:00.0").summary


def test_sxids_fatal_by_table_and_nonfatal_by_line():
    (fatal,) = _judged("dmesg-iso-sxid-12028-nvswitch.txt")
    assert (fatal.subject, fatal.status) == ("nvswitch 0000:84:00.0", "fail")
    assert "2025-01-25T10:34:54" in fatal.summary and "Fabric Manager" in fatal.evidence.source
    (nonfatal,) = _judged("dmesg-nvswitch-sxid-22013-nonfatal-ppcie.txt")
    assert nonfatal.status == "warn" and "non-fatal" in nonfatal.summary and "2 times" in nonfatal.summary


def test_fallen_off_the_bus_over_three_lines_is_xid79():
    (f,) = _judged("dmesg-fallen-off-bus-multiline-570.158.01.txt")
    assert (f.subject, f.status) == ("pci 0000:b3:00.0", "fail") and "Xid 79" in f.summary


def test_rminitadapter_failed_is_a_gpu_the_driver_cannot_start():
    (f,) = _judged("syslog-rminitadapter-failed-gpu-operator.txt")
    assert f.status == "fail" and "6 times" in f.summary and "first Dec  2 11:49:53" in f.summary


def test_a_log_with_no_nvidia_fault_passes_saying_how_far_back_it_read():
    (f,) = _judged("kmsg-nvswitch-no-nvidia-fault.log")
    assert f.status == "pass" and "47 lines" in f.summary and "[206.764307]" in f.summary
    assert "ring buffer" in f.summary  # it does not start at boot, and says so


def test_xid63_fails_only_while_a_remap_is_pending():
    log = kernel_log.parse_kernel_log("[ 10.0] NVRM: Xid (PCI:0000:86:00): 63, pid=1, Row Remapper: New row marked for remapping\n", "t")
    machine = capture.merge(capture.read_captures(str(H100_Q)))
    machine.kernel_log = log
    gpu3 = next(g for g in machine.gpus if g.pcie.bus_id == "0000:86:00.0")
    assert next(f for f in _xid_findings(machine) if f.subject == "gpu3").status == "warn"
    gpu3.ecc.remapped_rows_pending = True
    assert next(f for f in _xid_findings(machine) if f.subject == "gpu3").status == "fail"


def test_no_kernel_log_in_the_captures_is_a_skip_with_the_command():
    (f,) = _xid_findings(capture.merge(capture.read_captures(str(H100_Q))))
    assert f.status == "skip" and "dmesg" in f.remedy


def test_every_table_row_has_a_source_and_a_known_verdict():
    table = gpu_xid.xid_table()
    assert {48, 74, 79, 92, 94, 95, 119, 120}.issubset({code for kind, code in table if kind == "xid"})
    assert all(e.source and e.verdict in ("fail", "warn", "pending", "line") for e in table.values())
    assert all(table[("xid", c)].verdict == "warn" for c in (13, 31, 43, 45))


# -- live, on stand-ins ----------------------------------------------------------------------

def _tool(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def stand_ins(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    restrict = tmp_path / "dmesg_restrict"
    restrict.write_text("1\n")
    monkeypatch.setattr(kernel_log, "DMESG_RESTRICT_PATH", str(restrict))
    return bin_dir


def test_live_reads_kmsg_first(tmp_path, stand_ins):
    kmsg = tmp_path / "kmsg"
    kmsg.write_bytes((LOGS / "kmsg-nvswitch-no-nvidia-fault.log").read_bytes())
    log = kernel_log.read_kernel_log(5, kmsg_path=str(kmsg))
    assert log.read and log.source == str(kmsg) and log.lines == 47


def test_live_falls_back_to_journalctl_then_dmesg(tmp_path, stand_ins):
    missing = str(tmp_path / "no-kmsg")
    lines = (LOGS / "syslog-rminitadapter-failed-gpu-operator.txt").read_text()
    (tmp_path / "journal.txt").write_text(lines)
    _tool(stand_ins, "journalctl", f"exec /bin/cat {tmp_path / 'journal.txt'}\n")
    log = kernel_log.read_kernel_log(5, kmsg_path=missing)
    assert log.source == "journalctl -k" and log.since_boot and len(log.events) == 6
    assert "container" in log.why_unread  # why /dev/kmsg was passed over
    os.remove(stand_ins / "journalctl")
    _tool(stand_ins, "dmesg", f"exec /bin/cat {LOGS / 'dmesg-tesla-k40m-aer-surprise-down-xid79-390.30.txt'}\n")
    log = kernel_log.read_kernel_log(5, kmsg_path=missing)
    assert log.source == "dmesg" and any(e.code == 79 for e in log.events)
    assert "journalctl -k: not installed" in log.why_unread


def test_live_unreadable_says_why_for_each_and_gpu_xid_skips(tmp_path, stand_ins):
    _tool(stand_ins, "journalctl", "echo 'Hint: You are currently not seeing messages from other users and the system.'\n")
    _tool(stand_ins, "dmesg", "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2; exit 1\n")
    log = kernel_log.read_kernel_log(5, kmsg_path=str(tmp_path / "no-kmsg"))
    assert not log.read
    assert "adm or systemd-journal group" in log.why_unread and "kernel.dmesg_restrict=1" in log.why_unread
    (f,) = _xid_findings(Machine(kernel_log=log))
    assert f.status == "skip" and "dmesg_restrict" in f.summary and "sudo" in f.remedy


def test_live_a_hung_journalctl_is_cut_at_the_deadline(tmp_path, stand_ins):
    _tool(stand_ins, "journalctl", "exec /bin/sleep 30\n")
    log = kernel_log.read_kernel_log(0.5, kmsg_path=str(tmp_path / "no-kmsg"))
    assert not log.read and "gave no answer within" in log.why_unread and "dmesg: not tried" in log.why_unread


def test_an_nvml_xid_during_a_benchmark_fails_that_gpu_and_names_the_benchmark(monkeypatch):
    import threading
    import types

    import pynvml

    from gpuvet.probe import nvml_events

    taken = threading.Event()
    events = iter([types.SimpleNamespace(device="h1", eventData=79)])

    def wait(event_set, timeout_ms):
        for event in events:
            return event
        taken.set()
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)

    for name, fn in {"nvmlEventSetCreate": lambda: "set", "nvmlDeviceGetHandleByIndex": lambda i: f"h{i}",
                     "nvmlDeviceRegisterEvents": lambda h, kinds, s: None, "nvmlEventSetWait_v2": wait,
                     "nvmlEventSetFree": lambda s: None, "nvmlDeviceGetIndex": lambda h: int(h[1:])}.items():
        monkeypatch.setattr(pynvml, name, fn, raising=False)
    watch = nvml_events.XidWatch(2, during="benchmark gemm")
    assert taken.wait(5)
    watch.stop()
    machine = capture.merge(capture.read_captures(str(H100_Q)))
    machine.nvml_xid_events = watch.as_kernel_events({g.index: g.pcie.bus_id for g in machine.gpus})
    findings = _xid_findings(machine)
    failed = [f for f in findings if f.status == "fail"]
    assert [f.subject for f in failed] == ["gpu1"] and "seen by NVML during benchmark gemm" in failed[0].summary
    assert any(f.status == "skip" and "no kernel log" in f.summary for f in findings)  # the log itself was not given


def test_without_event_support_the_watch_says_why(monkeypatch):
    import pynvml

    from gpuvet.probe import nvml_events

    def refuse(*_args):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlEventSetCreate", refuse)
    watch = nvml_events.XidWatch(1)
    assert watch.last(0) is None and "not available" in watch.unavailable
    watch.stop()

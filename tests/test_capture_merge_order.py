"""Several captures of one machine: the judgement does not depend on the order the files are given,
a topology of another machine is left out, and a kernel module that differs from the report's
driver is noted."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuvet.judge import judge
from gpuvet.probe import capture

FIXTURES = Path(__file__).parent / "fixtures"
IDLE = "smi_text/q-h100-80gb-hbm3-vm-590.48.01-idle.txt"
LOAD = "smi_text/q-h100-80gb-hbm3-vm-590.48.01-load.txt"  # gpu_burn and two memhogs running


def merged(*names: str):
    return capture.merge([c for name in names for c in capture.read_captures(str(FIXTURES / name))])


def findings(*names: str) -> list[tuple[str, str, str, str]]:
    return sorted((f.check, f.subject, f.status, f.summary) for f in judge(merged(*names)))


def test_idle_and_load_snapshots_give_the_same_findings_in_either_order():
    assert findings(IDLE, LOAD) == findings(LOAD, IDLE)
    by_check = {check: (status, summary) for check, _, status, summary in findings(LOAD, IDLE)}
    assert by_check["gpu.isolation"][0] == "pass"  # judged from the idle snapshot, before you start
    assert by_check["gpu.pcie_link"] == ("pass", "Gen5 x16, the full Gen5 x16 link under load")  # read under load


def test_the_other_report_is_noted_as_supplying_only_link_readings():
    machine = merged(LOAD, IDLE)
    notes = {c["path"].rsplit("/", 1)[-1]: c.get("note", "") for c in machine.captures}
    assert "only its PCIe link readings are used (taken under load)" in notes[LOAD.rsplit("/", 1)[-1]]
    # The base report's note only says when it was taken (its own timestamp), not what it supplies.
    assert notes[IDLE.rsplit("/", 1)[-1]].startswith("taken Tue Jul 14 08:12:38 2026 by its own timestamp")


@pytest.mark.parametrize("report, used", [
    (IDLE, False),  # 1 GPU beside an 8-GPU DGX A100 matrix: another machine
    ("smi_text/q-8x-a100-sxm4-40gb-azure-ndv4-460.32.03.txt", True),
])
def test_topology_is_used_only_when_its_gpu_count_is_the_machines(report, used):
    machine = merged(report, "topo/dgx-a100-8gpu-nv12-12nics-topo-m.txt")
    assert (machine.topology is not None) is used
    topo_note = next(c.get("note", "") for c in machine.captures if c["kind"] == "topo")
    assert ("shows 8 GPUs, the nvidia-smi report 1: not used" in topo_note) is not used


def test_a_loaded_kernel_module_other_than_the_reports_driver_is_noted():
    machine = merged("smi_xml/gt-1030-x4-470.74-v11.xml", "proc_sysfs/proc-driver-nvidia-version-470.103.01-stale-loaded-module.txt")
    note = next(c.get("note", "") for c in machine.captures if c["kind"] == "proc-version")
    assert "kernel module 470.103.01 loaded, but the nvidia-smi report says driver 470.74" in note
    captures = [c for name in ("smi_xml/gt-1030-x4-470.74-v11.xml", "proc_sysfs/proc-driver-nvidia-version-470.63.01.txt")
                for c in capture.read_captures(str(FIXTURES / name))]
    captures[1].kernel_module_version = "470.74"  # edited (synthetic): the module the report's driver loaded
    assert not capture.merge(captures).captures[1].get("note")


def test_report_timestamp_is_read():
    (c,) = capture.read_captures(str(FIXTURES / IDLE))
    assert c.timestamp is not None and c.timestamp.isoformat() == "2026-07-14T08:12:38"

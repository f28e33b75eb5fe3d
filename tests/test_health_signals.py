"""gpu.link_errors, gpu.fabric, gpu.recovery, gpu.throttle_history, gpu.persistence: read from real
`-q`/`-q -x` captures (their Fabric, recovery, counters and histogram sections), and live through
stand-ins for NVML, sysfs and the fabric manager's tools."""

from __future__ import annotations

import stat
from pathlib import Path

import pynvml
import pytest

from gpuvet import judge
from gpuvet.facts import Fabric, Gpu, Host, Machine, NvLink
from gpuvet.probe import capture, fabric_manager, nvml_health, sysfs_pcie

FIXTURES = Path(__file__).parent / "fixtures"
H100_IDLE = FIXTURES / "smi_text/q-h100-80gb-hbm3-vm-590.48.01-idle.txt"
H100_8X = FIXTURES / "smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt"
RTX3090 = FIXTURES / "smi_xml/rtx-3090-swpowercap-590.44.01-v13.xml"
A100_MIG_XML = FIXTURES / "smi_xml/a100-sxm4-80gb-mig-4x1g-535.54.03-v12.xml"


def _machine(path: Path) -> Machine:
    return capture.merge(capture.read_captures(str(path)))


def _findings(machine: Machine, check: str) -> list:
    return [f for f in judge.judge(machine) if f.check == check]


def test_fabric_section_of_a_real_h100_capture_is_read_and_passes():
    machine = _machine(H100_8X)
    assert {(g.fabric.state, g.fabric.status) for g in machine.gpus} == {("Completed", "Success")}
    findings = _findings(machine, "gpu.fabric")
    assert len(findings) == 8 and {f.status for f in findings} == {"pass"}


def test_fabric_not_finished_fails_naming_error_802():
    machine = _machine(H100_8X)
    machine.gpus[5].fabric = Fabric(state="In Progress", status="N/A")
    failed = [f for f in _findings(machine, "gpu.fabric") if f.status == "fail"]
    assert [f.subject for f in failed] == ["gpu5"] and "802" in failed[0].summary
    assert "fabricmanager" in failed[0].remedy


def test_fabric_na_on_a_desktop_gpu_is_one_skip():
    (f,) = _findings(_machine(RTX3090), "gpu.fabric")
    assert f.status == "skip" and "NVSwitch" in f.summary


def test_fabric_manager_stopped_or_of_another_version_fails():
    machine = _machine(H100_8X)
    machine.driver.fabric_manager_state = "inactive"
    assert any(f.subject == "machine" and f.status == "fail" for f in _findings(machine, "gpu.fabric"))
    machine.driver.fabric_manager_state, machine.driver.fabric_manager_version = "active", "535.161.08"
    (fm,) = [f for f in _findings(machine, "gpu.fabric") if f.subject == "machine"]
    assert fm.status == "fail" and "535.183.01" in fm.summary


def test_recovery_action_and_histogram_from_a_real_capture():
    machine = _machine(H100_IDLE)
    gpu = machine.gpus[0]
    assert gpu.recovery_action == "None" and gpu.remap_histogram == {"max": 2560, "high": 0, "partial": 0, "low": 0, "none": 0}
    (f,) = _findings(machine, "gpu.recovery")
    assert f.status == "pass"
    gpu.recovery_action = "Drain and Reset"
    (f,) = _findings(machine, "gpu.recovery")
    assert f.status == "fail" and "Drain and Reset" in f.summary and "nvidia-smi -r -i 0" in f.remedy


def test_a_bank_with_no_spare_row_fails_recovery():
    machine = _machine(H100_8X)
    machine.gpus[1].remap_histogram = {"max": 2559, "none": 1}
    by_gpu = {f.subject: f.status for f in _findings(machine, "gpu.recovery")}
    assert by_gpu.get("gpu1") == "fail" and by_gpu.get("gpu0") == "pass"


def test_throttle_history_counters_from_a_real_xml_capture():
    machine = _machine(RTX3090)
    assert machine.gpus[0].clock_event_time_us["sw_power_cap"] == 9840338777.0
    (f,) = _findings(machine, "gpu.throttle_history")
    assert f.status == "pass" and "2.7 h at the power cap" in f.summary  # the cap is the limit, not a fault


def test_minutes_in_hw_slowdown_since_boot_fail_the_idle_capture():
    machine = _machine(H100_IDLE)
    machine.gpus[0].clock_event_time_us["hw_thermal_slowdown"] = 300e6
    (f,) = _findings(machine, "gpu.throttle_history")
    assert f.status == "fail" and "HW thermal slowdown 5.0 min" in f.summary
    machine.gpus[0].clock_event_time_us["hw_thermal_slowdown"] = 5e6
    (f,) = _findings(machine, "gpu.throttle_history")
    assert f.status == "warn"


def test_replays_are_judged_as_a_rate_only_with_an_uptime():
    machine = _machine(H100_8X)  # 43-120 replays since reset, no uptime in a capture
    assert {f.status for f in _findings(machine, "gpu.link_errors")} == {"measured"}
    machine.host = Host(uptime_s=3600.0)  # one hour: 120 replays are 2 per minute
    assert {f.status for f in _findings(machine, "gpu.link_errors")} == {"pass"}
    machine.host.uptime_s = 600.0  # ten minutes: 120 replays are 12 per minute
    gpu0 = next(f for f in _findings(machine, "gpu.link_errors") if f.subject == "gpu0")
    assert gpu0.status == "warn" and "DCGM" in gpu0.evidence.source


def test_persistence_off_on_a_datacenter_gpu_warns():
    machine = _machine(A100_MIG_XML)
    assert machine.gpus[0].persistence_mode is False
    (f,) = _findings(machine, "gpu.persistence")
    assert f.status == "warn" and "nvidia-persistenced" in f.remedy
    (f,) = _findings(_machine(RTX3090), "gpu.persistence")
    assert f.status == "pass"


# -- live stand-ins ----------------------------------------------------------------------------

def test_sysfs_aer_counters_fail_on_a_fatal_error(tmp_path):
    device = tmp_path / "0000:86:00.0"
    device.mkdir()
    (device / "aer_dev_correctable").write_text("RxErr 2\nBadTLP 1\nTOTAL_ERR_COR 3\n")
    (device / "aer_dev_nonfatal").write_text("Undefined 0\nTOTAL_ERR_NONFATAL 0\n")
    (device / "aer_dev_fatal").write_text("SurpriseDown 1\nTOTAL_ERR_FATAL 1\n")
    counts = sysfs_pcie.aer_counts("00000000:86:00.0", root=str(tmp_path))
    assert counts == {"correctable": 3, "nonfatal": 0, "fatal": 1}
    gpu = Gpu(index=0, name="NVIDIA H100 80GB HBM3")
    gpu.pcie.aer_counts = counts
    (f,) = _findings(Machine(gpus=[gpu]), "gpu.link_errors")
    assert f.status == "fail" and "1 fatal" in f.summary


class _FieldValue:
    class value:
        uiVal = 4  # NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET
    nvmlReturn = 0


def test_nvml_fabric_recovery_violations_and_nvlink_counters(monkeypatch):
    def fabric_info(handle, ref):
        info = ref._obj
        info.state, info.status = 2, 0  # in progress
        return 0

    monkeypatch.setattr(pynvml, "nvmlDeviceGetGpuFabricInfo", fabric_info, raising=False)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetFieldValues", lambda h, ids: [_FieldValue()], raising=False)

    class Violation:
        violationTime = 90_000_000_000  # 90 s in ns

    monkeypatch.setattr(pynvml, "nvmlDeviceGetViolationStatus", lambda h, policy: Violation(), raising=False)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkErrorCounter", lambda h, link, counter: 7 if counter == 1 else 0,
                        raising=False)
    histogram = pynvml.c_nvmlRowRemapperHistogramValues(max=0, high=0, partial=0, low=2, none=1)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetRowRemapperHistogram", lambda h: histogram, raising=False)
    gpu = Gpu(index=0, name="NVIDIA H100 80GB HBM3", nvlinks=[NvLink(link=0, active=True), NvLink(link=1, active=False)])

    def query(field, fn, *args):
        return fn(*args)

    nvml_health.fill(gpu, "handle", query)
    assert gpu.fabric == Fabric(state="In Progress", status="Success")
    assert gpu.recovery_action == "Drain and Reset"
    assert gpu.clock_event_time_us == {"sw_power_cap": 90e6, "thermal": 90e6}
    assert gpu.nvlink_errors == {"replay": 0, "recovery": 7, "crc": 0}
    assert gpu.nvlink_error_links == {"0": {"recovery": 7}}  # link 1 is down: not read
    assert gpu.remap_histogram == {"max": 0, "high": 0, "partial": 0, "low": 2, "none": 1}
    statuses = {f.check: f.status for f in judge.judge(Machine(gpus=[gpu])) if f.subject == "gpu0"}
    assert statuses["gpu.fabric"] == "fail" and statuses["gpu.recovery"] == "fail"
    assert statuses["gpu.throttle_history"] == "fail" and statuses["gpu.link_errors"] == "warn"


def test_nvlink5_counters_come_from_nvml_field_values_where_the_dl_counters_are_not_supported(monkeypatch):
    """Blackwell: nvmlDeviceGetNvLinkErrorCounter is not supported; the per-link NVLink 5 field values
    DCGM's health watch reads are (scope id = the link)."""
    def refuse(*_args):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def field_values(h, ids):
        values = (pynvml.c_nvmlFieldValue_t * len(ids))()
        for slot, field in zip(values, ids):
            field_id, link = field if isinstance(field, tuple) else (field, 0)
            slot.fieldId, slot.scopeId = field_id, link
            nvlink5 = isinstance(field, tuple)
            slot.nvmlReturn = pynvml.NVML_SUCCESS if nvlink5 else pynvml.NVML_ERROR_NOT_SUPPORTED
            slot.value.ullVal = 3 if (field_id, link) == (pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS, 2) else 0
        return values

    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkErrorCounter", refuse, raising=False)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetFieldValues", field_values, raising=False)
    gpu = Gpu(index=0, name="NVIDIA GB200", nvlinks=[NvLink(link=n, active=True) for n in range(3)])

    def query(field, fn, *args):
        try:
            return fn(*args)
        except pynvml.NVMLError:
            return None

    nvml_health.fill(gpu, "handle", query)
    assert gpu.nvlink_errors["total_link_recovery_events"] == 3 and gpu.nvlink_errors["symbol"] == 0
    assert gpu.nvlink_error_links == {"2": {"total_link_recovery_events": 3}}
    (f,) = [f for f in judge.judge(Machine(gpus=[gpu])) if f.check == "gpu.link_errors"]
    assert f.status == "warn" and "link 2: 3 total link recovery events" in f.summary


def test_nvml_without_the_calls_leaves_the_facts_unknown(monkeypatch):
    def refuse(*_args):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    for name in ("nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetFieldValues", "nvmlDeviceGetViolationStatus"):
        monkeypatch.setattr(pynvml, name, refuse, raising=False)
    gpu = Gpu(index=0)
    reasons = {}

    def query(field, fn, *args):
        try:
            return fn(*args)
        except pynvml.NVMLError as err:
            reasons[field] = str(err)
            return None

    nvml_health.fill(gpu, "handle", query)
    assert gpu.fabric is None and gpu.recovery_action is None and gpu.clock_event_time_us is None
    assert "fabric" in reasons


@pytest.fixture
def tools(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))

    def add(name: str, script: str) -> None:
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + script)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return add


def test_fabric_manager_state_and_version_from_its_tools(tools):
    tools("systemctl", "echo active\n")
    tools("nv-fabricmanager", "echo 'Fabric Manager version is : 535.183.01'\n")
    assert fabric_manager.read_state() == ("active", "535.183.01")


def test_fabric_manager_not_installed(tools):
    tools("systemctl", "echo inactive; exit 3\n")
    assert fabric_manager.read_state() == ("inactive", None)

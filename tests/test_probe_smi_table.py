"""The default nvidia-smi table and dmon (tests/fixtures/smi_text/ and bundles/, see SOURCES.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuvet.probe.errors import CaptureError
from gpuvet.probe.smi_table import (
    TRUNCATED_NAME,
    looks_like_dmon,
    looks_like_smi_table,
    parse_dmon,
    parse_smi_table,
)

FIXTURES = Path(__file__).parent / "fixtures"
TEXT = FIXTURES / "smi_text"


def parse(name: str):
    return parse_smi_table((TEXT / name).read_text())


def bundle_section(bundle: str, title: str) -> str:
    """The body of one '#####'-bannered section of an nvidia_gpu_exporter capture bundle."""
    text = (FIXTURES / "bundles" / bundle).read_text()
    parts = re.split(r"^#{80}\n# (.+)\n(?:# \$.*\n)?#{80}\n", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))[title]


IDLE_TABLE = "idle :: nvidia-smi (default table)"
LOAD_TABLE = "load :: nvidia-smi (default table)"


def test_8x_h100_wide_layout():
    driver, gpus = parse("default-table-8x-h100-550.90.07.txt")
    assert (driver.version, driver.cuda_version) == ("550.90.07", "12.4")
    assert [g.index for g in gpus] == list(range(8))
    assert [g.pcie.bus_id for g in gpus] == [
        "0000:19:00.0", "0000:3b:00.0", "0000:4c:00.0", "0000:5d:00.0",
        "0000:9b:00.0", "0000:bb:00.0", "0000:cb:00.0", "0000:db:00.0",
    ]
    assert {g.name for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {g.power.enforced_limit_w for g in gpus} == {700.0}
    assert {g.memory_total_mib for g in gpus} == {81559}
    assert [g.power.draw_w for g in gpus] == [72, 74, 70, 72, 73, 74, 73, 72]
    assert [g.thermal.gpu_c for g in gpus] == [27, 24, 23, 23, 27, 22, 24, 23]
    gpu = gpus[0]
    assert (gpu.persistence_mode, gpu.pstate, gpu.utilization_pct, gpu.compute_mode) == (True, 0, 0, "Default")
    assert (gpu.mig_enabled, gpu.ecc.enabled, gpu.ecc.volatile_uncorrected) == (False, True, 0)
    assert gpu.memory_used_mib == 1
    assert gpu.power.limit_w is None  # the table shows only the enforced cap
    assert all(g.processes == [] for g in gpus)  # "No running processes found"
    assert "name" not in gpu.unavailable


def test_10x_quadro_rtx8000_narrow_layout():
    driver, gpus = parse("default-table-10x-quadro-rtx8000-470.63.01.txt")
    assert (driver.version, driver.cuda_version) == ("470.63.01", "11.4")
    assert len(gpus) == 10
    assert [g.pcie.bus_id[5:7] for g in gpus] == ["12", "13", "14", "48", "49", "89", "8a", "c0", "c1", "c2"]
    assert {g.name for g in gpus} == {"Quadro RTX 8000"}
    assert {g.power.enforced_limit_w for g in gpus} == {260.0}
    assert {g.memory_total_mib for g in gpus} == {48601}
    assert {g.pstate for g in gpus} == {8}
    assert [g.power.draw_w for g in gpus] == [16, 13, 7, 11, 5, 8, 14, 6, 10, 9]
    assert {g.ecc.enabled for g in gpus} == {False}  # "Off"
    assert {g.mig_enabled for g in gpus} == {None}  # "N/A"
    assert {g.persistence_mode for g in gpus} == {True}


def test_v100_corrupted_inforom_warning_lands_on_its_gpu():
    driver, gpus = parse("default-table-8x-v100-sxm2-inforom-corrupted-460.32.03.txt")
    assert driver.version == "460.32.03"
    assert len(gpus) == 8
    assert [g.pcie.bus_id for g in gpus] == [f"000{d}:00:00.0" for d in range(1, 9)]
    assert {g.name for g in gpus} == {"Tesla V100-SXM2..."}
    assert {g.unavailable["name"] for g in gpus} == {TRUNCATED_NAME}
    assert "infoROM is corrupted" in gpus[7].unavailable["inforom"]
    assert not any("inforom" in g.unavailable for g in gpus[:7])
    assert {g.power.enforced_limit_w for g in gpus} == {300.0}
    assert {g.persistence_mode for g in gpus} == {False}


def test_err_fan_table_keeps_what_is_readable():
    driver, (gpu,) = parse("default-table-err-fan-525.125.06.txt")
    assert (driver.version, driver.cuda_version) == ("525.125.06", "12.0")
    assert gpu.unavailable["thermal.fan_pct"] == "nvidia-smi printed ERR!" and gpu.thermal.fan_pct == [None]
    assert (gpu.thermal.gpu_c, gpu.pstate) == (38.0, 5)
    assert (gpu.power.draw_w, gpu.power.enforced_limit_w) == (49.0, 450.0)
    assert (gpu.memory_used_mib, gpu.memory_total_mib) == (2021, 23028)
    assert gpu.compute_mode == "Exclusive_Process"  # "E. Process"
    assert (gpu.name, gpu.unavailable["name"]) == ("NVIDIA GeForce ...", TRUNCATED_NAME)
    assert gpu.processes is None  # the capture ends before the process table


def test_h100_vm_table_under_load_lists_processes():
    _, (idle,) = parse_smi_table(bundle_section("h100-80gb-hbm3-vm-590.48.01.txt", IDLE_TABLE))
    _, (load,) = parse_smi_table(bundle_section("h100-80gb-hbm3-vm-590.48.01.txt", LOAD_TABLE))
    assert (idle.power.draw_w, load.power.draw_w) == (69.0, 629.0)
    assert (idle.utilization_pct, load.utilization_pct) == (0, 100)
    assert idle.processes == []
    assert [(p.pid, p.type, p.name, p.used_memory_mib) for p in load.processes] == [
        (11327, "C", "/root/tools/memhog", 2566),
        (11328, "C", "/root/tools/memhog", 1542),
        (11345, "C", "./gpu_burn", 15690),
    ]


def test_standalone_table_equals_its_bundle_section():
    from_file = parse("default-table-h100-vm-590.48.01.txt")
    from_bundle = parse_smi_table(bundle_section("h100-80gb-hbm3-vm-590.48.01.txt", IDLE_TABLE))
    assert from_file == from_bundle
    assert from_file[1][0].pcie.bus_id == "0000:00:09.0"


def test_h200_mig_devices_and_instance_processes():
    _, (gpu,) = parse_smi_table(bundle_section("h200-mig-vm-590.48.01.txt", LOAD_TABLE))
    assert gpu.mig_enabled is True
    assert gpu.ecc.enabled is True  # "On": counts are per MIG device
    assert gpu.ecc.volatile_uncorrected is None
    assert gpu.utilization_pct is None  # "N/A" in MIG mode
    assert [(m.gpu_instance_id, m.compute_instance_id, m.index, m.sm_count, m.memory_total_mib)
            for m in gpu.mig_devices] == [
        (2, 0, 0, 16, 71424), (2, 1, 1, 32, 71424), (3, 0, 2, 32, 33280), (9, 0, 3, 16, 16384), (10, 0, 4, 16, 16384),
    ]
    assert gpu.mig_devices[0].memory_used_mib == 16925
    assert [p.used_memory_mib for p in gpu.processes] == [2194, 1170, 13526]


def test_kmd_version_header_of_610_drivers():
    driver, (gpu,) = parse_smi_table(bundle_section("rtx-2080-super-610.57.04.txt", IDLE_TABLE))
    assert (driver.version, driver.cuda_version) == ("610.57.04", "13.3")  # "CUDA UMD Version"
    assert gpu.name == "NVIDIA GeForce RTX 2080 ..."
    assert gpu.ecc.enabled is None and "ecc.enabled" in gpu.unavailable  # "N/A" on GeForce


def test_windows_wddm_table():
    driver, (gpu,) = parse_smi_table(bundle_section("rtx-2080-super-windows-591.86.txt", IDLE_TABLE))
    assert driver.version == "591.86"
    assert gpu.driver_model == "WDDM"
    assert gpu.persistence_mode is None
    assert len(gpu.processes) == 10
    assert {p.type for p in gpu.processes} == {"C+G"}
    assert {p.used_memory_mib for p in gpu.processes} == {None}  # WDDM: "N/A"
    assert gpu.processes[8].name == "...m Files\\NZXT CAM\\NZXT CAM.exe"  # spaces inside the name


def test_nvml_error_is_not_a_table():
    text = (TEXT / "error-nvml-driver-library-mismatch.txt").read_text()
    assert not looks_like_smi_table(text)
    with pytest.raises(CaptureError, match="Driver/library version mismatch"):
        parse_smi_table(text)


def test_dmon_samples():
    samples = parse_dmon((TEXT / "dmon-h100-vm-idle-590.48.01.txt").read_text())
    assert len(samples) == 5
    assert samples[0] == {
        "gpu": 0, "pwr": 69, "gtemp": 41, "mtemp": 47, "sm": 0, "mem": 0,
        "enc": 0, "dec": 0, "jpg": 0, "ofa": 0, "mclk": 2619, "pclk": 345,
    }
    assert [s["mtemp"] for s in samples] == [47, 47, 47, 48, 47]


def test_dmon_dash_means_not_reported():
    section = bundle_section("h200-mig-vm-590.48.01.txt", "idle :: dmon (per-device monitor, incl. PCIe rx/tx)")
    assert looks_like_dmon(section)
    samples = parse_dmon(section)
    assert samples[0]["sm"] is None and samples[0]["pwr"] == 78


def test_pmon_is_not_dmon():
    section = bundle_section("h100-80gb-hbm3-vm-590.48.01.txt", "load :: pmon (per-process monitor)")
    assert section.lstrip().startswith("# gpu")
    assert not looks_like_dmon(section)


def test_dmon_without_header_is_refused():
    with pytest.raises(CaptureError, match="# gpu"):
        parse_dmon("    0     69     41\n")


def fixture_files():
    return sorted(p for p in FIXTURES.rglob("*") if p.is_file())


@pytest.mark.parametrize("path", fixture_files(), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_looks_like_claims_only_its_own_kind(path):
    text = path.read_text(errors="replace")
    assert looks_like_smi_table(text) == path.name.startswith("default-table-")
    assert looks_like_dmon(text) == path.name.startswith("dmon-")

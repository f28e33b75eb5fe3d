"""`nvidia-smi -q -x` and `nvidia-smi -q` -> facts, checked against values a reader can find in the captures."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuvet.probe import smi_csv, smi_text, smi_xml
from gpuvet.probe.capture import read_captures
from gpuvet.probe.errors import CaptureError

FIXTURES = Path(__file__).parent / "fixtures"


def xml(name: str):
    return smi_xml.parse_smi_xml((FIXTURES / "smi_xml" / name).read_text())


def text(name: str):
    return smi_text.parse_smi_text((FIXTURES / "smi_text" / name).read_text())


@pytest.mark.parametrize("path", sorted((FIXTURES / "smi_xml").glob("*.xml")), ids=lambda p: p.name)
def test_every_xml_capture_parses_with_named_gpus(path):
    driver, gpus = smi_xml.parse_smi_xml(path.read_text())
    assert gpus and all(g.name for g in gpus)


@pytest.mark.parametrize("path", sorted((FIXTURES / "smi_text").glob("q-*.txt")), ids=lambda p: p.name)
def test_every_q_text_capture_parses(path):
    driver, gpus = smi_text.parse_smi_text(path.read_text())
    assert driver.version and gpus and all(g.pcie.bus_id for g in gpus)


def test_k80_azure_ecc_history_and_application_clocks():
    driver, gpus = xml("tesla-k80-x4-azure-ecc-retired-430.26-v10.xml")
    assert driver.version == "430.26" and driver.cuda_version is None  # the file says 'Not Found'
    assert [g.name for g in gpus] == ["Tesla K80"] * 4
    first = gpus[0]
    assert first.pcie.bus_id == "1580:00:00.0"
    assert first.ecc.enabled is True
    assert first.ecc.aggregate_corrected == 7 and first.ecc.aggregate_uncorrected == 7
    assert first.ecc.retired_pages_sbe == 1 and first.ecc.retired_pages_dbe == 1
    assert first.clocks.event_reasons == ["applications_clocks_setting"]
    assert first.virtualization_mode == "passthrough"
    assert [p.name for p in first.processes] == ["python"] and first.processes[0].used_memory_mib == 576


def test_a100_mig_instances_and_new_power_block():
    _, (gpu,) = xml("a100-sxm4-80gb-mig-4x1g-535.54.03-v12.xml")
    assert gpu.mig_enabled is True
    assert [(m.gpu_instance_id, m.sm_count, m.memory_total_mib) for m in gpu.mig_devices] == [
        (3, 14, 19968), (4, 14, 19968), (5, 14, 19968), (6, 14, 19968)]
    assert gpu.power.enforced_limit_w == 500.0 and gpu.power.default_limit_w == 500.0


def test_mining_rig_links_run_at_x1():
    _, gpus = xml("gtx-1070-x6-riser-pcie-x1-384.66-v9.xml")
    assert len(gpus) == 6
    assert {(r.current_width, r.max_width) for g in gpus for r in g.pcie.readings} == {(1, 16)}


def test_a10g_idle_link_and_passthrough():
    _, (gpu,) = xml("a10g-aws-passthrough-515.105.01-v11.xml")
    (link,) = gpu.pcie.readings
    assert (link.current_gen, link.max_gen, link.current_width, link.max_width) == (1, 4, 8, 16)
    assert gpu.clocks.event_reasons == ["gpu_idle"] and gpu.pstate == 8


def test_rtx3090_sw_power_cap_flag_while_idle():
    _, (gpu,) = xml("rtx-3090-swpowercap-590.44.01-v13.xml")
    assert gpu.clocks.event_reasons == ["sw_power_cap"]
    assert gpu.pstate == 8


def test_minimal_and_trimmed_xml_keep_what_is_there():
    _, (gt730,) = xml("gt-730-legacy-minimal-384.111-v9.xml")
    assert gt730.name == "GeForce GT 730" and gt730.power.enforced_limit_w is None
    driver, (ti,) = xml("gtx-1070-ti-trimmed-v10.xml")
    assert ti.name == "GeForce GTX 1070 Ti" and driver.version is None


def test_windows_raised_power_limit_is_read():
    _, (gpu,) = xml("rtx-3080-windows-wddm-536.40-v12.xml")
    assert gpu.power.enforced_limit_w == 336.0 and gpu.power.default_limit_w == 320.0


def test_h100_load_capture_has_the_load():
    _, (gpu,) = text("q-h100-80gb-hbm3-vm-590.48.01-load.txt")
    assert gpu.utilization_pct == 100 and gpu.power.draw_w == 629.45
    assert gpu.thermal.gpu_c == 59 and gpu.thermal.slowdown_margin_c == 28  # T.Limit 26 C, slowdown at -2 C
    assert "/root/tools/memhog" in [p.name for p in gpu.processes]
    assert gpu.pcie.replay_count == 9


def test_h200_mig_devices_from_text():
    _, (gpu,) = text("q-h200-mig-vm-590.48.01-idle.txt")
    assert gpu.mig_enabled is True and len(gpu.mig_devices) == 5
    assert gpu.mig_devices[0].sm_count == 16 and gpu.mig_devices[0].memory_total_mib == 71424


def test_driver_610_power_limits_moved_under_ceiling_block():
    driver, (gpu,) = text("q-rtx-2080-super-610.57.04-idle.txt")
    assert driver.version == "610.57.04" and driver.cuda_version == "13.3"
    assert gpu.power.enforced_limit_w == 250.0 and gpu.power.max_limit_w == 350.0


def test_old_text_report_without_nvidia_prefix_and_single_bit_totals():
    driver, gpus = text("q-4x-v100-pcie-16gb-azure-ncv3-460.32.03.txt")
    assert [g.name for g in gpus] == ["Tesla V100-PCIE-16GB"] * 4
    assert gpus[0].ecc.volatile_corrected == 0 and gpus[0].ecc.retired_pages_pending is False


def test_h100_swpowercap_capture_shows_thermal_and_power_brake_on_gpu2():
    _, gpus = text("q-8x-h100-sxm-vm-swpowercap-535.183.01.txt")
    assert set(gpus[2].clocks.event_reasons) >= {"hw_power_brake_slowdown", "sw_thermal_slowdown"}


def test_text_and_csv_of_the_same_machine_agree():
    """Two backends, one machine (the L40S bundle's idle -q and its --query-gpu CSV)."""
    _, (from_text,) = text("q-l40s-vm-595.80-idle.txt")
    _, (from_csv,) = smi_csv.parse_smi_csv((FIXTURES / "smi_csv" / "l40s-vm-595.80-idle.csv").read_text())
    for field in ("name", "uuid", "vbios", "memory_total_mib", "pstate", "utilization_pct"):
        assert getattr(from_text, field) == getattr(from_csv, field), field
    assert from_text.power.enforced_limit_w == from_csv.power.enforced_limit_w == 350.0
    assert from_text.power.default_limit_w == from_csv.power.default_limit_w
    assert from_text.ecc.enabled == from_csv.ecc.enabled is True
    link_t, link_c = from_text.pcie.readings[0], from_csv.pcie.readings[0]
    assert (link_t.max_gen, link_t.max_width) == (link_c.max_gen, link_c.max_width) == (4, 16)


def test_xml_that_is_not_smi_is_refused():
    with pytest.raises(CaptureError, match="nvidia_smi_log"):
        smi_xml.parse_smi_xml("<?xml version='1.0'?><svg></svg>")


def test_truncated_xml_says_so(tmp_path):
    cut = (FIXTURES / "smi_xml" / "rtx-3080-595.58.03-v13.xml").read_text()[:3000]
    path = tmp_path / "rtx-3080-truncated-copy.xml"
    path.write_text(cut)
    with pytest.raises(CaptureError, match="truncated nvidia-smi -q -x output: 1 GPU attached, 1 begun"):
        read_captures(str(path))

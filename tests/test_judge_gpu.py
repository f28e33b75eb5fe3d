"""GPU rules on real captures, and on variants made by editing one fact of a real capture
(each such test says which fact it edits)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from gpuvet.facts import Machine
from gpuvet.judge import judge
from gpuvet.judge.common import Context
from gpuvet.judge.gpu_identity import check_model, matches_expectation
from gpuvet.probe import capture

FIXTURES = Path(__file__).parent / "fixtures"


def machine_from(*names: str) -> Machine:
    captures = []
    for name in names:
        captures += capture.read_captures(str(FIXTURES / name))
    return capture.merge(captures)


def results(machine: Machine, check: str, **options) -> dict[str, object]:
    return {f.subject: f for f in judge(machine, options=options) if f.check == check}


RTX4090_IDLE = "smi_text/q-8x-rtx4090-all-idle-535.154.05.txt"
H100_LOAD = "smi_text/q-h100-80gb-hbm3-vm-590.48.01-load.txt"
H100_IDLE = "smi_text/q-h100-80gb-hbm3-vm-590.48.01-idle.txt"


# -- gpu.power_limit --------------------------------------------------------------------------

def test_power_limit_at_default_passes():
    found = results(machine_from(RTX4090_IDLE), "gpu.power_limit")
    assert {f.status for f in found.values()} == {"pass"}
    assert "450 W" in found["gpu0"].summary


@pytest.mark.parametrize("edited_limit, status", [(300.0, "fail"), (360.0, "fail"), (400.0, "warn"), (445.0, "pass")])
def test_power_cap_edited_on_one_gpu(edited_limit, status):
    machine = machine_from(RTX4090_IDLE)
    machine.gpus[3].power.enforced_limit_w = edited_limit  # edited: the real capture says 450 W
    f = results(machine, "gpu.power_limit")["gpu3"]
    assert f.status == status
    if status != "pass":
        assert f"{100 * edited_limit / 450:.0f}% of the 450 W default" in f.summary
        assert "nvidia-smi -i 3 -pl 450" in f.remedy
        assert "settable 150-450 W" in f.evidence.expected  # the capture's min/max limits


def test_power_limit_falls_back_to_reference_default_when_the_gpu_hides_it():
    machine = machine_from(RTX4090_IDLE)
    machine.gpus[0].power.default_limit_w = None  # edited: as a vGPU guest would report it
    machine.gpus[0].power.enforced_limit_w = 300.0
    f = results(machine, "gpu.power_limit")["gpu0"]
    assert f.status == "fail" and "RTX-4090" in f.evidence.source and "power_default_w" in f.evidence.source


def test_power_limit_unknown_is_a_skip_with_reason():
    machine = machine_from("smi_xml/gtx-1050-laptop-x8-515.65.01-nodoctype.xml")
    f = results(machine, "gpu.power_limit")["gpu0"]
    assert f.status == "skip" and "not available" in f.summary


# -- gpu.pcie_link ----------------------------------------------------------------------------

def test_idle_generation_drop_does_not_fail_and_says_to_read_under_load():
    found = results(machine_from(RTX4090_IDLE), "gpu.pcie_link")
    f = found["gpu0"]
    assert f.status == "pass"
    assert "idle" in f.summary and "under load" in f.summary
    assert "under load" in f.remedy


def test_x8_of_x16_is_a_warning_with_bandwidth():
    f = results(machine_from("smi_xml/a10g-aws-passthrough-515.105.01-v11.xml"), "gpu.pcie_link")["gpu0"]
    assert f.status == "warn" and "x8 of x16" in f.summary


def test_x1_riser_fails():
    found = results(machine_from("smi_xml/gtx-1070-x6-riser-pcie-x1-384.66-v9.xml"), "gpu.pcie_link")
    assert {f.status for f in found.values()} == {"fail"}
    assert "x1 of x16" in found["gpu0"].summary


def test_full_link_under_load_passes():
    f = results(machine_from(H100_LOAD), "gpu.pcie_link")["gpu0"]
    assert f.status == "pass" and "Gen5 x16" in f.summary and "under load" in f.summary


def test_generation_drop_under_load_is_judged():
    machine = machine_from(H100_LOAD)
    machine.gpus[0].pcie.readings[0].current_gen = 3  # edited: the load capture says Gen5
    f = results(machine, "gpu.pcie_link")["gpu0"]
    assert f.status == "fail" and "Gen3 under load on a Gen5 link" in f.summary


def test_bundle_judges_the_link_read_during_its_load_section():
    f = results(machine_from("bundles/rtx-4080-super-595.71.05.txt"), "gpu.pcie_link")["gpu0"]
    assert "under load" in f.evidence.measured


def test_width_drop_read_at_idle_counts_bandwidth_at_the_links_max_generation():
    # Real capture: Gen1 x8 at idle on a Gen4 x16 link; the lanes matter at Gen4, not at the idle Gen1.
    f = results(machine_from("smi_xml/a10g-aws-passthrough-515.105.01-v11.xml"), "gpu.pcie_link")["gpu0"]
    assert "~16 GB/s instead of ~32 GB/s at Gen4" in f.summary


def test_busy_reading_on_a_gpu_with_no_context_is_not_a_link_under_load():
    f = results(machine_from("smi_text/q-l40s-vm-595.80-idle.txt"), "gpu.pcie_link")["gpu0"]
    assert "under load" not in f.evidence.measured and "(load unknown)" in f.evidence.measured


def test_link_missing_from_a_topology_capture_says_not_in_the_capture():
    f = results(machine_from("topo/dgx1-8gpu-topo-mp-pcie-only.txt"), "gpu.pcie_link")["gpu0"]
    assert f.status == "skip" and "not in the capture" in f.summary and "vGPU" not in f.summary
    assert "nvidia-smi -q -x" in f.remedy


def test_lspci_link_alone_is_judged_with_idle_caveat():
    f = results(machine_from("lspci/lspci-vvv-rtx6000ada-idle-gen1-downgraded-spaces.txt"), "gpu.pcie_link")["gpu0"]
    assert f.status == "pass" and "Gen1" in f.summary and "(lspci)" in f.evidence.measured


# -- gpu.isolation ----------------------------------------------------------------------------

def test_bare_metal_idle_gpu_is_whole_and_free():
    f = results(machine_from(H100_IDLE), "gpu.isolation")["gpu0"]
    assert f.status == "pass" and "passed through" in f.summary


def test_processes_already_running_are_named():
    f = results(machine_from(H100_LOAD), "gpu.isolation")["gpu0"]
    assert f.status == "warn" and "memhog" in f.summary


def test_memory_and_load_nobody_accounts_for_fail():
    # Real capture: 9.2 GiB used at 65% utilisation and an empty process list.
    f = results(machine_from("smi_xml/rtx-3080-595.58.03-v13.xml"), "gpu.isolation")["gpu0"]
    assert f.status == "fail" and "cannot see" in f.summary


def test_an_exclusive_compute_mode_warns_that_a_second_process_is_refused():
    # Real capture: plain `nvidia-smi` table showing "E. Process" in the compute mode column.
    f = results(machine_from("smi_text/default-table-err-fan-525.125.06.txt"), "gpu.isolation")["gpu0"]
    assert f.status == "warn" and f.summary.startswith("compute mode Exclusive_Process: one process at a time")
    assert "compute mode Exclusive_Process" in f.evidence.measured
    assert "`sudo nvidia-smi -i 0 -c DEFAULT`" in f.remedy


def test_a_prohibited_compute_mode_fails():
    m = machine_from(H100_IDLE)
    m.gpus[0].compute_mode = "Prohibited"  # edited from the real idle capture
    f = results(m, "gpu.isolation")["gpu0"]
    assert f.status == "fail" and "no process may run CUDA on this GPU" in f.summary
    assert f.remedy.startswith("`sudo nvidia-smi -i 0 -c DEFAULT`")


@pytest.mark.parametrize("name", ["topo/dgx1-8gpu-topo-mp-pcie-only.txt", "lspci/lspci-nn-a10-kvm.txt",
                                  "smi_text/q-d-page-retirement-8gpu-azure-535.86.10.txt"])
def test_capture_without_occupancy_skips_isolation_saying_what_to_capture(name):
    found = results(machine_from(name), "gpu.isolation")
    assert {f.status for f in found.values()} == {"skip"}
    assert "does not report memory use, utilization or processes; capture `nvidia-smi -q -x`" in found["gpu0"].summary


def test_utilization_alone_is_not_enough_to_call_a_gpu_free():
    # A dmon is a loop: its 0% is a moment of a watched job, and no memory or process column says more.
    f = results(machine_from("smi_text/dmon-h100-vm-idle-590.48.01.txt"), "gpu.isolation")["gpu0"]
    assert f.status == "skip" and "cannot tell whether anyone else holds this GPU" in f.summary


def test_busy_reading_with_no_memory_in_use_is_the_driver_waking_the_gpu_not_a_co_tenant():
    # Real capture: idle L40S, persistence mode off, 0 MiB used, no process, utilization 100%.
    f = results(machine_from("smi_text/q-l40s-vm-595.80-idle.txt"), "gpu.isolation")["gpu0"]
    assert f.status == "warn" and "busy reading with no memory in use" in f.summary
    assert "persistence mode off" in f.summary and "shares this GPU" not in f.summary
    assert "nvidia-smi -pm 1" in f.remedy and "-d UTILIZATION" in f.remedy


def test_busy_gpu_with_memory_nobody_accounts_for_still_fails():
    machine = machine_from("smi_text/q-l40s-vm-595.80-idle.txt")
    machine.gpus[0].memory_used_mib = 9000  # edited: the capture says 0 MiB
    f = results(machine, "gpu.isolation")["gpu0"]
    assert f.status == "fail" and "another user, container or VM shares this GPU" in f.summary


def test_mig_slice_is_a_warning():
    f = results(machine_from("smi_xml/a100-sxm4-80gb-mig-4x1g-535.54.03-v12.xml"), "gpu.isolation")["gpu0"]
    assert f.status == "warn" and "MIG" in f.summary and "4 instances of 14 SMs" in f.summary


def test_vgpu_guest_is_a_warning():
    machine = machine_from(H100_IDLE)
    machine.gpus[0].virtualization_mode = "vgpu"  # edited: the capture says Pass-Through
    f = results(machine, "gpu.isolation")["gpu0"]
    assert f.status == "warn" and "vGPU" in f.summary


@pytest.mark.parametrize("driver", ["vfio-pci", "nouveau"])
def test_gpu_bound_to_another_kernel_driver_fails(driver):
    machine = machine_from("lspci/lspci-vvv-rtx6000ada-idle-gen1-downgraded-spaces.txt")
    machine.gpus[0].pcie.kernel_driver = driver  # edited: lspci says nvidia
    f = results(machine, "gpu.isolation")["gpu0"]
    assert f.status == "fail" and driver in f.summary


# -- gpu.ecc ----------------------------------------------------------------------------------

def test_k80_lifetime_errors_warn():
    found = results(machine_from("smi_xml/tesla-k80-x4-azure-ecc-retired-430.26-v10.xml"), "gpu.ecc")
    assert found["gpu0"].status == "warn" and "7 uncorrectable errors over the GPU's lifetime" in found["gpu0"].summary
    assert found["gpu2"].status == "pass"


@pytest.mark.parametrize(
    "field, value, words",
    [("volatile_uncorrected", 2, "2 uncorrectable memory errors since the last reset"),
     ("remapped_rows_pending", True, "row remap is pending"),
     ("remapped_rows_failure", True, "row remapping failed")],
)
def test_ecc_faults_fail(field, value, words):
    machine = machine_from(H100_IDLE)
    setattr(machine.gpus[0].ecc, field, value)  # edited: the capture shows 0 / No
    f = results(machine, "gpu.ecc")["gpu0"]
    assert f.status == "fail" and words in f.summary and "nvidia-smi -r -i 0" in f.remedy


def test_ecc_absent_on_geforce_is_a_skip_and_off_on_workstation_is_fine():
    assert results(machine_from(RTX4090_IDLE), "gpu.ecc")["gpu0"].status in ("pass", "skip")
    f = results(machine_from("smi_xml/dual-rtx-a5000-590.44.01-v13.xml"), "gpu.ecc")["gpu0"]
    assert f.status == "pass" and "optional" in f.summary
    f = results(machine_from("smi_xml/rtx-3080-595.58.03-v13.xml"), "gpu.ecc")["gpu0"]
    assert f.status == "skip"


def test_ecc_off_on_a_datacenter_gpu_warns():
    machine = machine_from(H100_IDLE)
    machine.gpus[0].ecc.enabled = False  # edited: the capture says Enabled
    f = results(machine, "gpu.ecc")["gpu0"]
    assert f.status == "warn" and "-e 1" in f.remedy


# -- gpu.throttle / gpu.temperature -----------------------------------------------------------

def test_thermal_and_power_brake_slowdown_fail():
    found = results(machine_from("smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt"), "gpu.throttle")
    assert found["gpu2"].status == "fail" and "power brake" in found["gpu2"].summary
    assert found["gpu0"].status == "pass"


def test_sw_power_cap_while_idle_is_not_a_fault():
    f = results(machine_from("smi_xml/rtx-3090-swpowercap-590.44.01-v13.xml"), "gpu.throttle")["gpu0"]
    assert f.status == "pass" and "idle" in f.summary


def test_application_clocks_at_their_default_are_not_a_hold():
    # The K80 flags applications_clocks_setting with application clocks at the default: 562 = 562 MHz.
    f = results(machine_from("smi_xml/tesla-k80-x4-azure-ecc-retired-430.26-v10.xml"), "gpu.throttle")["gpu0"]
    assert f.status == "pass" and "at the board's default (562 MHz)" in f.summary


def test_application_clocks_set_below_default_warn_with_reset_command():
    machine = machine_from("smi_xml/tesla-k80-x4-azure-ecc-retired-430.26-v10.xml")
    machine.gpus[0].clocks.applications_graphics_mhz = 324  # edited: the real capture says 562 (= default)
    f = results(machine, "gpu.throttle")["gpu0"]
    assert f.status == "warn" and "nvidia-smi -i 0 -rac" in f.remedy


@pytest.mark.parametrize("gpu_c, status", [(87.0, "fail"), (82.0, "warn"), (60.0, "pass")])
def test_temperature_against_slowdown_threshold(gpu_c, status):
    machine = machine_from("smi_text/q-8x-a100-sxm4-40gb-azure-ndv4-460.32.03.txt")  # slowdown at 89 C
    gpu = machine.gpus[0]
    gpu.thermal.gpu_c, gpu.thermal.slowdown_margin_c = gpu_c, 89.0 - gpu_c  # edited: the capture says 41 C
    assert results(machine, "gpu.temperature")["gpu0"].status == status


# -- gpu.nvlink -------------------------------------------------------------------------------

def test_inactive_nvlinks_fail_naming_the_links():
    found = results(machine_from("smi_text/nvlink-status-8x-v100-sxm2-some-inactive.txt"), "gpu.nvlink")
    assert found["gpu3"].status == "fail" and "links 3, 5 inactive" in found["gpu3"].summary
    assert found["gpu0"].status == "pass" and "6 NVLinks active" in found["gpu0"].summary


def test_topology_alone_judges_nvlink():
    found = results(machine_from("topo/dgx-a100-8gpu-nv12-12nics-topo-m.txt"), "gpu.nvlink")
    assert len(found) == 8 and {f.status for f in found.values()} == {"pass"}
    assert "NVLink to 7 of 7 other GPUs (12 links)" in found["gpu0"].summary  # NV12 to each peer: 12 links via NVSwitch


def test_topology_with_a_weaker_gpu_fails_it():
    machine = machine_from("topo/dgx-a100-8gpu-nv12-12nics-topo-m.txt")
    links = machine.topology.links
    links["GPU5"]["GPU6"] = links["GPU6"]["GPU5"] = "NV11"  # edited: one link of the pair down
    found = results(machine, "gpu.nvlink")
    assert found["gpu5"].status == "fail" and found["gpu6"].status == "fail" and found["gpu0"].status == "pass"
    assert "GPU6 NV11, where NV12 is usual" in found["gpu5"].summary


def test_pcie_only_topology_without_model_warns_and_topo_mp_skips():
    found = results(machine_from("topo/asus-esc8000a-4x-rtx6000ada-node-sys-nics-spaces.txt"), "gpu.nvlink")
    assert found["gpu0"].status == "warn" and "PCIe" in found["gpu0"].summary
    found = results(machine_from("topo/dgx1-8gpu-topo-mp-pcie-only.txt"), "gpu.nvlink")
    assert found["gpu0"].status == "skip" and "-mp" in found["gpu0"].summary


def test_sxm_model_with_all_links_inactive_fails():
    f = results(machine_from("smi_text/nvlink-status-a100-all-links-inactive.txt"), "gpu.nvlink")["gpu6"]
    assert f.status == "fail" and "built with NVLink" in f.summary


def test_model_without_nvlink_is_measured_pcie_only_with_its_source():
    f = results(machine_from(RTX4090_IDLE), "gpu.nvlink")["gpu0"]  # 8 GPUs
    assert f.status == "measured" and f.summary.startswith("PCIe only: NVIDIA GeForce RTX 4090 has no NVLink")
    assert f.evidence.measured == "8 GPUs, no NVLink on the model" and "column nvlink_gen" in (f.evidence.source or "")


def test_one_gpu_skips_nvlink_as_not_in_play():
    (f,) = results(machine_from("lspci/lspci-vvv-rtx6000ada-idle-gen1-downgraded-spaces.txt"), "gpu.nvlink").values()
    assert f.status == "skip" and f.summary == "one GPU: NVLink not in play, nothing to link it to"


# -- gpu.model / gpu.uniform ------------------------------------------------------------------

def test_model_matches_reference_and_expectation():
    machine = machine_from("smi_xml/a100-sxm4-80gb-mig-4x1g-535.54.03-v12.xml")
    f = results(machine, "gpu.model")["gpu0"]
    assert f.status == "pass" and "A100-SXM4-80GB" in f.summary
    assert results(machine, "gpu.model", expect="A100 80GB")["gpu0"].status == "pass"
    wrong = results(machine_from("smi_xml/a10g-aws-passthrough-515.105.01-v11.xml"), "gpu.model", expect="A100 80GB")["gpu0"]
    assert wrong.status == "fail" and "A10G" in wrong.summary


@pytest.mark.parametrize(
    "expect, name, memory_mib, ok",
    [
        ("RTX 4090", "NVIDIA GeForce RTX 4090", 24564, True),
        ("rtx4090", "NVIDIA GeForce RTX 4090", 24564, True),
        ("RTX 4090", "NVIDIA GeForce RTX 4090 D", 24564, False),
        ("H100 80GB", "NVIDIA H100 PCIe", 81559, True),
        ("H100 SXM", "NVIDIA H100 PCIe", 81559, False),
        ("A100 40GB", "NVIDIA A100-SXM4-80GB", 81920, False),
        ("NVIDIA A100", "A100-SXM4-40GB", 40536, True),
        ("L40S", "NVIDIA L40", 46068, False),
    ],
)
def test_expectation_matching(expect, name, memory_mib, ok):
    machine = machine_from(H100_IDLE)
    gpu = machine.gpus[0]
    gpu.name, gpu.memory_total_mib = name, memory_mib  # edited: name and memory under test
    assert matches_expectation(expect, gpu) is ok


def test_old_driver_name_without_prefix_still_finds_its_reference():
    machine = machine_from("smi_text/q-8x-a100-sxm4-40gb-azure-ndv4-460.32.03.txt")
    judge(machine)
    from gpuvet.judge import annotate_references

    annotate_references(machine)
    assert machine.gpus[0].name == "A100-SXM4-40GB" and machine.gpus[0].reference == "A100-SXM4-40GB"


def test_name_cut_off_by_the_table_is_not_judged_as_a_real_name():
    machine = machine_from("smi_text/default-table-err-fan-525.125.06.txt")  # "NVIDIA GeForce ..."
    f = results(machine, "gpu.model")["gpu0"]
    assert f.status == "skip" and "cut the name off" in f.summary and "NVIDIA GeForce RTX 4090" in f.summary
    assert "nvidia-smi --query-gpu=name" in f.remedy
    assert Context(machine).ref(machine.gpus[0]) is None  # model-specific checks get no figures


@pytest.mark.parametrize("expect, status", [("RTX 4090", "skip"), ("rtx 3090 24GB", "skip"), ("A10G", "fail"), ("H100", "fail")])
def test_expectation_on_a_cut_off_name_fails_only_when_what_it_shows_contradicts(expect, status):
    f = results(machine_from("smi_text/default-table-err-fan-525.125.06.txt"), "gpu.model", expect=expect)["gpu0"]
    assert f.status == status
    assert "nvidia-smi --query-gpu=name" in f.remedy


def test_cut_off_name_with_a_single_fitting_reference_is_taken_as_it():
    machine = machine_from("smi_text/default-table-8x-v100-sxm2-inforom-corrupted-460.32.03.txt")  # "Tesla V100-SXM2...", 32510 MiB
    f = results(machine, "gpu.model")["gpu0"]
    assert f.status == "pass" and "taken as Tesla V100-SXM2-32GB" in f.summary
    assert results(machine, "gpu.model", expect="A100")["gpu0"].status == "fail"
    assert results(machine, "gpu.model", expect="V100 16GB")["gpu0"].status == "fail"
    assert results(machine, "gpu.model", expect="V100")["gpu0"].status == "skip"


def test_live_run_without_a_visible_gpu_warns_and_a_capture_skips():
    machine = Machine(source="live", gpu_error="no NVIDIA driver: the NVML library (libnvidia-ml.so.1) is not installed")
    (f,) = check_model(Context(machine))
    assert f.status == "warn" and f.summary.startswith("no NVIDIA GPU visible: no NVIDIA driver")
    for command in ("`nvidia-smi`", "`lsmod | grep nvidia`", "`lspci | grep -i nvidia`"):
        assert command in f.remedy
    (f,) = check_model(Context(Machine(source="capture")))
    assert f.status == "skip"
    (f,) = check_model(Context(machine, options={"device": "cpu"}))
    assert f.status == "skip"


def test_graphics_device_name_warns():
    f = results(machine_from("smi_xml/gtx-1660-ti-graphics-device-418.43.xml"), "gpu.model")["gpu0"]
    assert f.status == "warn" and "Graphics Device" in f.summary


def test_uniform_fleet_passes_and_mixed_fleet_fails():
    assert results(machine_from(RTX4090_IDLE), "gpu.uniform")["machine"].status == "pass"
    machine = machine_from(RTX4090_IDLE)
    machine.gpus[5] = copy.deepcopy(machine.gpus[5])
    machine.gpus[5].name = "NVIDIA GeForce RTX 4090 D"  # edited: one GPU of another model
    f = results(machine, "gpu.uniform")["machine"]
    assert f.status == "fail" and "gpu5 NVIDIA GeForce RTX 4090 D" in f.summary


def test_vbios_difference_warns():
    f = results(machine_from("smi_xml/tesla-k80-x4-azure-ecc-retired-430.26-v10.xml"), "gpu.uniform")["machine"]
    assert f.status == "warn" and "VBIOS" in f.summary


def test_a_few_mib_of_memory_difference_is_not_a_difference():
    # Real capture: GTX 1070s with 8112 and 8114 MiB; their max links differ for real.
    f = results(machine_from("smi_xml/gtx-1070-x6-riser-pcie-x1-384.66-v9.xml"), "gpu.uniform")["machine"]
    assert "memory" not in f.summary and "max PCIe link" in f.summary
    machine = machine_from(RTX4090_IDLE)
    machine.gpus[2].memory_total_mib = 20000  # edited: the capture says 24564 MiB
    f = results(machine, "gpu.uniform")["machine"]
    assert f.status == "warn" and "memory gpu2 20000 MiB (others 24564 MiB)" in f.summary


def test_power_limit_difference_between_gpus_is_named():
    machine = machine_from(RTX4090_IDLE)
    machine.gpus[7].power.enforced_limit_w = 300.0  # edited
    f = results(machine, "gpu.uniform")["machine"]
    assert f.status == "warn" and "power limit gpu7 300 W (others 450 W)" in f.summary

"""What nvidia-smi flags beside the numbers (a corrupt infoROM, a fan it cannot read), and passes
that claim only what the capture holds: ECC mode, the facts gpu.uniform compared, a PCIe link
whose maximum is unknown, memory a desktop session holds."""

from __future__ import annotations

from pathlib import Path

from gpuvet.facts import Machine
from gpuvet.judge import judge
from gpuvet.probe import capture

FIXTURES = Path(__file__).parent / "fixtures"


def machine_from(*names: str) -> Machine:
    return capture.merge([c for name in names for c in capture.read_captures(str(FIXTURES / name))])


def results(machine: Machine, check: str) -> dict[str, object]:
    return {f.subject: f for f in judge(machine) if f.check == check}


def test_corrupted_inforom_warns_in_gpu_ecc_with_the_command_to_confirm():
    # The table ends with "WARNING: infoROM is corrupted at gpu 0008:00:00.0": GPU 7.
    found = results(machine_from("smi_text/default-table-8x-v100-sxm2-inforom-corrupted-460.32.03.txt"), "gpu.ecc")
    f = found["gpu7"]
    assert f.status == "warn" and f.summary.startswith("infoROM corrupted")
    assert "0008:00:00.0" in f.evidence.measured
    assert "nvidia-smi -q -i 7" in f.remedy and "provider" in f.remedy
    assert {found[f"gpu{i}"].status for i in range(7)} == {"pass"}


def test_fan_err_fails_gpu_fan_failure_with_the_command_to_confirm():
    machine = machine_from("smi_text/default-table-err-fan-525.125.06.txt")
    f = results(machine, "gpu.fan_failure")["gpu0"]
    assert f.status == "fail" and "ERR!" in f.summary
    assert "--query-gpu=fan.speed" in f.remedy and "provider" in f.remedy
    assert "ERR!" not in results(machine, "gpu.temperature")["gpu0"].summary  # said once, by the fan's check


def test_ecc_pass_does_not_claim_ecc_on_when_the_mode_is_unknown():
    # `nvidia-smi -q -d PAGE_RETIREMENT`: retired-page counts, no ECC mode.
    f = results(machine_from("smi_text/q-d-page-retirement-8gpu-azure-535.86.10.txt"), "gpu.ecc")["gpu0"]
    assert f.status == "pass" and "ECC on" not in f.summary and "ECC mode not in the capture" in f.summary
    assert f.evidence.measured.startswith("ECC unknown")


def test_uniform_names_only_the_facts_it_compared():
    f = results(machine_from("smi_text/default-table-8x-h100-550.90.07.txt"), "gpu.uniform")["machine"]
    assert f.status == "pass" and "link" not in f.summary and "VBIOS" not in f.summary
    assert "same memory, power limit" in f.summary
    assert "not in the facts: max PCIe link, VBIOS" in f.evidence.measured
    full = results(machine_from("smi_text/q-8x-rtx4090-all-idle-535.154.05.txt"), "gpu.uniform")["machine"]
    assert "max PCIe link, VBIOS" in full.summary


def test_pcie_link_with_unknown_maximum_and_no_reference_skips_saying_why():
    f = results(machine_from("smi_xml/gtx-1070-ti-trimmed-v10.xml"), "gpu.pcie_link")["gpu0"]
    assert f.status == "skip" and "maximum is not in the capture" in f.summary and "GTX 1070 Ti" in f.summary
    assert "Gen?" not in f.summary


def test_pcie_link_with_unknown_maximum_uses_the_reference_row():
    machine = machine_from("smi_text/q-8x-rtx4090-all-idle-535.154.05.txt")
    for r in machine.gpus[0].pcie.readings:
        r.max_gen = r.max_width = None  # edited (synthetic): as a trimmed capture without the Max lines
    f = results(machine, "gpu.pcie_link")["gpu0"]
    assert f.status == "pass" and "Gen4" in f.summary and "Gen?" not in f.summary
    assert "row RTX-4090" in f.evidence.source and "(reference)" in f.evidence.measured


def test_desktop_session_memory_is_not_called_a_co_tenant():
    # RTX 4000 SFF workstation with a display: 3.5 GiB used, 1.2 GiB by listed processes (a compositor, a browser).
    f = results(machine_from("smi_xml/rtx-4000-sff-ada-595.84-v13.xml"), "gpu.isolation")["gpu0"]
    assert f.status == "warn" and "desktop session" in f.summary and "cosmic-comp" in f.summary
    assert "another user, container or VM" not in f.summary

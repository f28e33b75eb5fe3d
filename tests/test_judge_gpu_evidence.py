"""Every passing GPU finding shows its evidence: what was measured, what was expected and where
that expectation comes from, so a reader can check a PASS as well as a FAIL."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuvet.judge import judge
from gpuvet.probe import capture

FIXTURES = Path(__file__).parent / "fixtures"

CAPTURES = [
    "smi_text/q-8x-rtx4090-all-idle-535.154.05.txt",
    "smi_text/q-h100-80gb-hbm3-vm-590.48.01-idle.txt",
    "smi_text/q-8x-a100-sxm4-40gb-azure-ndv4-460.32.03.txt",
    "smi_text/nvlink-status-8x-v100-sxm2-some-inactive.txt",
    "smi_text/dmon-h100-vm-idle-590.48.01.txt",
    "smi_xml/v100s-pcie-32gb-x8-vm-loaded-swpowercap-460.73.01-v11.xml",
    "smi_xml/dual-rtx-a5000-590.44.01-v13.xml",
    "topo/dgx-a100-8gpu-nv12-12nics-topo-m.txt",
]


@pytest.mark.parametrize("name", CAPTURES)
def test_every_passing_gpu_finding_has_measured_expected_and_source(name):
    machine = capture.merge(capture.read_captures(str(FIXTURES / name)))
    passes = [f for f in judge(machine) if f.status == "pass" and f.check.startswith("gpu.")]
    assert passes
    incomplete = [f"{f.check} {f.subject}: {f.evidence}" for f in passes
                  if not (f.evidence.measured and f.evidence.expected and f.evidence.source)]
    assert incomplete == []


def test_checks_named_in_the_audit_pass_with_full_evidence():
    machine = capture.merge(capture.read_captures(str(FIXTURES / "smi_text/q-h100-80gb-hbm3-vm-590.48.01-idle.txt")))
    found = {f.check: f for f in judge(machine) if f.subject == "gpu0"}
    assert found["gpu.ecc"].evidence.expected.startswith("0 uncorrectable errors")
    assert "slowdown threshold" in found["gpu.temperature"].evidence.expected
    assert found["gpu.isolation"].status == "pass" and found["gpu.isolation"].evidence.source
    assert found["gpu.throttle"].evidence.source.startswith("NVML clock-event reasons")

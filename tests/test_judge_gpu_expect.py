"""--expect MODEL on real captures: whole-token matching (A10 is not an A100), the reference row's
own words (SXM for "NVIDIA H100 80GB HBM3"), lspci-only captures, and a live run with no GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpuvet.cli import main
from gpuvet.facts import Machine
from gpuvet.judge import judge
from gpuvet.judge.common import Context
from gpuvet.judge.gpu_identity import check_model
from gpuvet.probe import capture

FIXTURES = Path(__file__).parent / "fixtures"
H100_SXM = "smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt"
A100_SXM4 = "smi_text/q-8x-a100-sxm4-40gb-azure-ndv4-460.32.03.txt"
L40S = "smi_text/q-l40s-vm-595.80-idle.txt"
H200 = "smi_text/q-h200-mig-vm-590.48.01-idle.txt"
LSPCI_A100 = "lspci/lspci-nn-azure-8x-a100-sxm4-hyperv.txt"


def model_findings(name: str, expect: str):
    machine = capture.merge(capture.read_captures(str(FIXTURES / name)))
    return [f for f in judge(machine, options={"expect": expect}) if f.check == "gpu.model"]


@pytest.mark.parametrize("name, expect, status", [
    (H100_SXM, "H100 SXM", "pass"),  # NVML says "NVIDIA H100 80GB HBM3"; the reference row is H100-SXM5-80GB
    (H100_SXM, "H100 SXM5 80GB", "pass"),
    (H100_SXM, "H100 80 GB", "pass"),
    (H100_SXM, "H100 PCIe", "fail"),
    (A100_SXM4, "A10", "fail"),
    (A100_SXM4, "A100 SXM", "pass"),
    (L40S, "L4", "fail"),
    (L40S, "L40S", "pass"),
    (H200, "H20", "fail"),
    (H200, "H200 141GB", "pass"),
])
def test_expectation_matches_whole_tokens_and_the_reference_row(name, expect, status):
    found = model_findings(name, expect)
    assert {f.status for f in found} == {status}
    if status == "fail":
        assert f"is not the {expect!r} you expected" in found[0].summary


def test_a_pass_through_the_reference_row_names_it():
    f = model_findings(H100_SXM, "H100 SXM")[0]
    assert "(reference H100-SXM5-80GB)" in f.summary and "row H100-SXM5-80GB" in f.evidence.source


@pytest.mark.parametrize("expect, status", [("H100", "fail"), ("A100 80GB", "pass"), ("A100 SXM", "pass")])
def test_lspci_only_capture_judges_the_expectation_against_the_pci_ids_name(expect, status):
    found = model_findings(LSPCI_A100, expect)  # "NVIDIA Corporation GA100 [A100 SXM4 80GB]"
    assert len(found) == 8 and {f.status for f in found} == {status}
    assert "'A100 SXM4 80GB'" in found[0].summary and "pci.ids" in found[0].evidence.source


def test_lspci_only_capture_with_expect_is_not_a_silent_pass_on_the_command_line(capsys):
    try:
        main(["inspect", "--expect", "H100", str(FIXTURES / LSPCI_A100)])
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    assert code == 1
    assert "lspci names it 'A100 SXM4 80GB', not the 'H100' you expected" in capsys.readouterr().out


def test_live_run_with_expect_and_no_gpu_fails():
    machine = Machine(source="live", gpu_error="no NVIDIA driver: the NVML library (libnvidia-ml.so.1) is not installed")
    (f,) = check_model(Context(machine, options={"expect": "H100 80GB"}))
    assert f.status == "fail" and f.summary.startswith("expected H100 80GB; no NVIDIA GPU visible")


@pytest.mark.parametrize("typed, meant", [("H10O 80GB", "H100 80GB"), ("A1OO 40GB", "A100 40GB"), ("RTX 409O", "RTX 4090"),
                                          ("rtx 4900", "rtx 4090"), ("L4O", "L40")])
def test_a_mistyped_model_names_the_known_model_it_meant(typed, meant):
    from gpuvet.judge.gpu_identity import expect_typo

    assert expect_typo(typed) == meant


@pytest.mark.parametrize("typed", ["H100 80GB", "H100 SXM", "L40S", "A10G", "RTX 4090 D", "Quantum 9000"])
def test_a_known_model_or_one_nothing_is_close_to_is_no_typo(typed):
    from gpuvet.judge.gpu_identity import expect_typo

    assert expect_typo(typed) is None

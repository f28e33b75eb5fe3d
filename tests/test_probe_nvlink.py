"""`nvidia-smi nvlink -s` parsing, checked against real captures (smi_text/nvlink-status-*, bundles/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuvet.probe.errors import CaptureError
from gpuvet.probe.nvlink_status import looks_like_nvlink_status, parse_nvlink_status

FIXTURES = Path(__file__).parent / "fixtures"
SMI_TEXT = FIXTURES / "smi_text"
A100_8X = SMI_TEXT / "nvlink-status-8x-a100-sxm4.txt"
V100_SOME_INACTIVE = SMI_TEXT / "nvlink-status-8x-v100-sxm2-some-inactive.txt"
A100_ALL_INACTIVE = SMI_TEXT / "nvlink-status-a100-all-links-inactive.txt"
A100_ONE_GPU_TABS = SMI_TEXT / "nvlink-status-a100-one-gpu-healthy.txt"
A10_EMPTY = SMI_TEXT / "nvlink-status-a10-none.txt"


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def bundle_section(bundle: str, command: str) -> str:
    """The body of one section of an nvidia_gpu_exporter bundle: between its banner and the next."""
    text = read(FIXTURES / "bundles" / bundle)
    after_command = text.split(f"# $ {command}\n", 1)[1]
    body = after_command.split("\n", 1)[1]  # the closing '#####' line of the banner
    return body.split("\n####", 1)[0]


def test_a100_8_gpus_12_links_each_at_25_gbs():
    gpus = parse_nvlink_status(read(A100_8X))
    assert [gpu.index for gpu in gpus] == list(range(8))
    assert gpus[0].name == "NVIDIA A100-SXM4-80GB"
    assert gpus[0].uuid == "GPU-5269b708-678a-b1a8-60f0-c90406537486"
    for gpu in gpus:
        assert [link.link for link in gpu.links] == list(range(12))
        assert all(link.active and link.speed_gbs == 25.0 for link in gpu.links)
        assert gpu.note is None


def test_v100_inactive_links_are_found():
    gpus = parse_nvlink_status(read(V100_SOME_INACTIVE))
    assert len(gpus) == 7  # the capture stops after GPU 6 (no trailing newline either)
    inactive = {(gpu.index, link.link) for gpu in gpus for link in gpu.links if not link.active}
    assert inactive == {(3, 3), (3, 5), (4, 1), (5, 0), (5, 4), (6, 1)}
    gpu3 = gpus[3]
    assert gpu3.uuid == "GPU-50b1bd2e-77ee-2731-fd2f-17c44103b7b9"
    assert [link.speed_gbs for link in gpu3.links] == [25.781, 25.781, 25.781, None, 25.781, None]


def test_all_links_inactive_gives_no_links_and_a_note():
    (gpu,) = parse_nvlink_status(read(A100_ALL_INACTIVE))
    assert gpu.index == 6
    assert gpu.links == []
    assert gpu.note == "NVML: Unable to retrieve NVLink information as all links are inactive"


def test_tab_indented_links():
    (gpu,) = parse_nvlink_status(read(A100_ONE_GPU_TABS))
    assert "\t" in read(A100_ONE_GPU_TABS)
    assert gpu.index == 7
    assert len(gpu.links) == 12 and all(link.active for link in gpu.links)


def test_h100_vm_bundle_shows_18_links_at_26_562():
    (gpu,) = parse_nvlink_status(bundle_section("h100-80gb-hbm3-vm-590.48.01.txt", "nvidia-smi nvlink -s"))
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    assert [link.link for link in gpu.links] == list(range(18))
    assert {link.speed_gbs for link in gpu.links} == {26.562}


@pytest.mark.parametrize(
    ("bundle", "note"),
    [
        ("h200-mig-vm-590.48.01.txt", "Nvlink queries are not supported for Devices in MIG mode"),
        ("l40s-vm-595.80.txt", "Device does not have or support Nvlink"),
        (
            "rtx-2080-super-610.57.04.txt",
            "NVML: Unable to retrieve Nvlink information as all links are inActive",
        ),
    ],
)
def test_gpus_without_links_keep_what_nvidia_smi_said(bundle, note):
    text = bundle_section(bundle, "nvidia-smi nvlink -s")
    assert looks_like_nvlink_status(text)
    (gpu,) = parse_nvlink_status(text)
    assert gpu.links == []
    assert gpu.note == note


def test_nvidia_smi_list_is_not_nvlink_status():
    for bundle in ("h100-80gb-hbm3-vm-590.48.01.txt", "h200-mig-vm-590.48.01.txt"):
        gpu_list = bundle_section(bundle, "nvidia-smi -L")
        assert gpu_list.startswith("GPU 0: NVIDIA H")
        assert not looks_like_nvlink_status(gpu_list)


def test_empty_output_raises():
    assert read(A10_EMPTY) == ""
    with pytest.raises(CaptureError, match="empty"):
        parse_nvlink_status(read(A10_EMPTY))


def test_error_message_raises():
    error = read(SMI_TEXT / "error-nvml-driver-library-mismatch.txt")
    with pytest.raises(CaptureError, match="nvlink -s"):
        parse_nvlink_status(error)


def test_foreign_line_among_links_raises():
    text = read(A100_ONE_GPU_TABS) + "\n# (exit code: 0)\n"
    with pytest.raises(CaptureError, match="exit code"):
        parse_nvlink_status(text)


def _every_fixture() -> list[Path]:
    return sorted(p for p in FIXTURES.rglob("*") if p.is_file() and p.name != "SOURCES.md")


@pytest.mark.parametrize("path", _every_fixture(), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_fixture_is_claimed_only_if_it_is_nvlink_status(path):
    text = path.read_text(encoding="utf-8", errors="replace")
    is_nvlink_status = path.name.startswith("nvlink-status-") and path != A10_EMPTY
    assert looks_like_nvlink_status(text) is is_nvlink_status
    try:
        parse_nvlink_status(text)  # whatever the file, either statuses or a CaptureError
    except CaptureError:
        assert not is_nvlink_status

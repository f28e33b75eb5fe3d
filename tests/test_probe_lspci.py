"""`lspci` parsing (plain, -nn, -vvv, -tv), checked against the real captures in tests/fixtures/lspci."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpuvet.probe.errors import CaptureError
from gpuvet.probe.lspci import gpu_link_readings, looks_like_lspci, parse_lspci

FIXTURES = Path(__file__).parent / "fixtures"
LSPCI = FIXTURES / "lspci"
HGX_H100 = LSPCI / "lspci-vvv-hgx-8x-h100-nvswitch.txt"
ADA_ASUS = LSPCI / "lspci-vvv-rtx6000ada-idle-gen1-downgraded-spaces.txt"
ADA_WRX90 = LSPCI / "lspci-vvv-rtx6000ada-wrx90-idle-downgraded-spaces.txt"
NVME_CARRIER = LSPCI / "lspci-vvv-nonGPU-nvme-carrier-width-x1-downgraded-spaces.txt"
AZURE_A100_NN = LSPCI / "lspci-nn-azure-8x-a100-sxm4-hyperv.txt"
A10_NN = LSPCI / "lspci-nn-a10-kvm.txt"
GB200_PLAIN = LSPCI / "lspci-gb200-grace-host.txt"
TREE = LSPCI / "lspci-tv-asus-esc8000a-4x-rtx6000ada.txt"

HGX_GPU_BUS_IDS = [f"0000:{bus}:00.0" for bus in ("19", "3b", "4c", "5d", "9b", "bb", "cb", "db")]


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def gpus(path: Path):
    return [device for device in parse_lspci(read(path)) if device.is_nvidia_gpu]


def test_rtx6000ada_idle_link_is_gen1_downgraded_of_gen4_x16():
    (gpu,) = parse_lspci(read(ADA_ASUS))
    assert gpu.bus_id == "0000:01:00.0"
    assert gpu.class_name == "VGA compatible controller"
    assert gpu.vendor_device == "NVIDIA Corporation AD102GL [RTX 6000 Ada Generation]"
    assert gpu.is_nvidia_gpu
    assert (gpu.link_sta_gts, gpu.link_sta_width) == (2.5, 16)
    assert (gpu.link_cap_gts, gpu.link_cap_width) == (16.0, 16)
    assert gpu.speed_downgraded is True and gpu.width_downgraded is False
    assert gpu.kernel_driver == "nvidia"
    assert gpu.kernel_modules == ["nvidiafb", "nouveau", "nvidia_drm", "nvidia"]
    assert gpu.numa_node == 0


def test_rtx6000ada_link_reading():
    ((bus_id, link),) = gpu_link_readings(parse_lspci(read(ADA_ASUS)))
    assert bus_id == "0000:01:00.0"
    assert (link.current_gen, link.current_width, link.max_gen, link.max_width) == (1, 16, 4, 16)
    assert link.source == "lspci"


def test_sudo_prompt_before_output_is_skipped():
    text = read(ADA_WRX90)
    assert text.startswith("[sudo] password for sonata:")
    assert looks_like_lspci(text)
    (gpu,) = parse_lspci(text)
    assert gpu.bus_id == "0000:c1:00.0"
    assert (gpu.link_sta_gts, gpu.speed_downgraded, gpu.link_sta_width) == (2.5, True, 16)
    assert gpu.numa_node is None  # this single-socket capture prints no "NUMA node:" line


def test_nvme_carrier_width_x1_downgraded_is_not_a_gpu():
    """The slice starts at "Subsystem:": its device line (71:00.0 RAID bus controller) was cut off."""
    (device,) = parse_lspci(read(NVME_CARRIER))
    assert device.bus_id is None and device.class_name is None
    assert not device.is_nvidia_gpu
    assert (device.link_sta_width, device.width_downgraded) == (1, True)
    assert (device.link_sta_gts, device.speed_downgraded) == (5.0, False)
    assert (device.link_cap_gts, device.link_cap_width) == (5.0, 2)
    assert gpu_link_readings([device]) == []


def test_hgx_h100_eight_gpus_at_gen5_x16_on_driver_nvidia():
    hgx = gpus(HGX_H100)
    assert [gpu.bus_id for gpu in hgx] == HGX_GPU_BUS_IDS
    for gpu in hgx:
        assert gpu.vendor_device == "NVIDIA Corporation Device 2330"  # old pci.ids: no H100 name
        assert (gpu.link_sta_gts, gpu.link_sta_width) == (32.0, 16)
        assert (gpu.link_cap_gts, gpu.link_cap_width) == (32.0, 16)
        assert not gpu.speed_downgraded and not gpu.width_downgraded
        assert gpu.kernel_driver == "nvidia"
    assert [gpu.numa_node for gpu in hgx] == [0, 0, 0, 0, 1, 1, 1, 1]
    readings = gpu_link_readings(parse_lspci(read(HGX_H100)))
    assert [bus_id for bus_id, _ in readings] == HGX_GPU_BUS_IDS
    assert {(r.current_gen, r.current_width, r.max_gen, r.max_width) for _, r in readings} == {(5, 16, 5, 16)}


def test_hgx_nvswitches_are_nvidia_bridges_not_gpus():
    devices = parse_lspci(read(HGX_H100))
    switches = [d for d in devices if d.class_name == "Bridge" and d.vendor_device.startswith("NVIDIA")]
    assert [d.bus_id for d in switches] == ["0000:83:00.0", "0000:84:00.0", "0000:85:00.0", "0000:86:00.0"]
    assert not any(d.is_nvidia_gpu for d in switches)
    assert {d.kernel_driver for d in switches} == {"nvidia-nvswitch"}
    assert {(d.link_sta_gts, d.link_sta_width) for d in switches} == {(16.0, 2)}


def test_hgx_upstream_switch_ports_trained_below_capability():
    by_bus = {d.bus_id: d for d in parse_lspci(read(HGX_H100))}
    port = by_bus["0000:39:00.0"]  # Broadcom PEX890xx upstream port
    assert (port.link_cap_gts, port.link_sta_gts, port.speed_downgraded) == (32.0, 16.0, True)


def test_hgx_parses_well_under_a_second():
    text = read(HGX_H100)
    assert len(text) > 900_000
    start = time.perf_counter()
    devices = parse_lspci(text)
    assert time.perf_counter() - start < 1.0
    assert len(devices) == 517


def test_lspci_nn_azure_a100_with_hyperv_domains():
    devices = parse_lspci(read(AZURE_A100_NN))
    a100s = [d for d in devices if d.is_nvidia_gpu]
    assert [d.bus_id for d in a100s] == [f"{dom}:00:00.0" for dom in
                                         ("0001", "0002", "0003", "0004", "000b", "000c", "000d", "000e")]
    assert {d.pci_id for d in a100s} == {"10de:20b2"}
    assert {d.class_id for d in a100s} == {"0302"}
    assert a100s[0].vendor_device == "NVIDIA Corporation GA100 [A100 SXM4 80GB]"
    switches = [d for d in devices if d.pci_id == "10de:1af1"]
    assert len(switches) == 6 and not any(d.is_nvidia_gpu for d in switches)
    assert gpu_link_readings(devices) == []  # -nn shows no link registers


def test_lspci_nn_a10_vm_one_gpu_and_a_virtio_vga():
    devices = parse_lspci(read(A10_NN))
    (a10,) = [d for d in devices if d.is_nvidia_gpu]
    assert (a10.bus_id, a10.pci_id) == ("0000:06:00.0", "10de:2236")
    assert a10.vendor_device == "NVIDIA Corporation GA102GL [A10]"
    virtio = next(d for d in devices if d.bus_id == "0000:00:01.0")
    assert virtio.class_name == "VGA compatible controller" and not virtio.is_nvidia_gpu


def test_plain_lspci_gb200_lists_four_blackwell_gpus_behind_nvidia_root_ports():
    devices = parse_lspci(read(GB200_PLAIN))
    assert [d.bus_id for d in devices if d.is_nvidia_gpu] == [
        "0008:01:00.0", "0009:01:00.0", "0018:01:00.0", "0019:01:00.0"
    ]
    bmc_vga = next(d for d in devices if d.bus_id == "0005:07:00.0")
    assert bmc_vga.vendor_device == "ASPEED Technology, Inc. ASPEED Graphics Family"
    assert bmc_vga.class_name == "VGA compatible controller" and not bmc_vga.is_nvidia_gpu
    root_ports = [d for d in devices if d.class_name == "PCI bridge" and d.vendor_device.startswith("NVIDIA")]
    assert root_ports and not any(d.is_nvidia_gpu for d in root_ports)


def test_lspci_n_numeric_only():
    (device,) = parse_lspci("06:00.0 0302: 10de:2236 (rev a1)\n")
    assert (device.class_id, device.pci_id, device.is_nvidia_gpu) == ("0302", "10de:2236", True)


def test_old_lspci_single_line_lnksta():
    """lspci before 3.6 printed the status flags on the LnkSta line itself, without (ok)/(downgraded)."""
    text = read(ADA_ASUS).replace(
        "LnkSta: Speed 2.5GT/s (downgraded), Width x16",
        "LnkSta:\tSpeed 8GT/s, Width x8, TrErr- Train- SlotClk+ DLActive- BWMgmt- ABWMgmt-",
    )
    (gpu,) = parse_lspci(text)
    assert (gpu.link_sta_gts, gpu.link_sta_width) == (8.0, 8)
    assert not gpu.speed_downgraded and not gpu.width_downgraded


def test_tree_is_recognised_and_refused_with_the_command_to_run_instead():
    text = read(TREE)
    assert looks_like_lspci(text)
    with pytest.raises(CaptureError, match=r"`lspci -tv` tree output is not supported.*sudo lspci -vvv -d 10de:"):
        parse_lspci(text)


NO_ACCESS = "pcilib: Cannot open /proc/bus/pci\nlspci: Cannot find any working access method.\n"


@pytest.mark.parametrize("text", ["", NO_ACCESS])
def test_not_lspci_output_raises(text):
    with pytest.raises(CaptureError, match="expected `lspci` output"):
        parse_lspci(text)


def _every_fixture() -> list[Path]:
    return sorted(p for p in FIXTURES.rglob("*") if p.is_file() and p.name != "SOURCES.md")


@pytest.mark.parametrize("path", _every_fixture(), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_fixture_is_claimed_only_if_it_is_lspci(path):
    text = path.read_text(encoding="utf-8", errors="replace")
    is_lspci = path.parent == LSPCI
    assert looks_like_lspci(text) is is_lspci
    try:
        parse_lspci(text)  # whatever the file, either devices or a CaptureError
    except CaptureError:
        assert not is_lspci or path == TREE


# -- issue 25 (a): lspci -nn naming the GPU, and the documents' grep'd lines ------------------------

@pytest.mark.parametrize("fixture, name", [
    ("lspci-nn-a10-kvm.txt", "NVIDIA A10"),
    ("lspci-nn-azure-8x-a100-sxm4-hyperv.txt", "NVIDIA A100 SXM4 80GB"),
    ("lspci-vvv-rtx6000ada-wrx90-idle-downgraded-spaces.txt", "NVIDIA RTX 6000 Ada Generation"),
    ("lspci-vvv-hgx-8x-h100-nvswitch.txt", None),  # an old pci.ids: "Device 2330", the device id alone
])
def test_the_gpus_name_is_the_product_name_lspci_prints(fixture, name):
    from gpuvet.probe import lspci as probe_lspci

    gpu = next(d for d in probe_lspci.parse_lspci((Path(__file__).parent / "fixtures/lspci" / fixture).read_text())
               if d.is_nvidia_gpu)
    assert probe_lspci.product_name(gpu.vendor_device) == name


def test_grepped_link_lines_are_refused_with_the_command_for_a_whole_capture(capsys, tmp_path):
    """`lspci -vv | grep -E "LnkCap|LnkSta"` (the seed documents' command), lines cut from the real
    RTX 6000 Ada capture: which device each line belongs to is gone, so gpuvet names the command
    that keeps it."""
    from cli_runner import gpuvet

    source = (Path(__file__).parent / "fixtures/lspci/lspci-vvv-rtx6000ada-wrx90-idle-downgraded-spaces.txt").read_text()
    grepped = "".join(line + "\n" for line in source.splitlines() if "LnkCap" in line or "LnkSta" in line)
    assert grepped
    path = tmp_path / "lspci-vvv-rtx6000ada-edited-grep-lnk.txt"
    path.write_text(grepped)
    code, out, err = gpuvet(capsys, "inspect", str(path))
    assert code == 2 and err.strip().splitlines() == [err.strip()] and "`sudo lspci -vv -d 10de: > lspci.txt`" in err

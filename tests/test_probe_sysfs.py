"""sysfs PCIe readers: the string formats of the kernel documentation, then a synthetic sysfs tree.

The machines that run these tests have no NVIDIA GPU, so the readers are tested on a directory
tree in tmp_path laid out like /sys (bus/pci/devices/<bdf> -> devices/pci0000:00/<bdf>).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuvet.facts import PcieLink
from gpuvet.probe.sysfs_pcie import (
    PCI_DEVICES,
    is_nvidia_display,
    kernel_driver,
    link_from_values,
    numa_node,
    nvidia_gpu_bus_ids,
    parse_hex,
    parse_link_speed,
    parse_link_width,
    parse_numa_node,
    read_link,
)


@pytest.mark.parametrize(
    ("raw", "gts"),
    [
        ("2.5 GT/s PCIe\n", 2.5),
        ("16.0 GT/s PCIe\n", 16.0),
        ("32.0 GT/s PCIe\n", 32.0),
        ("64.0 GT/s PCIe\n", 64.0),
        ("8 GT/s\n", 8.0),  # kernels <= 5.6
        ("2.5 GT/s\n", 2.5),
        ("Unknown\n", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_link_speed(raw, gts):
    assert parse_link_speed(raw) == gts


@pytest.mark.parametrize(
    ("raw", "lanes"), [("16\n", 16), ("1\n", 1), ("0\n", None), ("x16", None), (None, None)]
)
def test_parse_link_width(raw, lanes):
    assert parse_link_width(raw) == lanes


def test_parse_ids_and_numa_node():
    assert parse_hex("0x10de\n") == 0x10DE
    assert parse_hex("0x030200\n") == 0x030200
    assert parse_hex("garbage") is None
    assert parse_numa_node("1\n") == 1
    assert parse_numa_node("-1\n") is None  # no NUMA information


@pytest.mark.parametrize(
    ("vendor", "pci_class", "expected"),
    [
        (0x10DE, 0x030200, True),  # 3D controller
        (0x10DE, 0x030000, True),  # VGA compatible controller
        (0x10DE, 0x040300, False),  # the GPU's HDMI audio function
        (0x10DE, 0x068000, False),  # NVSwitch ("Bridge")
        (0x8086, 0x030000, False),  # another vendor's VGA
        (None, 0x030200, False),
    ],
)
def test_is_nvidia_display(vendor, pci_class, expected):
    assert is_nvidia_display(vendor, pci_class) is expected


def test_link_from_values_current_and_old_kernel_formats():
    idle = link_from_values("2.5 GT/s PCIe\n", "16\n", "16.0 GT/s PCIe\n", "16\n")
    assert idle == PcieLink(current_gen=1, current_width=16, max_gen=4, max_width=16, source="sysfs")
    old_kernel = link_from_values("8 GT/s\n", "8\n", "8 GT/s\n", "16\n")
    assert (old_kernel.current_gen, old_kernel.current_width) == (3, 8)
    assert (old_kernel.max_gen, old_kernel.max_width) == (3, 16)
    assert link_from_values("Unknown\n", None, None, None) is None


# -- synthetic sysfs ---------------------------------------------------------------------------

def _add_device(sys_root: Path, bdf: str, files: dict[str, str], driver: str | None = None) -> None:
    device = sys_root / "devices" / "pci0000:00" / bdf
    device.mkdir(parents=True)
    for name, content in files.items():
        (device / name).write_text(content)
    if driver:
        driver_dir = sys_root / "bus" / "pci" / "drivers" / driver
        driver_dir.mkdir(parents=True, exist_ok=True)
        (device / "driver").symlink_to(driver_dir)
    (sys_root / "bus" / "pci" / "devices" / bdf).symlink_to(device)


def _link_files(current: str, current_width: str, max_speed: str, max_width: str) -> dict[str, str]:
    return {
        "current_link_speed": current,
        "current_link_width": current_width,
        "max_link_speed": max_speed,
        "max_link_width": max_width,
    }


@pytest.fixture
def synthetic_sysfs(tmp_path: Path) -> str:
    """An idle GPU (gen1 of gen4) bound to nvidia, its HDMI audio function, an NVSwitch, another
    vendor's VGA, an unbound GPU on an old kernel, and a device with no link files."""
    (tmp_path / "bus" / "pci" / "devices").mkdir(parents=True)
    idle_gpu = {"vendor": "0x10de\n", "class": "0x030000\n", "numa_node": "0\n",
                **_link_files("2.5 GT/s PCIe\n", "16\n", "16.0 GT/s PCIe\n", "16\n")}
    unbound_gpu = {"vendor": "0x10de\n", "class": "0x030200\n", "numa_node": "-1\n",
                   **_link_files("8 GT/s\n", "8\n", "8 GT/s\n", "16\n")}
    hdmi_audio = {"vendor": "0x10de\n", "class": "0x040300\n"}
    nvswitch = {"vendor": "0x10de\n", "class": "0x068000\n"}
    bmc_vga = {"vendor": "0x1a03\n", "class": "0x030000\n"}
    isa_bridge = {"vendor": "0x8086\n", "class": "0x060100\n"}
    _add_device(tmp_path, "0000:01:00.0", idle_gpu, driver="nvidia")
    _add_device(tmp_path, "0000:01:00.1", hdmi_audio, driver="snd_hda_intel")
    _add_device(tmp_path, "0000:83:00.0", nvswitch, driver="nvidia-nvswitch")
    _add_device(tmp_path, "0000:03:00.0", bmc_vga, driver="ast")
    _add_device(tmp_path, "0000:c1:00.0", unbound_gpu)
    _add_device(tmp_path, "0000:00:1f.0", isa_bridge)
    return str(tmp_path / "bus" / "pci" / "devices")


def test_synthetic_sysfs_lists_only_nvidia_gpus(synthetic_sysfs):
    assert nvidia_gpu_bus_ids(synthetic_sysfs) == ["0000:01:00.0", "0000:c1:00.0"]


def test_synthetic_sysfs_read_link_accepts_every_bus_id_form(synthetic_sysfs):
    expected = PcieLink(current_gen=1, current_width=16, max_gen=4, max_width=16, source="sysfs")
    for bus_id in ("0000:01:00.0", "00000000:01:00.0", "01:00.0"):
        assert read_link(bus_id, root=synthetic_sysfs) == expected


def test_synthetic_sysfs_old_kernel_link_format(synthetic_sysfs):
    link = read_link("0000:c1:00.0", root=synthetic_sysfs)
    assert (link.current_gen, link.current_width, link.max_gen, link.max_width) == (3, 8, 3, 16)


def test_synthetic_sysfs_kernel_driver_and_numa_node(synthetic_sysfs):
    assert kernel_driver("0000:01:00.0", root=synthetic_sysfs) == "nvidia"
    assert kernel_driver("0000:83:00.0", root=synthetic_sysfs) == "nvidia-nvswitch"
    assert kernel_driver("0000:c1:00.0", root=synthetic_sysfs) is None  # unbound
    assert numa_node("0000:01:00.0", root=synthetic_sysfs) == 0
    assert numa_node("0000:c1:00.0", root=synthetic_sysfs) is None  # "-1"


def test_synthetic_sysfs_missing_device_or_files_give_none(synthetic_sysfs, tmp_path):
    for bus_id in ("0000:99:00.0", "not a bus id"):
        assert read_link(bus_id, root=synthetic_sysfs) is None
        assert kernel_driver(bus_id, root=synthetic_sysfs) is None
        assert numa_node(bus_id, root=synthetic_sysfs) is None
    assert read_link("0000:00:1f.0", root=synthetic_sysfs) is None  # no link files at all
    assert numa_node("0000:00:1f.0", root=synthetic_sysfs) is None
    assert nvidia_gpu_bus_ids(str(tmp_path / "no-such-dir")) == []


def test_synthetic_sysfs_unreadable_file_gives_none(synthetic_sysfs):
    device = Path(synthetic_sysfs) / "0000:01:00.0"
    os.remove(device / "current_link_speed")
    (device / "current_link_speed").mkdir()  # reading it raises IsADirectoryError
    link = read_link("0000:01:00.0", root=synthetic_sysfs)
    assert link.current_gen is None and link.max_gen == 4


@pytest.mark.skipif(not os.path.isdir(PCI_DEVICES), reason="no PCI sysfs on this machine")
def test_real_sysfs_reads_without_raising():
    for bus_id in sorted(os.listdir(PCI_DEVICES)):
        link = read_link(bus_id)
        assert link is None or link.source == "sysfs"
        assert kernel_driver(bus_id) is None or isinstance(kernel_driver(bus_id), str)
        assert numa_node(bus_id) is None or numa_node(bus_id) >= 0
    assert all(bus_id.count(":") == 2 for bus_id in nvidia_gpu_bus_ids())

"""Live PCIe facts from Linux sysfs (/sys/bus/pci/devices/<dddd:bb:dd.f>/...), readable without root.

Files read, one value each:
    vendor               "0x10de"            class               "0x030200" (0x03xxxx: display)
    current_link_speed   "16.0 GT/s PCIe"    (kernels <= 5.6: "16 GT/s", "2.5 GT/s"; "Unknown")
    max_link_speed       same format         current_link_width / max_link_width   "16"
    numa_node            "0" ("-1": none)    driver               symlink to .../drivers/<name>
    local_cpulist        "0-15,32-47"        the CPUs nearest the device (nvbandwidth binds to them)

current_* come from the link status register (LNKSTA), max_* from the capability (LNKCAP).
The parsing lives in pure functions; the readers never raise: a missing device, an absent file or
a read error (config space can answer EINVAL) gives None.
"""

from __future__ import annotations

import os
import re

from gpuvet.facts import PcieLink
from gpuvet.probe import values

PCI_DEVICES = "/sys/bus/pci/devices"
NVIDIA_VENDOR_ID = 0x10DE
_DISPLAY_CLASS = 0x03  # base class of VGA/3D/display controllers
_LINK_SPEED = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s")


# -- pure parsing ------------------------------------------------------------------------------

def parse_link_speed(raw: str | None) -> float | None:
    """GT/s from "16.0 GT/s PCIe", "8 GT/s" or "2.5 GT/s"; None for "Unknown" or anything else."""
    match = _LINK_SPEED.match(raw or "")
    return float(match.group(1)) if match else None


def parse_link_width(raw: str | None) -> int | None:
    """Lanes from "16"; None for 0 (link down, or nothing reported) and for non-numbers."""
    try:
        lanes = int((raw or "").strip())
    except ValueError:
        return None
    return lanes if lanes > 0 else None


def parse_hex(raw: str | None) -> int | None:
    """ "0x10de" -> 0x10de, "0x030200" -> 0x030200; None for anything else."""
    try:
        return int((raw or "").strip(), 16)
    except ValueError:
        return None


def parse_numa_node(raw: str | None) -> int | None:
    """ "0" -> 0; "-1" (no NUMA information) -> None."""
    try:
        node = int((raw or "").strip())
    except ValueError:
        return None
    return node if node >= 0 else None


def parse_cpu_list(raw: str | None) -> list[int]:
    """ "0-3,8,10-11" -> [0, 1, 2, 3, 8, 10, 11]; anything unreadable -> []."""
    cpus: list[int] = []
    for part in (raw or "").strip().split(","):
        low, _, high = part.strip().partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            cpus += range(int(low), int(high or low) + 1)
        elif part.strip():
            return []
    return cpus


def is_nvidia_display(vendor: int | None, pci_class: int | None) -> bool:
    """NVIDIA vendor and a display base class: GPUs, not their audio functions or NVSwitches."""
    return vendor == NVIDIA_VENDOR_ID and pci_class is not None and pci_class >> 16 == _DISPLAY_CLASS


def link_from_values(
    current_speed: str | None,
    current_width: str | None,
    max_speed: str | None,
    max_width: str | None,
) -> PcieLink | None:
    """A PcieLink from the four sysfs strings; None when none of them holds a value."""
    link = PcieLink(
        current_gen=values.pcie_gen_from_speed(parse_link_speed(current_speed)),
        current_width=parse_link_width(current_width),
        max_gen=values.pcie_gen_from_speed(parse_link_speed(max_speed)),
        max_width=parse_link_width(max_width),
        source="sysfs",
    )
    known = (link.current_gen, link.current_width, link.max_gen, link.max_width)
    return None if all(value is None for value in known) else link


# -- readers -----------------------------------------------------------------------------------

def nvidia_gpu_bus_ids(root: str = PCI_DEVICES) -> list[str]:
    """Bus ids ("0000:01:00.0") of the NVIDIA GPUs under `root`, sorted; [] when it cannot be listed."""
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return []
    return [
        entry
        for entry in entries
        if is_nvidia_display(
            parse_hex(_read(os.path.join(root, entry, "vendor"))),
            parse_hex(_read(os.path.join(root, entry, "class"))),
        )
    ]


def read_link(bus_id: str, root: str = PCI_DEVICES) -> PcieLink | None:
    """The device's link as sysfs reports it now; None when the device or its link files are missing."""
    device = _device_dir(bus_id, root)
    if device is None:
        return None
    return link_from_values(
        _read(os.path.join(device, "current_link_speed")),
        _read(os.path.join(device, "current_link_width")),
        _read(os.path.join(device, "max_link_speed")),
        _read(os.path.join(device, "max_link_width")),
    )


def kernel_driver(bus_id: str, root: str = PCI_DEVICES) -> str | None:
    """The bound driver ("nvidia", "vfio-pci", "nouveau"); None when unbound or unknown."""
    device = _device_dir(bus_id, root)
    if device is None:
        return None
    try:
        return os.path.basename(os.readlink(os.path.join(device, "driver"))) or None
    except OSError:
        return None


def numa_node(bus_id: str, root: str = PCI_DEVICES) -> int | None:
    device = _device_dir(bus_id, root)
    return None if device is None else parse_numa_node(_read(os.path.join(device, "numa_node")))


def local_cpus(bus_id: str, root: str = PCI_DEVICES) -> list[int]:
    """The CPUs nearest the device (its NUMA node's), from sysfs; [] when not known."""
    device = _device_dir(bus_id, root)
    return [] if device is None else parse_cpu_list(_read(os.path.join(device, "local_cpulist")))


# The kernel's AER counters per device (Linux 5.x: aer_dev_correctable, _nonfatal, _fatal), each
# a list of "NAME count" lines ending with TOTAL_ERR_COR / TOTAL_ERR_NONFATAL / TOTAL_ERR_FATAL.
_AER_FILES = (("correctable", "aer_dev_correctable", "TOTAL_ERR_COR"), ("nonfatal", "aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
              ("fatal", "aer_dev_fatal", "TOTAL_ERR_FATAL"))


def aer_counts(bus_id: str, root: str = PCI_DEVICES) -> dict[str, int] | None:
    """{"correctable": n, "nonfatal": n, "fatal": n} since boot; None without AER in sysfs."""
    device = _device_dir(bus_id, root)
    if device is None:
        return None
    counts = {}
    for name, filename, total in _AER_FILES:
        text = _read(os.path.join(device, filename))
        for line in (text or "").splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == total and parts[1].isdigit():
                counts[name] = int(parts[1])
    return counts or None


def _device_dir(bus_id: str, root: str) -> str | None:
    """The device's directory; accepts any bus id form ("00000000:01:00.0" from NVML, "01:00.0")."""
    normalised = values.bus_id(bus_id)
    return None if normalised is None else os.path.join(root, normalised)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as file:
            return file.read()
    except OSError:
        return None

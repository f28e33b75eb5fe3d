"""Reading `lspci` output: which PCI devices a machine has and, with -vv/-vvv, how their links trained.

Understood: plain `lspci`, `-D` (with domain), `-nn` (numeric ids in brackets), `-n` (ids only) and
`-v`/`-vv`/`-vvv` (indented detail lines, TAB or, after a Markdown paste, 8 spaces). LnkCap/LnkSta
are printed only to root: a non-root `-vvv` gives devices without link facts.

`lspci -tv` trees are recognised (looks_like_lspci is True) but refused with the command to run
instead: a tree shows neither class names nor link status, so it cannot say which device is a GPU
nor how its link trained.

A `-v` block pasted without its device line (it starts with an indented "Subsystem:" or
"Control:") parses to one device whose bus_id, class_name and vendor_device are None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuvet.facts import PcieLink
from gpuvet.probe import values
from gpuvet.probe.errors import CaptureError
from gpuvet.untrusted_text import quote

# "0000:01:00.0 3D controller [0302]: NVIDIA Corporation GA102GL [A10] [10de:2236] (rev a1)": the
# bus id by a regular expression, the class up to the first colon by string operations (a lazy
# class pattern backtracked quadratically on a run of spaces: 300 KB took 101 s).
_DEVICE_BUS = re.compile(r"(?P<bus>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s")
_CLASS_ID = re.compile(r"(?P<cls>[^\[]*)\[(?P<cls_id>[0-9a-fA-F]{4})\]")
# The root of an `lspci -t` tree: "-[0000:00]-+-00.0" or, with several root buses, "-+-[0000:00]-+-".
_TREE_ROOT = re.compile(r"^-(?:\+-)?\[[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}\]")
_SUDO_PROMPT = re.compile(r"^\[sudo\] password for ")
# The first detail lines of a `-v` block: what a paste starts with when its device line was cut off.
_HEADLESS_START = re.compile(r"^\s+(?:Subsystem|Control|Physical Slot|DeviceName):")
# `lspci -vv | grep -E "LnkCap|LnkSta"` (the seed documents' command): link lines with no device
# line above them, so which device (GPU, bridge, NVMe) each belongs to is cut away.
_GREPPED_LINK = re.compile(r"^\s*(?:LnkCap|LnkSta|LnkCtl)2?:")
WHOLE_COMMAND = "sudo lspci -vv -d 10de: > lspci.txt"
# The product name lspci's pci.ids gives in brackets: "NVIDIA Corporation GA102GL [A10]" -> "A10".
_BRACKETED_NAME = re.compile(r"\[([^\[\]]+)\]\s*$")
_PCI_ID = re.compile(r"\[([0-9a-fA-F]{4}:[0-9a-fA-F]{4})\]")
_NUMERIC_ONLY = re.compile(r"^([0-9a-fA-F]{4}:[0-9a-fA-F]{4})\b")  # `lspci -n`: "10de:2236 (rev a1)"
_TRAILERS = re.compile(r"\((?:rev|prog-if) [^()]*\)")  # "(rev a1)", "(prog-if 00 [VGA controller])"
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_SPEED = re.compile(r"Speed\s+(?P<gts>[\d.]+)GT/s(?P<note>\s*\(\w+\))?")
_WIDTH = re.compile(r"Width\s+x(?P<lanes>\d+)(?P<note>\s*\(\w+\))?")

NVIDIA_VENDOR_ID = "10de"
_DISPLAY_CLASSES = {"VGA compatible controller", "3D controller", "Display controller"}


@dataclass
class PciDevice:
    """One device of `lspci` output; link fields stay None unless `-vv` ran as root."""

    bus_id: str | None  # normalised "0000:01:00.0"; None: the device line was not in the text
    class_name: str | None  # "3D controller", "Bridge", ... ("0302" from `lspci -n`)
    vendor_device: str | None  # "NVIDIA Corporation GA102GL [A10]" (revision and numeric ids cut off)
    pci_id: str | None = None  # "10de:2236" when -nn / -n printed it
    class_id: str | None = None  # "0302" when -nn / -n printed it
    link_cap_gts: float | None = None  # LnkCap: what the device supports
    link_cap_width: int | None = None
    link_sta_gts: float | None = None  # LnkSta: what the link trained to now
    link_sta_width: int | None = None
    speed_downgraded: bool = False  # lspci marked LnkSta's speed "(downgraded)"
    width_downgraded: bool = False
    kernel_driver: str | None = None
    kernel_modules: list[str] = field(default_factory=list)
    numa_node: int | None = None

    @property
    def is_nvidia_gpu(self) -> bool:
        """NVIDIA vendor and a display class; NVSwitches ("Bridge") and HDMI audio functions are not."""
        nvidia = (self.pci_id or "").startswith(NVIDIA_VENDOR_ID + ":") or (
            (self.vendor_device or "").lower().startswith("nvidia")  # old pci.ids: "nVidia"
        )
        display = self.class_name in _DISPLAY_CLASSES or (self.class_id or "").startswith("03")
        return nvidia and display


def looks_like_lspci(text: str) -> bool:
    """True when the text starts (after a sudo password prompt) with an lspci device line, a tree,
    or the first detail line of a `-v` block whose device line was cut off."""
    first = _first_meaningful_line(text[:8192])
    return first is not None and any(
        pattern.match(first) for pattern in (_TREE_ROOT, _HEADLESS_START, _GREPPED_LINK)
    ) or (first is not None and device_line(first) is not None)


def parse_lspci(text: str) -> list[PciDevice]:
    """Every device of `lspci` (any verbosity), in the order printed.

    Lines at column 0 that are not device lines (a sudo prompt, "pcilib: ..." warnings) are skipped.
    Raises CaptureError for an `lspci -tv` tree and for text that holds no device.
    """
    if _is_tree(text):
        raise CaptureError(
            "`lspci -tv` tree output is not supported (it shows no device classes nor link status); "
            "capture `sudo lspci -vvv -d 10de:` instead (as root, so LnkCap/LnkSta are printed)"
        )
    devices: list[PciDevice] = []
    first = _first_meaningful_line(text[:8192]) or ""
    if _GREPPED_LINK.match(first) and not any(device_line(line) for line in text.splitlines()):
        raise CaptureError(
            "LnkCap/LnkSta lines without the device lines they belong to (`lspci -vv | grep`): which of them "
            f"is a GPU's link cannot be told; capture the NVIDIA devices whole: `{WHOLE_COMMAND}`"
        )
    if _HEADLESS_START.match(first):
        devices.append(PciDevice(bus_id=None, class_name=None, vendor_device=None))
    for line in text.splitlines():
        if line[:1].isspace():
            if devices:
                _read_detail(line.strip(), devices[-1])
            continue
        fields = device_line(line)
        if fields:
            devices.append(_device(*fields))
    if not devices:
        raise CaptureError(
            "expected `lspci` output (lines like '01:00.0 3D controller: NVIDIA Corporation ...'); "
            f"found {_describe(text)}"
        )
    return devices


def product_name(vendor_device: str | None) -> str | None:
    """The GPU's name as lspci knows it: "NVIDIA Corporation GA102GL [A10]" -> "NVIDIA A10" (the
    bracketed product name of pci.ids, which `lspci -nn` also prints); None when lspci printed only
    the chip or "Device 2236" (an old pci.ids): then the device id is all there is."""
    m = _BRACKETED_NAME.search(vendor_device or "")
    if not m or not (vendor_device or "").lower().startswith("nvidia"):
        return None
    name = m.group(1).strip()
    return name if name.lower().startswith("nvidia") else f"NVIDIA {name}"


def gpu_link_readings(devices: list[PciDevice]) -> list[tuple[str, PcieLink]]:
    """(bus_id, PcieLink) for each NVIDIA GPU that shows LnkCap or LnkSta.

    current_* come from LnkSta, max_* from LnkCap: the GPU's own capability, not the slot's.
    """
    readings = []
    for device in devices:
        if device.bus_id is None or not device.is_nvidia_gpu:
            continue
        if device.link_sta_gts is None and device.link_cap_gts is None:
            continue  # no -vv, or not run as root
        link = PcieLink(
            current_gen=values.pcie_gen_from_speed(device.link_sta_gts),
            current_width=device.link_sta_width,
            max_gen=values.pcie_gen_from_speed(device.link_cap_gts),
            max_width=device.link_cap_width,
            source="lspci",
        )
        readings.append((device.bus_id, link))
    return readings


def device_line(line: str) -> tuple[str, str, str | None, str] | None:
    """(bus, class name, class id, the rest) of an lspci device line, None for any other line."""
    bus = _DEVICE_BUS.match(line)
    if not bus:
        return None
    head, colon, rest = line[bus.end():].partition(":")
    cls, cls_id = head, None
    if "[" in head:
        with_id = _CLASS_ID.fullmatch(head)
        if not with_id:
            return None
        cls, cls_id = with_id.group("cls"), with_id.group("cls_id")
    if not colon or not cls.strip():
        return None
    return bus.group("bus"), cls.strip(), cls_id, rest.strip()


def _device(bus: str, class_name: str, cls_id: str | None, rest: str) -> PciDevice:
    ids = _PCI_ID.findall(rest) or _NUMERIC_ONLY.findall(rest)
    vendor_device = _TRAILERS.sub("", rest)
    if ids:
        vendor_device = vendor_device.replace(f"[{ids[-1]}]", "")
    class_id = cls_id or (class_name if _HEX4.fullmatch(class_name) else None)
    return PciDevice(
        bus_id=values.bus_id(bus) or bus,
        class_name=class_name,
        vendor_device=values.cut(" ".join(vendor_device.split())),
        pci_id=ids[-1].lower() if ids else None,
        class_id=class_id.lower() if class_id else None,
    )


def _read_detail(line: str, device: PciDevice) -> None:
    """One indented line (already stripped); only the few we use are looked at."""
    if line.startswith("LnkCap:"):
        device.link_cap_gts, device.link_cap_width, _, _ = _link_fields(line)
    elif line.startswith("LnkSta:"):
        (
            device.link_sta_gts,
            device.link_sta_width,
            device.speed_downgraded,
            device.width_downgraded,
        ) = _link_fields(line)
    elif line.startswith("Kernel driver in use:"):
        device.kernel_driver = line.split(":", 1)[1].strip() or None
    elif line.startswith("Kernel modules:"):
        device.kernel_modules = [m.strip() for m in line.split(":", 1)[1].split(",") if m.strip()]
    elif line.startswith("NUMA node:"):
        node = values.hex_or_int(line.split(":", 1)[1])
        device.numa_node = node if node is not None and node >= 0 else None


def _link_fields(line: str) -> tuple[float | None, int | None, bool, bool]:
    """ "Speed 2.5GT/s (downgraded), Width x16 (ok)" -> (2.5, 16, True, False)."""
    speed, width = _SPEED.search(line), _WIDTH.search(line)
    return (
        values.number(speed.group("gts")) if speed else None,
        values.whole(width.group("lanes")) if width else None,
        bool(speed and "downgraded" in (speed.group("note") or "")),
        bool(width and "downgraded" in (width.group("note") or "")),
    )


def _first_meaningful_line(text: str) -> str | None:
    for line in text.splitlines():
        if line.strip() and not _SUDO_PROMPT.match(line):
            return line
    return None


def _is_tree(text: str) -> bool:
    first = _first_meaningful_line(text[:8192])
    return first is not None and _TREE_ROOT.match(first) is not None


def _describe(text: str) -> str:
    stripped = text.strip()
    return quote(stripped.splitlines()[0]) if stripped else "an empty text"

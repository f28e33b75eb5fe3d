"""`nvidia-smi -q` (the text report, also `-q -d SECTION`) -> facts.

The report is an indented tree of "Label : value" lines; a label without a value opens a
section. Sections repeat ("MIG Device", processes), so the tree keeps every child in order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..facts import Driver, Gpu, GpuProcess, MigDevice
from ..text_patterns import PCI_BUS_ID
from . import values as v
from .errors import CaptureError
from .smi_common import Paths, build_gpu, counter_paths

_LINK = "PCI/GPU Link Info"

PATHS: Paths = {
    "name": ("Product Name",),
    "brand": ("Product Brand",),
    "architecture": ("Product Architecture",),
    "uuid": ("GPU UUID",),
    "serial": ("Serial Number",),
    "vbios": ("VBIOS Version",),
    "persistence": ("Persistence Mode",),
    "compute_mode": ("Compute Mode",),
    "pstate": ("Performance State",),
    "driver_model": ("Driver Model/Current",),
    "utilization": ("Utilization/GPU",),
    "virtualization": ("GPU Virtualization Mode/Virtualization Mode",),
    "mig_current": ("MIG Mode/Current",),
    "mig_pending": ("MIG Mode/Pending",),
    "memory_total": ("FB Memory Usage/Total",),
    "memory_used": ("FB Memory Usage/Used",),
    "memory_reserved": ("FB Memory Usage/Reserved",),
    "power_draw": (
        "GPU Power Readings/Average Power Draw",
        "GPU Power Readings/Power Draw",
        "GPU Power Readings/Instantaneous Power Draw",
        "Power Readings/Average Power Draw",
        "Power Readings/Power Draw",
    ),
    # Driver 610 moved the limits one level down, under "GPU Ceiling Power Limit".
    "power_limit": (
        "GPU Power Readings/Requested Power Limit",
        "GPU Power Readings/GPU Ceiling Power Limit/Requested Power Limit",
        "Power Readings/Requested Power Limit",
        "Power Readings/Power Limit",
    ),
    "power_enforced": (
        "GPU Power Readings/Current Power Limit",
        "GPU Power Readings/GPU Ceiling Power Limit/Current Power Limit",
        "Power Readings/Current Power Limit",
        "Power Readings/Enforced Power Limit",
    ),
    "power_default": (
        "GPU Power Readings/Default Power Limit",
        "GPU Power Readings/GPU Ceiling Power Limit/Default Power Limit",
        "Power Readings/Default Power Limit",
    ),
    "power_min": ("GPU Power Readings/Min Power Limit", "Power Readings/Min Power Limit"),
    "power_max": ("GPU Power Readings/Max Power Limit", "Power Readings/Max Power Limit"),
    "bus_id": ("PCI/Bus Id",),
    "pcie_gen_current": (f"{_LINK}/PCIe Generation/Current",),
    "pcie_gen_max": (f"{_LINK}/PCIe Generation/Max",),
    "pcie_gen_device_max": (f"{_LINK}/PCIe Generation/Device Max",),
    "pcie_gen_host_max": (f"{_LINK}/PCIe Generation/Host Max",),
    "pcie_width_current": (f"{_LINK}/Link Width/Current",),
    "pcie_width_max": (f"{_LINK}/Link Width/Max",),
    "pcie_replays": ("PCI/Replays Since Reset",),
    "clock_sm": ("Clocks/SM",),
    "clock_graphics": ("Clocks/Graphics",),
    "clock_memory": ("Clocks/Memory",),
    "clock_max_sm": ("Max Clocks/SM",),
    "clock_max_graphics": ("Max Clocks/Graphics",),
    "clock_max_memory": ("Max Clocks/Memory",),
    "clock_app_graphics": ("Applications Clocks/Graphics",),
    "clock_default_app_graphics": ("Default Applications Clocks/Graphics",),
    "fan_speed": ("Fan Speed",),
    "temp_gpu": ("Temperature/GPU Current Temp",),
    "temp_memory": ("Temperature/Memory Current Temp",),
    "temp_slowdown": ("Temperature/GPU Slowdown Temp",),
    "temp_shutdown": ("Temperature/GPU Shutdown Temp",),
    "temp_max_operating": ("Temperature/GPU Max Operating Temp",),
    "temp_tlimit": ("Temperature/GPU T.Limit Temp",),
    "temp_slowdown_tlimit": ("Temperature/GPU Slowdown T.Limit Temp",),
    "ecc_current": ("ECC Mode/Current",),
    "ecc_pending": ("ECC Mode/Pending",),
    "retired_sbe": ("Retired Pages/Single Bit ECC",),
    "retired_dbe": ("Retired Pages/Double Bit ECC",),
    "retired_pending": ("Retired Pages/Pending Page Retirement", "Retired Pages/Pending Page Blacklist"),
    "remap_correctable": ("Remapped Rows/Correctable Error",),
    "remap_uncorrectable": ("Remapped Rows/Uncorrectable Error",),
    "remap_pending": ("Remapped Rows/Pending",),
    "remap_failure": ("Remapped Rows/Remapping Failure Occurred",),
    "recovery_action": ("GPU Recovery Action",),
    "fabric_state": ("Fabric/State",),
    "fabric_status": ("Fabric/Status",),
    "fabric_health": ("Fabric/Health/Summary",),
}
_EVENT_TIME_LABELS = {
    "sw_power_cap": "SW Power Capping",
    "sync_boost": "Sync Boost",
    "sw_thermal_slowdown": "SW Thermal Slowdown",
    "hw_thermal_slowdown": "HW Thermal Slowdown",
    "hw_power_brake_slowdown": "HW Power Braking",
}
PATHS.update(counter_paths(
    event_time=lambda name: f"Clocks Event Reasons Counters/{_EVENT_TIME_LABELS[name]}",
    remap_bank=lambda level: f"Remapped Rows/Bank Remap Availability Histogram/{level.capitalize()}",
    ecc=lambda scope, leaf: f"ECC Errors/{scope.capitalize()}/{leaf}",
    ecc_leaves={
        "corrected_parts": ("SRAM Correctable", "DRAM Correctable"),
        "uncorrected_parts": ("SRAM Uncorrectable", "SRAM Uncorrectable Parity", "SRAM Uncorrectable SEC-DED", "DRAM Uncorrectable"),
        "single_bit_total": ("Single Bit/Total",),
        "double_bit_total": ("Double Bit/Total",),
    },
))

# Clock-event reason labels; "HW Thermal/Power Brake Slowdown" are nested under "HW Slowdown".
_REASON_LABELS = {
    "gpu_idle": "Idle",
    "applications_clocks_setting": "Applications Clocks Setting",
    "sw_power_cap": "SW Power Cap",
    "hw_slowdown": "HW Slowdown",
    "hw_thermal_slowdown": "HW Slowdown/HW Thermal Slowdown",
    "hw_power_brake_slowdown": "HW Slowdown/HW Power Brake Slowdown",
    "sync_boost": "Sync Boost",
    "sw_thermal_slowdown": "SW Thermal Slowdown",
    "display_clock_setting": "Display Clock Setting",
}
for _reason, _label in _REASON_LABELS.items():
    PATHS["reason_" + _reason] = (f"Clocks Event Reasons/{_label}", f"Clocks Throttle Reasons/{_label}")


@dataclass
class Node:
    label: str
    value: str | None = None
    children: list[Node] = field(default_factory=list)

    def child(self, label: str) -> Node | None:
        label = label.lower()
        return next((c for c in self.children if c.label.lower() == label), None)

    def all(self, label: str) -> list[Node]:
        label = label.lower()
        return [c for c in self.children if c.label.lower() == label]

    def find(self, path: str) -> Node | None:
        node: Node | None = self
        for part in path.split("/"):
            node = node.child(part) if node else None
        return node

    def value_at(self, path: str) -> str | None:
        node = self.find(path)
        return node.value if node else None


class _TextReport:
    def __init__(self, node: Node):
        self.node = node

    def value(self, path: str) -> str | None:
        return self.node.value_at(path)


_GPU_HEADER = re.compile(rf"GPU {PCI_BUS_ID}")


def split_line(line: str) -> tuple[int, str, str | None]:
    """(indent, label, value) of one "    Label   : value" line; value None for a section title.
    Plain string operations: a regular expression for this backtracked on a run of spaces (1,500
    spaces took 4.8 s, a 5 MB line never ended); this is linear in the line."""
    body = line.lstrip(" ")
    label, colon, value = body.partition(":")
    if colon and value[:1].isspace():
        value = value[1:]
    return len(line) - len(body), label.rstrip(), value.rstrip() if colon else None


def parse_tree(text: str) -> Node:
    """The indentation tree of a `nvidia-smi -q` report (tabs count as 4 spaces)."""
    root = Node("")
    stack: list[tuple[int, Node]] = [(-1, root)]
    for line in text.expandtabs(4).splitlines():
        if not line.strip() or line.lstrip().startswith("=="):
            continue
        indent, label, value = split_line(line)
        if not label:
            continue
        if _GPU_HEADER.fullmatch(line.strip()):  # "GPU 00000000:01:00.0" has colons but no value
            node = Node(line.strip())
        else:
            node = Node(label, value)
        while stack[-1][0] >= indent:
            stack.pop()
        stack[-1][1].children.append(node)
        stack.append((indent, node))
    return root


def looks_like_smi_text(text: str) -> bool:
    return "NVSMI LOG" in text[:2048]


def parse_smi_text(text: str) -> tuple[Driver, list[Gpu]]:
    if not looks_like_smi_text(text):
        raise CaptureError("no '==NVSMI LOG==' header: expected the output of `nvidia-smi -q`")
    root = parse_tree(text)
    driver = Driver(
        version=_strip_note(root.value_at("KMD Version") or root.value_at("Driver Version")),
        cuda_version=v.cuda_version(_strip_note(root.value_at("CUDA UMD Version") or root.value_at("CUDA Version"))),
    )
    sections = [n for n in root.children if re.match(r"GPU [0-9A-Fa-f]{4,8}:", n.label)]
    _refuse_if_cut(sections, attached_gpus(text))
    gpus = []
    for position, section in enumerate(sections):
        gpu = build_gpu(position, _TextReport(section), PATHS)
        gpu.pcie.bus_id = gpu.pcie.bus_id or v.bus_id(section.label)
        gpu.mig_devices = [_mig_device(m) for m in section.all("MIG Device")]
        processes = section.child("Processes")
        if processes is not None:
            gpu.processes = sorted((_process(p) for p in processes.all("Process ID")), key=lambda p: p.pid or 0)
        gpus.append(gpu)
    return driver, gpus


_ATTACHED = re.compile(r"^[ \t]*Attached GPUs[ \t]*:[ \t]*(\d+)[ \t]*$", re.M)
_RECAPTURE = "capture it again with `nvidia-smi -q > gpu.txt`"


def attached_gpus(text: str) -> int | None:
    """The "Attached GPUs" count of the report header (every GPU on the machine, even with `-i`)."""
    m = _ATTACHED.search(text[:8192])
    return v.whole(m.group(1)) if m else None


def _refuse_if_cut(sections: list[Node], attached: int | None) -> None:
    """A report cut short (pasted in part, `head`, a full disk) must not be judged as a smaller machine.

    A full report prints "Processes" in every GPU block and, on newer drivers, one more section
    after it: the last block must hold both. A `-q -d SECTION` report prints the same sections, with
    the same lines, in every block: the last block must hold all of the first block's. Fewer
    complete blocks than "Attached GPUs" is what `nvidia-smi -q -i N` prints: the caller notes that.
    """
    if not sections:
        if attached:
            raise CaptureError(f"truncated nvidia-smi -q output: {_gpus(attached)} attached, 0 in the file; {_RECAPTURE}")
        return
    missing = _missing_sections(sections[0], sections[-1])
    if missing:
        found = f"{_gpus(attached)} attached, {len(sections)} in the file" if attached else f"{_gpus(len(sections))} in the file"
        raise CaptureError(
            f"truncated nvidia-smi -q output: {found}, and the last GPU block stops before its "
            f"{' and '.join(missing)} section; {_RECAPTURE}"
        )


def _missing_sections(first: Node, last: Node) -> list[str]:
    """Sections the last GPU block should hold but does not (the block was cut)."""
    if not first.children or not last.children:
        return ["first"]
    if first.child("Product Name") is not None:
        required = ["Processes", first.children[-1].label]
        return sorted({label for label in required if last.child(label) is None})
    missing = [c.label for c in first.children if last.child(c.label) is None]
    if missing:
        return missing
    # `-q -d`: the last block's last section should have as many lines as the first block's.
    tail = last.children[-1]
    model = first.child(tail.label)
    return [tail.label] if model is not None and _size(tail) < _size(model) else []


def _size(node: Node) -> int:
    """Lines under `node`, counted without recursion: a damaged report can nest thousands deep."""
    count, stack = 0, [node]
    while stack:
        children = stack.pop().children
        count += len(children)
        stack.extend(children)
    return count


def _gpus(count: int) -> str:
    return f"{count} GPU" + ("" if count == 1 else "s")


def _strip_note(raw: str | None) -> str | None:
    """ "610.57.04 [Deprecated; will be removed ...]" -> "610.57.04"."""
    value = v.text(raw)
    return value.split("[", 1)[0].strip() if value else None


def _mig_device(node: Node) -> MigDevice:
    return MigDevice(
        index=v.integer(node.value_at("Index")),
        gpu_instance_id=v.integer(node.value_at("GPU Instance ID")),
        compute_instance_id=v.integer(node.value_at("Compute Instance ID")),
        sm_count=v.integer(node.value_at("Device Attributes/Shared/Multiprocessor count")),
        memory_total_mib=v.mib(node.value_at("Shared FB Memory Usage/Total") or node.value_at("FB Memory Usage/Total")),
        memory_used_mib=v.mib(node.value_at("Shared FB Memory Usage/Used") or node.value_at("FB Memory Usage/Used")),
    )


def _process(node: Node) -> GpuProcess:
    return GpuProcess(
        pid=v.integer(node.value),
        name=v.text(node.value_at("Name")),
        type=v.text(node.value_at("Type")),
        used_memory_mib=v.mib(node.value_at("Used GPU Memory")),
    )

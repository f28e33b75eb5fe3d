"""`nvidia-smi -q -x` (XML, DTD v9..v13) -> facts."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from ..facts import Driver, Gpu, GpuProcess, MigDevice
from . import values as v
from ..untrusted_text import clean, clean_document, quote
from .errors import CaptureError
from .smi_common import REASON_KEYS, Paths, build_gpu, counter_paths

_LINK = "pci/pci_gpu_link_info"

PATHS: Paths = {
    "name": ("product_name",),
    "brand": ("product_brand",),
    "architecture": ("product_architecture",),
    "uuid": ("uuid",),
    "serial": ("serial",),
    "vbios": ("vbios_version",),
    "persistence": ("persistence_mode",),
    "compute_mode": ("compute_mode",),
    "pstate": ("performance_state",),
    "driver_model": ("driver_model/current_dm",),
    "utilization": ("utilization/gpu_util",),
    "virtualization": ("gpu_virtualization_mode/virtualization_mode",),
    "mig_current": ("mig_mode/current_mig",),
    "mig_pending": ("mig_mode/pending_mig",),
    "memory_total": ("fb_memory_usage/total",),
    "memory_used": ("fb_memory_usage/used",),
    "memory_reserved": ("fb_memory_usage/reserved",),
    "power_draw": (
        "gpu_power_readings/average_power_draw",
        "gpu_power_readings/power_draw",
        "gpu_power_readings/instant_power_draw",
        "power_readings/average_power_draw",
        "power_readings/power_draw",
        "power_readings/instant_power_draw",
    ),
    "power_limit": ("gpu_power_readings/requested_power_limit", "power_readings/requested_power_limit", "power_readings/power_limit"),
    "power_enforced": ("gpu_power_readings/current_power_limit", "power_readings/current_power_limit", "power_readings/enforced_power_limit"),
    "power_default": ("gpu_power_readings/default_power_limit", "power_readings/default_power_limit"),
    "power_min": ("gpu_power_readings/min_power_limit", "power_readings/min_power_limit"),
    "power_max": ("gpu_power_readings/max_power_limit", "power_readings/max_power_limit"),
    "bus_id": ("pci/pci_bus_id",),
    "pcie_gen_current": (f"{_LINK}/pcie_gen/current_link_gen",),
    "pcie_gen_max": (f"{_LINK}/pcie_gen/max_link_gen",),
    "pcie_gen_device_max": (f"{_LINK}/pcie_gen/max_device_link_gen",),
    "pcie_gen_host_max": (f"{_LINK}/pcie_gen/max_host_link_gen",),
    "pcie_width_current": (f"{_LINK}/link_widths/current_link_width",),
    "pcie_width_max": (f"{_LINK}/link_widths/max_link_width",),
    "pcie_replays": ("pci/replay_counter",),
    "clock_sm": ("clocks/sm_clock",),
    "clock_graphics": ("clocks/graphics_clock",),
    "clock_memory": ("clocks/mem_clock",),
    "clock_max_sm": ("max_clocks/sm_clock",),
    "clock_max_graphics": ("max_clocks/graphics_clock",),
    "clock_max_memory": ("max_clocks/mem_clock",),
    "clock_app_graphics": ("applications_clocks/graphics_clock",),
    "clock_default_app_graphics": ("default_applications_clocks/graphics_clock",),
    "fan_speed": ("fan_speed",),
    "temp_gpu": ("temperature/gpu_temp",),
    "temp_memory": ("temperature/memory_temp",),
    "temp_slowdown": ("temperature/gpu_temp_slow_threshold",),
    "temp_shutdown": ("temperature/gpu_temp_max_threshold",),
    "temp_max_operating": ("temperature/gpu_temp_max_gpu_threshold",),
    "temp_tlimit": ("temperature/gpu_temp_tlimit",),
    "temp_slowdown_tlimit": ("temperature/gpu_temp_slow_tlimit_threshold",),
    "ecc_current": ("ecc_mode/current_ecc",),
    "ecc_pending": ("ecc_mode/pending_ecc",),
    "retired_sbe": ("retired_pages/multiple_single_bit_retirement/retired_count",),
    "retired_dbe": ("retired_pages/double_bit_retirement/retired_count",),
    "retired_pending": ("retired_pages/pending_retirement", "retired_pages/pending_blacklist"),
    "remap_correctable": ("remapped_rows/remapped_row_corr",),
    "remap_uncorrectable": ("remapped_rows/remapped_row_unc",),
    "remap_pending": ("remapped_rows/remapped_row_pending",),
    "remap_failure": ("remapped_rows/remapped_row_failure",),
    "recovery_action": ("gpu_recovery_action",),
    "fabric_state": ("fabric/state",),
    "fabric_status": ("fabric/status",),
    "fabric_health": ("fabric/health/summary",),
}
_EVENT_TIME_TAGS = {"sw_thermal_slowdown": "sw_therm_slowdown", "hw_thermal_slowdown": "hw_therm_slowdown",
                    "hw_power_brake_slowdown": "hw_power_brake"}
PATHS.update(counter_paths(
    event_time=lambda name: f"clocks_event_reasons_counters/clocks_event_reasons_counters_{_EVENT_TIME_TAGS.get(name, name)}",
    remap_bank=lambda level: f"remapped_rows/row_remapper_histogram/row_remapper_histogram_{level}",
    ecc=lambda scope, leaf: f"ecc_errors/{scope}/{leaf}",
    ecc_leaves={
        "corrected_parts": ("sram_correctable", "dram_correctable"),
        "uncorrected_parts": ("sram_uncorrectable", "sram_uncorrectable_parity", "sram_uncorrectable_secded", "dram_uncorrectable"),
        "single_bit_total": ("single_bit/total",),
        "double_bit_total": ("double_bit/total",),
    },
))
for _reason in REASON_KEYS:
    _tag = "display_clocks_setting" if _reason == "display_clock_setting" else _reason
    PATHS["reason_" + _reason] = (
        f"clocks_event_reasons/clocks_event_reason_{_tag}",
        f"clocks_throttle_reasons/clocks_throttle_reason_{_tag}",
    )


class _XmlReport:
    def __init__(self, element: ET.Element):
        self.element = element

    def value(self, path: str) -> str | None:
        found = self.element.find(path)
        if found is None:
            return None
        return (found.text or "").strip() if len(found) == 0 else None


_ATTACHED = re.compile(r"<attached_gpus>\s*(\d+)\s*</attached_gpus>")


def attached_gpus(text: str) -> int | None:
    """The report's <attached_gpus>: every GPU on the machine, even when `-i N` printed only one."""
    m = _ATTACHED.search(text[:8192])
    return v.whole(m.group(1)) if m else None


def looks_like_smi_xml(text: str) -> bool:
    """The report's root element near the top, or its DOCTYPE: `-q -x --dtd` puts the whole DTD
    (several KB) between them."""
    head = text[:4096]
    return "<nvidia_smi_log" in head or _DOCTYPE_OF_LOG.search(head) is not None


_DOCTYPE_OF_LOG = re.compile(r"<!DOCTYPE\s+nvidia_smi_log\b")
_DTD_END = re.compile(r"\]\s*>")


def without_dtd(text: str) -> str:
    """The report without its DOCTYPE: the DTD is neither needed nor trusted (entities declared in
    one are never expanded), and an embedded one pushes the data past where headers are looked for.

    An external DTD (`<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">`) ends at its first
    ">"; one embedded by `--dtd` (`<!DOCTYPE nvidia_smi_log [ <!ELEMENT ...> ... ]>`) at "]>". Only a
    DOCTYPE before the root element is one; each end is found by one forward scan (linear)."""
    start = text.find("<!DOCTYPE", 0, 4096)
    root = text.find("<nvidia_smi_log")
    if start < 0 or 0 <= root < start:
        return text
    bracket, close = text.find("[", start), text.find(">", start)
    if close < 0:
        return text
    if 0 <= bracket < close:
        end = _DTD_END.search(text, bracket)
        if end is None:
            return text
        return text[:start] + text[end.end():]
    return text[:start] + text[close + 1:]


# nvidia-smi nests its elements about 6 deep; a file nested a million deep (<d><d><d>...) took
# 16 s and 340 MB to build and free as a tree before it was refused for holding no GPU.
MAX_NESTING = 64
_TAG = re.compile(r"<(/?)[A-Za-z_][^<>]*>")


def _check_nesting(body: str) -> None:
    """Refuse elements nested deeper than MAX_NESTING before any tree is built (one scan of the tags)."""
    depth = 0
    for tag in _TAG.finditer(body):
        if tag.group(1):
            depth -= 1
        elif tag.group()[-2] != "/":
            depth += 1
            if depth > MAX_NESTING:
                raise ET.ParseError(f"elements nested more than {MAX_NESTING} deep; nvidia-smi nests about 6")


def load_xml(text: str) -> ET.Element:
    """The root element of an `nvidia-smi -q -x` report, parsed as untrusted input: its DOCTYPE
    is dropped, and a DOCTYPE or entity declaration left anywhere else is refused before the
    parser sees it (what defusedxml guards against: no billion laughs, no external entity, a
    local file or a URL, read). ET.ParseError for anything that is not well-formed XML."""
    body = without_dtd(text)
    if "<!DOCTYPE" in body or "<!ENTITY" in body:
        raise ET.ParseError("a DOCTYPE or entity declaration where nvidia-smi writes none; not expanded")
    _check_nesting(body)
    root = ET.fromstring(body)
    # A character reference (&#x9b; a CSI, &#x202e; a bidi override) becomes the character only
    # here, after the text was cleaned: each element's text and attributes are cleaned again.
    for element in root.iter():
        if element.text and not element.text.isprintable():
            element.text = clean_document(element.text)
        for name, value in element.attrib.items():
            if not value.isprintable():
                element.attrib[name] = clean(value)
    return root


def parse_smi_xml(text: str) -> tuple[Driver, list[Gpu]]:
    try:
        root = load_xml(text)
    except ET.ParseError as err:
        if "</nvidia_smi_log>" not in text:
            attached, found = attached_gpus(text), text.count("<gpu id=")
            of = f"{attached} GPU{'' if attached == 1 else 's'} attached, {found} begun in the file, " if attached else ""
            raise CaptureError(
                f"truncated nvidia-smi -q -x output: {of}no closing </nvidia_smi_log>; "
                "capture it again with `nvidia-smi -q -x > gpu.xml`"
            ) from None
        raise CaptureError(f"broken XML ({quote(str(err), quotes=False)}): expected the complete output of `nvidia-smi -q -x`") from None
    if root.tag != "nvidia_smi_log":
        raise CaptureError(f"XML root is <{root.tag}>, expected <nvidia_smi_log> from `nvidia-smi -q -x`")
    driver = Driver(
        version=v.text(root.findtext("driver_version")),
        cuda_version=v.cuda_version(root.findtext("cuda_version")),
    )
    gpus = []
    for position, element in enumerate(root.findall("gpu")):
        # nvidia-smi lists GPUs in NVML index order (the `-i N` of every nvidia-smi command);
        # minor_number is the /dev/nvidiaN number and may differ (the K80 capture shows it).
        gpu = build_gpu(position, _XmlReport(element), PATHS)
        gpu.pcie.bus_id = gpu.pcie.bus_id or v.bus_id(element.get("id"))
        gpu.mig_devices = [_mig_device(m) for m in element.findall("mig_devices/mig_device")]
        processes = element.find("processes")
        if processes is not None:
            # By pid, as the live backend lists them (nvidia-smi's order is not NVML's).
            gpu.processes = sorted((_process(p) for p in processes.findall("process_info")), key=lambda p: p.pid or 0)
        gpus.append(gpu)
    return driver, gpus


def _mig_device(element: ET.Element) -> MigDevice:
    return MigDevice(
        index=v.integer(element.findtext("index")),
        gpu_instance_id=v.integer(element.findtext("gpu_instance_id")),
        compute_instance_id=v.integer(element.findtext("compute_instance_id")),
        sm_count=v.integer(element.findtext("device_attributes/shared/multiprocessor_count")),
        memory_total_mib=v.mib(element.findtext("fb_memory_usage/total")),
        memory_used_mib=v.mib(element.findtext("fb_memory_usage/used")),
    )


def _process(element: ET.Element) -> GpuProcess:
    return GpuProcess(
        pid=v.integer(element.findtext("pid")),
        name=v.text(element.findtext("process_name")),
        type=v.text(element.findtext("type")),
        used_memory_mib=v.mib(element.findtext("used_memory")),
    )

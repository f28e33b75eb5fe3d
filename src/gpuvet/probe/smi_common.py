"""One GPU's facts from an `nvidia-smi -q` report, whichever form it was captured in.

The XML (`-q -x`) and text (`-q`) reports carry the same values under different names, and each
has changed names over driver generations (power_readings -> gpu_power_readings,
clocks_throttle_reasons -> clocks_event_reasons, ...). Each format module gives a table from our
canonical keys to its own paths, oldest names last; this module turns the values into facts once.
"""

from __future__ import annotations

from typing import Callable, Mapping, Protocol

from ..facts import REMAP_LEVELS, Ecc, Fabric, Gpu, PcieLink
from . import values as v


class Report(Protocol):
    def value(self, path: str) -> str | None:
        """Raw text at `path` ("a/b/c", case-insensitive), or None when absent."""


Paths = dict[str, tuple[str, ...]]

# Clock-event reasons in the order the reports list them (and Clocks.event_reasons keeps);
# facts.CLOCK_EVENT_REASONS has the same names in NVML's bit order.
REASON_KEYS = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "display_clock_setting",
)


# Counters each format names per reason, per histogram level and per ECC scope.
EVENT_TIME_REASONS = ("sw_power_cap", "sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
ECC_SCOPES = ("volatile", "aggregate")


def counter_paths(
    event_time: Callable[[str], str],
    remap_bank: Callable[[str], str],
    ecc: Callable[[str, str], str],
    ecc_leaves: Mapping[str, tuple[str, ...]],
) -> Paths:
    """The keys for those counters, at the path a format gives each one: `event_time(reason)`,
    `remap_bank(level)`, and `ecc(scope, leaf)` for each leaf that `ecc_leaves` lists under a key
    ("corrected_parts", "uncorrected_parts", "single_bit_total", "double_bit_total").
    Kept here so that a reason or level added once is read from every format."""
    paths: Paths = {"event_time_" + name: (event_time(name),) for name in EVENT_TIME_REASONS}
    paths.update({"remap_bank_" + level: (remap_bank(level),) for level in REMAP_LEVELS})
    for scope in ECC_SCOPES:
        paths.update({f"{scope}_{key}": tuple(ecc(scope, leaf) for leaf in leaves) for key, leaves in ecc_leaves.items()})
    return paths


class Reader:
    """Looks canonical keys up in a report and keeps the reason when a value is missing."""

    def __init__(self, report: Report, paths: Paths, gpu: Gpu):
        self.report, self.paths, self.gpu = report, paths, gpu

    def raw(self, key: str) -> str | None:
        found = None
        for path in self.paths.get(key, ()):
            raw = self.report.value(path)
            if raw is None:
                continue
            if v.missing_reason(raw) is None:
                return raw
            found = found or raw  # keep the first "N/A"-like answer for its reason
        return found

    def get(self, key: str, field: str, convert: Callable[[str | None], object] = v.text):
        raw = self.raw(key)
        value = convert(raw)
        if value is None and raw is not None:
            reason = v.missing_reason(raw)
            if reason and reason not in ("nvidia-smi reported N/A", "none", "empty in capture"):
                self.gpu.unavailable[field] = reason
        return value


def build_gpu(index: int, report: Report, paths: Paths) -> Gpu:
    gpu = Gpu(index=index)
    r = Reader(report, paths, gpu)
    gpu.name = r.get("name", "name")
    gpu.brand = r.get("brand", "brand")
    gpu.architecture = r.get("architecture", "architecture")
    gpu.uuid = r.get("uuid", "uuid")
    gpu.serial = r.get("serial", "serial")
    gpu.vbios = r.get("vbios", "vbios")
    gpu.compute_capability = r.get("compute_capability", "compute_capability")
    gpu.persistence_mode = v.flag(r.raw("persistence"))
    gpu.compute_mode = r.get("compute_mode", "compute_mode")
    gpu.pstate = v.pstate(r.raw("pstate"))
    gpu.driver_model = r.get("driver_model", "driver_model")
    gpu.utilization_pct = r.get("utilization", "utilization_pct", v.integer)
    gpu.virtualization_mode = v.virtualization_mode(r.raw("virtualization"))
    gpu.mig_enabled = v.flag(r.raw("mig_current"))
    gpu.mig_pending = v.flag(r.raw("mig_pending"))
    gpu.memory_total_mib = r.get("memory_total", "memory_total_mib", v.mib)
    gpu.memory_used_mib = r.get("memory_used", "memory_used_mib", v.mib)
    gpu.memory_reserved_mib = r.get("memory_reserved", "memory_reserved_mib", v.mib)
    _power(r, gpu)
    _pcie(r, gpu)
    _clocks(r, gpu)
    _thermal(r, gpu)
    gpu.ecc = _ecc(r)
    _health_signals(r, gpu)
    return gpu


def _health_signals(r: Reader, gpu: Gpu) -> None:
    """What newer reports add for fleet health: the recovery action the driver asks for, the
    NVSwitch fabric registration, time spent under each clock-event reason, spare rows per bank."""
    gpu.recovery_action = v.text(r.raw("recovery_action"))
    state, status = v.text(r.raw("fabric_state")), v.text(r.raw("fabric_status"))
    if state or status:  # "N/A" on GPUs without an NVSwitch fabric: no Fabric at all
        gpu.fabric = Fabric(state=state, status=status, health=v.text(r.raw("fabric_health")))
    times = {name: v.number(r.raw("event_time_" + name)) for name in EVENT_TIME_REASONS}
    if any(t is not None for t in times.values()):
        gpu.clock_event_time_us = {name: t for name, t in times.items() if t is not None}
    banks = {level: v.integer(r.raw("remap_bank_" + level)) for level in REMAP_LEVELS}
    if any(b is not None for b in banks.values()):
        gpu.remap_histogram = {level: b for level, b in banks.items() if b is not None}


def _power(r: Reader, gpu: Gpu) -> None:
    p = gpu.power
    p.draw_w = r.get("power_draw", "power.draw_w", v.number)
    p.limit_w = r.get("power_limit", "power.limit_w", v.number)
    p.enforced_limit_w = r.get("power_enforced", "power.enforced_limit_w", v.number)
    p.default_limit_w = r.get("power_default", "power.default_limit_w", v.number)
    p.min_limit_w = r.get("power_min", "power.min_limit_w", v.number)
    p.max_limit_w = r.get("power_max", "power.max_limit_w", v.number)
    if p.enforced_limit_w is None:  # very old reports print only "Power Limit"
        p.enforced_limit_w = p.limit_w


def _pcie(r: Reader, gpu: Gpu) -> None:
    pcie = gpu.pcie
    pcie.bus_id = v.bus_id(r.raw("bus_id"))
    link = PcieLink(
        current_gen=r.get("pcie_gen_current", "pcie.current_gen", v.integer),
        max_gen=r.get("pcie_gen_max", "pcie.max_gen", v.integer),
        current_width=r.get("pcie_width_current", "pcie.current_width", v.integer),
        max_width=r.get("pcie_width_max", "pcie.max_width", v.integer),
        source="nvidia-smi",
    )
    if any(x is not None for x in (link.current_gen, link.max_gen, link.current_width, link.max_width)):
        pcie.readings.append(link)
    pcie.device_max_gen = r.get("pcie_gen_device_max", "pcie.device_max_gen", v.integer)
    pcie.host_max_gen = r.get("pcie_gen_host_max", "pcie.host_max_gen", v.integer)
    pcie.replay_count = r.get("pcie_replays", "pcie.replay_count", v.integer)


def _clocks(r: Reader, gpu: Gpu) -> None:
    c = gpu.clocks
    c.sm_mhz = r.get("clock_sm", "clocks.sm_mhz", v.integer)
    c.graphics_mhz = r.get("clock_graphics", "clocks.graphics_mhz", v.integer)
    c.memory_mhz = r.get("clock_memory", "clocks.memory_mhz", v.integer)
    c.max_sm_mhz = r.get("clock_max_sm", "clocks.max_sm_mhz", v.integer)
    c.max_graphics_mhz = r.get("clock_max_graphics", "clocks.max_graphics_mhz", v.integer)
    c.max_memory_mhz = r.get("clock_max_memory", "clocks.max_memory_mhz", v.integer)
    c.applications_graphics_mhz = r.get("clock_app_graphics", "clocks.applications_graphics_mhz", v.integer)
    c.default_applications_graphics_mhz = r.get(
        "clock_default_app_graphics", "clocks.default_applications_graphics_mhz", v.integer
    )
    states = {name: v.flag(r.raw("reason_" + name)) for name in REASON_KEYS}
    if any(state is not None for state in states.values()):
        c.event_reasons = [name for name, active in states.items() if active]


def fan_speeds(gpu: Gpu, raw: str | None) -> None:
    """Thermal.fan_pct from what nvidia-smi printed for the fan (one value: its first fan): a speed;
    ERR! or "Unknown Error", a fan whose reading failed (None in the list); N/A or Not Supported, no
    fan of its own (passively cooled), said in unavailable."""
    if raw is None:
        return
    pct = v.integer(raw)
    if pct is not None:
        gpu.thermal.fan_pct = [pct]
        return
    reason = v.missing_reason(raw) or f"nvidia-smi printed {raw.strip()[:20]}"
    if raw.strip() == "ERR!" or "error" in reason:
        gpu.thermal.fan_pct = [None]
    gpu.unavailable["thermal.fan_pct"] = reason


def _thermal(r: Reader, gpu: Gpu) -> None:
    t = gpu.thermal
    fan_speeds(gpu, r.raw("fan_speed"))
    t.gpu_c = r.get("temp_gpu", "thermal.gpu_c", v.number)
    t.memory_c = r.get("temp_memory", "thermal.memory_c", v.number)
    t.slowdown_c = r.get("temp_slowdown", "thermal.slowdown_c", v.number)
    t.shutdown_c = r.get("temp_shutdown", "thermal.shutdown_c", v.number)
    t.max_operating_c = r.get("temp_max_operating", "thermal.max_operating_c", v.number)
    if t.gpu_c is not None and t.slowdown_c is not None:
        t.slowdown_margin_c = t.slowdown_c - t.gpu_c
        return
    # Newer drivers report degrees below the limit (T.Limit) and thresholds relative to it:
    # "GPU T.Limit Temp: 26 C", "GPU Slowdown T.Limit Temp: -2 C" -> 28 degrees to slowdown.
    tlimit = v.number(r.raw("temp_tlimit"))
    slowdown_offset = v.number(r.raw("temp_slowdown_tlimit"))
    if tlimit is not None:
        t.slowdown_margin_c = tlimit - (slowdown_offset or 0.0)


def _ecc(r: Reader) -> Ecc:
    e = Ecc()
    e.enabled = v.flag(r.raw("ecc_current")) if v.text(r.raw("ecc_current")) else None
    e.pending_enabled = v.flag(r.raw("ecc_pending")) if v.text(r.raw("ecc_pending")) else None
    for scope in ECC_SCOPES:
        corrected = _sum(r, f"{scope}_corrected_parts")
        if corrected is None:
            corrected = v.integer(r.raw(f"{scope}_single_bit_total"))
        uncorrected = _sum(r, f"{scope}_uncorrected_parts")
        if uncorrected is None:
            uncorrected = v.integer(r.raw(f"{scope}_double_bit_total"))
        setattr(e, f"{scope}_corrected", corrected)
        setattr(e, f"{scope}_uncorrected", uncorrected)
    e.retired_pages_sbe = v.integer(r.raw("retired_sbe"))
    e.retired_pages_dbe = v.integer(r.raw("retired_dbe"))
    e.retired_pages_pending = v.flag(r.raw("retired_pending"))
    e.remapped_rows_correctable = v.integer(r.raw("remap_correctable"))
    e.remapped_rows_uncorrectable = v.integer(r.raw("remap_uncorrectable"))
    e.remapped_rows_pending = v.flag(r.raw("remap_pending"))
    e.remapped_rows_failure = v.flag(r.raw("remap_failure"))
    return e


def _sum(r: Reader, key: str) -> int | None:
    """Sum of the counters listed under `key` (SRAM + DRAM ...), None when none is present."""
    read = [v.integer(r.report.value(path)) for path in r.paths.get(key, ())]
    numbers = [n for n in read if n is not None]
    return sum(numbers) if numbers else None

"""An NVML that answers from one real `nvidia-smi -q -x` capture: a testing and demonstration aid.

nvidia-smi builds its XML report from NVML calls, so a capture of a real machine holds most of
what gpuvet's live backend asks NVML (probe.nvml, the telemetry sampler, watch, the exporter).
`GPUVET_NVML_REPLAY=FILE` makes those live paths run against this stand-in for nvidia-ml-py
(pynvml) instead of the driver: one device per `<gpu>`, values in NVML's units and enums (mW,
bytes, clock-event bit masks, PCIe generations, mode enums), and the NVML error a driver raises
where the capture says N/A or Not Supported (a value the capture does not hold at all raises
NotSupported too: a replay cannot know it). Constants, structures and the NVMLError classes are
the real nvidia-ml-py ones, so error codes and `except pynvml.NVMLError_...` behave as live.

Off unless the variable is set. Facts read through it are marked `replay: FILE` in the record,
never as a live reading of this machine.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from types import ModuleType, SimpleNamespace
from typing import Any, Callable, NoReturn

import pynvml as real

from ..facts import CLOCK_EVENT_REASONS, REMAP_LEVELS
from . import nvml_names
from ..untrusted_text import clean_document, quote
from . import values as v
from .bounded_read import read_bounded
from .errors import CaptureError
from .smi_xml import PATHS, load_xml, looks_like_smi_xml

ENVIRONMENT = "GPUVET_NVML_REPLAY"
_MIB = 1024 * 1024

# What nvidia-smi printed -> the NVML return code behind it.
_ERRORS = {
    "insufficient permissions": real.NVML_ERROR_NO_PERMISSION,
    "unknown error": real.NVML_ERROR_UNKNOWN,
    "gpu requires reset": real.NVML_ERROR_RESET_REQUIRED,
    "gpu is lost": real.NVML_ERROR_GPU_IS_LOST,
}


def replay_file() -> str | None:
    """The capture named by GPUVET_NVML_REPLAY, or None when the replay is off."""
    return os.environ.get(ENVIRONMENT) or None


def _refuse(code: int = real.NVML_ERROR_NOT_SUPPORTED) -> NoReturn:
    raise real.NVMLError(code)


def _raw(element: ET.Element | None, *paths: str) -> str:
    """The text at the first of `paths` that holds a value; raises the NVML error for what the
    capture printed instead (N/A, Not Supported, Insufficient Permissions...) or for no element."""
    printed = None
    for path in paths:
        found = element.find(path) if element is not None else None
        if found is None or len(found):
            continue
        text = (found.text or "").strip()
        if v.missing_reason(text) is None or text.lower() == "none":  # "None" is a value (no virtualization)
            return text
        printed = printed or text
    word = (printed or "").strip("[] ").lower()
    _refuse(_ERRORS.get(word, real.NVML_ERROR_NOT_SUPPORTED))


def _int(element: ET.Element | None, *paths: str) -> int:
    value = v.integer(_raw(element, *paths))
    if value is None:
        _refuse(real.NVML_ERROR_UNKNOWN)
    return value


def _milliwatts(element: ET.Element, *names: str) -> int:
    paths = [f"{section}/{name}" for section in ("gpu_power_readings", "power_readings") for name in names]
    watts = v.number(_raw(element, *paths))
    if watts is None:  # a word nvidia-smi prints for a failed reading ("ERR!"), as _int refuses it
        _refuse(real.NVML_ERROR_UNKNOWN)
    return int(round(watts * 1000))


def _bytes(element: ET.Element, path: str) -> int:
    value = v.mib(_raw(element, path))
    if value is None:
        _refuse(real.NVML_ERROR_UNKNOWN)
    return value * _MIB


def _enabled(element: ET.Element, *paths: str) -> int:
    state = v.flag(_raw(element, *paths))
    if state is None:
        _refuse(real.NVML_ERROR_UNKNOWN)
    return int(state)


def _code(names: dict[int, str], word: str) -> int:
    code = nvml_names.code_of(names, word)
    if code is None:
        _refuse(real.NVML_ERROR_UNKNOWN)
    return code


def _enum(element: ET.Element, names: dict[int, str], *paths: str) -> int:
    return _code(names, _raw(element, *paths))


def _getter(read: Callable[..., Any], *args: Any) -> Callable[[Any, Device | MigDevice], Any]:
    """An NVML call that takes only a handle and answers `read(handle's element, *args)`."""
    def get(self: Any, h: Device | MigDevice) -> Any:
        return read(h.element, *args)
    return get


class Device:
    """One `<gpu>` of the capture: the handle NVML calls take."""

    def __init__(self, element: ET.Element):
        self.element = element
        self.mig_devices = [MigDevice(m) for m in element.findall("mig_devices/mig_device")]


class MigDevice:
    def __init__(self, element: ET.Element):
        self.element = element


_CLOCKS = {real.NVML_CLOCK_GRAPHICS: "graphics_clock", real.NVML_CLOCK_SM: "sm_clock",
           real.NVML_CLOCK_MEM: "mem_clock", real.NVML_CLOCK_VIDEO: "video_clock"}
_THRESHOLDS = {
    real.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: "gpu_temp_max_threshold",
    real.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: "gpu_temp_slow_threshold",
    real.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: "gpu_temp_max_mem_threshold",
    real.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: "gpu_temp_max_gpu_threshold",
}
# Where the report keeps what the parser reads too (smi_xml.PATHS): each clock-event reason bit's
# flag, and the v13 report's time under each reason (us) behind nvmlDeviceGetViolationStatus's policies.
_REASON_PATHS = {bit: PATHS["reason_" + name] for bit, name in CLOCK_EVENT_REASONS.items()}
_VIOLATION_COUNTERS = {real.NVML_PERF_POLICY_POWER: "sw_power_cap", real.NVML_PERF_POLICY_THERMAL: "sw_thermal_slowdown",
                       real.NVML_PERF_POLICY_SYNC_BOOST: "sync_boost"}
_LINK = "pci/pci_gpu_link_info"


def _event_time_us(element: ET.Element | None, reason: str) -> int:
    return _int(element, *PATHS["event_time_" + reason])


def _event_time_ns(reason: str) -> Callable[[ET.Element], tuple[str, int]]:
    return lambda e: ("ullVal", _event_time_us(e, reason) * 1000)  # nvidia-smi prints us


# Field ids by name: an older nvidia-ml-py (the declared floor) lacks the newer ones, whose calls
# then find no reader and answer NotSupported, as they would from that library.
_FIELD_READERS: dict[str, Callable[[ET.Element], tuple[str, int]]] = {
    "NVML_FI_DEV_MEMORY_TEMP": lambda e: ("uiVal", _int(e, *PATHS["temp_memory"])),
    "NVML_FI_DEV_POWER_AVERAGE": lambda e: ("uiVal", _milliwatts(e, "average_power_draw")),
    "NVML_FI_DEV_POWER_INSTANT": lambda e: ("uiVal", _milliwatts(e, "instant_power_draw")),
    "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION": lambda e: ("uiVal", _enum(e, nvml_names.RECOVERY_ACTIONS, "gpu_recovery_action")),
    **{field: _event_time_ns(reason) for reason, field in nvml_names.EVENT_TIME_FIELDS.items()},
}
_FIELDS: dict[int, Callable[[ET.Element], tuple[str, int]]] = {
    getattr(real, name): read for name, read in _FIELD_READERS.items() if hasattr(real, name)
}


class Replay(ModuleType):
    """A stand-in for the pynvml module, answering from one capture. Names it does not define
    (constants, structures, NVMLError classes) are the real module's; an NVML function it does
    not know raises NotSupported, as a driver without the feature does."""

    def __init__(self, path: str, text: str):
        super().__init__("pynvml")
        self.replay_file = path
        root = load_xml(text)  # the one hardened loader `inspect` reads the same capture with
        self.root = root
        self.devices = [Device(g) for g in root.findall("gpu")]
        self.names_by_pid = {
            v.integer(p.findtext("pid")): v.text(p.findtext("process_name"))
            for p in root.iterfind("gpu/processes/process_info")
        }

    def __getattr__(self, name: str) -> Any:
        value = getattr(real, name)
        if name.startswith("nvml") and callable(value) and not isinstance(value, type):
            return lambda *args, **kwargs: _refuse()
        return value

    # -- library and system ------------------------------------------------------------------
    def nvmlInit(self) -> None:
        return None

    def nvmlShutdown(self) -> None:
        return None

    def nvmlSystemGetDriverVersion(self) -> str:
        return _raw(self.root, "driver_version")

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        major, _, minor = _raw(self.root, "cuda_version").partition(".")
        if not (major.isdigit() and minor.isdigit()):
            _refuse(real.NVML_ERROR_UNKNOWN)
        return int(major) * 1000 + int(minor) * 10

    nvmlSystemGetCudaDriverVersion_v2 = nvmlSystemGetCudaDriverVersion

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        name = self.names_by_pid.get(pid)
        if name is None:
            _refuse(real.NVML_ERROR_NOT_FOUND)
        return name

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Device:
        if not 0 <= index < len(self.devices):
            _refuse(real.NVML_ERROR_INVALID_ARGUMENT)
        return self.devices[index]

    # -- identity and modes -------------------------------------------------------------------
    nvmlDeviceGetName = _getter(_raw, "product_name")
    nvmlDeviceGetUUID = _getter(_raw, "uuid")
    nvmlDeviceGetSerial = _getter(_raw, "serial")
    nvmlDeviceGetVbiosVersion = _getter(_raw, "vbios_version")
    nvmlDeviceGetBrand = _getter(_enum, nvml_names.BRANDS, "product_brand")
    nvmlDeviceGetArchitecture = _getter(_enum, nvml_names.ARCHITECTURES, "product_architecture")
    nvmlDeviceGetMinorNumber = _getter(_int, "minor_number")
    nvmlDeviceGetPersistenceMode = _getter(_enabled, "persistence_mode")
    nvmlDeviceGetComputeMode = _getter(_enum, nvml_names.COMPUTE_MODES, "compute_mode")

    def nvmlDeviceGetPerformanceState(self, h: Device) -> int:
        state = v.pstate(_raw(h.element, "performance_state"))
        return real.NVML_PSTATE_UNKNOWN if state is None else state

    nvmlDeviceGetPowerState = nvmlDeviceGetPerformanceState

    def nvmlDeviceGetVirtualizationMode(self, h: Device) -> int:
        word = v.virtualization_mode(_raw(h.element, *PATHS["virtualization"]))
        return _code(nvml_names.VIRTUALIZATION_MODES, word or "")

    def nvmlDeviceGetDriverModel(self, h: Device) -> list[int]:
        return [_enum(h.element, nvml_names.DRIVER_MODELS, f"driver_model/{which}_dm")
                for which in ("current", "pending")]

    nvmlDeviceGetDriverModel_v2 = nvmlDeviceGetDriverModel

    def nvmlDeviceGetUtilizationRates(self, h: Device) -> SimpleNamespace:
        return SimpleNamespace(gpu=_int(h.element, *PATHS["utilization"]),
                               memory=_int(h.element, "utilization/memory_util"))

    # -- memory -------------------------------------------------------------------------------
    def nvmlDeviceGetMemoryInfo(self, h: Device | MigDevice, version: Any = None) -> SimpleNamespace:
        e = h.element
        total, used, free = (_bytes(e, f"fb_memory_usage/{k}") for k in ("total", "used", "free"))
        if version:  # v2: reserved apart, as nvidia-smi shows it (drivers 510+ print <reserved>)
            return SimpleNamespace(version=version, total=total, reserved=_bytes(e, PATHS["memory_reserved"][0]),
                                   free=free, used=used)
        try:  # v1 counts the driver's reserve as used
            used += _bytes(e, PATHS["memory_reserved"][0])
        except real.NVMLError:
            pass
        return SimpleNamespace(total=total, free=free, used=used)

    # -- MIG ----------------------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, h: Device) -> list[int]:
        return [_enabled(h.element, *PATHS["mig_current"]), _enabled(h.element, *PATHS["mig_pending"])]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Device) -> int:
        self.nvmlDeviceGetMigMode(h)
        return len(h.mig_devices)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Device, index: int) -> MigDevice:
        if not 0 <= index < len(h.mig_devices):
            _refuse(real.NVML_ERROR_NOT_FOUND)
        return h.mig_devices[index]

    nvmlDeviceGetGpuInstanceId = _getter(_int, "gpu_instance_id")
    nvmlDeviceGetComputeInstanceId = _getter(_int, "compute_instance_id")

    def nvmlDeviceGetAttributes(self, mh: MigDevice) -> SimpleNamespace:
        return SimpleNamespace(multiprocessorCount=_int(mh.element, "device_attributes/shared/multiprocessor_count"))

    # -- processes ----------------------------------------------------------------------------
    def _processes(self, h: Device, kind: str) -> list[SimpleNamespace]:
        section = h.element.find("processes")
        if section is None:
            _refuse()
        found = []
        for p in section.findall("process_info"):
            if kind not in (v.text(p.findtext("type")) or ""):
                continue
            used = v.mib(p.findtext("used_memory"))
            found.append(SimpleNamespace(
                pid=v.integer(p.findtext("pid")),
                usedGpuMemory=None if used is None else used * _MIB,  # None: WDDM, as pynvml gives it
                gpuInstanceId=v.integer(p.findtext("gpu_instance_id")),
                computeInstanceId=v.integer(p.findtext("compute_instance_id")),
            ))
        return found

    def nvmlDeviceGetComputeRunningProcesses(self, h: Device) -> list[SimpleNamespace]:
        return self._processes(h, "C")

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: Device) -> list[SimpleNamespace]:
        return self._processes(h, "G")

    nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses
    nvmlDeviceGetGraphicsRunningProcesses_v3 = nvmlDeviceGetGraphicsRunningProcesses

    # -- power --------------------------------------------------------------------------------
    nvmlDeviceGetPowerUsage = _getter(_milliwatts, "average_power_draw", "power_draw", "instant_power_draw")
    nvmlDeviceGetPowerManagementLimit = _getter(_milliwatts, "requested_power_limit", "power_limit")
    nvmlDeviceGetEnforcedPowerLimit = _getter(_milliwatts, "current_power_limit", "enforced_power_limit")
    nvmlDeviceGetPowerManagementDefaultLimit = _getter(_milliwatts, "default_power_limit")

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: Device) -> list[int]:
        return [_milliwatts(h.element, "min_power_limit"), _milliwatts(h.element, "max_power_limit")]

    def nvmlDeviceGetViolationStatus(self, h: Device, policy: int) -> SimpleNamespace:
        name = _VIOLATION_COUNTERS.get(policy)
        if name is None:
            _refuse()
        return SimpleNamespace(referenceTime=0, violationTime=_event_time_us(h.element, name) * 1000)

    # -- PCIe ---------------------------------------------------------------------------------
    def nvmlDeviceGetPciInfo(self, h: Device) -> SimpleNamespace:
        bus = h.element.findtext(PATHS["bus_id"][0]) or h.element.get("id")
        if not bus:
            _refuse()
        return SimpleNamespace(busId=bus, busIdLegacy=bus, pciDeviceId=v.hex_or_int("0x" + (h.element.findtext("pci/pci_device_id") or "0")))

    nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo

    nvmlDeviceGetCurrPcieLinkGeneration = _getter(_int, f"{_LINK}/pcie_gen/current_link_gen")
    nvmlDeviceGetMaxPcieLinkGeneration = _getter(_int, f"{_LINK}/pcie_gen/max_link_gen")
    nvmlDeviceGetGpuMaxPcieLinkGeneration = _getter(_int, f"{_LINK}/pcie_gen/max_device_link_gen")
    nvmlDeviceGetCurrPcieLinkWidth = _getter(_int, f"{_LINK}/link_widths/current_link_width")
    nvmlDeviceGetMaxPcieLinkWidth = _getter(_int, f"{_LINK}/link_widths/max_link_width")
    nvmlDeviceGetPcieReplayCounter = _getter(_int, *PATHS["pcie_replays"])

    def nvmlDeviceGetPcieThroughput(self, h: Device, counter: int) -> int:
        tag = {real.NVML_PCIE_UTIL_TX_BYTES: "tx_util", real.NVML_PCIE_UTIL_RX_BYTES: "rx_util"}.get(counter)
        if tag is None:
            _refuse(real.NVML_ERROR_INVALID_ARGUMENT)
        return _int(h.element, f"pci/{tag}")  # KB/s, as both print it

    # -- clocks -------------------------------------------------------------------------------
    def _clock(self, h: Device, section: str, clock: int) -> int:
        tag = _CLOCKS.get(clock)
        if tag is None:
            _refuse(real.NVML_ERROR_INVALID_ARGUMENT)
        return _int(h.element, f"{section}/{tag}")

    def nvmlDeviceGetClockInfo(self, h: Device, clock: int) -> int:
        return self._clock(h, "clocks", clock)

    def nvmlDeviceGetMaxClockInfo(self, h: Device, clock: int) -> int:
        return self._clock(h, "max_clocks", clock)

    def nvmlDeviceGetApplicationsClock(self, h: Device, clock: int) -> int:
        return self._clock(h, "applications_clocks", clock)

    def nvmlDeviceGetDefaultApplicationsClock(self, h: Device, clock: int) -> int:
        return self._clock(h, "default_applications_clocks", clock)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Device) -> int:
        mask, known = 0, False
        for bit, paths in _REASON_PATHS.items():
            try:
                state = _raw(h.element, *paths)
            except real.NVMLError:
                continue
            known = True
            mask |= bit if v.flag(state) else 0
        if not known:
            _refuse()
        return mask

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

    # -- thermal ------------------------------------------------------------------------------
    def nvmlDeviceGetTemperature(self, h: Device, sensor: int) -> int:
        if sensor != real.NVML_TEMPERATURE_GPU:
            _refuse(real.NVML_ERROR_INVALID_ARGUMENT)
        return _int(h.element, *PATHS["temp_gpu"])

    def nvmlDeviceGetTemperatureV(self, h: Device, sensor: int, version: Any = None) -> int:
        return self.nvmlDeviceGetTemperature(h, sensor)

    def nvmlDeviceGetNumFans(self, h: Device) -> int:
        """The capture prints one fan speed (its first fan's): one fan where it printed a speed or a
        failed reading (ERR!, Unknown Error); a passive GPU's N/A is NVML's NotSupported."""
        try:
            _raw(h.element, *PATHS["fan_speed"])
        except real.NVMLError as err:
            if getattr(err, "value", None) == real.NVML_ERROR_NOT_SUPPORTED:
                raise
        return 1

    def nvmlDeviceGetFanSpeed_v2(self, h: Device, fan: int) -> int:
        if fan != 0:
            _refuse(real.NVML_ERROR_INVALID_ARGUMENT)
        return _int(h.element, *PATHS["fan_speed"])

    def nvmlDeviceGetTemperatureThreshold(self, h: Device, threshold: int) -> int:
        tag = _THRESHOLDS.get(threshold)
        if tag is None:
            _refuse()
        return _int(h.element, f"temperature/{tag}")

    nvmlDeviceGetMarginTemperature = _getter(_int, *PATHS["temp_tlimit"])

    def nvmlDeviceGetFieldValues(self, h: Device, field_ids: list[Any]) -> Any:
        values = (real.c_nvmlFieldValue_t * len(field_ids))()
        for slot, field_id in zip(values, field_ids):
            fid, scope = field_id if isinstance(field_id, tuple) else (field_id, 0)
            slot.fieldId, slot.scopeId = fid, scope
            read = _FIELDS.get(fid)
            try:
                if read is None:
                    _refuse()
                kind, value = read(h.element)
                setattr(slot.value, kind, value)
                slot.nvmlReturn = real.NVML_SUCCESS
            except real.NVMLError as err:
                slot.nvmlReturn = err.value
        return values

    # -- ECC and memory health ----------------------------------------------------------------
    def nvmlDeviceGetEccMode(self, h: Device) -> list[int]:
        return [_enabled(h.element, *PATHS["ecc_current"]), _enabled(h.element, *PATHS["ecc_pending"])]

    def nvmlDeviceGetTotalEccErrors(self, h: Device, error_type: int, counter_type: int) -> int:
        scope = "volatile" if counter_type == real.NVML_VOLATILE_ECC else "aggregate"
        if error_type == real.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            parts, total = PATHS[f"{scope}_corrected_parts"], PATHS[f"{scope}_single_bit_total"]
        else:
            parts, total = PATHS[f"{scope}_uncorrected_parts"], PATHS[f"{scope}_double_bit_total"]
        read = [v.integer(h.element.findtext(path)) for path in parts]
        numbers = [n for n in read if n is not None]
        return sum(numbers) if numbers else _int(h.element, *total)

    def nvmlDeviceGetRetiredPages(self, h: Device, cause: int) -> list[int]:
        section = ("retired_pages/multiple_single_bit_retirement"
                   if cause == real.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
                   else "retired_pages/double_bit_retirement")
        count = _int(h.element, f"{section}/retired_count")
        listed = [v.hex_or_int(a.text) for a in h.element.iterfind(f"{section}/retired_pagelist/*")]
        addresses = [a for a in listed if a is not None]
        return addresses if len(addresses) == count else list(range(count))  # the count is what a capture always has

    nvmlDeviceGetRetiredPagesPendingStatus = _getter(_enabled, *PATHS["retired_pending"])

    def nvmlDeviceGetRowRemapperHistogram(self, h: Device) -> SimpleNamespace:
        return SimpleNamespace(**{level: _int(h.element, *PATHS["remap_bank_" + level]) for level in REMAP_LEVELS})

    def nvmlDeviceGetGpuFabricInfo(self, h: Device, info: Any) -> int:
        """Fills nvidia-ml-py's c_nvmlGpuFabricInfo_t (passed by reference) from <fabric>."""
        state = _enum(h.element, nvml_names.FABRIC_STATES, *PATHS["fabric_state"])
        target = getattr(info, "_obj", info)  # ctypes.byref(...) keeps the structure in _obj
        target.state = state
        status = (h.element.findtext(PATHS["fabric_status"][0]) or "").strip()
        target.status = real.NVML_SUCCESS if status.lower() in ("success", "", "n/a") else real.NVML_ERROR_UNKNOWN
        return real.NVML_SUCCESS

    def nvmlDeviceGetRemappedRows(self, h: Device) -> tuple[int, int, int, int]:
        base = "remapped_rows"
        return (_int(h.element, f"{base}/remapped_row_corr"), _int(h.element, f"{base}/remapped_row_unc"),
                _enabled(h.element, f"{base}/remapped_row_pending"), _enabled(h.element, f"{base}/remapped_row_failure"))

    def nvmlDeviceGetGridLicensableFeatures(self, h: Device) -> Any:
        """nvidia-ml-py's c_nvmlGridLicensableFeatures_v4_t from <vgpu_software_licensed_product>:
        one feature, licensed when its status says "Licensed". The capture names the product, not
        NVML's feature code: the code is left UNKNOWN rather than guessed."""
        status = _raw(h.element, "vgpu_software_licensed_product/license_status")
        product = h.element.findtext("vgpu_software_licensed_product/licensed_product_name") or ""
        licence = real.c_nvmlGridLicensableFeatures_v4_t()
        licence.isGridLicenseSupported = 1
        licence.licensableFeaturesCount = 1
        feature = licence.gridLicensableFeatures[0]
        feature.featureCode = real.NVML_GRID_LICENSE_FEATURE_CODE_UNKNOWN
        feature.featureState = 1 if status.strip().lower().startswith("licensed") else 0
        feature.productName = product.strip().encode()[:127]
        return licence

    nvmlDeviceGetGridLicensableFeatures_v4 = nvmlDeviceGetGridLicensableFeatures


def load(path: str) -> Replay:
    """The replay of the `nvidia-smi -q -x` capture at `path`; CaptureError when it is not one."""
    try:  # bounded like every capture: /dev/zero or a FIFO without a writer is one line, not a hang
        text = clean_document(read_bounded(path).decode("utf-8", errors="replace"))
    except CaptureError as err:
        raise CaptureError(f"{ENVIRONMENT}={err}") from None
    if not looks_like_smi_xml(text.lstrip()):
        raise CaptureError(f"{ENVIRONMENT}={path}: not an `nvidia-smi -q -x` capture (the NVML replay needs one)")
    try:
        return Replay(path, text)
    except ET.ParseError as err:
        raise CaptureError(f"{ENVIRONMENT}={path}: broken XML ({quote(str(err), quotes=False)}); capture it again with `nvidia-smi -q -x`") from None

"""Live GPU facts from NVML (nvidia-ml-py), tolerant of every call a GPU or driver lacks.

A call that fails (NotSupported on a vGPU guest or MIG GPU, a function missing from an old
driver, no permission) leaves its field None and records why in `gpu.unavailable`; nothing here
raises past `collect()`.
"""

from __future__ import annotations

from typing import Any, Callable

from ..facts import (
    ECC_READ_FAILED,
    Driver,
    Gpu,
    GpuProcess,
    MigDevice,
    NvLink,
    PcieLink,
    Topology,
    reasons_from_mask,
)
from . import nvml_health, nvml_names
from .values import bus_id

try:  # nvidia-ml-py is a dependency, but a broken install must not stop the host checks
    import pynvml
except Exception as _err:  # pragma: no cover - only on broken installs
    pynvml = None
    _IMPORT_ERROR = f"nvidia-ml-py cannot be imported: {_err}"
else:
    _IMPORT_ERROR = ""

if pynvml is not None:
    from . import nvml_replay  # built on nvidia-ml-py's own constants and errors: only where it imports

    _REPLAY = nvml_replay.replay_file()
    if _REPLAY:
        # GPUVET_NVML_REPLAY: every NVML call of this process answers from a capture (a testing aid).
        try:
            pynvml = nvml_replay.load(_REPLAY)
        except Exception as _err:  # the CLI refuses a bad file up front; a library caller gets the reason
            pynvml, _IMPORT_ERROR = None, str(_err)


def replayed_from() -> str | None:
    """The capture NVML answers from (GPUVET_NVML_REPLAY), or None when NVML is the driver's."""
    return getattr(pynvml, "replay_file", None)

_MIB = 1024 * 1024


def error_reason(err: BaseException) -> str:
    """A short, human reason for a failed NVML call."""
    if pynvml is not None and isinstance(err, pynvml.NVMLError):
        code = getattr(err, "value", None)
        known = {
            pynvml.NVML_ERROR_NOT_SUPPORTED: "not supported on this GPU or driver",
            pynvml.NVML_ERROR_NO_PERMISSION: "no permission",
            pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: "this driver's NVML lacks the call (driver too old)",
            pynvml.NVML_ERROR_GPU_IS_LOST: "the GPU has fallen off the bus",
            pynvml.NVML_ERROR_NOT_FOUND: "not found",
            pynvml.NVML_ERROR_INVALID_ARGUMENT: "not present on this GPU",
        }
        return known.get(code, f"NVML error: {err}")
    return f"{type(err).__name__}: {err}"


def init_error() -> str | None:
    """Why NVML cannot start here (no driver, library mismatch...), or None when it can."""
    if pynvml is None:
        return _IMPORT_ERROR
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        return "no NVIDIA driver: the NVML library (libnvidia-ml.so.1) is not installed or not mounted into this container"
    except pynvml.NVMLError_DriverNotLoaded:
        return "the NVIDIA kernel driver is not loaded"
    except pynvml.NVMLError_LibRmVersionMismatch:
        return "driver/library version mismatch: the driver was upgraded without reloading its kernel module (reboot)"
    except pynvml.NVMLError_NoPermission:
        return "no permission to talk to the NVIDIA driver (/dev/nvidia* not accessible)"
    except Exception as err:  # NVML says many things; all of them mean "no GPU facts"
        return f"NVML could not start: {error_reason(err)}"
    return None


class Query:
    """Runs NVML calls for one GPU, keeping the reason of every failure, and which reads failed the
    way a GPU in trouble fails them (Unknown Error, fallen off the bus), not as "not supported"."""

    def __init__(self, gpu: Gpu):
        self.gpu = gpu
        self.broken: dict[str, str] = {}  # field -> reason, for reads that failed on a GPU in trouble

    def __call__(self, field: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as err:  # NVMLError, missing symbols in old nvidia-ml-py, ctypes errors
            self.gpu.unavailable.setdefault(field, error_reason(err))
            if _in_trouble(err):
                self.broken[field] = error_reason(err)
            return None


def _in_trouble(err: BaseException) -> bool:
    """An NVML failure that says something is wrong with the GPU (nvidia-smi prints it as "Unknown
    Error" or "GPU is lost"), not that the GPU or driver lacks the feature."""
    return pynvml is not None and isinstance(err, pynvml.NVMLError) and getattr(err, "value", None) in (
        pynvml.NVML_ERROR_UNKNOWN, pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_CORRUPTED_INFOROM)


def collect() -> tuple[Driver, list[Gpu], Topology | None, str | None]:
    """(driver, gpus, topology, error). Call only after init_error() returned None."""
    driver = Driver(
        version=_text(_safe(pynvml.nvmlSystemGetDriverVersion)),
        nvml_version=_text(_safe(pynvml.nvmlSystemGetNVMLVersion)),
    )
    cuda = _safe(pynvml.nvmlSystemGetCudaDriverVersion_v2) or _safe(pynvml.nvmlSystemGetCudaDriverVersion)
    if cuda:
        driver.cuda_version = f"{cuda // 1000}.{(cuda % 1000) // 10}"
    try:
        count = pynvml.nvmlDeviceGetCount()
    except Exception as err:
        return driver, [], None, f"NVML cannot count the GPUs: {error_reason(err)}"
    gpus, handles = [], []
    for index in range(count):
        gpu = Gpu(index=index)
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as err:
            gpu.unavailable["gpu"] = f"cannot open GPU {index}: {error_reason(err)}"
            gpus.append(gpu)
            continue
        _fill(gpu, handle)
        gpus.append(gpu)
        handles.append((gpu, handle))
    return driver, gpus, _topology(handles), None


def shutdown() -> None:
    _safe(pynvml.nvmlShutdown)


def _memory_info(handle):
    """NVML's v2 memory info (drivers 510+), as nvidia-smi shows it: "used" without the driver's
    reserve, which v1 counts as used (up to ~0.9 GiB on an 80 GB card: it would look like a
    process nobody lists). None where v2 is not supported: the caller falls back to v1."""
    version = getattr(pynvml, "nvmlMemory_v2", None)
    if version is None:
        return None
    try:
        return pynvml.nvmlDeviceGetMemoryInfo(handle, version=version)
    except (pynvml.NVMLError, TypeError, AttributeError):
        return None


def _safe(fn: Callable[..., Any] | None, *args: Any) -> Any:
    """fn(*args), or None when fn is missing (an older nvidia-ml-py) or raises."""
    if fn is None:
        return None
    try:
        return fn(*args)
    except Exception:
        return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _enum_name(names: dict[int, str], value: Any) -> str | None:
    """The word nvidia-smi prints for an NVML enum value (a value it has no word for: None)."""
    return None if value is None else names.get(value)


def _fill(gpu: Gpu, h: Any) -> None:
    q = Query(gpu)
    gpu.name = _text(q("name", pynvml.nvmlDeviceGetName, h))
    gpu.uuid = _text(q("uuid", pynvml.nvmlDeviceGetUUID, h))
    gpu.serial = _text(q("serial", pynvml.nvmlDeviceGetSerial, h))
    gpu.brand = _enum_name(nvml_names.BRANDS, q("brand", pynvml.nvmlDeviceGetBrand, h))
    gpu.architecture = _enum_name(nvml_names.ARCHITECTURES, q("architecture", pynvml.nvmlDeviceGetArchitecture, h))
    gpu.vbios = _text(q("vbios", pynvml.nvmlDeviceGetVbiosVersion, h))
    cc = q("compute_capability", pynvml.nvmlDeviceGetCudaComputeCapability, h)
    gpu.compute_capability = f"{cc[0]}.{cc[1]}" if cc else None
    memory = _memory_info(h) or q("memory_total_mib", pynvml.nvmlDeviceGetMemoryInfo, h)
    if memory is not None:
        gpu.memory_total_mib = int(memory.total // _MIB)
        gpu.memory_used_mib = int(memory.used // _MIB)
        if getattr(memory, "reserved", None) is not None:
            gpu.memory_reserved_mib = int(memory.reserved // _MIB)
    gpu.persistence_mode = _flag(q("persistence_mode", pynvml.nvmlDeviceGetPersistenceMode, h))
    gpu.compute_mode = _enum_name(nvml_names.COMPUTE_MODES, q("compute_mode", pynvml.nvmlDeviceGetComputeMode, h))
    pstate = q("pstate", pynvml.nvmlDeviceGetPerformanceState, h)
    gpu.pstate = pstate if isinstance(pstate, int) and pstate < 16 else None
    util = q("utilization_pct", pynvml.nvmlDeviceGetUtilizationRates, h)
    gpu.utilization_pct = util.gpu if util is not None else None
    gpu.virtualization_mode = _enum_name(
        nvml_names.VIRTUALIZATION_MODES, q("virtualization_mode", pynvml.nvmlDeviceGetVirtualizationMode, h)
    )
    models = _safe(getattr(pynvml, "nvmlDeviceGetDriverModel", None), h)  # Windows only: NotSupported on Linux, as nvidia-smi's N/A
    gpu.driver_model = _enum_name(nvml_names.DRIVER_MODELS, models[0]) if models else None
    _mig(gpu, h, q)
    gpu.processes = processes_of(h, q)
    _power(gpu, h, q)
    _pcie(gpu, h, q)
    _clocks(gpu, h, q)
    _thermal(gpu, h, q)
    _ecc(gpu, h, q)
    gpu.nvlinks = _nvlinks(h, q)
    nvml_health.fill(gpu, h, q)


def _flag(value: Any) -> bool | None:
    return None if value is None else bool(value)


def _mig(gpu: Gpu, h: Any, q: Query) -> None:
    mode = q("mig_enabled", pynvml.nvmlDeviceGetMigMode, h)
    if mode is None:
        return
    gpu.mig_enabled, gpu.mig_pending = bool(mode[0]), bool(mode[1])
    if not gpu.mig_enabled:
        return
    for i in range(q("mig_devices", pynvml.nvmlDeviceGetMaxMigDeviceCount, h) or 0):
        mh = _safe(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h, i)
        if mh is None:  # empty slot
            continue
        attrs = _safe(pynvml.nvmlDeviceGetAttributes, mh)
        mem = _safe(pynvml.nvmlDeviceGetMemoryInfo, mh)
        gpu.mig_devices.append(
            MigDevice(
                index=i,
                gpu_instance_id=_safe(pynvml.nvmlDeviceGetGpuInstanceId, mh),
                compute_instance_id=_safe(pynvml.nvmlDeviceGetComputeInstanceId, mh),
                sm_count=getattr(attrs, "multiprocessorCount", None),
                memory_total_mib=int(mem.total // _MIB) if mem else None,
                memory_used_mib=int(mem.used // _MIB) if mem else None,
                uuid=_text(_safe(pynvml.nvmlDeviceGetUUID, mh)),
            )
        )


def processes_of(h: Any, q: Query) -> list[GpuProcess] | None:
    found: dict[int, GpuProcess] = {}
    readable = False
    for kind, fn in (("C", pynvml.nvmlDeviceGetComputeRunningProcesses), ("G", pynvml.nvmlDeviceGetGraphicsRunningProcesses)):
        procs = q("processes", fn, h)
        if procs is None:
            continue
        readable = True
        for p in procs:
            used = p.usedGpuMemory
            entry = found.get(p.pid)
            if entry is not None:
                entry.type = "C+G"
                continue
            found[p.pid] = GpuProcess(
                pid=p.pid,
                name=_text(_safe(pynvml.nvmlSystemGetProcessName, p.pid)),
                type=kind,
                used_memory_mib=int(used // _MIB) if isinstance(used, int) else None,
            )
    # By pid, as the capture parsers list them: NVML's order is only the order of its two calls.
    return [found[pid] for pid in sorted(found)] if readable else None


def _power(gpu: Gpu, h: Any, q: Query) -> None:
    p = gpu.power
    p.draw_w = _watts(q("power.draw_w", pynvml.nvmlDeviceGetPowerUsage, h))
    p.limit_w = _watts(q("power.limit_w", pynvml.nvmlDeviceGetPowerManagementLimit, h))
    p.enforced_limit_w = _watts(q("power.enforced_limit_w", pynvml.nvmlDeviceGetEnforcedPowerLimit, h))
    p.default_limit_w = _watts(q("power.default_limit_w", pynvml.nvmlDeviceGetPowerManagementDefaultLimit, h))
    limits = q("power.max_limit_w", pynvml.nvmlDeviceGetPowerManagementLimitConstraints, h)
    if limits:
        p.min_limit_w, p.max_limit_w = _watts(limits[0]), _watts(limits[1])


def _watts(milliwatts: Any) -> float | None:
    return None if milliwatts is None else round(milliwatts / 1000.0, 2)


def _pcie(gpu: Gpu, h: Any, q: Query) -> None:
    info = q("pcie.bus_id", pynvml.nvmlDeviceGetPciInfo, h)
    if info is not None:
        gpu.pcie.bus_id = bus_id(_text(info.busId))
    link = PcieLink(
        current_gen=q("pcie.current_gen", pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
        max_gen=q("pcie.max_gen", pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
        current_width=q("pcie.current_width", pynvml.nvmlDeviceGetCurrPcieLinkWidth, h),
        max_width=q("pcie.max_width", pynvml.nvmlDeviceGetMaxPcieLinkWidth, h),
        source="nvml",
    )
    if any(x is not None for x in (link.current_gen, link.max_gen, link.current_width, link.max_width)):
        gpu.pcie.readings.append(link)  # a reading with nothing in it would hide the host's (sysfs) one
    gpu.pcie.device_max_gen = q("pcie.device_max_gen", pynvml.nvmlDeviceGetGpuMaxPcieLinkGeneration, h)
    gpu.pcie.replay_count = q("pcie.replay_count", pynvml.nvmlDeviceGetPcieReplayCounter, h)


def _clocks(gpu: Gpu, h: Any, q: Query) -> None:
    c = gpu.clocks
    SM, GR, MEM = pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_MEM
    c.sm_mhz = q("clocks.sm_mhz", pynvml.nvmlDeviceGetClockInfo, h, SM)
    c.graphics_mhz = q("clocks.graphics_mhz", pynvml.nvmlDeviceGetClockInfo, h, GR)
    c.memory_mhz = q("clocks.memory_mhz", pynvml.nvmlDeviceGetClockInfo, h, MEM)
    c.max_sm_mhz = q("clocks.max_sm_mhz", pynvml.nvmlDeviceGetMaxClockInfo, h, SM)
    c.max_graphics_mhz = q("clocks.max_graphics_mhz", pynvml.nvmlDeviceGetMaxClockInfo, h, GR)
    c.max_memory_mhz = q("clocks.max_memory_mhz", pynvml.nvmlDeviceGetMaxClockInfo, h, MEM)
    c.applications_graphics_mhz = q("clocks.applications_graphics_mhz", pynvml.nvmlDeviceGetApplicationsClock, h, GR)
    c.default_applications_graphics_mhz = q(
        "clocks.default_applications_graphics_mhz", pynvml.nvmlDeviceGetDefaultApplicationsClock, h, GR
    )
    mask = _current_reasons(h)
    if mask is None:
        gpu.unavailable.setdefault("clocks.event_reasons", "not supported on this GPU or driver")
    else:
        c.event_reasons = reasons_from_mask(mask)


def _current_reasons(h: Any) -> int | None:
    # New name since driver 535; the old one is deprecated and gone in CUDA 14.
    for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
        fn = getattr(pynvml, name, None)
        mask = _safe(fn, h) if fn else None
        if mask is not None:
            return mask
    return None


def _thermal(gpu: Gpu, h: Any, q: Query) -> None:
    t = gpu.thermal
    t.gpu_c = q("thermal.gpu_c", pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
    t.slowdown_c = q("thermal.slowdown_c", pynvml.nvmlDeviceGetTemperatureThreshold, h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
    t.shutdown_c = q("thermal.shutdown_c", pynvml.nvmlDeviceGetTemperatureThreshold, h, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
    t.max_operating_c = _safe(pynvml.nvmlDeviceGetTemperatureThreshold, h, pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX)
    values = _safe(pynvml.nvmlDeviceGetFieldValues, h, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
    if values and values[0].nvmlReturn == pynvml.NVML_SUCCESS:
        t.memory_c = values[0].value.uiVal
    t.fan_pct = _fans(gpu, h, q)
    if t.gpu_c is not None and t.slowdown_c is not None:
        t.slowdown_margin_c = t.slowdown_c - t.gpu_c
    elif hasattr(pynvml, "nvmlDeviceGetMarginTemperature"):
        # Newer GPUs give only T.Limit-relative values: degrees left below T.Limit (nvidia-smi's
        # "GPU T.Limit Temp"); slowdown starts a little past it, so this margin errs low.
        t.slowdown_margin_c = _safe(pynvml.nvmlDeviceGetMarginTemperature, h)


def _fans(gpu: Gpu, h: Any, q: Query) -> list[int | None] | None:
    """Each fan's speed in % of its maximum (nvidia-smi's 'Fan Speed'); None for a fan whose reading
    failed, which nvidia-smi prints as ERR! (a stopped fan or a broken tachometer). None: the GPU
    reports no fan (passively cooled, or a driver without the call)."""
    count = q("thermal.fan_pct", pynvml.nvmlDeviceGetNumFans, h) if hasattr(pynvml, "nvmlDeviceGetNumFans") else None
    if count is None:
        return None
    speeds: list[int | None] = []
    for fan in range(count):
        try:
            speeds.append(int(pynvml.nvmlDeviceGetFanSpeed_v2(h, fan)))
        except pynvml.NVMLError_NotSupported:
            continue  # a fan the driver does not report on (nvidia-smi prints N/A): no reading, no fault
        except Exception as err:  # NVMLError: this fan's reading failed
            gpu.unavailable.setdefault("thermal.fan_pct", f"fan {fan}: {error_reason(err)}")
            speeds.append(None)
    return speeds


def _ecc(gpu: Gpu, h: Any, q: Query) -> None:
    e = gpu.ecc
    mode = q("ecc.enabled", pynvml.nvmlDeviceGetEccMode, h)
    if mode is None:
        return  # no ECC on this GPU: the counters would all fail the same way
    e.enabled, e.pending_enabled = bool(mode[0]), bool(mode[1])
    total = pynvml.nvmlDeviceGetTotalEccErrors
    CORR, UNC = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    VOL, AGG = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC
    e.volatile_corrected = q("ecc.volatile_corrected", total, h, CORR, VOL)
    e.volatile_uncorrected = q("ecc.volatile_uncorrected", total, h, UNC, VOL)
    e.aggregate_corrected = q("ecc.aggregate_corrected", total, h, CORR, AGG)
    e.aggregate_uncorrected = q("ecc.aggregate_uncorrected", total, h, UNC, AGG)
    sbe = q("ecc.retired_pages_sbe", pynvml.nvmlDeviceGetRetiredPages, h,
            pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
    dbe = q("ecc.retired_pages_dbe", pynvml.nvmlDeviceGetRetiredPages, h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    e.retired_pages_sbe = len(sbe) if sbe is not None else None
    e.retired_pages_dbe = len(dbe) if dbe is not None else None
    e.retired_pages_pending = _flag(q("ecc.retired_pages_pending", pynvml.nvmlDeviceGetRetiredPagesPendingStatus, h))
    rows = q("ecc.remapped_rows", pynvml.nvmlDeviceGetRemappedRows, h)
    if rows is not None:
        corr, unc, pending, failure = rows
        e.remapped_rows_correctable, e.remapped_rows_uncorrectable = corr, unc
        e.remapped_rows_pending, e.remapped_rows_failure = bool(pending), bool(failure)
    broken = [field for field in q.broken if field.startswith("ecc.")]
    if broken:  # a read that failed is never "no errors": gpu.ecc fails on it, live as from a capture
        gpu.unavailable[ECC_READ_FAILED] = f"NVML answered \"{q.broken[broken[0]]}\" for {', '.join(broken)}"


def _nvlinks(h: Any, q: Query) -> list[NvLink] | None:
    links = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            state = pynvml.nvmlDeviceGetNvLinkState(h, link)
        except Exception as err:
            if link == 0:  # the GPU has no NVLink at all
                q.gpu.unavailable["nvlinks"] = error_reason(err)
                return None
            continue  # links beyond this GPU's count
        remote = _safe(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
        remote_type = _safe(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
        links.append(
            NvLink(
                link=link,
                active=bool(state),
                version=_safe(pynvml.nvmlDeviceGetNvLinkVersion, h, link),
                remote_bus_id=bus_id(_text(remote.busId)) if remote is not None else None,
                remote_type={0: "gpu", 1: "ibmnpu", 2: "switch"}.get(remote_type),
            )
        )
    return links


def _nvlinks_between(a: Gpu, b: Gpu) -> int:
    """NVLinks joining two GPUs: direct links, or (NVSwitch systems) the links both have to switches."""
    active = [link for link in a.nvlinks or [] if link.active]
    direct = sum(1 for link in active if link.remote_bus_id == b.pcie.bus_id)
    if direct:
        return direct
    a_switched = sum(1 for link in active if link.remote_type == "switch")
    b_switched = sum(1 for link in b.nvlinks or [] if link.active and link.remote_type == "switch")
    return min(a_switched, b_switched)


_ANCESTOR = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def _topology(handles: list[tuple[Gpu, Any]]) -> Topology | None:
    """The `nvidia-smi topo -m` matrix between GPUs, built from NVML (NV# where links join)."""
    if len(handles) < 2:
        return None
    topo = Topology(source="nvml", devices=[f"GPU{g.index}" for g, _ in handles])
    for a, ha in handles:
        row = topo.links.setdefault(f"GPU{a.index}", {})
        for b, hb in handles:
            if a is b:
                row[f"GPU{b.index}"] = "X"
                continue
            nv = _nvlinks_between(a, b)
            if nv:
                row[f"GPU{b.index}"] = f"NV{nv}"
                continue
            level = _safe(pynvml.nvmlDeviceGetTopologyCommonAncestor, ha, hb)
            row[f"GPU{b.index}"] = _ANCESTOR.get(level, "?")
    if all(level in ("X", "?") for row in topo.links.values() for level in row.values()):
        return None  # NVML said nothing about any pair: a matrix of "?" would read as "no NVLink"
    return topo

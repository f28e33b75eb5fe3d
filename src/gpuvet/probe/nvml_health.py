"""The health signals NVML gives beyond one instant's state: the NVSwitch fabric registration,
the recovery action the driver asks for, time spent under power and thermal limits since the
driver loaded, and NVLink error counters. Each call may be missing on an older driver or GPU:
then the fact stays None and its reason is kept, as everywhere in the NVML backend."""

from __future__ import annotations

from typing import Any, Callable

from ..facts import REMAP_LEVELS, Fabric, Gpu
from . import nvml, nvml_names  # nvml: its `pynvml`: the driver's, or the replay of a capture (GPUVET_NVML_REPLAY)

_NS_PER_US = 1000.0
_NVLINK_COUNTERS = (("replay", 0), ("recovery", 1), ("crc", 2))  # NVML_NVLINK_ERROR_DL_REPLAY, _RECOVERY, _CRC_FLIT
# NVLink 5 (Blackwell), where the counters above are not supported: the per-link field values DCGM's
# NVLink 5 health watch fails a GPU on, keyed as `nvidia-smi nvlink -e` names them (probe.nvlink_errors).
_NVLINK5_FIELDS = (
    ("malformed_packet", "NVML_FI_DEV_NVLINK_COUNT_MALFORMED_PACKET_ERRORS"),
    ("buffer_overrun", "NVML_FI_DEV_NVLINK_COUNT_BUFFER_OVERRUN_ERRORS"),
    ("rx", "NVML_FI_DEV_NVLINK_COUNT_RCV_ERRORS"),
    ("rx_remote", "NVML_FI_DEV_NVLINK_COUNT_RCV_REMOTE_ERRORS"),
    ("rx_general", "NVML_FI_DEV_NVLINK_COUNT_RCV_GENERAL_ERRORS"),
    ("local_link_integrity", "NVML_FI_DEV_NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS"),
    ("tx_discards", "NVML_FI_DEV_NVLINK_COUNT_XMIT_DISCARDS"),
    ("link_recovery_failed_events", "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS"),
    ("total_link_recovery_events", "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS"),
    ("effective", "NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS"),
    ("symbol", "NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS"),
)


def fill(gpu: Gpu, h: Any, query: Callable[..., Any]) -> None:
    """`query(field, fn, *args)`: the NVML backend's tolerant call (None, reason kept, on failure)."""
    gpu.fabric = _fabric(h, query)
    gpu.recovery_action = _recovery_action(h, query)
    gpu.clock_event_time_us = _event_times(h, query) or _violation_times(h, query)
    gpu.nvlink_errors, gpu.nvlink_error_links = _nvlink_errors(gpu, h, query)
    gpu.remap_histogram = _remap_histogram(h, query)


def _event_times(h: Any, query: Callable[..., Any]) -> dict[str, float] | None:
    """Time under each clock-event reason, named as the capture parsers name them."""
    p = nvml.pynvml
    known = [(name, getattr(p, field)) for name, field in nvml_names.EVENT_TIME_FIELDS.items() if hasattr(p, field)]
    if not known:
        return None
    values = query("clock_event_time_us", p.nvmlDeviceGetFieldValues, h, [field for _, field in known])
    if not values or len(values) != len(known):
        return None
    times = {name: int(value.value.ullVal) / _NS_PER_US for (name, _), value in zip(known, values)
             if int(value.nvmlReturn) == p.NVML_SUCCESS}
    return times or None


def _violation_times(h: Any, query: Callable[..., Any]) -> dict[str, float] | None:
    """Older drivers: the power and thermal violation counters ("thermal" is SW and HW together)."""
    times = {}
    for name, policy in (("sw_power_cap", 0), ("thermal", 1)):  # NVML_PERF_POLICY_POWER, _THERMAL
        violation = query(f"clock_event_time_us.{name}", nvml.pynvml.nvmlDeviceGetViolationStatus, h, policy)
        if violation is not None:
            times[name] = violation.violationTime / _NS_PER_US
    return times or None


def _remap_histogram(h: Any, query: Callable[..., Any]) -> dict[str, int] | None:
    """Banks by how many spare rows they have left (nvidia-smi's Row Remapper Histogram)."""
    fn = getattr(nvml.pynvml, "nvmlDeviceGetRowRemapperHistogram", None)
    values = query("remap_histogram", fn, h) if fn else None
    if values is None:
        return None
    return {level: int(getattr(values, level)) for level in REMAP_LEVELS}


def _fabric(h: Any, query: Callable[..., Any]) -> Fabric | None:
    info = nvml.pynvml.c_nvmlGpuFabricInfo_t()
    if query("fabric", nvml.pynvml.nvmlDeviceGetGpuFabricInfo, h, nvml.pynvml.byref(info)) is None:
        return None
    state = nvml_names.FABRIC_STATES.get(int(info.state))
    if state is None:
        return None  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: no NVSwitch fabric on this GPU
    status = "Success" if int(info.status) == 0 else nvml.pynvml.nvmlErrorString(int(info.status))
    return Fabric(state=state, status=status.decode() if isinstance(status, bytes) else str(status))


def _recovery_action(h: Any, query: Callable[..., Any]) -> str | None:
    field_id = getattr(nvml.pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)  # nvidia-ml-py 12.570+
    if field_id is None:
        return None
    values = query("recovery_action", nvml.pynvml.nvmlDeviceGetFieldValues, h, [field_id])
    if not values or int(values[0].nvmlReturn) != 0:
        return None
    return nvml_names.RECOVERY_ACTIONS.get(int(values[0].value.uiVal), f"action {int(values[0].value.uiVal)}")


def _nvlink_errors(gpu: Gpu, h: Any, query: Callable[..., Any]) -> tuple[dict[str, int] | None, dict[str, dict[str, int]] | None]:
    """(counter -> sum over the active links, link -> counter -> count where not 0); None, None unread.
    The DL counters first; on a GPU that has none of them (NVLink 5), its per-link field values."""
    active = [link.link for link in gpu.nvlinks or [] if link.active]
    totals: dict[str, int] = {}
    by_link: dict[str, dict[str, int]] = {}

    def add(name: str, link: int, count: int) -> None:
        totals[name] = totals.get(name, 0) + count
        if count:
            by_link.setdefault(str(link), {})[name] = count

    for name, counter in _NVLINK_COUNTERS:
        for link in active:
            count = query(f"nvlink_errors.{name}", nvml.pynvml.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
            if count is not None:
                add(name, link, int(count))
    if not totals and active:
        p = nvml.pynvml
        known = [(name, getattr(p, field)) for name, field in _NVLINK5_FIELDS if hasattr(p, field)]
        asked = [(name, field_id, link) for link in active for name, field_id in known]
        values = query("nvlink_errors.nvlink5", p.nvmlDeviceGetFieldValues, h,
                       [(field_id, link) for _, field_id, link in asked]) if asked else None
        for (name, _, link), value in zip(asked, values or []):
            if int(value.nvmlReturn) == p.NVML_SUCCESS:
                add(name, link, int(value.value.ullVal))
    return (totals, by_link) if totals else (None, None)

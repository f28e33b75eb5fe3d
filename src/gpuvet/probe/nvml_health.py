"""The health signals NVML gives beyond one instant's state: the NVSwitch fabric registration,
the recovery action the driver asks for, time spent under power and thermal limits since the
driver loaded, and NVLink error counters. Each call may be missing on an older driver or GPU:
then the fact stays None and its reason is kept, as everywhere in the NVML backend."""

from __future__ import annotations

from typing import Any, Callable

try:  # as in the NVML backend: a broken nvidia-ml-py install must not stop the other probes
    import pynvml
except Exception:  # pragma: no cover - only on broken installs
    pynvml = None

from ..facts import Fabric, Gpu

# nvidia-smi's words for NVML's enums, so live facts read like a `-q` capture's.
_FABRIC_STATES = {1: "Not Started", 2: "In Progress", 3: "Completed"}  # 0: not supported (no fabric)
_RECOVERY_ACTIONS = {0: "None", 1: "GPU Reset", 2: "Node Reboot", 3: "Drain P2P", 4: "Drain and Reset",
                     5: "Recover IMEX Domain", 6: "Bus Reset", 7: "System Reboot"}
_NS_PER_US = 1000.0
_NVLINK_COUNTERS = (("replay", 0), ("recovery", 1), ("crc", 2))  # NVML_NVLINK_ERROR_DL_REPLAY, _RECOVERY, _CRC_FLIT


def fill(gpu: Gpu, h: Any, query: Callable[..., Any]) -> None:
    """`query(field, fn, *args)`: the NVML backend's tolerant call (None, reason kept, on failure)."""
    gpu.fabric = _fabric(h, query)
    gpu.recovery_action = _recovery_action(h, query)
    times = {}
    for name, policy in (("sw_power_cap", 0), ("thermal", 1)):  # NVML_PERF_POLICY_POWER, _THERMAL
        violation = query(f"clock_event_time_us.{name}", pynvml.nvmlDeviceGetViolationStatus, h, policy)
        if violation is not None:
            times[name] = violation.violationTime / _NS_PER_US
    gpu.clock_event_time_us = times or None
    gpu.nvlink_errors = _nvlink_errors(gpu, h, query)


def _fabric(h: Any, query: Callable[..., Any]) -> Fabric | None:
    info = pynvml.c_nvmlGpuFabricInfo_t()
    if query("fabric", pynvml.nvmlDeviceGetGpuFabricInfo, h, pynvml.byref(info)) is None:
        return None
    state = _FABRIC_STATES.get(int(info.state))
    if state is None:
        return None  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: no NVSwitch fabric on this GPU
    status = "Success" if int(info.status) == 0 else pynvml.nvmlErrorString(int(info.status))
    return Fabric(state=state, status=status.decode() if isinstance(status, bytes) else str(status))


def _recovery_action(h: Any, query: Callable[..., Any]) -> str | None:
    values = query("recovery_action", pynvml.nvmlDeviceGetFieldValues, h, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
    if not values or int(values[0].nvmlReturn) != 0:
        return None
    return _RECOVERY_ACTIONS.get(int(values[0].value.uiVal), f"action {int(values[0].value.uiVal)}")


def _nvlink_errors(gpu: Gpu, h: Any, query: Callable[..., Any]) -> dict[str, int] | None:
    active = [link.link for link in gpu.nvlinks or [] if link.active]
    if not active:
        return None
    totals: dict[str, int] = {}
    for name, counter in _NVLINK_COUNTERS:
        counts = [query(f"nvlink_errors.{name}", pynvml.nvmlDeviceGetNvLinkErrorCounter, h, link, counter) for link in active]
        known = [int(c) for c in counts if c is not None]
        if known:
            totals[name] = sum(known)
    return totals or None

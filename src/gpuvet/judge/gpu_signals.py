"""The counters fleet health checkers read beyond one instant (NVIDIA gpud, DCGM's health watches,
Azure's health checks): link error counters, the NVSwitch fabric, the recovery action the driver
asks for, time spent slowed down since the driver loaded, and persistence mode."""

from __future__ import annotations

import re

from ..catalog import checked
from ..facts import Gpu, Machine
from ..record import MEASURED, Finding
from .bench_common import worst
from .common import FAIL, PASS, SKIP, WARN, Context, finding, subject

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
GPU_FABRIC = checked("gpu.fabric")
GPU_LINK_ERRORS = checked("gpu.link_errors")
GPU_PERSISTENCE = checked("gpu.persistence")
GPU_RECOVERY = checked("gpu.recovery")
GPU_THROTTLE_HISTORY = checked("gpu.throttle_history")

# DCGM's PCIe health watch: "Detected more than 8 PCIe replays per minute" (DCGM_FR_PCI_REPLAY_RATE,
# DCGM_LIMIT_MAX_PCIREPLAY_RATE = 8).
REPLAYS_PER_MINUTE_LIMIT = 8
_REPLAY_SOURCE = "DCGM PCIe health watch (DCGM_FR_PCI_REPLAY_RATE: more than 8 replays per minute)"


# -- gpu.link_errors ------------------------------------------------------------------------------

def check_link_errors(ctx: Context) -> list[Finding]:
    # A replayed capture's counters (GPUVET_NVML_REPLAY) were not counted over this host's uptime.
    replayed = ctx.machine.source.startswith("replay:")
    uptime = ctx.machine.host.uptime_s if ctx.machine.host and not replayed else None
    return [_link_errors(gpu, uptime) for gpu in ctx.machine.gpus]


def _link_errors(gpu: Gpu, uptime_s: float | None) -> Finding:
    s = subject(gpu)
    parts: list[tuple[str, str, str]] = []  # (status, text, which counters: replays, replay_count, aer, nvlink)
    replays = gpu.pcie.replay_count
    if replays is not None:
        if uptime_s and uptime_s > 0:
            rate = replays / (uptime_s / 60.0)
            status = WARN if rate > REPLAYS_PER_MINUTE_LIMIT else PASS
            parts.append((status, f"{replays} PCIe replays since reset ({rate:.2f}/min at most, over {uptime_s / 3600:.1f} h up)",
                          "replays"))
        else:
            parts.append((PASS, f"{replays} PCIe replays since reset", "replay_count"))
    aer = gpu.pcie.aer_counts
    if aer is not None:
        bad = aer.get("fatal", 0) + aer.get("nonfatal", 0)
        corrected = aer.get("correctable", 0)
        status = FAIL if bad else WARN if corrected else PASS
        parts.append((status, f"AER since boot: {corrected} corrected, {aer.get('nonfatal', 0)} non-fatal, "
                              f"{aer.get('fatal', 0)} fatal", "aer"))
    nvlink = gpu.nvlink_errors
    if nvlink is not None:
        parts.append(_nvlink_part(gpu, nvlink) + ("nvlink",))
    if not parts:
        return finding(GPU_LINK_ERRORS, s, SKIP, "no link error counter read (PCIe replays, AER, NVLink)",
                       remedy=f"`nvidia-smi -q -i {gpu.index} -d PCIE` and `nvidia-smi nvlink -e -i {gpu.index}`")
    judged = [which for _, _, which in parts if which != "replay_count"]
    status = worst(*(st for st, _, _ in parts))
    if status == PASS and not judged:
        status = MEASURED  # a count with no time to make a rate of it: shown, not judged
    measured = "; ".join(text for _, text, _ in parts)
    summary = {PASS: "link error counters clean", WARN: "link errors counted", FAIL: "uncorrected PCIe errors counted"}.get(status)
    # Not judged: one line for all the GPUs (the counts are in `measured`), not one per count.
    text = "PCIe replays counted; a capture has no uptime to make a rate of them" if status == MEASURED else f"{summary}: {measured}"
    faulty = {which for st, _, which in parts if st in (WARN, FAIL)}
    remedies = []
    if faulty & {"replays", "aer"}:
        remedies.append(f"`nvidia-smi -q -i {gpu.index} -d PCIE`, `sudo lspci -vvv -s {gpu.pcie.bus_id or 'BUS'}`; "
                        "reseat the GPU or its riser, or ask the provider")
    if "nvlink" in faulty:
        remedies.append(f"`nvidia-smi nvlink -e -i {gpu.index}` again after a load: counts that grow mean a failing link "
                        "(DCGM fails it); reset the GPU or reboot, and ask the provider if they keep growing")
    return finding(GPU_LINK_ERRORS, s, status, text, measured=measured,
                   expected="; ".join(_LINK_EXPECTED[w] for w in dict.fromkeys(judged)) or None,
                   source="; ".join(_LINK_SOURCES[w] for w in dict.fromkeys(which for _, _, which in parts)),
                   remedy="; ".join(remedies) or None)


# DCGM's NVLink health watch (NVIDIA/DCGM modules/health/DcgmHealthWatch.cpp, MonitorNVLink and the
# NVLink 5 fields; common/DcgmGPUHardwareLimits.h): over its one-minute window, 1 replay or recovery
# error (DCGM_LIMIT_MAX_NVLINK_ERROR) fails a GPU, CRC errors fail from 100 a second
# (DCGM_LIMIT_MAX_NVLINK_CRC_ERROR); on NVLink 5 every error counter fails from 1.
_NVLINK_SOURCE = ("NVLink error counters (NVML, `nvidia-smi nvlink -e`) against DCGM's NVLink health watch "
                  "(DCGM_LIMIT_MAX_NVLINK_ERROR 1, DCGM_LIMIT_MAX_NVLINK_CRC_ERROR 100 per second; "
                  "github.com/NVIDIA/DCGM common/DcgmGPUHardwareLimits.h, modules/health/DcgmHealthWatch.cpp)")


_LINK_EXPECTED = {
    "replays": f"at most {REPLAYS_PER_MINUTE_LIMIT} PCIe replays per minute",
    "aer": "no uncorrected AER error",
    "nvlink": "NVLink error counters 0 (DCGM's NVLink watch fails a GPU on 1 replay or recovery error, or 100 CRC errors "
              "a second, within a minute; a count since the counters were reset has no time, so it warns)",
}
_LINK_SOURCES = {"replays": _REPLAY_SOURCE, "replay_count": _REPLAY_SOURCE, "aer": "the kernel's AER counters (sysfs aer_dev_*)",
                 "nvlink": _NVLINK_SOURCE}


def _nvlink_part(gpu: Gpu, totals: dict[str, int]) -> tuple[str, str]:
    """One line on the NVLink counters, naming the links that counted errors."""
    if not any(totals.values()):
        return PASS, "NVLink error counters 0 (" + ", ".join(k.replace("_", " ") for k in sorted(totals)) + ")"
    links = gpu.nvlink_error_links
    if links:
        where = "; ".join(f"link {link}: " + ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in sorted(counts.items()))
                          for link, counts in sorted(links.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0))
    else:
        where = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in sorted(totals.items()) if n)
    return WARN, f"NVLink errors since the counters were reset: {where}"


# -- gpu.fabric -----------------------------------------------------------------------------------

_FABRIC_SOURCE = "NVML GpuFabricInfo / nvidia-smi -q 'Fabric' (NVIDIA Fabric Manager user guide)"
_ERROR_802 = "until it completes CUDA fails with error 802 \"system not yet initialized\""


def check_fabric(ctx: Context) -> list[Finding]:
    machine = ctx.machine
    with_fabric = [g for g in machine.gpus if g.fabric is not None]
    if not with_fabric:
        return [finding(GPU_FABRIC, "machine", SKIP, "no NVSwitch fabric on these GPUs (Fabric N/A or not reported)")]
    findings = [_fabric(gpu) for gpu in with_fabric]
    findings += _fabric_manager(machine)
    return findings


def _fabric(gpu: Gpu) -> Finding:
    fabric = gpu.fabric
    assert fabric is not None
    measured = f"state {fabric.state}, status {fabric.status}" + (f", health {fabric.health}" if fabric.health else "")
    expected = "state Completed, status Success"
    if fabric.state != "Completed":
        problem = f"NVSwitch fabric registration {fabric.state or 'unknown'}"
    elif fabric.status and fabric.status.lower() != "success":
        problem = f"NVSwitch fabric registration failed ({fabric.status})"
    else:
        return finding(GPU_FABRIC, subject(gpu), PASS, "registered with the NVSwitch fabric", measured=measured,
                       expected=expected, source=_FABRIC_SOURCE)
    return finding(GPU_FABRIC, subject(gpu), FAIL, f"{problem}: {_ERROR_802}", measured=measured, expected=expected,
                   source=_FABRIC_SOURCE,
                   remedy="`systemctl status nvidia-fabricmanager` and `journalctl -u nvidia-fabricmanager`; start it "
                          "(`sudo systemctl start nvidia-fabricmanager`) with the driver's own version, or ask the provider")


def _fabric_manager(machine: Machine) -> list[Finding]:
    state, version = machine.driver.fabric_manager_state, machine.driver.fabric_manager_version
    if state is None:
        return []  # not read (a capture): the GPUs' own registration above says whether it ran
    source = "systemctl is-active nvidia-fabricmanager; nv-fabricmanager --version (Fabric Manager user guide)"
    if state != "active":
        return [finding(GPU_FABRIC, "machine", FAIL, f"the fabric manager service is {state}: {_ERROR_802}",
                        measured=f"nvidia-fabricmanager {state}", expected="active", source=source,
                        remedy="`sudo systemctl enable --now nvidia-fabricmanager` (the package of the driver's exact version)")]
    if version and machine.driver.version and version != machine.driver.version:
        return [finding(GPU_FABRIC, "machine", FAIL, f"fabric manager {version} with driver {machine.driver.version}: "
                        "it must be the driver's exact version", measured=f"fabric manager {version}",
                        expected=f"{machine.driver.version} (the driver)", source=source,
                        remedy=f"install nvidia-fabricmanager {machine.driver.version} (or the driver of {version})")]
    return [finding(GPU_FABRIC, "machine", PASS, f"fabric manager running{f' ({version})' if version else ''}",
                    measured=f"nvidia-fabricmanager active{f', {version}' if version else ''}",
                    expected=f"active{f', version {machine.driver.version}' if machine.driver.version else ''}", source=source)]


# -- gpu.recovery ---------------------------------------------------------------------------------

_RECOVERY_SOURCE = "nvidia-smi 'GPU Recovery Action' / NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; 'Bank Remap Availability Histogram'"

# Remapped rows (Ampere and later), judged as the field's tools judge them:
# - DCGM: the health watch fails a GPU on a row-remap failure and warns from 512 rows remapped for
#   uncorrectable errors; `dcgmi diag` fails on a failure, on 512 such rows, and on a pending remap
#   (NVIDIA/DCGM@72fa3feaa67d716a75323a8f47c34ff3ee73f824: common/DcgmGPUHardwareLimits.h
#   DCGM_LIMIT_MAX_ROW_REMAP_UNCORRECTABLE 512, modules/health/DcgmHealthWatch.cpp
#   MonitorMemRowRemapFailures / MonitorMemRowRemapUncorrectable, nvvs/src/Software.cpp).
# - Azure's azurehpc-health-checks, check_gpu_ecc: fails on a pending remap, a remap failure, or
#   more than 512 uncorrectable remapped rows (FaultCode NHC2007; Azure/azurehpc-health-checks@
#   0295e2f1c29cc17725f0150817b4e6e7e05a74ca customTests/azure_gpu_ecc.nhc).
# - NVIDIA's GPU memory error management guide: row remapping "supports up to 512 remapping for the
#   frame buffer" (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/row-remapping.html).
REMAP_UNCORRECTABLE_LIMIT = 512
_REMAP_SOURCE = ("DCGM (DCGM_LIMIT_MAX_ROW_REMAP_UNCORRECTABLE 512; health watch: a remap failure fails, 512 uncorrectable "
                 "remaps warn; dcgmi diag: a failure, 512 uncorrectable remaps or a pending remap fail; github.com/NVIDIA/DCGM "
                 "common/DcgmGPUHardwareLimits.h, modules/health/DcgmHealthWatch.cpp, nvvs/src/Software.cpp); "
                 "Azure azurehpc-health-checks check_gpu_ecc (a pending remap, a remap failure or more than 512 uncorrectable "
                 "remapped rows fail, NHC2007; github.com/Azure/azurehpc-health-checks customTests/azure_gpu_ecc.nhc); "
                 "NVIDIA: up to 512 remappings per frame buffer (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/row-remapping.html)")
_RECOVERY_EXPECTED = (f"recovery action None; no bank without spare rows; no pending or failed row remap and fewer than "
                      f"{REMAP_UNCORRECTABLE_LIMIT} rows remapped for uncorrectable errors (DCGM, Azure)")


def check_recovery(ctx: Context) -> list[Finding]:
    return [_recovery(gpu) for gpu in ctx.machine.gpus]


def _recovery(gpu: Gpu) -> Finding:
    s = subject(gpu)
    action, banks, e = gpu.recovery_action, gpu.remap_histogram, gpu.ecc
    remaps = (e.remapped_rows_uncorrectable, e.remapped_rows_pending, e.remapped_rows_failure)
    if action is None and banks is None and all(r is None for r in remaps):
        return finding(GPU_RECOVERY, s, SKIP, "this driver or capture reports no recovery action, remap histogram or "
                                               "remapped rows (drivers since R550 on datacenter GPUs do)")
    parts: list[tuple[str, str]] = []
    remedy = None
    if action is not None:
        if action.lower() in ("none", "no action"):
            parts.append((PASS, "no recovery action asked for"))
        else:
            parts.append((FAIL, f"the driver asks for: {action}"))
            remedy = (f"drain the GPU's jobs, then `sudo nvidia-smi -r -i {gpu.index}` (GPU reset) or reboot as asked; "
                      "if it comes back, ask the provider")
    if banks is not None:
        if banks.get("none", 0):
            parts.append((FAIL, f"{banks['none']} memory bank(s) with no spare row left: the next uncorrectable error there "
                                "cannot be remapped"))
            remedy = remedy or "ask the provider for another GPU (its memory can no longer repair itself)"
        elif banks.get("low", 0):
            parts.append((WARN, f"{banks['low']} memory bank(s) low on spare rows"))
            remedy = remedy or f"watch `nvidia-smi -q -i {gpu.index} -d ROW_REMAPPER`; ask the provider if it grows"
        else:
            parts.append((PASS, "spare rows left in every memory bank"))
    remap_part, remap_remedy = _remaps(gpu)
    if remap_part is not None:
        parts.append(remap_part)
        remedy = remedy or remap_remedy
    status = worst(*(st for st, _ in parts))
    measured = "; ".join(text for _, text in parts)
    histogram = f"; banks {banks}" if banks else ""
    rows = "" if all(r is None for r in remaps) else (
        f"; remapped rows: uncorrectable {_known(e.remapped_rows_uncorrectable)}, pending {_known(e.remapped_rows_pending)}, "
        f"failure {_known(e.remapped_rows_failure)}")
    source = _RECOVERY_SOURCE + ("" if all(r is None for r in remaps) else f"; remapped rows against {_REMAP_SOURCE}")
    return finding(GPU_RECOVERY, s, status, measured, measured=f"recovery action {action}{histogram}{rows}",
                   expected=_RECOVERY_EXPECTED, source=source, remedy=remedy)


def _remaps(gpu: Gpu) -> tuple[tuple[str, str] | None, str | None]:
    """Remapped rows against the figures DCGM and Azure's health checks fail a GPU at."""
    e = gpu.ecc
    reset = f"drain the GPU's jobs and reset it (`sudo nvidia-smi -r -i {gpu.index}`) so the remap takes effect"
    replace = "ask the provider for another GPU: its memory can no longer hide its bad rows"
    if e.remapped_rows_failure:
        return (FAIL, "a row remapping failed (DCGM and Azure fail the GPU)"), replace
    uncorrectable = e.remapped_rows_uncorrectable
    if uncorrectable is not None and uncorrectable >= REMAP_UNCORRECTABLE_LIMIT:
        return (FAIL, f"{uncorrectable} rows remapped for uncorrectable errors: at DCGM's limit of "
                      f"{REMAP_UNCORRECTABLE_LIMIT} (the most the frame buffer supports)"), replace
    if e.remapped_rows_pending:
        return (FAIL, "a row remap is pending until the GPU is reset (dcgmi diag and Azure fail the GPU)"), reset
    if uncorrectable is None and e.remapped_rows_pending is None and e.remapped_rows_failure is None:
        return None, None
    said = [] if uncorrectable is None else [f"{uncorrectable} of at most {REMAP_UNCORRECTABLE_LIMIT} rows remapped for "
                                              "uncorrectable errors"]
    said += ["no remap pending"] * (e.remapped_rows_pending is False) + ["no remap failed"] * (e.remapped_rows_failure is False)
    return (PASS, ", ".join(said)), None


def _known(value: object) -> str:
    return "unknown" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


# -- gpu.throttle_history -------------------------------------------------------------------------

_FAULT_TIMES = {"hw_thermal_slowdown": "HW thermal slowdown", "hw_power_brake_slowdown": "HW power brake",
                "sw_thermal_slowdown": "SW thermal slowdown", "thermal": "thermal limit", "hw_slowdown": "HW slowdown"}
FAIL_AFTER_S = 60.0  # a minute slowed by heat or a power brake since the driver loaded is not a blip
_HISTORY_SOURCE = "nvidia-smi 'Clocks Event Reasons Counters' / NVML violation counters (time since the driver loaded)"


def check_throttle_history(ctx: Context) -> list[Finding]:
    return [_throttle_history(gpu) for gpu in ctx.machine.gpus]


def _throttle_history(gpu: Gpu) -> Finding:
    s = subject(gpu)
    times = gpu.clock_event_time_us
    if times is None:
        return finding(GPU_THROTTLE_HISTORY, s, SKIP, "no clock-event time counters in this report (newer drivers print "
                                                       "'Clocks Event Reasons Counters': `nvidia-smi -q -d PERFORMANCE`)")
    slowed = {name: us / 1e6 for name, us in times.items() if name in _FAULT_TIMES and us > 0}
    capped = times.get("sw_power_cap", 0.0) / 1e6
    measured = ", ".join(f"{_FAULT_TIMES.get(k, k.replace('_', ' '))} {_duration(v / 1e6)}" for k, v in sorted(times.items()))
    cap_note = f"; {_duration(capped)} at the power cap (the limit, not a fault)" if capped else ""
    if not slowed:
        return finding(GPU_THROTTLE_HISTORY, s, PASS, f"never slowed by heat or a power brake since the driver loaded{cap_note}",
                       measured=measured, expected="no time in HW slowdown, thermal slowdown or power brake",
                       source=_HISTORY_SOURCE)
    longest = max(slowed.values())
    status = FAIL if longest >= FAIL_AFTER_S else WARN
    what = ", ".join(f"{_FAULT_TIMES[k]} {_duration(v)}" for k, v in sorted(slowed.items(), key=lambda kv: -kv[1]))
    return finding(GPU_THROTTLE_HISTORY, s, status, f"slowed since the driver loaded: {what}{cap_note}", measured=measured,
                   expected=f"no time in HW slowdown, thermal slowdown or power brake (fails from {FAIL_AFTER_S:.0f} s)",
                   source=_HISTORY_SOURCE,
                   remedy=f"watch `nvidia-smi -q -i {gpu.index} -d PERFORMANCE,TEMPERATURE` under load; check cooling "
                          "and power cabling, or ask the provider")


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


# -- gpu.persistence ------------------------------------------------------------------------------

# Datacenter GPUs, where a CUDA start without persistence mode re-initialises the GPU (seconds on
# 8-GPU machines) and nvidia-persistenced is the documented setting.
_DATACENTER = re.compile(r"\b(Tesla|A100|A800|A30|A40|A10G?|A16|A2|L4|L40S?|L20|H100|H800|H200|H20|GH200|B100|B200|GB200|"
                         r"V100S?|T4|P100|P40|K80)\b")
_PERSISTENCE_SOURCE = "NVIDIA driver persistence documentation (nvidia-persistenced); NVML persistence mode"


def check_persistence(ctx: Context) -> list[Finding]:
    return [_persistence(gpu) for gpu in ctx.machine.gpus]


def _persistence(gpu: Gpu) -> Finding:
    s = subject(gpu)
    if gpu.driver_model is not None:
        return finding(GPU_PERSISTENCE, s, SKIP, "Windows (WDDM/TCC): persistence mode is a Linux setting")
    if gpu.persistence_mode is None:
        return finding(GPU_PERSISTENCE, s, SKIP, "persistence mode not reported")
    datacenter = bool(gpu.name and _DATACENTER.search(gpu.name))
    if gpu.persistence_mode:
        return finding(GPU_PERSISTENCE, s, PASS, "persistence mode on", measured="persistence mode Enabled",
                       expected="Enabled on a datacenter GPU", source=_PERSISTENCE_SOURCE)
    if not datacenter:
        return finding(GPU_PERSISTENCE, s, PASS, "persistence mode off (a desktop GPU: only its CUDA start is slower)",
                       measured="persistence mode Disabled", expected="any on a non-datacenter GPU", source=_PERSISTENCE_SOURCE)
    return finding(GPU_PERSISTENCE, s, WARN, "persistence mode off on a datacenter GPU: every CUDA start re-initialises it "
                                            "(seconds per process, and NVML reads wake it)",
                   measured="persistence mode Disabled", expected="Enabled (nvidia-persistenced)", source=_PERSISTENCE_SOURCE,
                   remedy="`sudo systemctl enable --now nvidia-persistenced` (or `sudo nvidia-smi -pm 1`, lost at reboot)")

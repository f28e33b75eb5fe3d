"""gpu.isolation and gpu.ecc: is the whole GPU yours, and is its memory healthy?"""

from __future__ import annotations

from ..catalog import checked
from .. import actions
from .. import occupancy as occ
from ..facts import ECC_READ_FAILED, Gpu
from ..record import Finding
from .common import FAIL, PASS, SKIP, WARN, Context, finding, gib, subject, why_missing

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
GPU_ECC = checked("gpu.ecc")
GPU_ISOLATION = checked("gpu.isolation")

# Whose work is on a GPU is decided by gpuvet.occupancy, the rule `gpuvet run` follows too: memory
# a GPU holds before anyone uses it is small (the driver's own reservation is reported apart on
# current drivers); more than 1 GiB or 2% of it, or utilisation while a context holds memory,
# means someone is on it.
_HIDDEN_FAIL_SHARE = 0.10  # a tenth of the memory held by someone you cannot see is lost to you
_ISOLATION_SOURCE = "the GPU's virtualization mode, MIG mode, memory use, utilization and process list (NVML / nvidia-smi)"
_WAKING = "busy reading with no memory in use"

_DRIVER_MEANING = {
    "vfio-pci": "bound to vfio-pci: reserved for passthrough to a virtual machine, CUDA cannot use it here",
    "nouveau": "bound to the open-source nouveau driver: CUDA cannot use it",
    "pci-stub": "bound to pci-stub: held away from every driver",
}


def check_isolation(ctx: Context) -> list[Finding]:
    return [_isolation(gpu) for gpu in ctx.machine.gpus]


def _isolation(gpu: Gpu) -> Finding:
    s = subject(gpu)
    driver = gpu.pcie.kernel_driver
    if driver is not None and driver != "nvidia":
        return finding(GPU_ISOLATION, s, FAIL, _DRIVER_MEANING.get(driver, f"bound to the '{driver}' kernel driver, not nvidia"),
                       measured=f"kernel driver in use: {driver}", expected="nvidia",
                       source="sysfs / lspci 'Kernel driver in use'",
                       remedy=f"`lspci -k -s {gpu.pcie.bus_id or 'BUS_ID'}`; ask the provider for a GPU bound to the nvidia driver")
    issues: list[tuple[str, str]] = []
    mode = gpu.virtualization_mode
    if mode == "vgpu":
        issues.append((WARN, "vGPU guest: a time-sliced or MIG-backed share of a physical GPU, not the whole card "
                             "(slower context start, some counters hidden)"))
    elif mode in ("host_vgpu", "host_vsga"):
        issues.append((WARN, "this GPU serves virtual GPUs to other VMs (vGPU host mode)"))
    if gpu.mig_enabled:
        slices = gpu.mig_devices
        shape = ""
        if slices:
            sms = {m.sm_count for m in slices}
            shape = f" ({len(slices)} instances" + (f" of {sms.pop()} SMs" if len(sms) == 1 and None not in sms else "") + ")"
        issues.append((WARN, f"MIG is enabled: the GPU is split into instances{shape}; a job gets a slice, not the whole GPU"))
    compute = _compute_mode(gpu)
    issues += compute
    occupancy = _occupancy(gpu)
    issues += occupancy
    whole = {"none": "whole GPU, bare metal", "passthrough": "whole GPU, passed through to this VM"}.get(mode or "", "whole GPU")
    measured = _occupancy_text(gpu) + (f"; virtualization {mode}" if mode else "")
    measured += f"; compute mode {gpu.compute_mode}" if compute else ""
    expected = "a whole GPU with nothing else on it before you start"
    if not issues and gpu.memory_used_mib is None and gpu.processes is None:
        return finding(GPU_ISOLATION, s, SKIP, _no_occupancy_reason(gpu), measured=measured)
    if not issues:
        # Without a process table the capture says nothing of processes: "unknown", never "none".
        what = ("nothing else running on it" if gpu.processes is not None else
                f"{gib(gpu.memory_used_mib)} in use and idle; processes unknown (the capture has no process list)")
        return finding(GPU_ISOLATION, s, PASS, f"{whole}; {what}", measured=measured,
                       expected=expected, source=_ISOLATION_SOURCE)
    status = FAIL if any(st == FAIL for st, _ in issues) else WARN
    remedy = (f"`nvidia-smi -i {gpu.index}` (processes, memory) and `nvidia-smi -q -i {gpu.index} -d MEMORY,UTILIZATION`; "
              "if it is not yours, ask the provider")
    if occupancy and occupancy[0][1].startswith(_WAKING):
        remedy = f"re-check with `nvidia-smi -q -i {gpu.index} -d UTILIZATION,MEMORY` after `sudo nvidia-smi -pm 1`"
    if compute:
        mode_fix = f"`sudo nvidia-smi -i {gpu.index} -c DEFAULT` (as root; back after a reboot) or ask the provider"
        remedy = mode_fix if len(issues) == len(compute) else f"{remedy}; compute mode: {mode_fix}"
    return finding(GPU_ISOLATION, s, status, "; ".join(text for _, text in issues), measured=measured,
                   expected=expected, source=_ISOLATION_SOURCE, remedy=remedy)


def _compute_mode(gpu: Gpu) -> list[tuple[str, str]]:
    """A compute mode other than Default limits who may use the GPU (nvidia-smi -c)."""
    mode = gpu.compute_mode
    if mode == "Prohibited":
        return [(FAIL, "compute mode Prohibited: no process may run CUDA on this GPU")]
    if mode in ("Exclusive_Process", "Exclusive_Thread"):
        return [(WARN, f"compute mode {mode}: one process at a time; a second one (a notebook beside the training "
                       "script, a profiler, a second job) fails with 'CUDA-capable device(s) is/are busy or unavailable'")]
    return []


def _no_occupancy_reason(gpu: Gpu) -> str:
    why = why_missing(gpu, "memory_total_mib", "") or why_missing(gpu, "processes", "")
    if why:  # a live query that failed
        return f"memory use and processes not readable ({why}): cannot tell whether anyone else holds this GPU"
    capture = "capture `nvidia-smi -q -x`"
    if gpu.utilization_pct is not None:
        return (f"the capture reports utilization ({gpu.utilization_pct}%) but not memory use or processes: "
                f"cannot tell whether anyone else holds this GPU; {capture}")
    return f"the capture does not report memory use, utilization or processes; {capture}"


def _occupancy_text(gpu: Gpu) -> str:
    parts = []
    if gpu.memory_used_mib is not None:
        parts.append(f"{gib(gpu.memory_used_mib)} of {gib(gpu.memory_total_mib)} used")
    if gpu.utilization_pct is not None:
        parts.append(f"utilization {gpu.utilization_pct}%")
    if gpu.processes is not None:
        parts.append(f"{len(gpu.processes)} process(es) visible")
    if gpu.persistence_mode is not None and gpu.utilization_pct:
        parts.append(f"persistence mode {'on' if gpu.persistence_mode else 'off'}")
    return ", ".join(parts) or "occupancy not reported"


def _occupancy(gpu: Gpu) -> list[tuple[str, str]]:
    """Someone else's work on the GPU: visible processes, or memory/utilisation nobody accounts for."""
    used = gpu.memory_used_mib or 0
    total = gpu.memory_total_mib or 0
    kind = occ.occupancy(gpu)
    busy = occ.is_busy(gpu)
    listed = "no process" if gpu.processes is not None else "processes not in the capture"
    if kind == occ.WAKING_QUIET:  # a few percent on an idle GPU without a context: the driver's own work, not a tenant
        return []
    if kind == occ.WAKING:
        # No context on the GPU, so no kernel can be running: the utilisation sample covers the
        # driver initialising the GPU, which it does on every query while persistence mode is off.
        cause = ("likely the driver waking the GPU with persistence mode off" if gpu.persistence_mode is False
                 else "likely the driver initialising the GPU as it was read")
        return [(WARN, f"{_WAKING} ({gpu.utilization_pct}% busy, {gpu.memory_used_mib} MiB used, {listed}): {cause}, "
                       "not another user")]
    load = (f"{gib(used)} in use" if gpu.memory_used_mib is not None else "memory use not reported") + (
        f", {gpu.utilization_pct}% busy" if busy else "")
    if kind == occ.UNLISTED:
        return [(WARN, f"{load}; the capture has no process list to say whose")]
    compute, graphics, desktop = occ.compute_processes(gpu), occ.graphics_processes(gpu), occ.desktop_processes(gpu)
    hidden = occ.hidden_mib(gpu)
    if kind == occ.DESKTOP_BUFFERS:
        # A desktop on this GPU (compositor, browser, editor) holds display buffers that nvidia-smi
        # attributes to no process: memory in use, but the capture shows no other tenant.
        others = [p for p in compute if p not in desktop]
        also = f"; {len(others)} compute process(es) too: {_names(others)}" if others else ""
        return [(WARN, f"{load} by a desktop session on this GPU ({_names(desktop)}); {gib(hidden)} of it is attributed to "
                       f"no listed process (display buffers), not another tenant as far as the capture shows{also}")]
    if kind == occ.TENANT:
        # Nothing you run shows up here before you start: this is another user, container or VM.
        status = FAIL if busy or hidden > _HIDDEN_FAIL_SHARE * total else WARN
        whose = (f"{gib(hidden)} of it held by processes you cannot see" if hidden > occ.idle_memory_mib(gpu)
                 else "and no process visible")
        return [(status, f"{load}, {whose}: another user, container or VM shares this GPU")]
    if kind == occ.COMPUTE:
        return [(WARN, f"{load} by {len(compute)} process(es) already running: {_names(compute)}")]
    if kind == occ.DESKTOP_BUSY:
        return [(WARN, f"{gpu.utilization_pct}% busy with display processes ({_names(graphics)}): a desktop session shares the GPU")]
    return []


def _names(processes) -> str:
    shown = ", ".join(f"{p.name or '?'} (pid {p.pid})" for p in processes[:3])
    return shown + (" ..." if len(processes) > 3 else "")


# -- gpu.ecc ----------------------------------------------------------------------------------

_DATACENTER_BRANDS = {"tesla", "nvidia"}
_RETIREMENT_LIMIT = 60  # pre-Ampere GPUs retire at most ~64 pages; near it the board is worn out
_ECC_HEALTHY = "0 uncorrectable errors, no pending or failed page retirement / row remap"
_ECC_SOURCE = "NVML ECC counters; NVIDIA GPU memory error management (page retirement, row remapping)"


def check_ecc(ctx: Context) -> list[Finding]:
    return [_ecc(gpu) for gpu in ctx.machine.gpus]


def _ecc(gpu: Gpu) -> Finding:
    s, e = subject(gpu), gpu.ecc
    if failed := gpu.unavailable.get(ECC_READ_FAILED):
        # A counter that could not be read is not a zero: nvidia-smi says "Unknown Error" when NVML
        # fails, which a GPU in trouble does. Never a pass.
        return finding(GPU_ECC, s, FAIL, "the memory-health counters could not be read (\"Unknown Error\"): "
                       "a GPU in trouble, whose errors cannot be ruled out", measured=failed, expected=_ECC_HEALTHY,
                       source=_ECC_SOURCE + "; nvidia-smi prints Unknown Error where NVML returns an error",
                       remedy=f"`nvidia-smi -q -i {gpu.index} -d ECC,ROW_REMAPPER` again; if it still fails, drain the GPU, "
                              f"reset it (`sudo nvidia-smi -r -i {gpu.index}`) and check `dmesg` for Xids; then ask the provider",
                       action=actions.RESET_GPU)
    counters = (e.volatile_uncorrected, e.aggregate_uncorrected, e.retired_pages_sbe, e.retired_pages_dbe,
                e.remapped_rows_uncorrectable, e.remapped_rows_pending, e.remapped_rows_failure, e.retired_pages_pending)
    inforom = _inforom_warning(gpu)
    if e.enabled is None and all(c is None for c in counters):
        return inforom or finding(GPU_ECC, s, SKIP, "no ECC on this GPU (or not in the capture)")
    measured = _ecc_text(gpu)
    reset = (f"stop jobs on it, reset it (`sudo nvidia-smi -r -i {gpu.index}`) and run gpuvet again; "
             "if errors return, ask the provider to replace the GPU")
    failures = []
    if e.volatile_uncorrected:
        failures.append(f"{e.volatile_uncorrected} uncorrectable memory errors since the last reset: results may be corrupt")
    if e.remapped_rows_failure:
        failures.append("a row remapping failed: the GPU's memory cannot hide its bad rows any more")
    if e.remapped_rows_pending:
        failures.append("a row remap is pending: reset the GPU to apply it")
    if e.retired_pages_pending:
        failures.append("a page retirement is pending: reset the GPU to apply it")
    retired = (e.retired_pages_sbe or 0) + (e.retired_pages_dbe or 0)
    if retired >= _RETIREMENT_LIMIT:
        failures.append(f"{retired} pages retired: close to the retirement limit")
    if failures:
        return finding(GPU_ECC, s, FAIL, "; ".join(failures), measured=measured,
                       expected=_ECC_HEALTHY, source=_ECC_SOURCE, remedy=reset)
    if inforom:
        return inforom
    warnings = []
    if e.aggregate_uncorrected:
        warnings.append(f"{e.aggregate_uncorrected} uncorrectable errors over the GPU's lifetime")
    if retired:
        warnings.append(f"{retired} memory pages retired")
    if e.remapped_rows_uncorrectable:
        warnings.append(f"{e.remapped_rows_uncorrectable} rows remapped after uncorrectable errors")
    if e.enabled is False and (gpu.brand or "").lower() in _DATACENTER_BRANDS:
        warnings.append("ECC is off on a datacenter GPU: memory errors go undetected")
    if warnings:
        remedy = (f"sudo nvidia-smi -i {gpu.index} -e 1, then reboot" if e.enabled is False
                  else f"watch the counters: `nvidia-smi -q -i {gpu.index} -d ECC,PAGE_RETIREMENT,ROW_REMAPPER`")
        return finding(GPU_ECC, s, WARN, "; ".join(warnings), measured=measured,
                       expected="ECC on, no error history", source=_ECC_SOURCE, remedy=remedy)
    if e.enabled is False:
        return finding(GPU_ECC, s, PASS, "ECC off (optional on this card); no errors recorded", measured=measured,
                       expected=_ECC_HEALTHY, source=_ECC_SOURCE)
    if e.enabled is None:  # counters read, mode not: say only what was read
        return finding(GPU_ECC, s, PASS, "no uncorrectable errors or pending retirements recorded (ECC mode not in the capture)",
                       measured=measured, expected=_ECC_HEALTHY, source=_ECC_SOURCE)
    return finding(GPU_ECC, s, PASS, "ECC on, no uncorrectable errors", measured=measured,
                   expected=_ECC_HEALTHY, source=_ECC_SOURCE)


def _inforom_warning(gpu: Gpu) -> Finding | None:
    """nvidia-smi's "WARNING: infoROM is corrupted": the infoROM keeps the ECC error counts and the
    retired-page list, so with it corrupt the error history cannot be trusted (or kept)."""
    text = why_missing(gpu, "inforom", "")
    if "corrupt" not in text.lower():
        return None
    return finding(GPU_ECC, subject(gpu), WARN,
                   "infoROM corrupted: the ECC error counts and retired-page list it stores cannot be trusted",
                   measured=text, expected="an intact infoROM (no nvidia-smi warning)",
                   source="nvidia-smi warning; the infoROM holds ECC and page-retirement records (NVML docs)",
                   remedy=f"confirm with `nvidia-smi -q -i {gpu.index}` (a corrupt infoROM prints the warning again); "
                          "ask the provider to reflash or replace the GPU")


def _ecc_text(gpu: Gpu) -> str:
    e = gpu.ecc
    parts = [f"ECC {'on' if e.enabled else 'off' if e.enabled is False else 'unknown'}"]
    for label, value in (
        ("volatile uncorrected", e.volatile_uncorrected),
        ("aggregate uncorrected", e.aggregate_uncorrected),
        ("aggregate corrected", e.aggregate_corrected),
        ("retired pages SBE", e.retired_pages_sbe),
        ("retired pages DBE", e.retired_pages_dbe),
        ("remapped rows uncorrectable", e.remapped_rows_uncorrectable),
    ):
        if value is not None:
            parts.append(f"{label} {value}")
    return ", ".join(parts)

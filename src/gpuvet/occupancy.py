"""Whose work is on a GPU before gpuvet starts: the one rule that `gpuvet run` (bench.schedule and
bench.plan: which GPUs to load) and the judge (gpu.isolation: what to say of them) share, so that
run never refuses a GPU the judge calls idle, nor loads one the judge says another tenant holds.
Pure: it reads facts, never the machine (judge/ imports it)."""

from __future__ import annotations

from .facts import Gpu, GpuProcess

# No CUDA context is on a GPU whose used memory is below these. A context takes ~250 MiB or more
# on current GPUs; idle GPUs with no process report 0-120 MiB in the fixtures when the driver's
# reserve is shown apart (nvidia-smi since R510). When it is not (NVML's v1 memory info), "used"
# includes that reserve, up to ~870 MiB (A100 80GB, a100-sxm4-80gb-mig capture).
NO_CONTEXT_MIB = 256
NO_CONTEXT_WITH_RESERVE_MIB = 1024
# Memory in use that nobody accounts for, above which someone else holds the GPU: 1 GiB or 2% of it.
IDLE_MEMORY_MIB = 1024
IDLE_MEMORY_SHARE = 0.02
BUSY_PCT = 5  # utilisation from which a GPU is busy
# Busy with no context on it (so no kernel can run): the driver initialising the GPU as it is read,
# which it does on every query while persistence mode is off. Under this, not even worth a word.
WAKING_QUIET_PCT = 10

# What is on a GPU (occupancy()), from nothing to another tenant.
WAKING_QUIET = "waking-quiet"  # a few percent busy, no context: the driver's own work
WAKING = "waking"  # busy, no context: the driver initialising the GPU, not a user
DESKTOP_BUFFERS = "desktop-buffers"  # memory a desktop session on this GPU holds, not a tenant's
DESKTOP_BUSY = "desktop-busy"  # busy with display processes: a desktop session shares the GPU
UNLISTED = "unlisted"  # memory or load in use, and no process list to say whose
TENANT = "tenant"  # memory or load nobody listed accounts for: another user, container or VM
COMPUTE = "compute"  # compute processes already running
# The kinds `gpuvet run` does not load a GPU for (unless --force): someone else's work is, or may be, on it.
OCCUPIED = (UNLISTED, TENANT, COMPUTE)


def holds_no_context(gpu: Gpu) -> bool:
    """Nothing runs on this GPU: no process listed and too little memory used for a CUDA context."""
    if gpu.memory_used_mib is None or gpu.processes:
        return False
    limit = NO_CONTEXT_MIB if gpu.memory_reserved_mib is not None else NO_CONTEXT_WITH_RESERVE_MIB
    return gpu.memory_used_mib < limit


def idle_memory_mib(gpu: Gpu) -> float:
    """The most memory an idle GPU may hold unaccounted for."""
    return max(IDLE_MEMORY_MIB, IDLE_MEMORY_SHARE * (gpu.memory_total_mib or 0))


def is_busy(gpu: Gpu) -> bool:
    return (gpu.utilization_pct or 0) >= BUSY_PCT


def compute_processes(gpu: Gpu) -> list[GpuProcess]:
    return [p for p in gpu.processes or [] if (p.type or "C") != "G"]


def graphics_processes(gpu: Gpu) -> list[GpuProcess]:
    return [p for p in gpu.processes or [] if p.type == "G"]


def desktop_processes(gpu: Gpu) -> list[GpuProcess]:
    """Processes with a graphics context ("G", "C+G"): a desktop session on this GPU."""
    return [p for p in gpu.processes or [] if "G" in (p.type or "")]


def hidden_mib(gpu: Gpu) -> float:
    """Memory in use that no listed process accounts for."""
    return (gpu.memory_used_mib or 0) - sum(p.used_memory_mib or 0 for p in gpu.processes or [])


def occupancy(gpu: Gpu) -> str | None:
    """What is on the GPU besides us (one of the kinds above), or None: idle as far as it shows."""
    busy = is_busy(gpu)
    if busy and holds_no_context(gpu):
        return WAKING_QUIET if (gpu.utilization_pct or 0) < WAKING_QUIET_PCT else WAKING
    threshold = idle_memory_mib(gpu)
    if gpu.processes is None:
        return UNLISTED if (gpu.memory_used_mib or 0) > threshold or busy else None
    hidden = hidden_mib(gpu)
    if desktop_processes(gpu) and hidden > threshold and not busy:
        return DESKTOP_BUFFERS
    if hidden > threshold or (busy and not gpu.processes):
        return TENANT
    if compute_processes(gpu):
        return COMPUTE
    if busy and graphics_processes(gpu):
        return DESKTOP_BUSY
    return None


def someone_else_on(gpu: Gpu) -> str | None:
    """Why `gpuvet run` leaves a GPU alone: someone else's work is (or may be) on it; None to load it."""
    kind = occupancy(gpu)
    if kind not in OCCUPIED:
        return None
    if kind == UNLISTED:
        return "memory or load in use, and no process list to say whose"
    compute = compute_processes(gpu)
    if compute:
        return f"{len(compute)} compute process(es) already on {gpu.name or 'this GPU'}"
    return "memory or load in use by processes you cannot see"

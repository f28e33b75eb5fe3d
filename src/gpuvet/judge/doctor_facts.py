"""gpuvet doctor's verdicts on facts no check covers: for a cause, each says confirmed, ruled out or
unknown, with its figure. Made here, in judge/, like every verdict; doctor only tables and shows them."""

from __future__ import annotations

from ..record import RunRecord
from .common import subject_range
from .gpu_links import link_state
from .stack import coarse_memory_accounting

CONFIRMED, RULED_OUT, UNKNOWN = "confirmed", "ruled out", "unknown"
FactVerdict = tuple[str, str]  # (state, figure)

# -- facts no check covers -------------------------------------------------------------------------

def driver_here(record: RunRecord) -> FactVerdict | None:
    m = record.machine
    if m.gpus:
        return RULED_OUT, f"the NVIDIA driver answers here: {len(m.gpus)} GPU(s) visible"
    if m.source != "live":
        return None  # a capture says nothing about the container it was not taken in
    where = f" (inside {m.host.container})" if m.host and m.host.container else ""
    return CONFIRMED, f"no GPU visible{where}: {m.gpu_error or 'no NVIDIA GPU found'}"


def in_container(record: RunRecord) -> FactVerdict | None:
    host = record.machine.host
    if host is None:
        return None
    if host.container:
        return UNKNOWN, f"running in {host.container}: packages installed at run time live in the container and go with it"
    return RULED_OUT, "not in a container"


def vgpu(record: RunRecord) -> FactVerdict | None:
    modes = {g.virtualization_mode or "unknown" for g in record.machine.gpus}
    if "vgpu" in modes:
        names = subject_range([f"gpu{g.index}" for g in record.machine.gpus if g.virtualization_mode == "vgpu"])
        return CONFIRMED, f"{names}: vGPU guest (every new process pays a slower context start)"
    if modes and modes <= {"none", "passthrough"}:
        # Whole GPUs start faster than vGPU guests, but a slow start has other causes: only the
        # context time itself (gpu.context_init) rules this out.
        return UNKNOWN, f"whole GPUs ({', '.join(sorted(modes))}), not a vGPU guest"
    return None


def persistence(record: RunRecord) -> FactVerdict | None:
    gpus = record.machine.gpus
    off = [f"gpu{g.index}" for g in gpus if g.persistence_mode is False]
    if off:
        return CONFIRMED, f"persistence mode off on {subject_range(off)}: the driver tears down between processes"
    if gpus and all(g.persistence_mode for g in gpus):
        return RULED_OUT, "persistence mode on"
    return None


def module_loading(record: RunRecord) -> FactVerdict | None:
    stack = record.machine.stack
    if stack is None:
        return None
    value = (stack.cuda_module_loading or "").upper()
    if value == "LAZY":
        return RULED_OUT, "CUDA_MODULE_LOADING=LAZY"
    if value:
        return CONFIRMED, f"CUDA_MODULE_LOADING={value}: every kernel of every library loads at start-up"
    return UNKNOWN, "CUDA_MODULE_LOADING not set (PyTorch 2.x sets LAZY itself; older code loads eagerly)"


def pcie_full_link(record: RunRecord) -> FactVerdict | None:
    """Rules the link out where every GPU's link reads its full width and generation, as gpu.pcie_link
    reads it: under load, or already at idle (a link downshifts when idle, it never trains up past
    its max under load)."""
    full, idle = [], False
    for gpu in record.machine.gpus:
        state = link_state(gpu)
        if state is None or not state.full:
            return None
        idle = idle or not state.under_load
        full.append((f"gpu{gpu.index}", f"Gen{state.reading.current_gen} x{state.reading.current_width}"))
    if not full:
        return None
    links = ", ".join(dict.fromkeys(link for _, link in full))
    when = "already at idle" if idle else "read under load"
    return RULED_OUT, f"{subject_range([s for s, _ in full])}: the full {links} link, {when}"


def old_driver(record: RunRecord) -> FactVerdict | None:
    version = record.machine.driver.version
    coarse = coarse_memory_accounting(version)
    if coarse is None:
        return None
    if coarse:
        return CONFIRMED, f"driver {version}: older drivers account memory coarsely (418-era drivers over-report used memory)"
    return RULED_OUT, f"driver {version}"

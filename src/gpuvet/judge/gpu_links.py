"""gpu.pcie_link and gpu.nvlink: are the GPU's links as wide and fast as they should be?"""

from __future__ import annotations

import dataclasses
import re

from ..catalog import checked
from ..facts import DRIVER_SOURCES, Gpu, Machine, PcieLink, Topology
from ..record import MEASURED, Finding
from .common import FAIL, NOT_IN_PLAY, PASS, SKIP, WARN, Context, finding, holds_no_context, subject, why_missing
from ..specs.reference import Reference

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
GPU_NVLINK = checked("gpu.nvlink")
GPU_PCIE_LINK = checked("gpu.pcie_link")

# Approximate usable GB/s per lane and direction for each generation (after encoding).
GBS_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def _bandwidth(gen: int | None, width: int | None) -> str:
    if gen in GBS_PER_LANE and width:
        gbs = GBS_PER_LANE[gen] * width
        return f"~{gbs:.0f} GB/s" if gbs >= 10 else f"~{gbs:.1f} GB/s"
    return "?"


def link_text(gen: int | None, width: int | None) -> str:
    return f"Gen{gen if gen else '?'} x{width if width else '?'}"


def check_pcie_link(ctx: Context) -> list[Finding]:
    return [_pcie_link(gpu, ctx.ref(gpu)) for gpu in ctx.machine.gpus]


def _under_load(gpu: Gpu, reading: PcieLink) -> bool:
    if reading.under_load is not None:
        return reading.under_load
    # A report taken while the GPU was busy shows the link as it is under load; a "busy" reading
    # on a GPU with no context is the driver waking it (see gpu.isolation), not load.
    return reading.source in DRIVER_SOURCES and (gpu.utilization_pct or 0) >= 50 and not holds_no_context(gpu)


def _when(gpu: Gpu, loaded: bool) -> str:
    if loaded:
        return "under load"
    idle = (gpu.pstate is not None and gpu.pstate >= 8) or gpu.utilization_pct == 0 or "gpu_idle" in (gpu.clocks.event_reasons or [])
    return "at idle" if idle else "(load unknown)"


def _best_reading(gpu: Gpu) -> PcieLink | None:
    readings = [r for r in gpu.pcie.readings if r.current_width or r.current_gen]
    loaded = [r for r in readings if _under_load(gpu, r)]
    return next(iter(loaded or readings), None)


def not_reported(gpu: Gpu) -> str:
    """Why a GPU has no PCIe link reading: the one sentence every PCIe check says for it."""
    return f"PCIe link not reported: {why_missing(gpu, 'pcie.current_gen', 'not in the capture')}"


def _pcie_link(gpu: Gpu, ref: Reference | None) -> Finding:
    s = subject(gpu)
    r = _best_reading(gpu)
    if r is None:
        return finding(GPU_PCIE_LINK, s, SKIP, not_reported(gpu), remedy="capture `nvidia-smi -q -x` or `sudo lspci -vv -d 10de:`")
    loaded = _under_load(gpu, r)
    reported_max = bool(r.max_gen and r.max_width)
    r, capability = known_maximum(r, ref)
    now, best = link_text(r.current_gen, r.current_width), link_text(r.max_gen, r.max_width)
    if capability is None:
        return finding(GPU_PCIE_LINK, s, SKIP,
                       f"{now} now, but the link's maximum is not in the capture and there is no reference for "
                       f"{gpu.name or 'this GPU'}: cannot tell whether that is the full link",
                       measured=f"{now} {_when(gpu, loaded)} ({r.source}), max not reported",
                       remedy=f"`nvidia-smi -i {gpu.index} -q -d PCIE` (Max link generation/width) or "
                              f"`sudo lspci -vv -s {gpu.pcie.bus_id or 'BUS_ID'} | grep LnkCap`")
    measured = f"{now} {_when(gpu, loaded)} ({r.source}), max {best}" + ("" if reported_max else " (reference)")
    confirm = (f"confirm under load: `nvidia-smi -i {gpu.index} -q -d PCIE` while a job runs, or "
               f"`sudo lspci -vv -s {gpu.pcie.bus_id or 'BUS_ID'} | grep -E 'LnkCap|LnkSta'`")
    problems: list[tuple[str, str]] = []  # (status, text)

    if r.current_width and r.max_width and r.current_width < r.max_width:
        share = r.current_width / r.max_width
        status = FAIL if share <= 0.25 else WARN
        # At idle the generation drops too; the lanes stay, so count them at the speed the link runs under load.
        gen = (r.current_gen if loaded else r.max_gen) or r.current_gen or r.max_gen
        problems.append((status, f"x{r.current_width} of x{r.max_width} lanes: host<->GPU bandwidth {_bandwidth(gen, r.current_width)} "
                                 f"instead of {_bandwidth(gen, r.max_width)} at Gen{gen or '?'} (slot, riser or bifurcation)"))
    gen_note = ""
    if r.current_gen and r.max_gen and r.current_gen < r.max_gen:
        if loaded:
            steps = r.max_gen - r.current_gen
            problems.append((FAIL if steps >= 2 else WARN,
                             f"Gen{r.current_gen} under load on a Gen{r.max_gen} link: {_bandwidth(r.current_gen, r.current_width)} "
                             f"instead of {_bandwidth(r.max_gen, r.current_width)}"))
        else:
            gen_note = (f"; Gen{r.current_gen} now is the idle power-saving downshift (max Gen{r.max_gen}), "
                        "not a fault: the generation only counts when read under load")
    slot = _slot_limit(gpu, r, ref)
    if slot:
        problems.append((WARN, slot))
    narrow = _narrower_than_model(gpu, r, ref)
    if narrow and ref is not None:
        problems.append((WARN, narrow))
        capability += f"; {ref.cite('pcie_lanes')}"
        best = f"{link_text(r.max_gen, int(ref.number('pcie_lanes') or 0))} ({ref.id}'s own lanes)"

    if problems:
        status = FAIL if any(st == FAIL for st, _ in problems) else WARN
        return finding(GPU_PCIE_LINK, s, status, "; ".join(text for _, text in problems) + gen_note,
                       measured=measured, expected=f"{best}" + (" under load" if not loaded else ""),
                       source=capability, remedy=confirm)
    summary = f"{now}{gen_note}" if gen_note else f"{now}, the full {best} link" + (" under load" if loaded else "")
    return finding(GPU_PCIE_LINK, s, PASS, summary, measured=measured, expected=best,
                   source=capability, remedy=confirm if gen_note else None)


def known_maximum(r: PcieLink, ref: Reference | None) -> tuple[PcieLink, str | None]:
    """The reading with its maximum generation and width, and where they come from: the capture
    (PCIe link capability), else the model's reference row; None when neither knows them."""
    if r.max_gen and r.max_width:
        return r, f"PCIe link capability ({r.source})"
    if ref is None:
        return r, None
    ref_gen, ref_lanes = ref.number("pcie_gen"), ref.number("pcie_lanes")
    max_gen = r.max_gen or (int(ref_gen) if ref_gen else None)
    max_width = r.max_width or (int(ref_lanes) if ref_lanes else None)
    if not max_gen or not max_width:
        return r, None
    filled = dataclasses.replace(r, max_gen=max_gen, max_width=max_width)
    return filled, f"the link maximum is not in the capture: {ref.cite('pcie_gen')} and pcie_lanes"


def _narrower_than_model(gpu: Gpu, r: PcieLink, ref: Reference | None) -> str | None:
    """A maximum narrower than the model's own lanes (an x16 card whose link tops out at x8):
    the slot, a riser or a virtualization layer halves what the card was built to move."""
    if ref is None:
        return None
    lanes = ref.number("pcie_lanes")
    if not lanes or not r.max_width or r.max_width >= lanes or "pcie_lanes" in (ref.row.get("uncertain_fields") or ""):
        return None
    gen = r.max_gen or (int(ref.number("pcie_gen") or 0) or None)
    return (f"the link tops out at x{r.max_width}, but {ref.id} is an x{lanes:.0f} card (reference): "
            f"{_bandwidth(gen, r.max_width)} instead of {_bandwidth(gen, int(lanes))} host<->GPU at Gen{gen or '?'} "
            "(slot, riser, bifurcation or a virtualization layer)")


def _slot_limit(gpu: Gpu, r: PcieLink, ref: Reference | None) -> str | None:
    """The slot or host allows less than the GPU can do (a Gen5 card in a Gen4 server)."""
    device_max = gpu.pcie.device_max_gen
    if device_max and r.max_gen and r.max_gen < device_max:
        return f"the slot allows Gen{r.max_gen}, the GPU supports Gen{device_max}"
    ref_gen = ref.number("pcie_gen") if ref else None
    if ref_gen and r.max_gen and r.max_gen < ref_gen and r.source in DRIVER_SOURCES:
        return f"the link tops out at Gen{r.max_gen}; {gpu.name} supports Gen{ref_gen:.0f} (reference)"
    return None


# -- gpu.nvlink -------------------------------------------------------------------------------

def check_nvlink(ctx: Context) -> list[Finding]:
    topology = ctx.machine.topology
    totals = _topology_totals(topology) if topology and topology.shows_nvlink else {}
    # One GPU numbered 0 is a one-GPU machine; "GPU 6" alone is one GPU of a bigger box.
    attached = attached_gpus(ctx.machine)
    return [_nvlink(gpu, ctx.ref(gpu), topology, totals, attached) for gpu in ctx.machine.gpus]


def attached_gpus(machine: Machine) -> int:
    """How many GPUs the machine has: those in the facts, or more where a report's header says so
    (`nvidia-smi -q -i 0` of a 4-GPU machine lists one GPU of "Attached GPUs: 4"). One GPU numbered
    other than 0 is one GPU of a bigger box."""
    attached = max([len(machine.gpus)] + [int(c.get("attached") or 0) for c in machine.captures])
    if attached == 1 and machine.gpus and machine.gpus[0].index != 0:
        return machine.gpus[0].index + 1
    return attached


def _nv_count(code: str) -> int:
    m = re.fullmatch(r"NV(\d+)", code.strip())
    return int(m.group(1)) if m else 0


def nvlinks_per_gpu(topology: Topology, label: str) -> int:
    """How many NVLinks a GPU has, from its `topo -m` row.

    Behind NVSwitches every peer shows the GPU's whole link count (DGX A100: NV12 to each of 7
    peers, 12 links in all); in a direct mesh the links are split between peers (DGX-1: NV1/NV2
    to four peers, 6 links), so they add up.
    """
    row = topology.links.get(label, {})
    counts = [_nv_count(row.get(o, "")) for o in topology.gpus if o != label]
    linked = [c for c in counts if c]
    if len(linked) > 2 and len(linked) == len(counts) and len(set(linked)) == 1:
        return linked[0]
    return sum(linked)


def _topology_totals(topology: Topology) -> dict[str, int]:
    """NVLinks summed over each GPU's row: not a link count behind switches, but a link that is
    down lowers it, so GPUs can be compared."""
    gpus = topology.gpus
    return {g: sum(_nv_count(topology.links.get(g, {}).get(o, "")) for o in gpus if o != g) for g in gpus}


def _nvlink(gpu: Gpu, ref: Reference | None, topology: Topology | None, totals: dict[str, int], attached: int) -> Finding:
    s, single_gpu = subject(gpu), attached == 1
    kind = ref.nvlink if ref else None
    model = gpu.name or s
    if single_gpu and not any(link.active for link in gpu.nvlinks or []):
        return finding(GPU_NVLINK, s, SKIP, f"one GPU: NVLink {NOT_IN_PLAY}, nothing to link it to",
                       measured="1 GPU attached")
    if ref is not None and ref.nvlink == "none":
        return finding(GPU_NVLINK, s, MEASURED,
                       f"PCIe only: {model} has no NVLink, so the GPUs talk over PCIe and all-reduce is limited to "
                       "~PCIe rate (measure it: `gpuvet bench p2p allreduce`)",
                       measured=f"{attached} GPUs, no NVLink on the model", source=ref.cite("nvlink_gen"))
    if gpu.nvlinks is not None:
        return _from_links(gpu, kind, ref)
    label = f"GPU{gpu.index}"
    if topology is not None and label in totals and len(totals) > 1:
        return _from_topology(gpu, kind, ref, topology, totals)
    if topology is not None and not topology.shows_nvlink:
        return finding(GPU_NVLINK, s, SKIP, "the topology was captured with `topo -mp`, which hides NVLink",
                       remedy="capture `nvidia-smi topo -m` and `nvidia-smi nvlink -s`")
    reason = why_missing(gpu, "nvlinks", "no NVLink data (capture `nvidia-smi nvlink -s` or `nvidia-smi topo -m`)")
    return finding(GPU_NVLINK, s, SKIP, f"NVLink state not available: {reason}")


def _from_links(gpu: Gpu, kind: str | None, ref: Reference | None) -> Finding:
    s, links = subject(gpu), gpu.nvlinks or []
    active = [link for link in links if link.active]
    inactive = [link for link in links if not link.active]
    speed = next((link.speed_gbs for link in active if link.speed_gbs), None)
    speed_text = f" at {speed:g} GB/s each" if speed else ""
    measured = f"{len(active)} active, {len(inactive)} inactive"
    source = ref.cite("nvlink_gen") if ref else "NVML NVLink state"
    confirm = f"`nvidia-smi nvlink -s -i {gpu.index}` and `nvidia-smi topo -m`"
    if not active:
        note = why_missing(gpu, "nvlinks", "no link active")
        if kind == "bridge":
            return finding(GPU_NVLINK, s, SKIP, f"no NVLink bridge in use ({note}): optional on {gpu.name}; GPUs talk over PCIe",
                           measured=measured, source=source)
        status = FAIL if kind == "integral" else WARN
        return finding(GPU_NVLINK, s, status, f"no active NVLink: {note}" + (f"; {gpu.name} is built with NVLink" if kind == "integral" else ""),
                       measured=measured, expected="every NVLink active", source=source,
                       remedy=f"check {confirm}; ask the provider (fabric manager, cabling or a faulty GPU)")
    if inactive:
        ids = ", ".join(str(link.link) for link in inactive)
        return finding(GPU_NVLINK, s, FAIL if kind != "bridge" else WARN,
                       f"links {ids} inactive: {len(active)} of {len(links)} NVLinks up{speed_text}",
                       measured=measured, expected="every NVLink active", source=source,
                       remedy=f"check {confirm}; a link down cuts GPU-to-GPU bandwidth: ask for a replacement")
    return finding(GPU_NVLINK, s, PASS, f"{len(active)} NVLinks active{speed_text}", measured=measured,
                   expected="every NVLink active", source=source)


def _from_topology(gpu: Gpu, kind: str | None, ref: Reference | None, topology: Topology, totals: dict[str, int]) -> Finding:
    s, label = subject(gpu), f"GPU{gpu.index}"
    row = topology.links.get(label, {})
    peers = {o: row.get(o, "?") for o in topology.gpus if o != label}
    measured = ", ".join(f"{o} {code}" for o, code in peers.items())
    total, most = totals[label], max(totals.values())
    source = ref.cite("nvlink_gen") if ref else "nvidia-smi topo -m"
    if total == 0:
        if kind == "bridge":
            return finding(GPU_NVLINK, s, SKIP, f"no NVLink bridge (optional on {gpu.name}); GPUs talk over PCIe: {measured}",
                           measured=measured, source=source)
        status = FAIL if kind == "integral" or most > 0 else WARN
        why = (f"{gpu.name} is built with NVLink" if kind == "integral"
               else "other GPUs here have NVLink" if most > 0
               else "if this machine was sold with NVLink, it is missing")
        return finding(GPU_NVLINK, s, status, f"no NVLink to any other GPU, all traffic crosses PCIe ({why})",
                       measured=measured, expected="NV# links between GPUs", source=source,
                       remedy="check `nvidia-smi nvlink -s` and `nvidia-smi topo -m`; ask the provider")
    if total < most:
        usual = max((code for code in peers.values() if _nv_count(code)), key=_nv_count, default="NV#")
        weak = ", ".join(f"{o} {code}" for o, code in peers.items() if _nv_count(code) < _nv_count(usual))
        return finding(GPU_NVLINK, s, FAIL, f"fewer NVLinks than the other GPUs ({weak}, where {usual} is usual): a link is down",
                       measured=measured, expected="as many links as the other GPUs", source="nvidia-smi topo -m",
                       remedy=f"check `nvidia-smi nvlink -s -i {gpu.index}`; ask for a replacement")
    linked = sum(1 for code in peers.values() if _nv_count(code))
    links = nvlinks_per_gpu(topology, label)
    islands = nvlink_islands(topology)
    if len(islands) > 1:
        mine = next(island for island in islands if label in island)
        crossed = _slowest_hop({o: code for o, code in peers.items() if o not in mine})
        return finding(GPU_NVLINK, s, WARN,
                       f"NVLink only within {'-'.join(sorted(mine))} ({links} links); the {len(islands)} NVLink groups reach each "
                       f"other over {crossed}: an all-reduce over all {len(topology.gpus)} GPUs runs at that speed, not NVLink's",
                       measured=measured, expected="every GPU reachable from every other over NVLink (a switch or a mesh)",
                       source="nvidia-smi topo -m; NCCL's ring crosses the slowest link between the groups",
                       remedy=f"keep jobs within {len(mine)} GPUs of one group (`CUDA_VISIBLE_DEVICES`), or measure the "
                              "8-GPU all-reduce: `gpuvet bench allreduce`; ask for an NVSwitch machine if the job needs all of them")
    return finding(GPU_NVLINK, s, PASS, f"NVLink to {linked} of {len(peers)} other GPUs ({links} links)", measured=measured,
                   expected="NVLink to other GPUs, as many links as the best-connected GPU", source=source)


def nvlink_islands(topology: Topology) -> list[set[str]]:
    """The GPUs that reach each other over NVLink, hop by hop: one group behind NVSwitches or in a
    mesh (DGX-1), several where bridges join pairs (NV4 between 0-1, 2-3, ...; SYS elsewhere)."""
    left, islands = set(topology.gpus), []
    while left:
        stack, island = [left.pop()], set()
        while stack:
            gpu = stack.pop()
            island.add(gpu)
            near = {o for o, code in topology.links.get(gpu, {}).items() if o in left and _nv_count(code)}
            left -= near
            stack += near
        islands.append(island)
    return islands


# What each topo code crosses, slowest last (nvidia-smi topo -m's legend).
_HOPS = {"PIX": "a PCIe switch (PIX)", "PXB": "several PCIe switches (PXB)", "PHB": "the CPU's PCIe host bridge (PHB)",
         "NODE": "the PCIe host bridges of one NUMA node (NODE)",
         "SYS": "PCIe and the link between the CPU sockets (SYS)"}


def _slowest_hop(peers: dict[str, str]) -> str:
    codes = [code.strip() for code in peers.values() if code.strip() in _HOPS]
    worst = max(codes, key=list(_HOPS).index, default=None)
    return _HOPS[worst] if worst else "PCIe"


# -- the PCIe rule's reading of a link, for the checklist, doctor and the cluster view ---------------
# One rule: whoever asks "is this link full?" asks it here, so no copy can drift from gpu.pcie_link.

@dataclasses.dataclass(frozen=True)
class LinkState:
    reading: PcieLink  # the reading gpu.pcie_link judges: one under load if there is one, else the first
    under_load: bool  # read under load (or in a report taken while the GPU was busy with a context)
    full_width: bool  # all the lanes of the link's maximum
    full_generation: bool  # at the link's maximum generation now
    idle: bool  # read at idle, where the generation drops to save power

    @property
    def full(self) -> bool:
        return self.full_width and self.full_generation


def link_state(gpu: Gpu) -> LinkState | None:
    """The link as gpu.pcie_link reads it (None: no reading with a current width or generation)."""
    reading = _best_reading(gpu)
    if reading is None:
        return None
    loaded = _under_load(gpu, reading)
    full_width = not (reading.current_width and reading.max_width and reading.current_width < reading.max_width)
    full_gen = bool(reading.current_gen and reading.max_gen and reading.current_gen >= reading.max_gen)
    return LinkState(reading, loaded, full_width, full_gen, _when(gpu, loaded) == "at idle")


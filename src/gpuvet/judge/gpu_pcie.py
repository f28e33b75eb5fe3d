"""gpu.pcie_under_load and gpu.pcie_driver_view: what the PCIe link is when it counts, and as the
NVIDIA driver sees it.

gpu.pcie_link judges the reading it has; these two say what that reading can and cannot tell. A
GPU trains its link down to Gen1 at idle to save power, so an idle reading shows the lanes but not
the generation a job gets; and the host (lspci, sysfs) may see a wider link than the driver, which
is what the GPU moves data over (the seed's virtualised x8 behind an lspci x16).
"""

from __future__ import annotations

from ..catalog import checked
from ..facts import DRIVER_SOURCES, Gpu, PcieLink
from ..record import MEASURED, Finding
from ..specs.reference import Reference
from .common import PASS, SKIP, WARN, Context, finding, subject
from .gpu_bench import check_pcie_bandwidth
from .gpu_links import known_maximum, link_state, link_text, not_reported

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
GPU_PCIE_DRIVER_VIEW = checked("gpu.pcie_driver_view")
GPU_PCIE_UNDER_LOAD = checked("gpu.pcie_under_load")

HOST_SOURCES = ("sysfs", "lspci")


# -- gpu.pcie_under_load --------------------------------------------------------------------------

def check_pcie_under_load(ctx: Context) -> list[Finding]:
    copies = {f.subject: f for f in check_pcie_bandwidth(ctx) if f.status == PASS}
    return [_under_load(gpu, ctx.ref(gpu), copies.get(subject(gpu))) for gpu in ctx.machine.gpus]


def _under_load(gpu: Gpu, ref: Reference | None, copy: Finding | None) -> Finding:
    s, state = subject(gpu), link_state(gpu)
    if state is None:
        return finding(GPU_PCIE_UNDER_LOAD, s, SKIP, not_reported(gpu))
    r, capability = known_maximum(state.reading, ref)
    now, full = link_text(r.current_gen, r.current_width), link_text(r.max_gen, r.max_width)
    confirm = (f"`gpuvet bench pcie`, or `nvidia-smi -i {gpu.index} -q -d PCIE` while a job runs")
    if state.under_load:
        measured = f"{now} under load ({r.source})"
        if capability is not None and state.full:
            return finding(GPU_PCIE_UNDER_LOAD, s, PASS, f"{now} under load, the full link", measured=measured,
                           expected=full, source=capability)
        return finding(GPU_PCIE_UNDER_LOAD, s, MEASURED,
                       f"{now} under load" + (f", of a {full} link (judged by gpu.pcie_link)" if capability else
                                              ": the link's maximum is unknown"), measured=measured,
                       expected=full if capability else None, source=capability)
    if copy is not None:  # host<->GPU copies at the full link's rate: the link ran at its generation
        return finding(GPU_PCIE_UNDER_LOAD, s, PASS, f"the copy benchmark ran at the full link's rate: {copy.summary}",
                       measured=copy.evidence.measured, expected=copy.evidence.expected, source=copy.evidence.source)
    when = "at idle" if state.idle else "with the load unknown"
    if capability is None:
        return finding(GPU_PCIE_UNDER_LOAD, s, SKIP,
                       f"read only {when} ({now}) and the link's maximum is unknown: cannot tell what a job gets",
                       measured=f"{now} {when} ({r.source})", remedy=confirm)
    if state.full:  # a link only trains down when idle, never up past its maximum
        return finding(GPU_PCIE_UNDER_LOAD, s, PASS, f"{now} {when}, already the link's maximum: load cannot raise it",
                       measured=f"{now} {when} ({r.source})", expected=full, source=capability)
    width = "" if state.full_width else f"; x{r.current_width} of x{r.max_width} lanes (judged by gpu.pcie_link)"
    downshift = ", the power-saving downshift" if state.idle else ""
    return finding(GPU_PCIE_UNDER_LOAD, s, MEASURED,
                   f"read only {when} ({now}{downshift}); under load it should show {full}{width}",
                   measured=f"{now} {when} ({r.source})", expected=f"{full} under load", source=capability, remedy=confirm)


# -- gpu.pcie_driver_view -------------------------------------------------------------------------

def check_pcie_driver_view(ctx: Context) -> list[Finding]:
    return [_driver_view(gpu, ctx.ref(gpu)) for gpu in ctx.machine.gpus]


def _max_text(r: PcieLink) -> str:
    return link_text(r.max_gen, r.max_width)


def _driver_view(gpu: Gpu, ref: Reference | None) -> Finding:
    s = subject(gpu)
    readings = [r for r in gpu.pcie.readings if r.max_width or r.current_width]
    if not readings:
        return finding(GPU_PCIE_DRIVER_VIEW, s, SKIP, not_reported(gpu))
    driver = next((r for r in readings if r.source in DRIVER_SOURCES and r.max_width), None)
    host = next((r for r in readings if r.source in HOST_SOURCES and r.max_width), None)
    if driver is None:
        seen = ", ".join(dict.fromkeys(r.source or "?" for r in readings))
        return finding(GPU_PCIE_DRIVER_VIEW, s, SKIP,
                       f"the driver's view was not read (only {seen}): the driver may see a narrower link than the host",
                       measured="; ".join(f"{r.source}: max {_max_text(r)}" for r in readings),
                       remedy="run `nvidia-smi -q -d PCIE` or `gpuvet run`")
    measured = f"{driver.source}: max {_max_text(driver)}" + (f"; {host.source}: max {_max_text(host)}" if host else "")
    if host is not None:
        if (driver.max_width, driver.max_gen) != (host.max_width, host.max_gen):
            slower = min(driver.max_width or 0, host.max_width or 0)
            return finding(GPU_PCIE_DRIVER_VIEW, s, WARN,
                           f"the driver reports a max of {_max_text(driver)} ({driver.source}) but the host shows "
                           f"{_max_text(host)} ({host.source} LnkCap): a virtualization layer or the slot narrows the "
                           f"link the GPU uses" + (f"; host<->GPU copies run at x{slower}" if slower else ""),
                           measured=measured, expected="the same maximum in both views",
                           source=f"the driver ({driver.source}) and the host's PCIe capability ({host.source})",
                           remedy="ask the provider whether the GPU sits behind a virtualization layer or a narrower slot")
        return finding(GPU_PCIE_DRIVER_VIEW, s, PASS, f"driver and {host.source} agree: max {_max_text(driver)}",
                       measured=measured, expected="the same maximum in both views",
                       source=f"the driver ({driver.source}) and the host's PCIe capability ({host.source})")
    link, capability = known_maximum(PcieLink(source=driver.source), ref)  # the model's own link, from its reference
    model = (link.max_gen, link.max_width) if capability else None
    if model and (driver.max_gen, driver.max_width) == model:
        return finding(GPU_PCIE_DRIVER_VIEW, s, PASS,
                       f"the driver sees the model's full {_max_text(driver)} link (no host view to compare)",
                       measured=measured, expected=f"{link_text(*model)} ({ref.id if ref else 'reference'})", source=capability)
    return finding(GPU_PCIE_DRIVER_VIEW, s, MEASURED,
                   f"the driver sees a max of {_max_text(driver)}; the host's view (lspci, sysfs) "
                   "was not read to compare" + ("" if model else " and no reference gives the model's link"),
                   measured=measured, remedy="`sudo lspci -vv -d 10de: | grep LnkCap`")
